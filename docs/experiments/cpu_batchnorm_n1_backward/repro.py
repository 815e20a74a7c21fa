"""PyTorch CPU batch_norm backward (training) gives a wrong input gradient when the batch
has one sample, the input is contiguous (NCHW) and grad_output has channels_last strides
with a batch stride other than C*H*W (legal: the batch dim has size 1).

Found with torch 2.14.1 (CPU) while testing FusedCvT: CvT's dw_bn projection
(depthwise conv -> BatchNorm2d -> 'b c h w -> b (h w) c') produces exactly this at batch 1,
so the reference CvT module (and microsoft/CvT's original code) trains with wrong gradients
at batch 1 on the CPU; FusedCvT, whose conv output is channels_last, does not hit it
(checked against finite differences in tests/python/test_fused_cvt.py).  Not checked on
CUDA.  Run: python repro.py  (prints the max difference to the contiguous-grad result)."""
import torch
import torch.nn.functional as F

torch.manual_seed(0)
c = 8
for n, hw in ((1, 2), (1, 3), (2, 2)):
    y = torch.randn(n, c, hw, hw, dtype=torch.float64)
    g = torch.randn(n, c, hw, hw, dtype=torch.float64)

    def grad(g_out):
        yy = y.clone().requires_grad_()
        F.batch_norm(yy, None, None, None, None, True, 0.1, 1e-5).backward(g_out)
        return yy.grad

    # grad_output as it arrives through x.flatten(2).transpose(1, 2): token-major memory
    g_tok = g.flatten(2).transpose(1, 2).contiguous().transpose(1, 2).reshape(n, c, hw, hw)
    print(f"N={n} {hw}x{hw}: grad_output strides {g_tok.stride()}, max |difference| "
          f"{(grad(g_tok) - grad(g.contiguous())).abs().max().item():.3g}")
