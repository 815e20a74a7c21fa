"""Which cuDNN kernels write the weight gradients that conv2d_wgrad's epilogue reads (compute-sanitizer's
initcheck flags those reads in FusedResNet's backward, but not after the same cuDNN call made
alone)?  Lists the CUDA kernels of every conv2d_wgrad call in a FusedResNet training step, then
of the same aten.convolution_backward made alone for block 3's 512->512 3x3 conv.  On a GPU:
    python docs/experiments/initcheck_cudnn_wgrad/kernels.py"""
import sys
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "tests" / "python"))
import cutlass_ops.autograd as ag  # noqa: E402
import cutlass_ops.small_map_conv as smc  # noqa: E402
from test_sanitize_selection import _model, _r, _train_step  # noqa: E402


def kernels_of(fn):
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as p:
        out = fn()
        torch.cuda.synchronize()
    return out, [e.name for e in p.events() if e.device_type == torch.autograd.DeviceType.CUDA]


def wrap(orig, where):
    def f(g, x, w, stride, padding, scale=None):
        out, names = kernels_of(lambda: orig(g, x, w, stride, padding, scale))
        print(f"{where}: dy {tuple(g.shape)} x {tuple(x.shape)} w {tuple(w.shape)} stride {stride} pad {padding}")
        for n in names:
            print(f"    {n[:160]}")
        return out
    return f


smc.conv2d_wgrad = wrap(smc.conv2d_wgrad, "small_map_conv")
ag.conv2d_wgrad = wrap(ag.conv2d_wgrad, "autograd")
model = _model().train()
x = _r(2, 3, 64, 64)
_train_step(model, x)
print("== alone: block 3's 512->512 3x3 conv's weight gradient, as tests/sanitize_tma_probe.py --writer cudnn makes it")
cl = torch.channels_last
dy = torch.randn(2, 512, 2, 2, device="cuda").half().contiguous(memory_format=cl)
xi = torch.randn(2, 512, 2, 2, device="cuda").half().contiguous(memory_format=cl)
w = torch.randn(512, 512, 3, 3, device="cuda").half().contiguous(memory_format=cl)
_, names = kernels_of(lambda: torch.ops.aten.convolution_backward(dy, xi, w, None, [1, 1], [1, 1], [1, 1], False,
                                                                   [0, 0], 1, [False, True, False]))
for n in names:
    print(f"    {n[:160]}")
