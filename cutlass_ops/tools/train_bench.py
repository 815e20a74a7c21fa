"""Training-step benchmark (not a test): forward + backward of FusedResNet against PyTorch
running the reference module as its best users run it, in one process.

    python -m cutlass_ops bench train --batch 512 2048

A step is: gradients set to None, forward, loss = mean(out^2) in float32, backward.  The
optimizer update is left out (it is the same for every system).  Each system is timed in the
three metrics of systems.measure_systems, one system after the other (throughput: K back-to-back steps between two CUDA
events; latency: one synchronized step; device time: the profiler's kernel sum), with its
setup time (compile, autotune, capture) and peak memory.

The peers: eager channels_last + a CUDA graph; torch.compile mode="max-autotune" on the NCHW
and on the channels_last model (forward, loss and backward compiled; its own CUDA graphs,
cudagraph trees); and mode="max-autotune-no-cudagraphs" captured in one CUDA graph by hand.
FusedResNet's backward (cutlass_ops/ops/): the conv2d_dgrad/conv2d_wgrad ops
(generated CUTLASS kernels, or cuDNN where the build's profile measured it faster) plus our
kernels for the epilogues and se_gate.  Each row also records a per-kernel breakdown of one
FusedResNet step (printed for the largest batch).
"""
from __future__ import annotations

import torch

from .systems import measure_systems, plot_systems, print_systems, ratios
from .timing import graphed

# Timed one after the other (measure_systems(interleave=False)), hand-captured graphs first.
TRAIN_SYSTEMS = ("FusedResNet", "FusedResNet + CUDA graph", "eager channels_last + CUDA graph",
                 "torch.compile max-autotune-no-cudagraphs channels_last + CUDA graph",
                 "torch.compile max-autotune", "torch.compile max-autotune channels_last")
TRAIN_OPTIONAL_SYSTEMS = ("eager NCHW", "eager channels_last",
                          "torch.compile max-autotune-no-cudagraphs + CUDA graph")


def _loss(model):
    return lambda x: model(x).float().square().mean()


def _step_fn(model, loss, x, mark_step: bool = False):
    def step():
        if mark_step:  # a new iteration for cudagraph trees, as a training loop marks it
            torch.compiler.cudagraph_mark_step_begin()
        model.zero_grad(set_to_none=True)
        loss(x).backward()
    return step


def _train_system(name, ref, x, in_channels, dtype):
    """The step to time for system `name` (its model built from a copy of `ref`)."""
    from ..fused_resnet import FusedResNet
    from ..models import SEResNet9FixUp
    if name.startswith("FusedResNet"):
        model = FusedResNet.from_reference(ref).train()
    else:
        model = SEResNet9FixUp(in_channels).cuda().to(dtype).train()
        model.load_state_dict(ref.state_dict())
    if "channels_last" in name:
        model = model.to(memory_format=torch.channels_last)
        x = x.contiguous(memory_format=torch.channels_last)
    if name.startswith("torch.compile max-autotune-no-cudagraphs"):
        # The step's zero_grad(set_to_none) runs at capture only: backward then allocates
        # the .grad tensors in the graph's pool and each replay rewrites them.
        assert name.endswith("+ CUDA graph"), name
        return graphed(_step_fn(model, torch.compile(_loss(model), mode="max-autotune-no-cudagraphs"), x))
    if name.startswith("torch.compile max-autotune"):
        return _step_fn(model, torch.compile(_loss(model), mode="max-autotune"), x, mark_step=True)
    if name.startswith("torch.compile"):
        raise ValueError(f"unknown system {name!r}")
    step = _step_fn(model, _loss(model), x)
    return graphed(step) if name.endswith("CUDA graph") else step


def bench_train(batch_sizes=(512, 2048), dtype=torch.float16, in_channels=3, systems=TRAIN_SYSTEMS,
                calls=50, reps=5, latency_iters=20, rounds=3, progress=print) -> dict:
    from .bench import resnet_reference  # random weights, random non-zero FixUp scalars
    known = TRAIN_SYSTEMS + TRAIN_OPTIONAL_SYSTEMS
    unknown = [s for s in systems if s not in known]
    if unknown:
        raise ValueError(f"unknown training systems {unknown}; choose from {list(known)}")
    rows = []
    for n in batch_sizes:
        ref = resnet_reference(in_channels, dtype).train()
        x = torch.randn(n, in_channels, 64, 64, device="cuda", dtype=dtype)
        setups = {name: (lambda name=name: _train_system(name, ref, x, in_channels, dtype)) for name in systems}
        results = measure_systems(setups, rounds=rounds, calls=calls, reps=reps, latency_iters=latency_iters,
                                  progress=progress, label=f"N={n}: ", interleave=False)
        row = {"n": n, "results": results, "ratios": ratios(results)}
        if "kernel_us" in results.get("FusedResNet", {}):  # where the step's device time goes
            row["fused_step"] = _step_breakdown(results["FusedResNet"]["kernel_us"])
        rows.append(row)
        torch._dynamo.reset()
        torch.cuda.empty_cache()
    return {"dtype": str(dtype)[6:], "in_channels": in_channels,
            "timing": {"throughput": f"{calls} back-to-back steps between two CUDA events, median of {reps}",
                       "latency": f"one synchronized step between two CUDA events, median of {latency_iters}",
                       "device_time": "torch.profiler kernel sum of one step (memcpy/memset excluded)",
                       "rounds": f"{rounds} rounds per system, median of the rounds' medians; the systems one "
                                 "after the other, each released before the next is set up"},
            "rows": rows}


def _step_breakdown(kernels: list, top: int = 12) -> dict:
    """Kernel count, device time, and the kernels taking most of it (summed by name) in one
    training step, from its kernels (name, µs) as device_time measured them."""
    by_name: dict = {}
    for name, us in kernels:
        by_name[name] = by_name.get(name, 0.0) + us
    return {"kernels": len(kernels), "device_ms": sum(us for _, us in kernels) / 1e3,
            "top_kernels_us": sorted(by_name.items(), key=lambda kv: -kv[1])[:top]}


def print_train_table(result: dict) -> None:
    print(f"FusedResNet training step (fwd + bwd), {result['dtype']}, C_in={result['in_channels']}, "
          f"{result.get('environment', {}).get('gpu', '')}")
    for k, v in result.get("timing", {}).items():
        print(f"  {k}: {v}")
    print("  ms per step, peak memory above the model's; ratio = our best / the best peer in the same metric")
    for row in result["rows"]:
        print(f"N={row['n']}")
        print_systems(row["results"])
    big = result["rows"][-1]
    if "fused_step" in big:
        b = big["fused_step"]
        print(f"N={big['n']}: one FusedResNet step is {b['kernels']} kernels, {b['device_ms']:.2f} ms of "
              f"device time (torch.profiler); by kernel name, the largest (µs):")
        for name, us in b["top_kernels_us"]:
            print(f"  {us:9.1f}  {name}")


def plot_train(result: dict, path) -> None:
    env = result.get("environment", {})
    plot_systems(result["rows"], f"SE-ResNet9-FixUp training step, {result['dtype']}, {env.get('gpu', '')}, "
                 f"torch {env.get('torch', '')}\nthroughput (plain) and latency (hatched)", path)
