"""Which kernel the dispatchers choose for each of FusedResNet's convs, on this GPU.

    python tests/kernel_choice.py [--batch 128 2048] [--out choice.json]
    python tests/kernel_choice.py --compare before.json after.json

Runs every conv FusedResNet (cutlass_ops.FusedResNet(3), 64x64 inputs) runs, fp16 channels_last,
at each batch size: the forward through cutlass_ops.conv2d_fused with the module's epilogue
(conv1: bias, ReLU, post-bias; conv2: FixUp scale; downsample: plain; block 3's conv2 on its 2x2
map as the dense 1x1 conv), and the training backward through cutlass_ops.conv2d_dgrad /
conv2d_wgrad (block 3's conv2: dgrad of the dense conv, wgrad of the 3x3 conv, as
small_map_conv.py runs them).  After each call it reads the kernel that ran
(torch.ops.cutlass_ops.conv2d_fused_last_kernel / conv2d_backward_last_kernel) and prints a
table: layer, pass, problem, kernel; --out writes it as JSON, --compare prints the rows where
two such files differ.  The choice depends on the shapes, dtype, alignment and the profile
rules of this GPU, not on the values, so the data is arbitrary.

It uses only the public ops that every version of the package has, so the same script runs
against an older build to compare.  Exit status 2 without a CUDA device (or a CPU-only build).
"""
from __future__ import annotations

import argparse
import json
import os
import sys

# The run-time switches that change the choice (their defaults when unset).
SWITCHES = ("CUTLASS_OPS_SM90", "CUTLASS_OPS_SM90_HALO", "CUTLASS_OPS_CUDNN")


def resnet_convs(in_channels: int = 3, base: int = 64, hw: int = 16) -> list[dict]:
    """FusedResNet's convs, block by block (SEResNet9FixUp: four blocks of planes base*2^i,
    stride 2 from block 1 on, a downsample where the shape changes): name, c, k, r, stride,
    input h, and whether conv2 runs as a dense 1x1 conv (maps smaller than its 3x3 footprint)."""
    convs, c = [], base
    for i in range(4):
        k, stride = base * 2 ** i, 1 if i == 0 else 2
        out = hw // stride
        convs.append(dict(name=f"layers.{i}.conv1", c=c, k=k, r=3, stride=stride, pad=1, h=hw))
        convs.append(dict(name=f"layers.{i}.conv2", c=k, k=k, r=3, stride=1, pad=1, h=out,
                          dense=out * out < 9))
        if stride != 1 or c != k:
            convs.append(dict(name=f"layers.{i}.downsample", c=c, k=k, r=1, stride=1, pad=0, h=out))
        c, hw = k, out
    return convs


def _problem(n, c, k, r, stride, h):
    p = (h + 2 * (r // 2) - r) // stride + 1
    return f"N={n} {c}->{k} {r}x{r}/{stride} {h}x{h}->{p}x{p}"


def run(batches: list[int]) -> dict:
    import torch
    import cutlass_ops

    if not torch.cuda.is_available():
        raise SystemExit("kernel_choice: needs a CUDA device (none found)")
    if not hasattr(torch.ops.cutlass_ops, "conv2d_backward_last_kernel"):
        raise SystemExit("kernel_choice: this cutlass_ops build has no CUDA kernels")
    dev = torch.device("cuda")
    fused_last = torch.ops.cutlass_ops.conv2d_fused_last_kernel
    backward_last = torch.ops.cutlass_ops.conv2d_backward_last_kernel
    gen = torch.Generator(device=dev).manual_seed(0)

    def rand(*shape, dtype=torch.float16):
        t = torch.randn(*shape, device=dev, dtype=dtype, generator=gen)
        return t.contiguous(memory_format=torch.channels_last) if t.dim() == 4 else t

    def scalar(v):
        return torch.tensor(v, device=dev, dtype=torch.float32)

    rows = []
    for n in batches:
        for conv in resnet_convs():
            c, k, r, s, pad, h = conv["c"], conv["k"], conv["r"], conv["stride"], conv["pad"], conv["h"]
            p = (h + 2 * pad - r) // s + 1
            name = conv["name"]
            x, w = rand(n, c, h, h), rand(k, c, r, r)
            # forward, with FusedResNet's epilogue
            if name.endswith("conv1"):
                y = cutlass_ops.conv2d_fused(x, w, scalar(0.1), None, s, pad, None, scalar(0.2), relu=True)
                problem = _problem(n, c, k, r, s, h)
            elif conv.get("dense"):  # a 1x1 conv on one "pixel" of h*h*c channels
                dc, dk = h * h * c, p * p * k
                y = cutlass_ops.conv2d_fused(rand(n, dc, 1, 1), rand(dk, dc, 1, 1), None, None, 1, 0, scalar(0.5))
                problem = _problem(n, dc, dk, 1, 1, 1) + " (dense)"
            elif name.endswith("conv2"):
                y = cutlass_ops.conv2d_fused(x, w, None, None, s, pad, scalar(0.5))
                problem = _problem(n, c, k, r, s, h)
            else:
                y = cutlass_ops.conv2d_fused(x, w, None, None, s, pad)
                problem = _problem(n, c, k, r, s, h)
            torch.cuda.synchronize()
            rows.append(dict(layer=name, pass_="forward", n=n, problem=problem, kernel=fused_last()))
            del y
            # backward: dgrad (block 3's conv2: of the dense conv) and wgrad (of the 3x3 conv)
            dy = rand(n, k, p, p)
            if conv.get("dense"):
                dc, dk = h * h * c, p * p * k
                cutlass_ops.conv2d_dgrad(rand(n, dk, 1, 1), rand(dk, dc, 1, 1), (n, dc, 1, 1), 1, 0, scalar(0.5))
                dgrad_problem = _problem(n, dc, dk, 1, 1, 1) + " (dense)"
            else:
                cutlass_ops.conv2d_dgrad(dy, w, tuple(x.shape), s, pad, scalar(0.5))
                dgrad_problem = _problem(n, c, k, r, s, h)
            torch.cuda.synchronize()
            rows.append(dict(layer=name, pass_="dgrad", n=n, problem=dgrad_problem, kernel=backward_last()))
            cutlass_ops.conv2d_wgrad(dy, x, w, s, pad, scalar(0.5))
            torch.cuda.synchronize()
            rows.append(dict(layer=name, pass_="wgrad", n=n, problem=_problem(n, c, k, r, s, h),
                             kernel=backward_last()))
            del x, w, dy
    props = torch.cuda.get_device_properties(dev)
    info = {}
    try:
        info = dict(cutlass_ops.build_info())
    except Exception:  # an older build may lack it; the table matters, not this
        pass
    return dict(device=props.name, capability=f"{props.major}{props.minor}", torch=torch.__version__,
                switches={v: os.environ.get(v) for v in SWITCHES}, build_info=info,
                rows=[{("pass" if key == "pass_" else key): v for key, v in row.items()} for row in rows])


def print_table(result: dict) -> None:
    print(f"# {result['device']} (sm{result['capability']}), torch {result['torch']}, switches {result['switches']}")
    width = max(len(r["problem"]) for r in result["rows"])
    print(f"{'layer':<20} {'pass':<8} {'problem':<{width}}  kernel")
    for r in result["rows"]:
        print(f"{r['layer']:<20} {r['pass']:<8} {r['problem']:<{width}}  {r['kernel']}")


def compare(before_path: str, after_path: str) -> int:
    with open(before_path) as f:
        before = json.load(f)
    with open(after_path) as f:
        after = json.load(f)
    key = lambda r: (r["layer"], r["pass"], r["problem"])  # noqa: E731
    old = {key(r): r["kernel"] for r in before["rows"]}
    changed = 0
    print(f"# before: {before['device']}; after: {after['device']}")
    for r in after["rows"]:
        was = old.get(key(r), "(absent)")
        if was != r["kernel"]:
            changed += 1
            print(f"{r['layer']:<20} {r['pass']:<8} {r['problem']}\n    before {was}\n    after  {r['kernel']}")
    print(f"{changed} of {len(after['rows'])} choices changed")
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--batch", type=int, nargs="+", default=[128, 2048], help="batch sizes (default 128 2048)")
    ap.add_argument("--out", help="write the table as JSON here")
    ap.add_argument("--compare", nargs=2, metavar=("BEFORE", "AFTER"),
                    help="print the choices that differ between two --out files (no GPU needed)")
    args = ap.parse_args(argv)
    if args.compare:
        return compare(*args.compare)
    try:
        import torch
        cuda = torch.cuda.is_available()
    except ImportError:
        cuda = False
    if not cuda:
        print("kernel_choice: needs a CUDA device (none found); nothing to report", file=sys.stderr)
        return 2
    try:
        result = run(args.batch)
    except SystemExit as e:
        print(e, file=sys.stderr)
        return 2
    print_table(result)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(result, f, indent=1)
        print(f"# written to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
