"""CvT-13's stage-1 embedding (7x7/4, 3 -> 64, bias, LayerNorm) on an NCHW fp16 image batch:
FusedCvT's path before (a channels_last copy of the image, cuDNN's conv with its bias,
layer_norm_rows) against one conv_embed kernel.  us per call, a CUDA graph of 20 calls (median
of 5 replays); the kernel's error against float64 beside the old path's."""
import sys
import torch, torch.nn.functional as F
from cutlass_ops.ops import conv_embed, layer_norm_rows
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
def rel(a, b):
    return ((a.double() - b).norm() / b.norm()).item(), (a.double() - b).abs().max().item()
for dtype in (torch.float16, torch.bfloat16):
    for n in (1, 64, 256):
        torch.manual_seed(n)
        x = torch.randn(n, 3, 224, 224, device="cuda").to(dtype)
        w = (torch.randn(64, 3, 7, 7, device="cuda") / 147 ** 0.5).to(dtype)
        b = (torch.randn(64, device="cuda") * 0.3).to(dtype)
        lw, lb = torch.rand(64, device="cuda") + 0.5, torch.randn(64, device="cuda") * 0.3
        def old():
            xc = x.contiguous(memory_format=torch.channels_last)
            y = F.conv2d(xc, w, b, 4, 2)
            t = y.permute(0, 2, 3, 1).reshape(n, 3136, 64)
            return layer_norm_rows(t, lw, lb, 1e-5, None)[0]
        def new():
            return conv_embed(x, w, b, 4, 2, True, lw, lb)
        ref = F.layer_norm(F.conv2d(x.double(), w.double(), b.double(), 4, 2).flatten(2).transpose(1, 2), (64,),
                           lw.double(), lb.double(), 1e-5)
        e_old, e_new = rel(old(), ref), rel(new(), ref)
        t_old, t_new = graphed_us(old), graphed_us(new)
        mb = (x.numel() + n * 3136 * 64) * 2 / 1e6
        print(f"{str(dtype)[6:]} N={n}: cuDNN path {t_old:7.1f} us (err {e_old[0]:.2e} / {e_old[1]:.2e}), "
              f"conv_embed {t_new:7.1f} us (err {e_new[0]:.2e} / {e_new[1]:.2e}; {mb:.1f} MB in+out: "
              f"{mb / t_new:.2f} TB/s)", flush=True)
# each path's kernels at N=64, fp16, from the profiler (us per call)
n = 64
x = torch.randn(n, 3, 224, 224, device="cuda").half()
w = (torch.randn(64, 3, 7, 7, device="cuda") / 147 ** 0.5).half()
b = (torch.randn(64, device="cuda") * 0.3).half()
lw, lb = torch.rand(64, device="cuda") + 0.5, torch.randn(64, device="cuda") * 0.3
xcl = x.contiguous(memory_format=torch.channels_last)
xodd = torch.cat([x, x], 3)[:, :, :, 1:225]  # odd offsets: no paired loads
for name, fn in [("conv_embed", lambda: conv_embed(x, w, b, 4, 2, True, lw, lb)),
                 ("conv_embed channels_last input (element loads)", lambda: conv_embed(xcl, w, b, 4, 2, True, lw, lb)),
                 ("conv_embed odd-offset input (element loads)", lambda: conv_embed(xodd, w, b, 4, 2, True, lw, lb))]:
    for _ in range(3): fn()
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(10): fn()
        torch.cuda.synchronize()
    evs = [e for e in prof.events() if e.device_type.name == "CUDA"]
    by = {}
    for e in evs: by.setdefault(e.name[:90], []).append(e.device_time)
    print(name, {k: round(sum(v) / 10, 1) for k, v in by.items()}, flush=True)
