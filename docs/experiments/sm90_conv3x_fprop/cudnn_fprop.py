# cuDNN fprop (channels_last fp16, F.conv2d, cudnn.benchmark) on conv3x_fprop.cu's shapes; CUDA events, median.
import torch, torch.nn.functional as F
torch.backends.cudnn.benchmark = True
shapes = [(16, 64, 64, 3, 1, 1), (16, 64, 128, 3, 2, 1), (8, 128, 128, 3, 1, 1), (8, 128, 256, 3, 2, 1),
          (4, 256, 256, 3, 1, 1), (4, 256, 512, 3, 2, 1), (2, 512, 512, 3, 1, 1), (8, 64, 128, 1, 1, 0)]
for n in (512, 2048):
    for h, c, k, r, s, p in shapes:
        x = torch.randn(n, c, h, h, device="cuda", dtype=torch.half).contiguous(memory_format=torch.channels_last)
        w = torch.randn(k, c, r, r, device="cuda", dtype=torch.half).contiguous(memory_format=torch.channels_last)
        f = lambda: F.conv2d(x, w, stride=s, padding=p)
        for _ in range(5): f()
        ts = []
        for _ in range(7):
            a, b = torch.cuda.Event(True), torch.cuda.Event(True)
            a.record()
            for _ in range(20): f()
            b.record(); b.synchronize(); ts.append(a.elapsed_time(b) * 1000 / 20)
        print(f"CUDNN n{n} h{h} c{c} k{k} r{r} s{s}: {sorted(ts)[3]:.1f} us")
