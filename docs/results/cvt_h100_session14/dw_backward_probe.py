"""CvT-13's dw_bn input gradients at N=64 (fp16): cuDNN's dgrad per projection
(aten.convolution_backward, input gradient only) and their sum, as autograd ran them, against
one dw_conv3x3_tokens_backward_input call.  us per attention, CUDA graph of 20 calls, median
of 5 replays; the error of each against float64."""
import torch
from cutlass_ops.ops import dw_conv3x3_tokens_backward_input
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
n, strides = 64, [1, 2, 2]
for h, c in [(56, 64), (28, 192), (14, 384)]:
    wt = torch.randn(3, c, 1, 3, 3, device="cuda", dtype=torch.float16) / 3
    grads = [torch.randn(n, ((h - 1) // s + 1) ** 2, c, device="cuda", dtype=torch.float16) for s in strides]
    x = torch.empty(n, h, h, c, device="cuda", dtype=torch.float16).permute(0, 3, 1, 2)
    gmaps = [g.view(n, (h - 1) // s + 1, (h - 1) // s + 1, c).permute(0, 3, 1, 2) for g, s in zip(grads, strides)]
    def cudnn():
        outs = [torch.ops.aten.convolution_backward(gm, x, wt[j], None, [s, s], [1, 1], [1, 1], False, [0, 0], c,
                                                    [True, False, False])[0] for j, (gm, s) in enumerate(zip(gmaps, strides))]
        return outs[0] + outs[1] + outs[2]
    ours = lambda: dw_conv3x3_tokens_backward_input(grads, h, h, wt, strides)
    ref = sum(torch.ops.aten.convolution_backward(gm.double(), x.double(), wt[j].double(), None, [s, s], [1, 1], [1, 1],
                                                  False, [0, 0], c, [True, False, False])[0]
              for j, (gm, s) in enumerate(zip(gmaps, strides)))
    ref = ref.permute(0, 2, 3, 1).reshape(n, h * h, c)
    err = lambda y: ((y.double() - ref).norm() / ref.norm()).item()
    e_cudnn = err(cudnn().permute(0, 2, 3, 1).reshape(n, h * h, c)); e_ours = err(ours())
    mb = (sum(g.numel() for g in grads) + n * h * h * c) * 2 / 1e6
    t_c, t_o = graphed_us(cudnn), graphed_us(ours)
    print(f"map {h}x{h}x{c}: cuDNN dgrads + sum {t_c:6.1f} us (err {e_cudnn:.1e}), one kernel {t_o:6.1f} us "
          f"(err {e_ours:.1e}; {mb:.1f} MB in+out: {mb / t_o:.2f} TB/s)", flush=True)
