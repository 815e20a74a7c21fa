"""A CvT block's norm1 + its three dw_bn projections (fp16, eval), N from argv: layer_norm_rows then
dw_conv3x3_tokens (two kernels) against layer_norm_dw_conv3x3_tokens (one); us per call from a CUDA
graph of 20 calls (median of 5 replays); the two paths' outputs compared."""
import sys, torch
from cutlass_ops.ops import dw_conv3x3_tokens, layer_norm_dw_conv3x3_tokens, layer_norm_rows
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
print(torch.cuda.get_device_name(), torch.__version__, flush=True)
for n in [int(v) for v in sys.argv[1:]] or [64]:
    for h, c, cls in [(56, 64, False), (28, 192, False), (14, 384, True)]:
        t = torch.randn(n, int(cls) + h * h, c, device="cuda", dtype=torch.float16) * 2 + 1
        wt = torch.randn(3, c, 1, 3, 3, device="cuda", dtype=torch.float16) / 3
        b = torch.randn(3, c, device="cuda", dtype=torch.float16)
        lw = 1 + 0.3 * torch.randn(c, device="cuda", dtype=torch.float16)
        lb = 0.3 * torch.randn(c, device="cuda", dtype=torch.float16)
        def apart():
            y, _ = layer_norm_rows(t, lw, lb, 1e-5)
            lead, x = (y[:, :1], y[:, 1:]) if cls else (None, y)
            return dw_conv3x3_tokens(x, h, h, wt, b, [1, 2, 2], lead)
        def fused():
            lead, x = (t[:, :1], t[:, 1:]) if cls else (None, t)
            return layer_norm_dw_conv3x3_tokens(x, h, h, lw, lb, 1e-5, wt, b, [1, 2, 2], lead)
        d = max((p.float() - q.float()).abs().max().item() for p, q in zip(apart(), fused()))
        print(f"N={n} {h}x{h}x{c}{' +cls' if cls else ''}: layer_norm_rows + dw {graphed_us(apart):6.1f} us, "
              f"layer_norm_dw {graphed_us(fused):6.1f} us; max |difference| {d:.2e}", flush=True)
