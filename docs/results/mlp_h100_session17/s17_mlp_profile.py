"""FusedMLP at 2^21 rows, fp16: kernels of one inference call and one training step
(forward with saves, backward, bias sums), by the profiler, for the bench's models."""
import sys, torch
from torch.profiler import profile, ProfilerActivity
from cutlass_ops.tools.mlp_bench import MODELS
from cutlass_ops.mlp import FusedMLP
rows = 2 ** 21
for name in sys.argv[1:]:
    torch.manual_seed(0)
    ref = MODELS[name]().to("cuda", torch.float16)
    fused = FusedMLP.from_module(ref)
    x = torch.randn(rows, ref[0].in_features, device="cuda", dtype=torch.float16)
    xg = x.clone().requires_grad_(True)
    params = list(fused.parameters())
    def infer():
        with torch.no_grad():
            fused(x)
    def train():
        y = fused(xg)
        torch.autograd.grad(y, [xg] + params, torch.ones_like(y))
    for mode, fn in (("inference", infer), ("train", train)):
        for _ in range(3): fn()
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            fn(); torch.cuda.synchronize()
        ev = [e for e in prof.key_averages() if e.device_type.name == "CUDA" or e.self_device_time_total > 0]
        ev = [e for e in ev if not e.key.startswith("aten::") and not e.key.startswith("cutlass_ops::")]
        tot = sum(e.self_device_time_total for e in ev) / 1e3
        print(f"{name} {mode}: kernel sum {tot:.3f} ms; info {fused.kernel_info()}")
        for e in sorted(ev, key=lambda e: -e.self_device_time_total)[:12]:
            print(f"   {e.self_device_time_total/1e3:8.3f} ms {e.count:3d}  {e.key[:100]}")
