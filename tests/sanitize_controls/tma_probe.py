"""Does compute-sanitizer's initcheck see these writers' output stores?  The method of
tests/sanitize_tma_probe.py (which probes conv2d_fused's family-80 and family-90 kernels and
cuDNN's wgrad), for the other writers with a CUTLASS sm90 TMA-store epilogue:

  bwd90        a generated family-90 conv2d_dgrad kernel (stock CUTLASS sm90 conv), forced
  linear_silu  linear_silu's generated sm90 GEMM (the dispatcher's choice)

  PYTORCH_NO_CUDA_MEMORY_CACHING=1 compute-sanitizer --tool initcheck \\
      python tests/sanitize_controls/tma_probe.py --writer linear_silu

A buffer of the output's size is filled with NaN and freed; with the caching allocator off the
output's cudaMalloc gets that address back (printed), so an element the kernel did not write
would read NaN.  The output is then read by a copy kernel and checked against float64.  Values
all right while initcheck reports that copy's reads: initcheck's blind spot, not a kernel that
skips elements.  Prints one "writer ..." line, "values right" or "values WRONG"; exits 1 when
wrong, 3 when the writer is not in this build or GPU."""
import argparse
import os
import sys

import torch
import torch.nn.functional as F
from torch.nn.grad import conv2d_input

import cutlass_ops  # noqa: F401  (registers the ops)
from cutlass_ops import ops


def poisoned_free(numel):
    """Fill a float16 buffer of numel elements with NaN, free it, return its address."""
    poison = torch.full((numel,), float("nan"), dtype=torch.half, device="cuda")
    torch.cuda.synchronize()
    return poison.data_ptr()  # freed on return (the caching allocator is off: cudaFree)


def report(writer, name, out, address, want):
    got = out.double()  # the copy kernel whose reads initcheck judges
    torch.cuda.synchronize()
    rel = ((got.cpu() - want.cpu()).norm() / want.norm()).item()
    nan = torch.isnan(got).sum().item()
    right = rel < 1e-2 and nan == 0
    print(f"writer {writer} ({name}): output at the poisoned buffer's address {out.data_ptr() == address}, "
          f"NaN {nan} of {got.numel()}, rel error vs float64 {rel:.2e}: values {'right' if right else 'WRONG'}",
          flush=True)
    return 0 if right else 1


def bwd90():
    names = [k for k in torch.ops.cutlass_ops.conv2d_backward_kernels() if k.startswith("cutlass_ops_conv2d_dgrad_f16_sm90")]
    cl = torch.channels_last
    x = torch.randn(2, 64, 8, 8, device="cuda").half().contiguous(memory_format=cl)
    w = (torch.randn(64, 64, 3, 3, device="cuda") / 24).half().contiguous(memory_format=cl)
    dy = torch.randn(2, 64, 8, 8, device="cuda").half().contiguous(memory_format=cl)
    want = conv2d_input(x.shape, w.double(), dy.double(), 1, 1)
    for name in names:
        address = poisoned_free(x.numel())
        torch.ops.cutlass_ops.conv2d_backward_force_kernel(name, 0)
        try:
            dx = ops.conv2d_dgrad(dy, w, x.shape, 1, 1)
        except ValueError:  # this kernel cannot run the problem: the next one
            continue
        finally:
            torch.ops.cutlass_ops.conv2d_backward_force_kernel("", 0)
        return report("bwd90", name, dx, address, want)
    print("writer bwd90: no family-90 f16 dgrad kernel runs the probe's problem (none built?)")
    return 3


def linear_silu():
    if not ops.linear_silu_kernels():
        print("writer linear_silu: no generated kernel in this build")
        return 3
    x = torch.randn(64, 64, device="cuda").half()
    w = (torch.randn(128, 64, device="cuda") / 8).half()
    b = torch.randn(128, device="cuda").half()
    want = F.silu(x.double() @ w.double().t() + b.double())
    address = poisoned_free(64 * 128)
    y = ops.linear_silu(x, w, b, 1.0)
    return report("linear_silu", "linear_silu's sm90 GEMM", y, address, want)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--writer", choices=("bwd90", "linear_silu"), required=True)
    args = p.parse_args()
    if os.environ.get("PYTORCH_NO_CUDA_MEMORY_CACHING") != "1":
        p.error("run with PYTORCH_NO_CUDA_MEMORY_CACHING=1 (the output must reuse the poisoned cudaMalloc)")
    if torch.cuda.get_device_capability() != (9, 0):
        print(f"writer {args.writer}: sm90 writers only")
        return 3
    torch.manual_seed(0)
    return {"bwd90": bwd90, "linear_silu": linear_silu}[args.writer]()


if __name__ == "__main__":
    sys.exit(main())
