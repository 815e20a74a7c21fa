"""CvT-13's fc1 GEMMs at N=64 (fp16, eval): cuBLAS addmm (alpha 1.702) + F.silu, as FusedCvT's
path without linear_silu, against linear_silu with each generated kernel forced
(CUTLASS_OPS_LINEAR_SILU_TILE) and with the default order.  us per call, CUDA graph of 20
calls, median of 5 replays; the error of each against float64."""
import os, torch, torch.nn.functional as F
from cutlass_ops.ops import linear_silu, linear_silu_kernels
def graphed_us(fn, calls=20, reps=5):
    s = torch.cuda.Stream(); s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3): fn()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(calls): fn()
    out = []
    for _ in range(reps):
        a = torch.cuda.Event(enable_timing=True); b = torch.cuda.Event(enable_timing=True)
        a.record(); g.replay(); b.record(); torch.cuda.synchronize(); out.append(a.elapsed_time(b) * 1e3 / calls)
    return sorted(out)[len(out) // 2]
print(torch.cuda.get_device_name(), "kernels:", linear_silu_kernels(), flush=True)
for dtype in (torch.float16, torch.bfloat16):
    names = [k.split(" ")[0] for k in linear_silu_kernels() if k.endswith(f"({str(dtype)[6:]})")]
    for m, k, n in [(64 * 3136, 64, 256), (64 * 784, 192, 768), (64 * 197, 384, 1536), (256 * 197, 384, 1536)]:
        x = torch.randn(m, k, device="cuda", dtype=dtype)
        w = torch.randn(n, k, device="cuda", dtype=dtype) / k ** 0.5
        b = torch.randn(n, device="cuda", dtype=dtype)
        ref = F.silu(1.702 * (x.double() @ w.double().t() + b.double()))
        err = lambda y: ((y.double() - ref).norm() / ref.norm()).item()
        cublas = lambda: F.silu(torch.addmm(b * 1.702, x, w.t(), alpha=1.702))
        gemm = lambda: torch.addmm(b, x, w.t())
        row = [f"{dtype} m={m} k={k} n={n}: cuBLAS+SiLU {graphed_us(cublas):6.1f} us (err {err(cublas()):.1e}), "
               f"cuBLAS GEMM alone {graphed_us(gemm):6.1f}"]
        for name in names + [""]:
            os.environ["CUTLASS_OPS_LINEAR_SILU_TILE"] = name
            f = lambda: linear_silu(x, w, b, 1.702)
            row.append(f"{name.replace('cutlass_ops_linear_silu_', '') or 'default'} {graphed_us(f):6.1f} (err {err(f()):.1e})")
        os.environ.pop("CUTLASS_OPS_LINEAR_SILU_TILE")
        print("\n    ".join(row), flush=True)
