"""Host time of a FusedMLP training step (32-64x4-16, fp16, 2^14 rows: the kernels take ~0.1 ms,
so the step's wall time is host work): wall time per step, cProfile of 200 steps (Python
functions by own time), and the torch profiler's CPU ops by self time; eager PyTorch beside."""
import cProfile, pstats, io, time, torch
from torch.profiler import profile, ProfilerActivity
from cutlass_ops.tools.mlp_bench import MODELS
from cutlass_ops.mlp import FusedMLP
torch.manual_seed(0)
ref = MODELS["relu_32-64x4-16"]().to("cuda", torch.float16)
fused = FusedMLP.from_module(ref)
x = torch.randn(2 ** 14, 32, device="cuda", dtype=torch.float16).requires_grad_(True)
for name, mod in (("FusedMLP", fused), ("eager", ref)):
    params = list(mod.parameters())
    def step():
        y = mod(x)
        torch.autograd.grad(y, [x] + params, torch.ones_like(y))
    for _ in range(20): step()
    torch.cuda.synchronize()
    for _ in range(3):
        t = time.perf_counter()
        for _ in range(200): step()
        host = (time.perf_counter() - t) / 200 * 1e3
        torch.cuda.synchronize()
        wall = (time.perf_counter() - t) / 200 * 1e3
        print(f"{name}: host {host:.3f} ms per step (issue time), wall {wall:.3f} ms")
    if name != "FusedMLP":
        continue
    pr = cProfile.Profile(); pr.enable()
    for _ in range(200): step()
    pr.disable(); torch.cuda.synchronize()
    s = io.StringIO(); pstats.Stats(pr, stream=s).sort_stats("tottime").print_stats(30); print(s.getvalue()[:6000])
    s = io.StringIO(); pstats.Stats(pr, stream=s).sort_stats("cumtime").print_stats(30); print(s.getvalue()[:6000])
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(20): step()
    print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=30))
