"""CvT-13's attentions at N=64 (fp16), q/k/v as FusedCvT hands them (head views of (N, L, C)
tokens): each SDPA backend, us per call from a CUDA graph of 20 calls (median of 5 replays)."""
import torch, torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from cutlass_ops.ops import attention_tokens
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
n = 64
for lq, lkv, heads, dim in [(3136, 784, 1, 64), (784, 196, 3, 192), (197, 50, 6, 384)]:
    mk = lambda l: torch.randn(n, l, dim, device="cuda", dtype=torch.float16).view(n, l, heads, 64).transpose(1, 2)
    q, k, v = mk(lq), mk(lkv), mk(lkv)
    ref = F.scaled_dot_product_attention(q.float(), k.float(), v.float(), scale=dim ** -0.5)
    row = []
    for name, be in [("cudnn", SDPBackend.CUDNN_ATTENTION), ("flash", SDPBackend.FLASH_ATTENTION),
                     ("efficient", SDPBackend.EFFICIENT_ATTENTION), ("math", SDPBackend.MATH)]:
        try:
            with sdpa_kernel([be]):
                fn = lambda: F.scaled_dot_product_attention(q, k, v, scale=dim ** -0.5).transpose(1, 2).reshape(n, lq, dim)
                err = ((fn().float() - ref.transpose(1, 2).reshape(n, lq, dim)).norm() / ref.norm()).item()
                row.append(f"{name} {graphed_us(fn):7.1f} us (err {err:.1e})")
        except Exception as e:
            row.append(f"{name} n/a ({type(e).__name__})")
    if lkv <= 256:
        tok = lambda t: t.transpose(1, 2).reshape(n, t.shape[2], dim)
        fn = lambda: attention_tokens(tok(q), tok(k), tok(v), heads, dim ** -0.5)
        err = ((fn().float() - ref.transpose(1, 2).reshape(n, lq, dim)).norm() / ref.norm()).item()
        mb = (2 * q.numel() + 2 * k.numel()) * 2 / 1e6
        row.append(f"attention_tokens {graphed_us(fn):7.1f} us (err {err:.1e}; {mb:.1f} MB q+k+v+o)")
    print(f"Lq {lq} Lkv {lkv} heads {heads}: " + ", ".join(row), flush=True)
