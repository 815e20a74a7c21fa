"""Training-step benchmark (not a test): forward + backward of FusedResNet against PyTorch
running the reference module, CUDA-event medians and peak memory, in one run.

    python -m cutlass_ops bench train --batch 512 2048

A step is: gradients set to None, forward, loss = mean(out^2) in float32, backward.  The
optimizer update is left out (it is the same for every system).  FusedResNet's backward:
cuDNN dgrad/wgrad plus our kernels for the epilogues and se_gate (cutlass_ops/autograd.py),
not fused CUTLASS dgrad/wgrad kernels yet.  Each row also records a per-kernel breakdown of
one FusedResNet step (printed for the largest batch).
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


def conv_backward_problems(n: int, in_channels: int = 3, base: int = 64) -> list[dict]:
    """FusedResNet's convs at batch n as (layer, x shape, w shape, stride, padding)."""
    from .fused_resnet import FusedResNet
    model = FusedResNet(in_channels, base)
    problems, hw, channels = [], 16, base  # the stem's output: 16x16, base channels
    for i, blk in enumerate(model._blocks()):
        stride = blk.conv1.stride[0]
        k = blk.conv1.weight.shape[0]
        problems.append({"layer": f"layers.{i}.conv1", "x": (n, channels, hw, hw),
                         "w": tuple(blk.conv1.weight.shape), "stride": stride, "padding": 1})
        out_hw = (hw + 2 - 3) // stride + 1
        problems.append({"layer": f"layers.{i}.conv2", "x": (n, k, out_hw, out_hw),
                         "w": tuple(blk.conv2.weight.shape), "stride": 1, "padding": 1})
        if blk.downsample is not None:
            problems.append({"layer": f"layers.{i}.downsample", "x": (n, channels, out_hw, out_hw),
                             "w": tuple(blk.downsample[1].weight.shape), "stride": 1, "padding": 0})
        hw, channels = out_hw, k
    return problems


def bench_conv_backward(batch_sizes=(512, 2048), dtype=torch.float16, in_channels=3, iters=50,
                        progress=print) -> dict:
    """Per conv of FusedResNet: our dgrad/wgrad ops (generated CUTLASS kernels; wgrad with
    its split-K sum) against cuDNN's (aten.convolution_backward, one gradient at a time),
    each CUDA-graphed so that launch overhead does not count."""
    from .ops import conv2d_backward_last_kernel, conv2d_dgrad, conv2d_wgrad
    cl = torch.channels_last
    rows = []
    for n in batch_sizes:
        for prob in conv_backward_problems(n, in_channels):
            progress(f"  N={n}: {prob['layer']} ...")
            x = torch.randn(prob["x"], device="cuda", dtype=dtype).contiguous(memory_format=cl)
            w = torch.randn(prob["w"], device="cuda", dtype=dtype).contiguous(memory_format=cl)
            s, p = prob["stride"], prob["padding"]
            dy = torch.randn_like(torch.nn.functional.conv2d(x, w, stride=s, padding=p)).contiguous(memory_format=cl)
            scale = torch.tensor(0.5, device="cuda")

            def cudnn(mask):
                return lambda: torch.ops.aten.convolution_backward(dy, x, w, None, [s, s], [p, p], [1, 1], False,
                                                                   [0, 0], 1, mask)
            fns = {"dgrad ours": lambda: conv2d_dgrad(dy, w, x.shape, s, p, scale),
                   "dgrad cuDNN": cudnn([True, False, False]),
                   "wgrad ours": lambda: conv2d_wgrad(dy, x, w.shape, s, p),
                   "wgrad cuDNN": cudnn([False, True, False])}
            row = {"n": n, **prob, "us": {}, "kernels": {}}
            for name, fn in fns.items():
                fn()
                if name.endswith("ours"):
                    row["kernels"][name.split()[0]] = conv2d_backward_last_kernel()
                row["us"][name] = time_cuda(graphed(fn), warmup=5, iters=iters)["median_ms"] * 1e3
            rows.append(row)
    return {"dtype": str(dtype)[6:], "in_channels": in_channels, "rows": rows}


def print_conv_backward_table(result: dict) -> None:
    print(f"conv dgrad/wgrad per FusedResNet layer, {result['dtype']}: CUDA-graphed medians (µs), "
          f"ours (CUTLASS) vs cuDNN")
    print(f"  {'N':>5} {'layer':18s} {'dgrad ours':>10} {'cuDNN':>8} {'wgrad ours':>10} {'cuDNN':>8}")
    total = {k: 0.0 for k in ("dgrad ours", "dgrad cuDNN", "wgrad ours", "wgrad cuDNN")}
    for r in result["rows"]:
        u = r["us"]
        print(f"  {r['n']:5d} {r['layer']:18s} {u['dgrad ours']:10.1f} {u['dgrad cuDNN']:8.1f} "
              f"{u['wgrad ours']:10.1f} {u['wgrad cuDNN']:8.1f}")
    for n in sorted({r["n"] for r in result["rows"]}):
        for k in total:
            total[k] = sum(r["us"][k] for r in result["rows"] if r["n"] == n)
        print(f"  {n:5d} {'sum':18s} {total['dgrad ours']:10.1f} {total['dgrad cuDNN']:8.1f} "
              f"{total['wgrad ours']:10.1f} {total['wgrad cuDNN']:8.1f}")
    print("kernels (largest batch):")
    big = max(r["n"] for r in result["rows"])
    for r in result["rows"]:
        if r["n"] == big:
            print(f"  {r['layer']:18s} {r['kernels']['dgrad']}  |  {r['kernels']['wgrad']}")
