"""python -m cutlass_ops {info,demo,bench}: what was built, a quick demo, benchmarks."""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def cmd_info(args) -> int:
    import torch
    import cutlass_ops
    from .bench import environment
    info = environment()
    info["cuda_kernels_built"] = cutlass_ops.cuda_kernels_built()
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
    from .bench import bench_conv, environment, print_table
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
    from .bench import bench_conv, environment, print_table, write_json
    if not torch.cuda.is_available():
        print("bench: needs a CUDA device", file=sys.stderr)
        return 2
    dtype = {"fp16": torch.float16, "bf16": torch.bfloat16}[args.dtype]
    result = bench_conv(args.n, args.c, args.k, args.hw, dtype,
                        compile_max_autotune=not args.no_compile, iters=args.iters)
    result["kernel"] = cutlass_ops.conv2d_fused_last_kernel()
    result["environment"] = environment()
    print(f"GPU: {result['environment']['gpu']}  kernel: {result['kernel']}  "
          f"rel. error vs float64: {result['fused_rel_error_vs_float64']:.2e}")
    print_table(result)
    write_json(Path(args.out), result)
    return 0


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m cutlass_ops", description=__doc__)
    sub = p.add_subparsers(dest="command", required=True)
    sub.add_parser("info", help="print build and device facts as JSON").set_defaults(fn=cmd_info)
    sub.add_parser("demo", help="fused conv vs PyTorch on one ResNet layer").set_defaults(fn=cmd_demo)
    b = sub.add_parser("bench", help="benchmark one fused conv layer against PyTorch baselines "
                                     "(CUDA events, medians); writes JSON")
    b.add_argument("what", choices=["conv"], help="what to benchmark")
    b.add_argument("--n", type=int, default=128, help="batch size (default 128)")
    b.add_argument("--c", type=int, default=64, help="input channels (default 64)")
    b.add_argument("--k", type=int, default=64, help="output channels (default 64)")
    b.add_argument("--hw", type=int, default=16, help="height = width (default 16)")
    b.add_argument("--dtype", choices=["fp16", "bf16"], default="fp16")
    b.add_argument("--iters", type=int, default=200, help="timed iterations (median reported)")
    b.add_argument("--no-compile", action="store_true", help="skip the torch.compile baseline")
    b.add_argument("--out", default="bench_results/conv.json", help="JSON output path")
    b.set_defaults(fn=cmd_bench)
    args = p.parse_args(argv)
    return args.fn(args)


if __name__ == "__main__":
    sys.exit(main())
