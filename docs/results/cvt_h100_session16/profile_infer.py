"""FusedCvT inference (eval, fp16, 224) by kernel: device time per kernel name (profiler), the
network's total, N from argv."""
import sys, torch
from torch.profiler import profile, ProfilerActivity
from cutlass_ops.tools.cvt_bench import cvt_reference
from cutlass_ops.fused_cvt import FusedCvT
n = int(sys.argv[1]) if len(sys.argv) > 1 else 64
model = FusedCvT.from_reference(cvt_reference(torch.float16)).eval()
x = torch.randn(n, 3, 224, 224, device="cuda", dtype=torch.float16)
with torch.no_grad():
    for _ in range(3): model(x)
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        model(x); torch.cuda.synchronize()
kern = {}
for e in prof.events():
    if e.device_type == torch.autograd.DeviceType.CUDA:
        k = kern.setdefault(e.name, [0, 0.0]); k[0] += 1; k[1] += e.device_time_total
total = sum(v[1] for v in kern.values())
print(f"inference N={n}: {sum(v[0] for v in kern.values())} kernels, {total / 1e3:.3f} ms device time")
for name, (cnt, us) in sorted(kern.items(), key=lambda kv: -kv[1][1]):
    print(f"{us / 1e3:8.3f} ms {100 * us / total:5.1f}% {cnt:4d}  {name[:150]}")
