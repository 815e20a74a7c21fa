"""The tiled dw kernel's band size (CUTLASS_OPS_DW_TILE_BYTES) at CvT-13's three maps, fp16, N=64
and 256: us per call (a CUDA graph of 20 calls, median of 5 replays), two rounds."""
import os, sys, torch
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
for n in (64, 256):
    for h, c, cls in [(56, 64, False), (28, 192, False), (14, 384, True)]:
        t = torch.randn(n, int(cls) + h * h, c, device="cuda", dtype=torch.float16)
        wt = torch.randn(3, c, 1, 3, 3, device="cuda", dtype=torch.float16) / 3
        b = torch.randn(3, c, device="cuda", dtype=torch.float16)
        def ours():
            lead, x = (t[:, :1], t[:, 1:]) if cls else (None, t)
            return dw_conv3x3_tokens(x, h, h, wt, b, [1, 2, 2], lead)
        row = []
        for rnd in range(2):
            for kb in (24, 32, 48, 64, 96, 128):
                os.environ["CUTLASS_OPS_DW_TILE_BYTES"] = str(kb * 1024)
                row.append(f"{kb}K {graphed_us(ours):6.1f}")
        print(f"N={n} {h}x{h}x{c}: " + ", ".join(row), flush=True)
