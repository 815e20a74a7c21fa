"""cutlass-ops (or python -m cutlass_ops): what was built and what this machine has (info), a
quick demo, benchmarks against PyTorch's best (bench) and their saved results reprinted (report),
the kernel per layer (layers), training checks against the reference networks (train-check,
train-check-cvt) and the profiler sweep that writes profiles/ (profile).  `cutlass-ops COMMAND
--help` for each."""
from __future__ import annotations

import argparse
import sys

from .tools.cli import RESNET_BATCHES, _cuda, cmd_bench, cmd_demo, cmd_info, cmd_layers, cmd_profile, cmd_report


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="cutlass-ops", description=__doc__)
    sub = p.add_subparsers(dest="command", required=True)
    sub.add_parser("info", help="print build and device facts as JSON").set_defaults(fn=cmd_info)
    sub.add_parser("demo", help="fused conv vs PyTorch on one ResNet layer").set_defaults(fn=cmd_demo)
    b = sub.add_parser("bench", help="benchmarks against PyTorch in the same process (CUDA events, "
                                     "medians); writes JSON")
    b.add_argument("what", choices=["conv", "resnet", "giou", "train", "mlp", "cvt", "cvt-ops", "b2b", "se-excite"],
                   help="conv: one fused conv layer; resnet: FusedResNet inference, train: a FusedResNet "
                        "training step (fwd+bwd), each vs eager (+ CUDA graph) and torch.compile "
                        "max-autotune (NCHW, channels_last, and no-cudagraphs captured by hand), in "
                        "throughput, latency and device time, with setup time and peak memory (JSON + "
                        "PNG); giou: the fused GIoU loss (fwd+bwd, 1024 images) vs PyTorch/torchvision "
                        "forms (dgrad/wgrad vs cuDNN per conv: `profile --backward`); mlp: FusedMLP vs "
                        "eager and torch.compile max-autotune on the MLPs of tools/mlp_bench.py (MODELS), inference and "
                        "fwd+bwd, batch 2^14, 2^18, 2^21 (throughput, latency and device time, JSON); cvt: "
                        "FusedCvT (CvT-13; fused so far: the conv embeddings (the first in inference), the LayerNorms with their residual adds, forward and backward, QuickGELU as one SiLU (on sm90 in inference inside fc1's GEMM), the q/k/v depthwise convs, the drop path) inference and a training "
                        "step vs the same peers as resnet/train (JSON + PNGs); cvt-ops: CvT-13's parts (embedding, norm, "
                        "projection, attention, MLP) one at a time at each stage's shapes, FusedCvT's path vs the "
                        "reference's, forward and forward+backward (--n, --size; JSON); b2b: conv2d_b2b (3x3 C->K then "
                        "1x1 K->K1, --n --c --k --k1 --hw) vs the two convs in eager, cuDNN and torch.compile; se-excite: "
                        "FusedResNet's four SE gates with the excite MLP as se_gate's loop vs as a B2B GEMM "
                        "(FusedMLP) between se_squeeze and se_gate_apply (--batch, default 128 2048; JSON)")
    b.add_argument("--models", nargs="+", default=None, help="mlp: subset of the models (default all: cutlass_ops/tools/mlp_bench.py MODELS)")
    b.add_argument("--modes", nargs="+", default=["inference", "train"], choices=["inference", "train"],
                   help="mlp: inference and/or train (fwd+bwd)")
    b.add_argument("--batch", type=int, nargs="+", default=RESNET_BATCHES,
                   help="resnet: batch sizes (default 1 128 512 2048); train: default 512 2048")
    b.add_argument("--infer-batch", type=int, nargs="*", default=None,
                   help="cvt: inference batch sizes (default 1 64 256; the option alone: no inference)")
    b.add_argument("--train-batch", type=int, nargs="*", default=None,
                   help="cvt: training-step batch sizes (default 64 128; the option alone: no training)")
    b.add_argument("--size", type=int, default=224, help="cvt: image height = width (default 224)")
    b.add_argument("--in-channels", type=int, default=3, choices=[1, 3, 11], help="resnet/train: input channels")
    b.add_argument("--systems", nargs="+", default=None,
                   help="resnet/train/cvt/mlp/b2b: subset of systems to time (names as printed; unknown names list the choices; mlp also takes \"FusedMLP GEMM dW\" (weight gradients as GEMMs: MlpOptions(fused_weight_grads=False)), \"FusedMLP + CUDA graph\" (captured by hand, a training step in one graph), \"FusedMLP kernel\" (the kernel for models wider than 128 too: MlpOptions(wide_kernel=True)), \"torch.compile max-autotune-no-cudagraphs + CUDA graph\" (the hand-graphed peer of FusedMLP + CUDA graph))")
    b.add_argument("--merge", action="store_true",
                   help="resnet/train/cvt: merge the rows into an existing --out JSON (split long runs)")
    b.add_argument("--calls", type=int, default=None,
                   help="resnet/train throughput metric: back-to-back calls between two CUDA events "
                        "(default 200 for resnet, 50 training steps for train)")
    b.add_argument("--reps", type=int, default=5,
                   help="resnet/train throughput metric: repeats of the back-to-back run, median (default 5)")
    b.add_argument("--latency-iters", type=int, default=50,
                   help="resnet/train latency metric: synchronized single calls per round, median (default 50)")
    b.add_argument("--n", type=int, default=128, help="batch size (default 128)")
    b.add_argument("--c", type=int, default=64, help="input channels (default 64)")
    b.add_argument("--k", type=int, default=64, help="output channels (default 64)")
    b.add_argument("--hw", type=int, default=16, help="height = width (default 16)")
    b.add_argument("--k1", type=int, default=256, help="b2b: the 1x1 conv's output channels (default 256)")
    b.add_argument("--dtype", choices=["fp16", "bf16", "fp32"], default=None,
                   help="conv/resnet: fp16 (default) or bf16; giou: box dtype (default fp32)")
    b.add_argument("--iters", type=int, default=100, help="conv/giou: timed iterations (median reported)")
    b.add_argument("--rounds", type=int, default=3,
                   help="resnet/train: time every system this many times (resnet: interleaved; train: one "
                        "system after the other); report the median of the rounds' medians (default 3)")
    b.add_argument("--no-compile", action="store_true", help="skip the torch.compile baseline")
    b.add_argument("--out", default="bench_results/conv.json", help="JSON output path")
    b.set_defaults(fn=cmd_bench)
    rep = sub.add_parser("report", help="reprint the tables of saved `bench resnet` / `bench train` JSON "
                                        "(e.g. docs/benchmarks/resnet/*.json), the per-layer table with each kernel's "
                                        "bound; no GPU needed")
    rep.add_argument("files", nargs="+", help="JSON files that bench resnet or bench train wrote")
    rep.set_defaults(fn=cmd_report)
    lay = sub.add_parser("layers", help="the kernel FusedResNet runs for each conv layer (tile, "
                                        "alignment, split-K) at given batch sizes")
    lay.add_argument("--batch", type=int, nargs="+", default=[1, 128, 2048])
    lay.add_argument("--dtype", choices=["fp16", "bf16"], default="fp16")
    lay.add_argument("--in-channels", type=int, default=3, choices=[1, 3, 11])
    lay.set_defaults(fn=cmd_layers)
    t = sub.add_parser("train-check", help="train FusedResNet and the reference side by side on a "
                                           "synthetic task; compare and plot the loss curves")
    t.add_argument("--steps", type=int, default=50, help="optimizer steps (default 50)")
    t.add_argument("--n", type=int, default=16, help="batch size (default 16)")
    t.add_argument("--device", default="cuda" if _cuda() else "cpu", help="default cuda when available")
    t.add_argument("--dtype", choices=["fp32", "fp16", "bf16"], default="fp32",
                   help="weights and activations (default fp32)")
    t.add_argument("--amp", choices=["fp16", "bf16"], default=None,
                   help="mixed precision: float32 weights, torch.autocast to this dtype, GradScaler")
    t.add_argument("--out", default="bench_results/train", help="output path without suffix (.json, .png)")
    t.set_defaults(fn=lambda a: __import__("cutlass_ops.tools.train_check", fromlist=["main"]).main(a))
    tc = sub.add_parser("train-check-cvt", help="train FusedCvT and the CvT-13 reference side by side on a "
                                                "fixed synthetic batch; compare and plot the loss curves")
    tc.add_argument("--steps", type=int, default=50, help="optimizer steps (default 50)")
    tc.add_argument("--n", type=int, default=16, help="batch size (default 16)")
    tc.add_argument("--size", type=int, default=224, help="image height = width, a multiple of 16 (default 224)")
    tc.add_argument("--device", default="cuda" if _cuda() else "cpu", help="default cuda when available")
    tc.add_argument("--dtype", choices=["fp32", "fp16", "bf16"], default="fp32",
                    help="weights and activations (default fp32)")
    tc.add_argument("--amp", choices=["fp16", "bf16"], default=None,
                    help="mixed precision: float32 weights, torch.autocast to this dtype, GradScaler")
    tc.add_argument("--lr", type=float, default=1e-3, help="AdamW learning rate (default 1e-3)")
    tc.add_argument("--out", default="bench_results/train_cvt", help="output path without suffix (.json, .png)")
    tc.set_defaults(fn=lambda a: __import__("cutlass_ops.tools.cvt_bench", fromlist=["train_check_main"]).train_check_main(a))
    pr = sub.add_parser("profile", help="time every built conv kernel on FusedResNet's conv problems and "
                                        "write profiles/<gpu>/sm<family>.csv (build with "
                                        "CUTLASS_OPS_KERNELS=sweep first); resumes an interrupted sweep")
    pr.add_argument("--batch", type=int, nargs="+", default=[1, 32, 128, 512, 2048],
                    help="batch sizes (default 1 32 128 512 2048)")
    pr.add_argument("--in-channels", type=int, default=3, choices=[1, 3, 11],
                    help="FusedResNet input channels (default 3)")
    pr.add_argument("--model", default=None,
                    help="profile another model's convs instead: 'package.module:factory' "
                         "(called with no arguments), with --input-shape")
    pr.add_argument("--input-shape", default="3,64,64", help="with --model: C,H,W of one input")
    pr.add_argument("--backward", action="store_true",
                    help="profile the dgrad/wgrad kernels and cuDNN's on the model's training convs "
                         "instead of conv2d_fused (rows with conv_kind dgrad/wgrad in the same CSV): family 80 "
                         "and cuDNN into sm80.csv, and on sm90 in a CUTLASS_OPS_SM90_BACKWARD=1 build family 90 "
                         "into sm90.csv (--family 80/90 for one of them)")
    pr.add_argument("--family", type=int, choices=[70, 80, 90], default=None,
                    help="conv2d_fused kernel family to time (default: the newest this GPU runs; on an "
                         "H100/H200 90, the CUTLASS 3.x sm90a kernels, into sm90.csv; run again with "
                         "--family 80 for sm80.csv: on sm90 the two profiles' rules compete per problem)")
    pr.add_argument("--dtype", choices=["fp16", "bf16"], default=None, help="default fp16")
    pr.add_argument("--iters", type=int, default=20, help="timed runs per kernel (median)")
    pr.add_argument("--profiles", default="profiles", help="profiles folder (default ./profiles)")
    pr.add_argument("--out", default=None, help="CSV path (default <profiles>/<gpu>/sm<family>.csv)")
    pr.set_defaults(fn=cmd_profile)
    args = p.parse_args(argv)
    return args.fn(args)


if __name__ == "__main__":
    sys.exit(main())