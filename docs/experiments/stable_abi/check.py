"""Load a PoC library into the running torch and compare against torch.

usage: python check.py stable|unstable path/to/lib.so [path/to/cuda_lib.so]
"""
import sys

import torch

kind, lib = sys.argv[1], sys.argv[2]
print(f"[{kind}] torch {torch.__version__}: loading {lib.rsplit('/', 1)[-1]}")
try:
    torch.ops.load_library(lib)
except OSError as e:  # undefined symbol / ABI mismatch
    print(f"[{kind}] torch {torch.__version__}: LOAD FAILED: {e}")
    import ctypes  # torch hides the dlerror; ask the loader directly

    try:
        ctypes.CDLL(lib)
    except OSError as e2:
        print(f"[{kind}] torch {torch.__version__}: dlopen: {str(e2).rsplit('/', 1)[-1]}")
    sys.exit(1)

ns = torch.ops.cutlass_ops_stable if kind == "stable" else torch.ops.cutlass_ops_unstable
torch.manual_seed(0)
grad = torch.randn(4, 3, 17, 9)
out = torch.relu(torch.randn(4, 3, 17, 9))
got = ns.relu_backward(grad, out)
ref = torch.ops.aten.threshold_backward(grad, out, 0.0)
print(f"[{kind}] torch {torch.__version__}: relu_backward max|diff| = "
      f"{(got - ref).abs().max().item():.3g}, equal = {torch.equal(got, ref)}")
# non-contiguous input goes through torch::stable::contiguous
g_nc, o_nc = grad.transpose(1, 3), out.transpose(1, 3)
print(f"[{kind}] torch {torch.__version__}: relu_backward (non-contiguous) equal = "
      f"{torch.equal(ns.relu_backward(g_nc, o_nc), torch.ops.aten.threshold_backward(g_nc, o_nc, 0.0))}")
try:
    ns.relu_backward(grad.double(), out.double())
    print(f"[{kind}] dtype check: NOT raised")
except Exception as e:  # noqa: BLE001
    print(f"[{kind}] torch {torch.__version__}: dtype check raises {type(e).__name__}: "
          f"{str(e).splitlines()[0][:110]}")

if kind == "stable":
    x = torch.randn(2, 8, 10, 10, dtype=torch.float64)
    w = torch.randn(16, 8, 3, 3, dtype=torch.float64)
    b = torch.randn(16, dtype=torch.float64)
    y = ns.conv2d_fallback(x, w, b, 2, 1)
    yr = torch.nn.functional.conv2d(x, w, b, stride=2, padding=1)
    print(f"[{kind}] torch {torch.__version__}: conv2d_fallback (aten::convolution via "
          f"torch_call_dispatcher) max|diff| = {(y - yr).abs().max().item():.3g}")
    y0 = ns.conv2d_fallback(x, w, None, 1, 0)
    print(f"[{kind}] torch {torch.__version__}: conv2d_fallback bias=None max|diff| = "
          f"{(y0 - torch.nn.functional.conv2d(x, w)).abs().max().item():.3g}")
    go = torch.randn_like(yr)
    gi, gw, gb = ns.conv2d_backward_fallback(go, x, w, 2, 1)
    xr, wr, br = (t.clone().requires_grad_() for t in (x, w, b))
    torch.nn.functional.conv2d(xr, wr, br, stride=2, padding=1).backward(go)
    err = max((gi - xr.grad).abs().max().item(), (gw - wr.grad).abs().max().item(),
              (gb - br.grad).abs().max().item())
    print(f"[{kind}] torch {torch.__version__}: conv2d_backward_fallback (aten::convolution_backward, "
          f"3 outputs, bool[3] mask) max|diff| = {err:.3g}")
    import warnings

    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        ns.force_kernel("bogus", 0)
        ns.force_kernel("bogus", 0)
    print(f"[{kind}] torch {torch.__version__}: warn-once via aoti_torch_warn: {len(w)} Python warning(s) captured: "
          f"{[f'{x.category.__name__}: {str(x.message)[:60]}' for x in w]}")
    ns.force_kernel("cpu_loop", 3)
    print(f"[{kind}] torch {torch.__version__}: kernel_names() = {ns.kernel_names()}, "
          f"after force_kernel('cpu_loop', 3): last_kernel() = {ns.last_kernel()!r}")
if len(sys.argv) > 3:  # CUDA registration: load + dispatcher table (no GPU here)
    torch.ops.load_library(sys.argv[3])
    has = torch._C._dispatch_has_kernel_for_dispatch_key("cutlass_ops_stable::relu_backward", "CUDA")
    print(f"[{kind}] torch {torch.__version__}: loaded {sys.argv[3].rsplit('/', 1)[-1]}, "
          f"CUDA kernel registered = {has}, cuda available = {torch.cuda.is_available()}")
    if torch.cuda.is_available():
        gc, oc = grad.cuda(), out.cuda()
        print(f"[{kind}] torch {torch.__version__}: relu_backward CUDA equal = "
              f"{torch.equal(ns.relu_backward(gc, oc).cpu(), ref)}")
print(f"[{kind}] torch {torch.__version__}: OK")
