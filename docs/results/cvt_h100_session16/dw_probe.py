"""CvT-13's dw_bn projections (fp16, eval): cuDNN's three depthwise convs (+ stage 3's contiguous
copy and cls concatenations, as FusedCvT's default path) against one dw_conv3x3_tokens call, the
strip kernel (CUTLASS_OPS_DW_TILE=0) and the tiled kernel (default).  us per projection set, from
a CUDA graph of 20 back-to-back calls (median of 5 replays); the two kernels' outputs compared."""
import os, sys, torch, torch.nn.functional as F
from cutlass_ops.ops import dw_conv3x3_tokens
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
        t = torch.randn(n, int(cls) + h * h, c, device="cuda", dtype=torch.float16)
        wt = torch.randn(3, c, 1, 3, 3, device="cuda", dtype=torch.float16) / 3
        b = torch.randn(3, c, device="cuda", dtype=torch.float16)
        strides = [1, 2, 2]
        def cudnn():
            lead, x = (t[:, :1], t[:, 1:]) if cls else (None, t)
            m = x.reshape(n, h, h, c)
            if not m.is_contiguous(): m = m.contiguous()
            m = m.permute(0, 3, 1, 2)
            outs = [F.conv2d(m, wt[j], b[j], s, 1, 1, c).flatten(2).transpose(1, 2) for j, s in enumerate(strides)]
            return [torch.cat((lead, z), 1) for z in outs] if cls else outs
        def ours():
            lead, x = (t[:, :1], t[:, 1:]) if cls else (None, t)
            return dw_conv3x3_tokens(x, h, h, wt, b, strides, lead)
        ref = [z.float() for z in cudnn()]
        os.environ["CUTLASS_OPS_DW_TILE"] = "0"; strip = ours(); t_strip = graphed_us(ours)
        os.environ["CUTLASS_OPS_DW_TILE"] = "1"; tiled = ours(); t_tiled = graphed_us(ours)
        d_st = max((p.float() - q.float()).abs().max().item() for p, q in zip(strip, tiled))
        d_ref = max((p.float() - r).abs().max().item() for p, r in zip(tiled, ref))
        t_cudnn = graphed_us(cudnn)
        mb = (t.numel() + sum(z.numel() for z in tiled)) * 2 / 1e6
        print(f"N={n} map {h}x{h}x{c}{' +cls' if cls else ''}: cuDNN path {t_cudnn:6.1f} us, strip {t_strip:6.1f} us, "
              f"tiled {t_tiled:6.1f} us ({mb:.1f} MB in+out: {mb / t_tiled:.2f} TB/s); max|tiled-strip| {d_st:.2e}, "
              f"max|tiled-cuDNN| {d_ref:.2e}", flush=True)
