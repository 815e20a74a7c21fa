"""Training-step benchmark (not a test): forward + backward of FusedResNet against PyTorch
running the reference module, CUDA-event medians and peak memory, in one run.

    python -m cutlass_ops bench train --batch 512 2048

A step is: gradients set to None, forward, loss = mean(out^2) in float32, backward.  The
optimizer update is left out (it is the same for every system).  FusedResNet's backward
(cutlass_ops/autograd.py): the conv2d_dgrad/conv2d_wgrad ops (generated CUTLASS kernels, or
cuDNN where the build's profile measured it faster) plus our kernels for the epilogues and
se_gate.  Each row also records a per-kernel breakdown of one FusedResNet step (printed for
the largest batch).
"""
from __future__ import annotations

import torch

from .bench import graphed, kernel_times, time_cuda

TRAIN_SYSTEMS = ("FusedResNet", "FusedResNet + CUDA graph", "eager channels_last",
                 "eager channels_last + CUDA graph", "torch.compile")


def _step_fn(model, x):
    def step():
        model.zero_grad(set_to_none=True)
        model(x).float().square().mean().backward()
    return step


def bench_train(batch_sizes=(512, 2048), dtype=torch.float16, in_channels=3, systems=TRAIN_SYSTEMS,
                iters=20, progress=print) -> dict:
    from .bench import resnet_reference  # random weights, random non-zero FixUp scalars
    from .fused_resnet import FusedResNet
    rows = []
    for n in batch_sizes:
        row = {"n": n, "results": {}}
        for name in systems:
            progress(f"  N={n}: {name} ...")
            ref = resnet_reference(in_channels, dtype).train()
            x = torch.randn(n, in_channels, 64, 64, device="cuda", dtype=dtype)
            if name.startswith("FusedResNet"):
                model = FusedResNet.from_reference(ref).train()
            else:
                model = ref.to(memory_format=torch.channels_last)
                x = x.contiguous(memory_format=torch.channels_last)
            # Peak memory counts from here: activations, gradients, and for the graphed
            # systems the graph's private pool (allocated at capture).
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            base = torch.cuda.memory_allocated()
            if name == "torch.compile":
                step = _step_fn(torch.compile(model), x)
            elif name.endswith("CUDA graph"):
                # The step's zero_grad(set_to_none) runs at capture only: backward then
                # allocates the .grad tensors in the graph's pool and each replay rewrites them.
                step = graphed(_step_fn(model, x))
            else:
                step = _step_fn(model, x)
            step()
            timing = time_cuda(step, warmup=3, iters=iters)
            timing["peak_mem_mib"] = (torch.cuda.max_memory_allocated() - base) / 2**20
            row["results"][name] = timing
            if name == "FusedResNet":  # where the step's device time goes
                row["fused_step"] = _step_breakdown(step)
            del model, step
            torch._dynamo.reset()
            torch.cuda.empty_cache()
        rows.append(row)
    return {"dtype": str(dtype)[6:], "in_channels": in_channels, "rows": rows}


def _step_breakdown(step, top: int = 12) -> dict:
    """Kernel count, device time, and the kernels taking most of it (summed by name) in one
    training step, from torch.profiler."""
    kernels = kernel_times(step, repeat=3)
    by_name: dict = {}
    for name, us in kernels:
        by_name[name] = by_name.get(name, 0.0) + us
    return {"kernels": len(kernels), "device_ms": sum(us for _, us in kernels) / 1e3,
            "top_kernels_us": sorted(by_name.items(), key=lambda kv: -kv[1])[:top]}


def print_train_table(result: dict) -> None:
    print(f"FusedResNet training step (fwd + bwd), {result['dtype']}, C_in={result['in_channels']}: "
          f"median ms (CUDA events) and peak memory above the model's (MiB)")
    for row in result["rows"]:
        best_torch = min(r["median_ms"] for s, r in row["results"].items() if not s.startswith("Fused"))
        print(f"N={row['n']}")
        for name, r in row["results"].items():
            print(f"  {name:34s} {r['median_ms']:9.3f} ms  {r['peak_mem_mib']:9.1f} MiB  "
                  f"{r['median_ms'] / best_torch:5.2f}x best PyTorch")
    big = result["rows"][-1]
    if "fused_step" in big:
        b = big["fused_step"]
        print(f"N={big['n']}: one FusedResNet step is {b['kernels']} kernels, {b['device_ms']:.2f} ms of "
              f"device time (torch.profiler); by kernel name, the largest (µs):")
        for name, us in b["top_kernels_us"]:
            print(f"  {us:9.1f}  {name}")

