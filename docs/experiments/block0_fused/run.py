"""Block 0 of SE-ResNet9-FixUp as one kernel: correctness against float64, then timing.

    python docs/experiments/block0_fused/run.py            # needs an sm_90 GPU and cutlass_ops

Three kernels: the mma.sync one (`forward`, block0_fused_kernel.cuh), the wgmma one
(`forward_wgmma`, block0_wgmma_kernel.cuh) and the wgmma one with its filters streamed, two
CTAs an SM (`forward_stream`, block0_stream_kernel.cuh), which runs last (step 5).
1. Builds block0_fused.cu as a torch extension (build directory under /tmp), or imports the one
   --build-only compiled beforehand (--ext).
2. Correctness, N = 1, 3, 127, 128, 2048: a SEFixupBasicBlock(64, 64) from cutlass_ops.models
   with random weights, non-zero FixUp scalars and SE weights (a seeded torch.Generator) is
   the reference, run in float64 on the GPU.  Each fused kernel writes into a NaN-poisoned
   buffer; it passes when ||out - ref|| / ||ref|| <= 2x PyTorch's own fp16 error (the same
   block in fp16, channels_last, against float64) and every output is finite.  The wgmma
   kernel is checked after the mma.sync one, on inputs of its own seeded generator.  When the
   wgmma kernel fails, it is run once more with the other reading of the wgmma descriptor's
   base-offset field (desc_base_offset_mode=1, see block0_wgmma_kernel.cuh) and that result
   printed (a diagnosis; the run still fails).
3. Timing, N = 128, 512, 2048 (a CUDA graph of 20 calls, median of 10 replays, CUDA events):
   both fused kernels; FusedResNet's block-0 path (conv2d_fused, conv2d_fused, se_gate: the
   ops and arguments FusedResNet._fused_ops passes for block 0; with the pooled map
   block 1's downsample reads, as in the model, and without); PyTorch eager fp16
   channels_last.  Bound = max(compulsory bytes / HBM bandwidth, FLOPs / 0.99e15).  Then, at
   N = 2048, the wgmma kernel's cycles an image by phase (its phase_clk: where the time goes).
4. Writes results.json (beside this file unless --out).
5. The stream kernel (unless --skip-stream): CTAs an SM, the same correctness check on inputs
   of its own generator, its timing rows beside FusedResNet's, its phases at N = 2048; then
   results.json again, with a "stream" entry.  Exit status 1 if a check of any kernel failed.
"""
from __future__ import annotations

import argparse
import copy
import importlib.util
import json
import os
import statistics
import sys
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
C, H, W = 64, 16, 16
FLOP_PEAK = 0.99e15                                  # dense fp16 tensor cores, H100/H200 SXM
HBM = {"H200": 4.8e12, "H100": 3.35e12}              # bytes/s; other GPUs: the H100 figure


EXT_NAME = "block0_fused_ext"


def build_extension(build_dir: Path = Path("/tmp/block0_fused_build"), sm90a: bool | None = None):
    """Compiles block0_fused.cu as a torch extension into build_dir and imports it; for sm_90a
    where the GPU is an sm_90 one (sm90a=None) or when asked (--build-only, on a machine without
    a GPU)."""
    from torch.utils.cpp_extension import CUDA_HOME, load
    build_dir.mkdir(parents=True, exist_ok=True)
    flags = ["-O3", "-std=c++17"]
    if sm90a or (sm90a is None and torch.cuda.get_device_capability() == (9, 0)):
        flags.append("-gencode=arch=compute_90a,code=sm_90a")
    includes = [str(HERE)]
    if not (Path(CUDA_HOME or "/usr/local/cuda") / "include" / "cusparse.h").exists():
        # a toolkit without the CUDA libraries' headers that torch's include (cusparse.h, ...): those
        # of the NVIDIA wheels torch depends on
        spec = importlib.util.find_spec("nvidia")
        for root in (spec.submodule_search_locations if spec else []):
            includes += sorted(str(p) for p in Path(root).glob("*/include") if p.is_dir())
    return load(name=EXT_NAME, sources=[str(HERE / "block0_fused.cu")],
                extra_include_paths=includes, extra_cuda_cflags=flags,
                build_directory=str(build_dir), verbose=False)


def module_from_file(name: str, path: Path):
    """Imports the module at ``path`` under ``name``: a .py file, or an extension module such as
    the one --build-only left (built against this same torch), without compiling."""
    spec = importlib.util.spec_from_file_location(name, str(path))  # the loader follows the suffix
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def reference_block_class():
    """cutlass_ops.models.SEFixupBasicBlock; without an importable cutlass_ops (its compiled
    library missing), the same file from this checkout (plain PyTorch), so the correctness
    check still runs (the FusedResNet-path rows then report the import error)."""
    try:
        from cutlass_ops.models import SEFixupBasicBlock
        return SEFixupBasicBlock
    except ImportError as e:
        path = HERE.parents[2] / "cutlass_ops" / "models" / "se_resnet.py"
        print(f"(cutlass_ops not importable: {e}; reference block from {path})")
        return module_from_file("block0_se_resnet", path).SEFixupBasicBlock


def make_block(gen: torch.Generator):
    """The reference block with every parameter random (FixUp's own init zeroes conv2 and
    the scalars, which would test nothing)."""
    blk = reference_block_class()(C, C, 1)

    def randn(*shape):
        return torch.randn(*shape, generator=gen)

    std = (2.0 / (C * 9)) ** 0.5
    with torch.no_grad():
        blk.conv1.weight.copy_(randn(C, C, 3, 3) * std)
        blk.conv2.weight.copy_(randn(C, C, 3, 3) * std)
        blk.fixup_bias1a.copy_(0.1 * randn(1))
        blk.fixup_bias1b.copy_(0.1 * randn(1))
        blk.fixup_bias2a.copy_(0.1 * randn(1))
        blk.fixup_scale.copy_(1.0 + 0.25 * randn(1))
        blk.fixup_bias2b.copy_(0.1 * randn(1))
        fc1, fc2 = blk.se.excite[0], blk.se.excite[2]
        fc1.weight.copy_(0.5 * randn(*fc1.weight.shape))
        fc1.bias.copy_(0.1 * randn(*fc1.bias.shape))
        fc2.weight.copy_(0.5 * randn(*fc2.weight.shape))
        fc2.bias.copy_(0.1 * randn(*fc2.bias.shape))
    return blk.eval()


class Variants:
    """The block's parameters in the forms each implementation takes."""

    def __init__(self, blk):
        dev = torch.device("cuda")
        self.ref64 = copy.deepcopy(blk).to(dev, torch.float64)
        self.ref16 = copy.deepcopy(blk).to(dev, torch.float16).to(memory_format=torch.channels_last)
        f32 = copy.deepcopy(blk).to(dev, torch.float32)
        fc1, fc2 = f32.se.excite[0], f32.se.excite[2]
        self.w1 = self.ref16.conv1.weight.detach()            # fp16, channels_last (KRSC)
        self.w2 = self.ref16.conv2.weight.detach()
        self.b1a, self.b1b, self.b2a = (f32.fixup_bias1a.detach(), f32.fixup_bias1b.detach(),
                                        f32.fixup_bias2a.detach())
        self.scale, self.b2b = f32.fixup_scale.detach(), f32.fixup_bias2b.detach()
        self.fc = [t.detach().contiguous() for t in (fc1.weight, fc1.bias, fc2.weight, fc2.bias)]
        self.neg_b1a = -self.b1a
        self.next_b1a = torch.zeros(1, device=dev)             # block 1's fixup_bias1a in the model
        self.taps = None                                       # the stream kernel's packed filters

    def fused(self, ext, x, out=None):
        return ext.forward(x, self.w1, self.w2, self.b1a, self.b1b, self.b2a, self.scale, self.b2b,
                           *self.fc, out)

    def fused_wgmma(self, ext, x, out=None, desc_base_offset_mode: int = 0, phase_clk=None):
        return ext.forward_wgmma(x, self.w1, self.w2, self.b1a, self.b1b, self.b2a, self.scale, self.b2b,
                                 *self.fc, out, desc_base_offset_mode, phase_clk)

    def fused_stream(self, ext, x, out=None, phase_clk=None):
        if self.taps is None:  # packed once, as a model would at load time
            self.taps = ext.pack_taps(self.w1, self.w2)
        return ext.forward_stream(x, self.w1, self.w2, self.b1a, self.b1b, self.b2a, self.scale, self.b2b,
                                  *self.fc, out, phase_clk, self.taps)

    def fusedresnet_path(self, xa, pooled: bool):
        """FusedResNet._fused_ops for block 0: the stem hands over xa = x + b1a; identity is
        xa + (-b1a) in se_gate; se_gate adds block 1's b1a and writes block 1's pooled map."""
        from cutlass_ops import conv2d_fused, se_gate
        h = conv2d_fused(xa, self.w1, self.b1b.view(()), None, 1, 1, None, self.b2a, relu=True)
        h = conv2d_fused(h, self.w2, None, None, 1, 1, self.scale, None, relu=False)
        if pooled:
            return se_gate(h, xa, *self.fc, self.neg_b1a, self.next_b1a, avgpool=True,
                           h_bias=self.b2b.view(()))
        return se_gate(h, xa, *self.fc, self.neg_b1a, None, avgpool=False, h_bias=self.b2b.view(()))


def rel_err(a: torch.Tensor, ref: torch.Tensor) -> float:
    return ((a.double() - ref).norm() / ref.norm()).item()


def make_input(n: int, gen: torch.Generator) -> torch.Tensor:
    # Like the stem's output (a ReLU): non-negative, about half zeros.
    x = torch.randn(n, C, H, W, generator=gen).relu_()
    return x.to("cuda", torch.float16).contiguous(memory_format=torch.channels_last)


def check_wgmma(ext, v: Variants, x: torch.Tensor, ref: torch.Tensor, torch_err: float,
                mode: int = 0, label: str = "wgmma") -> dict:
    """The wgmma kernel (label "stream": the stream kernel) on x against ref; the same
    criterion as the mma.sync kernel's."""
    n = x.shape[0]
    row = {"n": n, "torch_fp16_err": torch_err, "desc_base_offset_mode": mode}
    try:
        with torch.no_grad():
            out = torch.full_like(x, float("nan"), memory_format=torch.channels_last)
            if label == "stream":
                v.fused_stream(ext, x, out)
            else:
                v.fused_wgmma(ext, x, out, mode)
            torch.cuda.synchronize()
        row["finite"] = bool(torch.isfinite(out).all())
        row["fused_err"] = rel_err(out, ref)
        row["passed"] = row["finite"] and row["fused_err"] <= 2 * torch_err
        msg = (f"{label} err {row['fused_err']:.3e}  torch fp16 err {torch_err:.3e}  bound {2 * torch_err:.3e}  "
               f"finite {row['finite']}  -> {'ok' if row['passed'] else 'FAIL'}")
    except Exception as e:  # noqa: BLE001 (not an sm_90 GPU, or the kernel faulted)
        row.update(error=f"{type(e).__name__}: {e}", passed=False)
        msg = f"{label} unavailable: {row['error']}  -> FAIL"
    print(f"N={n:5d}  {msg}")
    return row


def check(ext, v: Variants, gen: torch.Generator, sizes) -> list[dict]:
    rows = []
    for n in sizes:
        x = make_input(n, gen)
        with torch.no_grad():
            ref = v.ref64(x.double())
            torch_err = rel_err(v.ref16(x), ref)
            out = torch.full_like(x, float("nan"), memory_format=torch.channels_last)
            v.fused(ext, x, out)
            torch.cuda.synchronize()
            finite = bool(torch.isfinite(out).all())
            err = rel_err(out, ref)
            row = {"n": n, "fused_err": err, "torch_fp16_err": torch_err, "finite": finite,
                   "passed": finite and err <= 2 * torch_err}
            try:  # informational: the three-kernel path on the same input
                xa = (x.float() + v.b1a).half().contiguous(memory_format=torch.channels_last)
                row["fusedresnet_path_err"] = rel_err(v.fusedresnet_path(xa, pooled=False), ref)
            except Exception as e:  # noqa: BLE001 (cutlass_ops' library may be missing)
                row["fusedresnet_path_err"] = f"unavailable: {type(e).__name__}: {e}"
        rows.append(row)
        path_err = row["fusedresnet_path_err"]
        print(f"N={n:5d}  fused err {err:.3e}  torch fp16 err {torch_err:.3e}  bound {2 * torch_err:.3e}  "
              f"finite {finite}  -> {'ok' if row['passed'] else 'FAIL'}   (FusedResNet path err: "
              f"{path_err if isinstance(path_err, str) else format(path_err, '.3e')})")
    return rows


def check_wgmma_sizes(ext, v: Variants, seed: int, sizes, mode: int = 0, label: str = "wgmma") -> list[dict]:
    """The wgmma kernel (label "stream": the stream kernel) at each N, on inputs of its own
    generator (so the mma.sync kernel's checks and the timing see the same inputs as without it)."""
    gen = torch.Generator().manual_seed(seed + (2 if label == "stream" else 1))
    rows = []
    for n in sizes:
        x = make_input(n, gen)
        with torch.no_grad():
            ref = v.ref64(x.double())
            torch_err = rel_err(v.ref16(x), ref)
        rows.append(check_wgmma(ext, v, x, ref, torch_err, mode, label))
    return rows


def diagnose_wgmma(ext, v: Variants, seed: int) -> list[dict]:
    """After a failure of the wgmma kernel: N = 3 and 2048 with the descriptors' base-offset
    field = (start >> 7) & 7 instead of 0.  Passing here says the hardware reads that field
    as the swizzle phase of the matrix start, not of the swizzle pattern's start."""
    print("(diagnosis: the wgmma kernel with desc_base_offset_mode=1)")
    return check_wgmma_sizes(ext, v, seed, [3, 2048], mode=1, label="wgmma base_offset=(start>>7)&7")


def time_graph(fn, calls: int = 20, replays: int = 10) -> float:
    """Seconds per call: a CUDA graph of `calls` calls, median over `replays` replays."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(calls):
            fn()
    graph.replay()
    torch.cuda.synchronize()
    times = []
    for _ in range(replays):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e-3 / calls)
    return statistics.median(times)


def bench(ext, v: Variants, gen: torch.Generator, sizes, hbm: float, wgmma_ok: bool = True,
          wgmma_mode: int = 0, stream_ok=None) -> list[dict]:
    """stream_ok: None leaves the stream kernel out; otherwise only it (marked when it failed its
    check), FusedResNet's path and PyTorch's are timed (the other two kernels were already)."""
    rows = []
    print(f"\n{'N':>5} {'implementation':<40} {'us':>9} {'TFLOP/s':>8} {'GB/s':>7} {'of bound':>8}")
    for n in sizes:
        x = make_input(n, gen)
        xa = (x.float() + v.b1a).half().contiguous(memory_format=torch.channels_last)
        flops = 2 * 2 * n * H * W * C * 9 * C               # two 3x3 convs (the SE is noise)
        nbytes = 2 * n * H * W * C * 2                     # input once, output once (fp16)
        bound = max(nbytes / hbm, flops / FLOP_PEAK)
        impls = [("fused (1 kernel)", lambda: v.fused(ext, x)),
                 ("fused wgmma (1 kernel)" + ("" if wgmma_ok else ", check FAILED"),
                  lambda: v.fused_wgmma(ext, x, None, wgmma_mode)),
                 *([] if stream_ok is None else
                   [("fused stream, 2 CTAs/SM (1 kernel)" + ("" if stream_ok else ", check FAILED"),
                     lambda: v.fused_stream(ext, x))]),
                 ("FusedResNet block 0 (3 kernels, +pooled)", lambda: v.fusedresnet_path(xa, True)),
                 ("FusedResNet ops, no pooled map", lambda: v.fusedresnet_path(xa, False)),
                 ("PyTorch eager fp16 channels_last", lambda: v.ref16(x))]
        if stream_ok is not None:
            impls = [(name, fn) for name, fn in impls if "wgmma" not in name and name != "fused (1 kernel)"]
        for name, fn in impls:
            try:
                with torch.no_grad():
                    t = time_graph(fn)
            except Exception as e:  # noqa: BLE001
                print(f"{n:5d} {name:<40} unavailable: {type(e).__name__}: {e}")
                rows.append({"n": n, "impl": name, "error": f"{type(e).__name__}: {e}"})
                continue
            row = {"n": n, "impl": name, "us": t * 1e6, "tflops": flops / t / 1e12, "gbs": nbytes / t / 1e9,
                   "of_bound": bound / t, "bound_us": bound * 1e6}
            rows.append(row)
            print(f"{n:5d} {name:<40} {row['us']:9.1f} {row['tflops']:8.1f} {row['gbs']:7.0f} {row['of_bound']:8.2f}")
        print(f"{n:5d} {'(bound)':<40} {bound * 1e6:9.1f}")
    return rows


PHASES = ["input landed, xa = x + b1a", "conv1 (wgmma)", "conv1 epilogue -> B", "prefetch + conv2 (wgmma)",
          "conv2 epilogue, SE sums", "excite", "gate + residual -> B", "copy-out", "prologue (once a CTA)"]


def wgmma_phases(ext, v: Variants, gen: torch.Generator, n: int, mode: int = 0, stream: bool = False) -> dict:
    """Where an image's time goes in the wgmma kernel (stream: the stream kernel, whose timed
    build spills a few registers) at batch n: the cycles each CTA's thread 0 spent per phase
    (clock64, its warpgroup's MMAs and every barrier's wait included), summed over the CTAs and
    divided by n: cycles an image; and the run's own time by CUDA events.  With two CTAs an SM
    (the stream kernel) an image's cycles overlap the other CTA's: the total is then twice an
    SM's time an image."""
    assert len(PHASES) == ext.wgmma_phases
    x = make_input(n, gen)
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    ctas = min(n, sms * (ext.stream_ctas_per_sm() if stream else 1))
    clk = torch.zeros(ctas, ext.wgmma_phases, dtype=torch.int64, device="cuda")

    def launch(phase_clk=None):
        if stream:
            v.fused_stream(ext, x, None, phase_clk)
        else:
            v.fused_wgmma(ext, x, None, mode, phase_clk=phase_clk)
    with torch.no_grad():
        launch()  # warm
        clk.zero_()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        launch(clk)
        end.record()
        end.synchronize()
    per_image = (clk.sum(0).double() / n).tolist()
    total = sum(per_image)
    us = start.elapsed_time(end) * 1e3
    print(f"\n{'stream' if stream else 'wgmma'} kernel at N={n}: cycles an image by phase (thread 0 of each CTA; "
          f"{clk.shape[0]} CTAs, {us:.1f} us this launch)")
    for name, c in zip(PHASES, per_image):
        print(f"  {name:<32} {c:10.0f} {c / total:6.1%}")
    # cycles per CTA over the launch against its time: the SM clock the run saw
    mhz = clk.sum(1).double().mean().item() / us
    print(f"  {'total':<32} {total:10.0f}   (~{mhz:.0f} MHz: a CTA's cycles over the launch's time)")
    return {"n": n, "ctas": clk.shape[0], "us": us, "cycles_per_image": dict(zip(PHASES, per_image)),
            "mhz_seen": mhz}


def stream_part(ext, v: Variants, gen: torch.Generator, seed: int, hbm: float, skip_timing: bool) -> dict:
    """The stream kernel, last (a fault loses the CUDA context; a hang in its ring stops the
    run where the earlier results are already written): how many CTAs an SM holds, the
    correctness check, its timing row against FusedResNet's path, its phases."""
    ctas = ext.stream_ctas_per_sm()
    print(f"\nstream kernel: {ext.stream_smem_bytes} B/CTA, {ctas} CTA(s) an SM")
    rows = check_wgmma_sizes(ext, v, seed, [1, 3, 127, 128, 2048], label="stream")
    ok = all(r["passed"] for r in rows)
    timing = [] if skip_timing else bench(ext, v, gen, [128, 512, 2048], hbm, stream_ok=ok)
    phases = wgmma_phases(ext, v, gen, 2048, stream=True) if ok and not skip_timing else None
    return {"ctas_per_sm": ctas, "smem_bytes": ext.stream_smem_bytes, "correctness": rows, "passed": ok,
            "timing": timing, "phases": phases}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=str(HERE / "results.json"), help="the results JSON (default: %(default)s)")
    ap.add_argument("--skip-timing", action="store_true", help="the correctness checks only (no timing, no phases)")
    ap.add_argument("--seed", type=int, default=0, help="seeds the block's weights and the inputs (default 0)")
    ap.add_argument("--wgmma-mode", type=int, choices=(0, 1), default=0,
                    help="the wgmma descriptors' base-offset field: 0 (the design's reading) or (start >> 7) & 7; "
                         "a process whose kernel faulted cannot run the other mode itself (the CUDA context is lost)")
    ap.add_argument("--skip-stream", action="store_true",
                    help="leave out the stream kernel (block0_stream_kernel.cuh), which runs last")
    ap.add_argument("--build-only", metavar="DIR", type=Path,
                    help="compile the extension for sm_90a into DIR (no GPU needed: e.g. before a GPU "
                         "session, to save its minutes) and exit; DIR/%s.so is what --ext takes" % EXT_NAME)
    ap.add_argument("--ext", metavar="SO", type=Path,
                    help="import this prebuilt extension (--build-only's, the same torch and Python) instead of "
                         "compiling; one that does not import (another Python version) is compiled here after all")
    args = ap.parse_args()
    if args.build_only:
        os.environ.setdefault("TORCH_CUDA_ARCH_LIST", "9.0")  # what torch picks on an H100/H200
        build_extension(args.build_only, sm90a=True)
        print(f"built {args.build_only / (EXT_NAME + '.so')}")
        return 0
    if not torch.cuda.is_available():
        print("block0_fused: needs a CUDA GPU (sm_90: the kernels take 215600 and 231456 bytes of shared memory)")
        return 2
    name = torch.cuda.get_device_name()
    hbm = next((bw for key, bw in HBM.items() if key in name), HBM["H100"])
    ext = None
    if args.ext:
        try:
            ext = module_from_file(EXT_NAME, args.ext)
        except ImportError as e:  # e.g. built under another Python version: compile it here instead
            print(f"--ext {args.ext} does not import ({e}); building the extension here")
    if ext is None:
        ext = build_extension()
    gen = torch.Generator().manual_seed(args.seed)
    v = Variants(make_block(gen))
    print(f"{name}: torch {torch.__version__}, CUDA {torch.version.cuda}, smem {ext.smem_bytes} B/CTA "
          f"(wgmma kernel {ext.wgmma_smem_bytes} B/CTA)")
    correctness = check(ext, v, gen, [1, 3, 127, 128, 2048])
    correctness_wgmma = check_wgmma_sizes(ext, v, args.seed, [1, 3, 127, 128, 2048], mode=args.wgmma_mode)
    ok_wgmma = all(r["passed"] for r in correctness_wgmma)
    diagnosis = None if ok_wgmma or args.wgmma_mode else diagnose_wgmma(ext, v, args.seed)
    timing = [] if args.skip_timing else bench(ext, v, gen, [128, 512, 2048], hbm, ok_wgmma, args.wgmma_mode)
    phases = wgmma_phases(ext, v, gen, 2048, args.wgmma_mode) if ok_wgmma and not args.skip_timing else None
    try:
        import cutlass_ops
        cutlass_version = getattr(cutlass_ops, "__version__", "?")
    except Exception as e:  # noqa: BLE001
        cutlass_version = f"unavailable: {e}"
    result = {"gpu": name, "capability": list(torch.cuda.get_device_capability()),
              "torch": torch.__version__, "cuda": torch.version.cuda,
              "cudnn": torch.backends.cudnn.version(), "cutlass_ops": cutlass_version,
              "hbm_bytes_per_s": hbm, "flop_peak": FLOP_PEAK, "smem_bytes": ext.smem_bytes,
              "wgmma_smem_bytes": ext.wgmma_smem_bytes, "correctness": correctness,
              "correctness_wgmma": correctness_wgmma, "wgmma_base_offset_diagnosis": diagnosis,
              "timing": timing, "wgmma_phases": phases}
    Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    print(f"\nwrote {args.out}")
    ok = all(r["passed"] for r in correctness)
    print("correctness: " + ("all passed" if ok else "FAILED"))
    print("correctness (wgmma kernel): " + ("all passed" if ok_wgmma else "FAILED"))
    if args.skip_stream:
        return 0 if ok and ok_wgmma else 1
    result["stream"] = stream_part(ext, v, gen, args.seed, hbm, args.skip_timing)
    Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    print(f"\nwrote {args.out} (with the stream kernel)")
    ok_stream = result["stream"]["passed"]
    print("correctness (stream kernel): " + ("all passed" if ok_stream else "FAILED"))
    return 0 if ok and ok_wgmma and ok_stream else 1


if __name__ == "__main__":
    sys.exit(main())
