"""Is compute-sanitizer's initcheck blind to TMA stores?  (a triage probe, not a test.)

The family-90 conv2d_fused kernels write their output with TMA (cp.async.bulk.tensor), the
family-80 ones with ordinary stores; "cudnn" is cuDNN's float16 weight gradient (what
conv2d_wgrad's cuDNN path reads back).  Run under initcheck, once per writer:

  PYTORCH_NO_CUDA_MEMORY_CACHING=1 compute-sanitizer --tool initcheck \\
      python tests/sanitize_tma_probe.py --writer 90

Before the conv, a buffer of the output's size is filled with NaN and freed; with the caching
allocator off, the output's cudaMalloc gets that address back (checked), so an element the
kernel did not write would still read NaN.  Then the output is checked against float64 and
read by a copy kernel.  If the values are all right (every element was written) while
initcheck reports that copy's reads as uninitialized, the reports are the tool's blind spot,
not a kernel that skips elements."""
import argparse
import os
import sys

import torch
import torch.nn.functional as F

import cutlass_ops
from cutlass_ops import ops


def poisoned_free(shape):
    """Fill a channels_last buffer of `shape` with NaN, free it, return its address."""
    poison = torch.empty(shape, dtype=torch.half, device="cuda", memory_format=torch.channels_last)
    poison.fill_(float("nan"))
    torch.cuda.synchronize()
    return poison.data_ptr()  # freed on return (the caching allocator is off: cudaFree)


def report(writer, name, out, address, want):
    got = out.double()  # the copy kernel whose reads initcheck judges
    torch.cuda.synchronize()
    rel = ((got - want).norm() / want.norm()).item()
    print(f"writer {writer} ({name}): output at the poisoned buffer's address {out.data_ptr() == address}, "
          f"NaN {torch.isnan(got).sum().item()} of {got.numel()}, rel error vs float64 {rel:.2e}", flush=True)
    return 0 if rel < 1e-2 else 1


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--writer", choices=("80", "90", "cudnn"), required=True,
                   help="conv2d_fused's family-80 or family-90 kernels, or cuDNN's weight gradient")
    p.add_argument("--shape", default="2,64,64,8", help="N,C,K,HW of the 3x3 conv (default: %(default)s)")
    p.add_argument("--warmup", type=int, default=0,
                   help="cudnn: identical calls before the probed one (cuDNN's first call of a shape memsets "
                        "its output, which initcheck counts as initializing it; later calls do not)")
    args = p.parse_args()
    if os.environ.get("PYTORCH_NO_CUDA_MEMORY_CACHING") != "1":
        p.error("run with PYTORCH_NO_CUDA_MEMORY_CACHING=1 (the output must reuse the poisoned cudaMalloc)")
    torch.manual_seed(0)
    n, c, k, hw = (int(v) for v in args.shape.split(","))
    cl = torch.channels_last
    x = torch.randn(n, c, hw, hw, device="cuda").half().contiguous(memory_format=cl)
    w = (torch.randn(k, c, 3, 3, device="cuda") / (3 * c ** 0.5)).half().contiguous(memory_format=cl)
    if args.writer == "cudnn":
        dy = torch.randn(n, k, hw, hw, device="cuda").half().contiguous(memory_format=cl)
        want = torch.nn.grad.conv2d_weight(x.double(), w.shape, dy.double(), 1, 1)

        def call():
            return torch.ops.aten.convolution_backward(dy, x, w, None, [1, 1], [1, 1], [1, 1], False, [0, 0], 1,
                                                       [False, True, False])[1]
        for _ in range(args.warmup):
            call()
        torch.cuda.synchronize()
        address = poisoned_free(w.shape)
        dw = call()
        return report("cudnn", "aten.convolution_backward", dw, address, want)
    family = int(args.writer)
    want = F.conv2d(x.double(), w.double(), None, 1, 1)
    for name in [m for m in ops.conv2d_fused_kernels(family) if "_f16_" in m]:
        address = poisoned_free((n, k, hw, hw))
        torch.ops.cutlass_ops.conv2d_fused_force_kernel(name, 0)
        try:
            out = cutlass_ops.conv2d_fused(x, w, None, None, 1, 1, None, None, False)
        except ValueError:  # this kernel cannot run the problem: the next one
            continue
        finally:
            torch.ops.cutlass_ops.conv2d_fused_force_kernel("", 0)
        return report(args.writer, name, out, address, want)
    print(f"no family-{family} f16 kernel runs the probe's problem")
    return 1

if __name__ == "__main__":
    sys.exit(main())
