"""cutlass-ops (or python -m cutlass_ops): what was built and what this machine has (info), a
quick demo, benchmarks against PyTorch's best (bench) and their saved results reprinted (report),
the kernel per layer (layers), training checks against the reference networks (train-check,
train-check-cvt) and the profiler sweep that writes profiles/ (profile).  `cutlass-ops COMMAND
--help` for each."""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


DTYPES = {"fp16": "float16", "bf16": "bfloat16", "fp32": "float32"}
RESNET_BATCHES = [1, 128, 512, 2048]


def _dtype(name: str):
    import torch
    return getattr(torch, DTYPES[name])


def _cuda() -> bool:
    import torch
    return torch.cuda.is_available()


def cmd_info(args) -> int:
    import cutlass_ops
    from .tools.bench import environment
    from ._library import driver_version, unsupported_gpus
    info = environment()
    driver = driver_version()
    info["driver_supports_cuda"] = f"{driver // 1000}.{driver % 1000 // 10}" if driver else None
    info["cuda_kernels_built"] = cutlass_ops.cuda_kernels_built()
    info["conv2d_fused_kernels"] = {f"sm{family}": len(cutlass_ops.ops.conv2d_fused_kernels(family))
                                    for family in (70, 80, 90)}
    info["conv2d_backward_kernels"] = {f"sm{family}": len(cutlass_ops.ops.conv2d_backward_kernels(family))
                                       for family in (80, 90)}
    info["conv2d_b2b_kernels"] = len(cutlass_ops.ops.conv2d_b2b_kernels())  # family 80 only
    info["linear_silu_kernels"] = len(cutlass_ops.ops.linear_silu_kernels())  # family 90 only
    info["gpus_this_build_cannot_run"] = unsupported_gpus()
    print(json.dumps(info, indent=2))
    return 0


def cmd_demo(args) -> int:
    """Fused conv on one ResNet layer: error vs float64 and time vs PyTorch."""
    import torch
    import cutlass_ops
    if not torch.cuda.is_available():
        print("demo: no CUDA device; running the CPU (ATen) path once")
        x = torch.randn(2, 16, 8, 8)
        w = torch.randn(32, 16, 3, 3)
        y = cutlass_ops.conv2d_fused(x, w, torch.randn(32), padding=1, relu=True)
        print(f"output {tuple(y.shape)}, kernel: {cutlass_ops.conv2d_fused_last_kernel()}")
        return 0
    from .tools.bench import bench_conv, environment, print_table
    env = environment()
    print(f"GPU: {env['gpu']}  torch {env['torch']}  CUDA {env['cuda']}")
    result = bench_conv(compile_max_autotune=False, iters=50)
    print(f"kernel: {cutlass_ops.conv2d_fused_last_kernel()}  "
          f"rel. error vs float64: {result['fused_rel_error_vs_float64']:.2e}")
    print_table(result)
    return 0


def cmd_bench(args) -> int:
    import torch
    import cutlass_ops
    from .tools.bench import bench_conv, environment, print_table, write_json
    if not torch.cuda.is_available():
        print("bench: needs a CUDA device", file=sys.stderr)
        return 2
    if args.what == "resnet":
        return bench_resnet_cmd(args)
    if args.what == "mlp":
        return bench_mlp_cmd(args)
    if args.what == "train":
        return bench_train_cmd(args)
    if args.what == "cvt":
        return bench_cvt_cmd(args)
    if args.what == "cvt-ops":
        from .tools.cvt_ops_bench import bench_cvt_ops
        timing = _timing_args(args, 20)
        result = bench_cvt_ops(args.n, args.size, _dtype(args.dtype or "fp16"), calls=timing["calls"],
                               reps=timing["reps"], progress=timing["progress"])
        result["environment"] = environment()
        write_json(Path(args.out if args.out != "bench_results/conv.json" else "bench_results/cvt_ops.json"), result)
        return 0
    if args.what == "b2b":
        from .tools.b2b_bench import B2B_SYSTEMS, bench_b2b, print_b2b_table
        systems = [s for s in B2B_SYSTEMS if (not args.systems or s in args.systems)
                   and not (args.no_compile and s.startswith("torch.compile"))]
        result = bench_b2b(args.n, args.c, args.k, args.k1, args.hw, _dtype(args.dtype or "fp16"), systems,
                           **_timing_args(args, 200))
        result["environment"] = environment()
        print_b2b_table(result)
        write_json(Path(args.out if args.out != "bench_results/conv.json" else "bench_results/b2b.json"), result)
        return 0
    if args.what == "se-excite":
        from .tools.se_excite_bench import bench_se_excite
        result = bench_se_excite(args.batch if args.batch != RESNET_BATCHES else [128, 2048],
                                 _dtype(args.dtype or "fp16"), **_timing_args(args, 200))
        result["environment"] = environment()
        write_json(Path(args.out if args.out != "bench_results/conv.json" else "bench_results/se_excite.json"), result)
        return 0
    if args.what == "giou":
        from .tools.giou_bench import bench_giou, print_giou_table
        result = bench_giou(dtype=_dtype(args.dtype or "fp32"))
        result["environment"] = environment()
        print_giou_table(result)
        write_json(Path(args.out if args.out != "bench_results/conv.json" else "bench_results/giou.json"), result)
        return 0
    dtype = _dtype(args.dtype or "fp16")
    result = bench_conv(args.n, args.c, args.k, args.hw, dtype,
                        compile_max_autotune=not args.no_compile, iters=args.iters)
    result["kernel"] = cutlass_ops.conv2d_fused_last_kernel()
    result["environment"] = environment()
    print(f"GPU: {result['environment']['gpu']}  kernel: {result['kernel']}  "
          f"rel. error vs float64: {result['fused_rel_error_vs_float64']:.2e}")
    print_table(result)
    write_json(Path(args.out), result)
    return 0


def _merged(result: dict, out: Path, merge: bool) -> dict:
    """With --merge: the rows of an earlier run's JSON at `out` added to this run's (one
    batch size per call when a run would not fit one call); this run's rows win."""
    if merge and out.exists():
        old = json.loads(out.read_text())
        new_n = {r["n"] for r in result["rows"]}
        result["rows"] = sorted([r for r in old["rows"] if r["n"] not in new_n] + result["rows"],
                                key=lambda r: r["n"])
    return result


def _timing_args(args, default_calls: int) -> dict:
    return {"calls": default_calls if args.calls is None else args.calls, "reps": args.reps,
            "latency_iters": args.latency_iters, "rounds": args.rounds,
            "progress": lambda m: print(m, file=sys.stderr, flush=True)}


def _finish(result: dict, out: Path, merge: bool, print_table, plot) -> int:
    """Environment, --merge, the printed table, the JSON and the PNG of a resnet/train run."""
    from .tools.bench import environment, write_json
    result["environment"] = environment()
    result = _merged(result, out, merge)
    print_table(result)
    write_json(out, result)
    plot(result, out.with_suffix(".png"))
    return 0


def bench_mlp_cmd(args) -> int:
    from .tools.bench import environment, write_json
    from .tools.mlp_bench import BATCHES, MODELS, OPTIONAL_SYSTEMS, SYSTEMS, bench_mlp, plot_mlp
    out = Path(args.out if args.out != "bench_results/conv.json" else "bench_results/mlp.json")
    batches = args.batch if args.batch != RESNET_BATCHES else BATCHES
    for name in args.systems or []:
        if name not in SYSTEMS + OPTIONAL_SYSTEMS:
            print(f"bench mlp: unknown system {name!r}; choices: {SYSTEMS + OPTIONAL_SYSTEMS}", file=sys.stderr)
            return 2
    for name in args.models or []:
        if name not in MODELS:
            print(f"bench mlp: unknown model {name!r}; choices: {list(MODELS)}", file=sys.stderr)
            return 2
    result = bench_mlp(args.models, batches, _dtype(args.dtype or "fp16"), tuple(args.modes), args.systems,
                       calls=args.calls or 20, reps=args.reps, latency_iters=args.latency_iters)
    result["environment"] = environment()
    write_json(out, result)
    plot_mlp(result, out.with_suffix(".png"))
    print(f"wrote {out} and {out.with_suffix('.png')}")
    return 0


def cmd_report(args) -> int:
    """Reprint saved `bench resnet` / `bench train` JSON as bench printed it (the per-layer table
    recomputed, with its bounds); no GPU needed."""
    from .tools.bench import not_a_systems_table, print_resnet_table
    from .tools.train_bench import print_train_table
    status = 0
    for path in args.files:
        try:
            result = json.loads(Path(path).read_text())
        except (OSError, ValueError) as err:
            print(f"report: {path}: {err}", file=sys.stderr)
            status = 2
            continue
        why = not_a_systems_table(result)
        if why:
            print(f"report: {path}: not the JSON of `bench resnet` or `bench train` as written today ({why})",
                  file=sys.stderr)
            status = 2
            continue
        # bench resnet's rows carry the accuracy check and its result the GPU's peaks; train's neither
        is_resnet = "peaks" in result and "fused_vs_eager_rel_error" in result["rows"][0]
        print(f"== {path}")
        (print_resnet_table if is_resnet else print_train_table)(result)
    return status


def bench_resnet_cmd(args) -> int:
    from .tools.bench import bench_resnet, plot_resnet, print_resnet_table
    out = Path(args.out if args.out != "bench_results/conv.json" else "bench_results/resnet.json")
    result = bench_resnet(args.batch, _dtype(args.dtype or "fp16"), args.in_channels,
                          **({"systems": args.systems} if args.systems else {}), **_timing_args(args, 200))
    return _finish(result, out, args.merge, print_resnet_table, plot_resnet)


def bench_train_cmd(args) -> int:
    from .tools.train_bench import TRAIN_SYSTEMS, bench_train, plot_train, print_train_table
    out = Path(args.out if args.out != "bench_results/conv.json" else "bench_results/train.json")
    # Steps of 1-7 ms: 50 back-to-back steps per throughput sample are plenty.
    result = bench_train(args.batch if args.batch != RESNET_BATCHES else [512, 2048],
                         _dtype(args.dtype or "fp16"), args.in_channels,
                         systems=args.systems or TRAIN_SYSTEMS, **_timing_args(args, 50))
    return _finish(result, out, args.merge, print_train_table, plot_train)


def bench_cvt_cmd(args) -> int:
    from .tools.bench import environment, write_json
    from .tools.cvt_bench import (CVT_INFER_BATCHES, CVT_INFER_SYSTEMS, CVT_TRAIN_BATCHES, CVT_TRAIN_SYSTEMS, bench_cvt,
                            merge_results, plot_cvt, print_cvt_table)
    out = Path(args.out if args.out != "bench_results/conv.json" else "bench_results/cvt.json")
    known = set(CVT_INFER_SYSTEMS) | set(CVT_TRAIN_SYSTEMS)
    unknown = [s for s in args.systems or [] if s not in known]
    if unknown:
        print(f"bench cvt: unknown systems {unknown}; choose from {sorted(known)}", file=sys.stderr)
        return 2

    def pick(systems):
        chosen = [s for s in systems if not args.systems or s in args.systems]
        return [s for s in chosen if not (args.no_compile and s.startswith("torch.compile"))]
    timing = _timing_args(args, 50)
    result = bench_cvt(CVT_INFER_BATCHES if args.infer_batch is None else args.infer_batch,
                       CVT_TRAIN_BATCHES if args.train_batch is None else args.train_batch,
                       _dtype(args.dtype or "fp16"), pick(CVT_INFER_SYSTEMS), pick(CVT_TRAIN_SYSTEMS),
                       size=args.size, **timing)
    result["environment"] = environment()
    if args.merge and out.exists():
        result = merge_results(json.loads(out.read_text()), result)
    print_cvt_table(result)
    write_json(out, result)
    plot_cvt(result, out.with_suffix(".png"))
    return 0


def cmd_layers(args) -> int:
    import torch
    from .fused_resnet import FusedResNet
    device = "cuda" if torch.cuda.is_available() else "cpu"
    model = FusedResNet(args.in_channels).to(device=device, dtype=_dtype(args.dtype)).eval()
    for n in args.batch:
        x = torch.randn(n, args.in_channels, 64, 64, device=device, dtype=_dtype(args.dtype))
        print(f"N={n} ({device}):")
        for name, shape, kernel in model.kernel_report(x):
            print(f"  {name:20s} {str(shape):22s} {kernel}")
    return 0


def cmd_profile(args) -> int:
    import torch
    import cutlass_ops  # noqa: F401
    from .tools.profiler import gpu_slug, resnet_problems, sweep
    if not torch.cuda.is_available():
        print("profile: needs a CUDA device", file=sys.stderr)
        return 2
    from .tools.profiler import kernel_families
    families = kernel_families()
    family = args.family or (families[0] if families else 80)
    if args.backward:
        # dgrad/wgrad: family 80 and cuDNN into sm80.csv, then (sm90, a CUTLASS_OPS_SM90_BACKWARD=1
        # build) family 90 into sm90.csv; --family picks one of them.
        from .tools.profiler import backward_families
        built = backward_families()
        backward = [args.family] if args.family else sorted(built)
        if args.family and args.family not in built:
            print(f"profile --backward: this build has no family-{args.family} dgrad/wgrad kernels this GPU "
                  f"runs (it has {built or 'none'})", file=sys.stderr)
            return 2
        if args.out and len(backward) > 1:
            print("profile --backward --out: pick one family with --family (80: sm80.csv rows, cuDNN's "
                  "included; 90: sm90.csv rows)", file=sys.stderr)
            return 2
        family = backward[0] if backward else 80
    elif family not in families:
        print(f"profile: this build has no family-{family} conv2d_fused kernels this GPU runs "
              f"(it has {families or 'none'})", file=sys.stderr)
        return 2
    out = Path(args.out) if args.out else (
        Path(args.profiles) / gpu_slug(torch.cuda.get_device_name()) / f"sm{family}.csv")
    if args.model:
        import importlib
        from .tools.profiler import problems_from_model
        module, _, attr = args.model.partition(":")
        model = getattr(importlib.import_module(module), attr)()
        shape = [int(v) for v in args.input_shape.split(",")]
        problems = problems_from_model(model, shape, args.batch)
    else:
        problems = resnet_problems(args.batch, args.in_channels, training=args.backward)
    if args.backward:
        from .tools.profiler import sweep_backward
        n = 0
        for fam in backward or [80]:
            path = out if args.out else out.with_name(f"sm{fam}.csv")
            n += sweep_backward(problems, path, _dtype(args.dtype or "fp16"), iters=args.iters, family=fam)
            print(f"profile --backward: family {fam} rows in {path}")
    else:
        n = sweep(problems, out, _dtype(args.dtype or "fp16"), iters=args.iters, family=family)
    print(f"profile: wrote {n} rows to {out}; rebuild to use them (see README: Profiles)")
    return 0


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
                        "eager and torch.compile max-autotune on issue 19's four MLPs (+ one), inference and "
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
                   help="resnet/train/cvt/mlp/b2b: subset of systems to time (names as printed; unknown names list the choices; mlp also takes \"FusedMLP streamed\" (its kernel with streamed weights, CUTLASS_OPS_MLP_RESIDENT=0), \"FusedMLP GEMM dW\" (weight gradients as GEMMs, CUTLASS_OPS_MLP_FUSED_DW=0), \"FusedMLP in-place\" and \"FusedMLP not in place\" (width-128 models resident in place for every kernel or none, CUTLASS_OPS_MLP_INPLACE=1/0; the default: the forwards, not the backward), \"FusedMLP + CUDA graph\" (captured by hand, a training step in one graph), \"FusedMLP kernel\" (the kernel for models wider than 128 too, CUTLASS_OPS_MLP_WIDE=kernel), \"torch.compile max-autotune-no-cudagraphs + CUDA graph\" (the hand-graphed peer of FusedMLP + CUDA graph))")
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
                                        "(e.g. docs/results/*/*.json), the per-layer table with each kernel's "
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
