# Which conv2d_wgrad calls of a FusedResNet training step does initcheck flag, and which operand?
import sys, torch
sys.path.insert(0, "/work/main/tests/python")
import cutlass_ops, cutlass_ops.small_map_conv as smc, cutlass_ops.autograd as ag
from cutlass_ops import ops
calls = [0]
def wrap(orig, where):
    def f(g, x, w, stride, padding, scale=None):
        torch.cuda.synchronize()
        calls[0] += 1
        print(f"--- call {calls[0]} {where}: dy {tuple(g.shape)} {g.dtype} cl={g.is_contiguous(memory_format=torch.channels_last)} "
              f"x {tuple(x.shape)} w {tuple(w.shape)} w.cl={w.is_contiguous(memory_format=torch.channels_last)} stride {stride} pad {padding} "
              f"w at [{w.data_ptr():#x}, {w.data_ptr() + w.numel() * w.element_size():#x}) w._base {w._base is not None} w.requires_grad {w.requires_grad}", flush=True)
        out = orig(g, x, w, stride, padding, scale)
        torch.cuda.synchronize()
        print(f"    ran {ops.conv2d_backward_last_kernel()}", flush=True)
        return out
    return f
smc.conv2d_wgrad = wrap(smc.conv2d_wgrad, "small_map_conv")
ag.conv2d_wgrad = wrap(ag.conv2d_wgrad, "autograd")
from test_sanitize_selection import _model, _r, _train_step
model = _model().train()
_train_step(model, _r(2, 3, 64, 64))
torch.cuda.synchronize()
print("done", flush=True)
