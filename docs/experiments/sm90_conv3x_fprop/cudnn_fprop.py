# cuDNN fprop (channels_last fp16, F.conv2d, cudnn.benchmark) on conv3x_fprop.cu's shapes; CUDA events, median.
# Optional: --json PATH writes the numbers; --reps/--launches set the timing (default 7 batches of 20 launches).
import argparse, json
import torch, torch.nn.functional as F

ap = argparse.ArgumentParser()
ap.add_argument("--json", default=None)
ap.add_argument("--reps", type=int, default=7)
ap.add_argument("--launches", type=int, default=20)
args = ap.parse_args()

torch.backends.cudnn.benchmark = True
shapes = [(16, 64, 64, 3, 1, 1), (16, 64, 128, 3, 2, 1), (8, 128, 128, 3, 1, 1), (8, 128, 256, 3, 2, 1),
          (4, 256, 256, 3, 1, 1), (4, 256, 512, 3, 2, 1), (2, 512, 512, 3, 1, 1), (8, 64, 128, 1, 1, 0)]
rows = []
for n in (512, 2048):
    for h, c, k, r, s, p in shapes:
        x = torch.randn(n, c, h, h, device="cuda", dtype=torch.half).contiguous(memory_format=torch.channels_last)
        w = torch.randn(k, c, r, r, device="cuda", dtype=torch.half).contiguous(memory_format=torch.channels_last)
        f = lambda: F.conv2d(x, w, stride=s, padding=p)
        for _ in range(5): f()
        ts = []
        for _ in range(args.reps):
            a, b = torch.cuda.Event(True), torch.cuda.Event(True)
            a.record()
            for _ in range(args.launches): f()
            b.record(); b.synchronize(); ts.append(a.elapsed_time(b) * 1000 / args.launches)
        ts.sort()
        med = ts[len(ts) // 2]
        print(f"CUDNN n{n} h{h} c{c} k{k} r{r} s{s}: {med:.1f} us")
        rows.append(dict(n=n, h=h, w=h, c=c, k=k, r=r, stride=s, pad=p, us_median=med, us_min=ts[0]))
if args.json:
    with open(args.json, "w") as fh:
        json.dump(dict(device=torch.cuda.get_device_name(), torch=torch.__version__,
                       cudnn=torch.backends.cudnn.version(), reps=args.reps, launches=args.launches, rows=rows), fh,
                  indent=1)
