"""What each subcommand of ``python -m cutlass_ops`` (cutlass_ops/__main__.py, which holds the
argument parser) does: info, demo, bench (one function per benchmark, each driving its tool
module here), report, layers and profile.  Torch and the tools are imported inside each
command, so ``--help`` stays fast."""
from __future__ import annotations

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
    from .timing import environment
    from .._library import driver_version, unsupported_gpus
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
    from .bench import bench_conv, print_table
    from .timing import environment
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
    from .bench import bench_conv, print_table
    from .timing import environment, write_json
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
        from .cvt_ops_bench import bench_cvt_ops
        timing = _timing_args(args, 20)
        result = bench_cvt_ops(args.n, args.size, _dtype(args.dtype or "fp16"), calls=timing["calls"],
                               reps=timing["reps"], progress=timing["progress"])
        result["environment"] = environment()
        write_json(Path(args.out if args.out != "bench_results/conv.json" else "bench_results/cvt_ops.json"), result)
        return 0
    if args.what == "b2b":
        from .b2b_bench import B2B_SYSTEMS, bench_b2b, print_b2b_table
        systems = [s for s in B2B_SYSTEMS if (not args.systems or s in args.systems)
                   and not (args.no_compile and s.startswith("torch.compile"))]
        result = bench_b2b(args.n, args.c, args.k, args.k1, args.hw, _dtype(args.dtype or "fp16"), systems,
                           **_timing_args(args, 200))
        result["environment"] = environment()
        print_b2b_table(result)
        write_json(Path(args.out if args.out != "bench_results/conv.json" else "bench_results/b2b.json"), result)
        return 0
    if args.what == "se-excite":
        from .se_excite_bench import bench_se_excite
        result = bench_se_excite(args.batch if args.batch != RESNET_BATCHES else [128, 2048],
                                 _dtype(args.dtype or "fp16"), **_timing_args(args, 200))
        result["environment"] = environment()
        write_json(Path(args.out if args.out != "bench_results/conv.json" else "bench_results/se_excite.json"), result)
        return 0
    if args.what == "giou":
        from .giou_bench import bench_giou, print_giou_table
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
    from .timing import environment, write_json
    result["environment"] = environment()
    result = _merged(result, out, merge)
    print_table(result)
    write_json(out, result)
    plot(result, out.with_suffix(".png"))
    return 0


def bench_mlp_cmd(args) -> int:
    from .timing import environment, write_json
    from .mlp_bench import BATCHES, MODELS, OPTIONAL_SYSTEMS, SYSTEMS, bench_mlp, plot_mlp
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
    from .bench import print_resnet_table
    from .systems import not_a_systems_table
    from .train_bench import print_train_table
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
    from .bench import bench_resnet, plot_resnet, print_resnet_table
    out = Path(args.out if args.out != "bench_results/conv.json" else "bench_results/resnet.json")
    result = bench_resnet(args.batch, _dtype(args.dtype or "fp16"), args.in_channels,
                          **({"systems": args.systems} if args.systems else {}), **_timing_args(args, 200))
    return _finish(result, out, args.merge, print_resnet_table, plot_resnet)


def bench_train_cmd(args) -> int:
    from .train_bench import TRAIN_SYSTEMS, bench_train, plot_train, print_train_table
    out = Path(args.out if args.out != "bench_results/conv.json" else "bench_results/train.json")
    # Steps of 1-7 ms: 50 back-to-back steps per throughput sample are plenty.
    result = bench_train(args.batch if args.batch != RESNET_BATCHES else [512, 2048],
                         _dtype(args.dtype or "fp16"), args.in_channels,
                         systems=args.systems or TRAIN_SYSTEMS, **_timing_args(args, 50))
    return _finish(result, out, args.merge, print_train_table, plot_train)


def bench_cvt_cmd(args) -> int:
    from .timing import environment, write_json
    from .cvt_bench import (CVT_INFER_BATCHES, CVT_INFER_SYSTEMS, CVT_TRAIN_BATCHES, CVT_TRAIN_SYSTEMS, bench_cvt,
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
    from ..fused_resnet import FusedResNet
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
    from .profiler import gpu_slug, resnet_problems, sweep
    if not torch.cuda.is_available():
        print("profile: needs a CUDA device", file=sys.stderr)
        return 2
    from .profiler import kernel_families
    families = kernel_families()
    family = args.family or (families[0] if families else 80)
    if args.backward:
        # dgrad/wgrad: family 80 and cuDNN into sm80.csv, then (sm90, a CUTLASS_OPS_SM90_BACKWARD=1
        # build) family 90 into sm90.csv; --family picks one of them.
        from .profiler_backward import backward_families
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
        from .profiler import problems_from_model
        module, _, attr = args.model.partition(":")
        model = getattr(importlib.import_module(module), attr)()
        shape = [int(v) for v in args.input_shape.split(",")]
        problems = problems_from_model(model, shape, args.batch)
    else:
        problems = resnet_problems(args.batch, args.in_channels, training=args.backward)
    if args.backward:
        from .profiler_backward import sweep_backward
        n = 0
        for fam in backward or [80]:
            path = out if args.out else out.with_name(f"sm{fam}.csv")
            n += sweep_backward(problems, path, _dtype(args.dtype or "fp16"), iters=args.iters, family=fam)
            print(f"profile --backward: family {fam} rows in {path}")
    else:
        n = sweep(problems, out, _dtype(args.dtype or "fp16"), iters=args.iters, family=family)
    print(f"profile: wrote {n} rows to {out}; rebuild to use them (see README: Profiles)")
    return 0
