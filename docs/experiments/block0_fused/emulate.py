"""CPU emulation (numpy) of block0_fused_kernel.cuh's index math, for a check without a GPU.

Replays one CTA (gridDim.x = 1) over a few images with the kernel's own address formulas:
the swizzled cp.async loads, every lane's ldmatrix row address (zero chunk for the padding),
the ldmatrix and mma.sync.m16n8k16 fragment layouts (PTX ISA), the b1a add on the A
fragments, the epilogues, the squeeze's shuffles, the excite, the gate and the output copy,
with the two map buffers swapping roles per image.  Compares with a float64 numpy reference
of SEFixupBasicBlock and counts shared-memory bank conflicts of the ldmatrix phases.

    python docs/experiments/block0_fused/emulate.py
"""
from __future__ import annotations

import sys

import numpy as np

C, H, W, PIX, K = 64, 16, 16, 256, 576
WARPS, HID = 8, 4
OFF_W1, OFF_W2 = 0, 73728
OFF_BUF = (147456, 147456 + 32768)
OFF_ZERO = 215600 - 16
SMEM = 215600


def map_offset(pixel, chunk):
    return pixel * 128 + ((chunk ^ (pixel & 7)) << 4)


def weight_offset(n, chunk):
    return n * 1152 + ((chunk ^ (n & 7)) << 4)


class Smem:
    def __init__(self):
        self.b = np.zeros(SMEM, np.uint8)
        self.worst_conflict = 1

    def halves(self, addr, count):
        return self.b[addr:addr + 2 * count].view(np.float16)

    def ldmatrix_x4(self, addrs):
        """addrs[32] -> regs[32, 4, 2] (fp16 pairs): matrix j from lanes 8j..8j+7's rows;
        lane L gets row L // 4, elements 2 (L % 4), +1 of each matrix."""
        regs = np.zeros((32, 4, 2), np.float16)
        for j in range(4):
            rows = [self.halves(a, 8) for a in addrs[8 * j:8 * j + 8]]
            distinct = set(addrs[8 * j:8 * j + 8])
            groups = [(a >> 4) & 7 for a in distinct]       # 16-byte bank group of each row
            self.worst_conflict = max(self.worst_conflict, max(groups.count(x) for x in set(groups)))
            for lane in range(32):
                regs[lane, j] = rows[lane // 4][2 * (lane % 4):2 * (lane % 4) + 2]
        return regs


def mma(acc, a, b0, b1):
    """acc[32, 4] += A (16x16, fragments a[32, 4, 2]) @ B (16x8, fragments b0, b1 [32, 2])."""
    A = np.zeros((16, 16), np.float32)
    B = np.zeros((16, 8), np.float32)
    for lane in range(32):
        g, t = lane // 4, lane % 4
        A[g, 2 * t:2 * t + 2] = a[lane, 0]
        A[g + 8, 2 * t:2 * t + 2] = a[lane, 1]
        A[g, 2 * t + 8:2 * t + 10] = a[lane, 2]
        A[g + 8, 2 * t + 8:2 * t + 10] = a[lane, 3]
        B[2 * t:2 * t + 2, g] = b0[lane]
        B[2 * t + 8:2 * t + 10, g] = b1[lane]
    D = A @ B
    for lane in range(32):
        g, t = lane // 4, lane % 4
        acc[lane, 0:2] += D[g, 2 * t:2 * t + 2]
        acc[lane, 2:4] += D[g + 8, 2 * t:2 * t + 2]


def conv3x3(sm, warp, inbuf, wbuf, bias_h):
    """The kernel's conv3x3 for one warp: acc[mi][ni] = [32 lanes, 4]."""
    acc = np.zeros((2, 8, 32, 4), np.float32)
    lanes = np.arange(32)
    for tap in range(9):
        r, s = divmod(tap, 3)
        for kc in range(4):
            a = []
            for mi in range(2):
                addrs = []
                for lane in lanes:
                    sy, sx = 2 * warp + mi + r - 1, (lane & 15) + s - 1
                    pad = not (0 <= sy < H and 0 <= sx < W)
                    chunk = ((2 * kc + (lane >> 4)) ^ (sx & 7)) << 4
                    addrs.append(OFF_ZERO if pad else inbuf + (sy * W + sx) * 128 + chunk)
                frag = sm.ldmatrix_x4(addrs)
                if bias_h is not None:
                    row_ok = 0 <= sy < H
                    for lane in lanes:
                        g = lane >> 2
                        lo = bias_h if (row_ok and g + s - 1 >= 0) else np.float16(0)
                        hi = bias_h if (row_ok and g + 8 + s - 1 < W) else np.float16(0)
                        frag[lane, 0] += lo
                        frag[lane, 2] += lo
                        frag[lane, 1] += hi
                        frag[lane, 3] += hi
                a.append(frag)
            k_chunk_base = (tap * 4 + kc) * 2
            for np_ in range(4):
                addrs = []
                for lane in lanes:
                    n = np_ * 16 + (lane & 7) + ((lane >> 4) << 3)
                    addrs.append(wbuf + weight_offset(n, k_chunk_base + ((lane >> 3) & 1)))
                b = sm.ldmatrix_x4(addrs)
                for mi in range(2):
                    mma(acc[mi, 2 * np_], a[mi], b[:, 0], b[:, 1])
                    mma(acc[mi, 2 * np_ + 1], a[mi], b[:, 2], b[:, 3])
    return acc


def kernel(x, w1, w2, b1a, b1b, b2a, scale, b2b, fc1w, fc1b, fc2w, fc2b):
    """One CTA over all images of x [N, 16, 16, 64] fp16; returns out [N, 16, 16, 64] fp16."""
    sm = Smem()
    n_img = x.shape[0]
    out = np.full(x.shape, np.nan, np.float16)
    for off, w in ((OFF_W1, w1), (OFF_W2, w2)):            # KRSC [64, 576]
        wb = np.ascontiguousarray(w).reshape(-1).view(np.uint8)
        for q in range(64 * 72):
            d = off + weight_offset(q // 72, q % 72)
            sm.b[d:d + 16] = wb[q * 16:q * 16 + 16]

    def load_map(buf, img):
        xb = np.ascontiguousarray(x[img]).reshape(-1).view(np.uint8)
        for q in range(PIX * 8):
            d = buf + map_offset(q >> 3, q & 7)
            sm.b[d:d + 16] = xb[q * 16:q * 16 + 16]

    cur = 0
    load_map(OFF_BUF[0], 0)
    b1a_h = np.float16(b1a)
    for img in range(n_img):
        s_cur, s_mid = OFF_BUF[cur], OFF_BUF[cur ^ 1]
        # conv1 + epilogue -> mid
        for warp in range(WARPS):
            acc = conv3x3(sm, warp, s_cur, OFF_W1, b1a_h)
            for mi in range(2):
                for ni in range(8):
                    for lane in range(32):
                        g, t = lane >> 2, lane & 3
                        pix = (2 * warp + mi) * W + g
                        for hi in range(2):
                            v = np.maximum(acc[mi, ni, lane, 2 * hi:2 * hi + 2] + b1b, 0) + b2a
                            d = s_mid + map_offset(pix + 8 * hi, ni) + 4 * t
                            sm.b[d:d + 4] = v.astype(np.float16).view(np.uint8)
        # conv2, squeeze (per-warp partial sums through the shuffle pattern)
        hs, red = [], np.zeros((WARPS, C), np.float32)
        for warp in range(WARPS):
            acc = conv3x3(sm, warp, s_mid, OFF_W2, None) * np.float32(scale) + np.float32(b2b)
            hs.append(acc)
            for ni in range(8):
                for j in range(2):
                    s = acc[0, ni, :, j] + acc[0, ni, :, j + 2] + acc[1, ni, :, j] + acc[1, ni, :, j + 2]
                    for off in (4, 8, 16):
                        s = s + s[np.arange(32) ^ off]
                    for t in range(4):                         # lanes g == 0
                        red[warp, ni * 8 + 2 * t + j] = s[t]
        if img + 1 < n_img:
            load_map(s_mid, img + 1)                           # the prefetch
        mean = red.sum(0) / PIX
        hidden = np.maximum(fc1w @ mean + fc1b, 0)
        gate = 1 / (1 + np.exp(-(fc2w @ hidden + fc2b)))
        for warp in range(WARPS):
            acc = hs[warp]
            for mi in range(2):
                for ni in range(8):
                    for lane in range(32):
                        g, t = lane >> 2, lane & 3
                        c = ni * 8 + 2 * t
                        pix = (2 * warp + mi) * W + g
                        for hi in range(2):
                            d = s_cur + map_offset(pix + 8 * hi, ni) + 4 * t
                            xv = sm.b[d:d + 4].view(np.float16).astype(np.float32)
                            o = np.maximum(acc[mi, ni, lane, 2 * hi:2 * hi + 2] * gate[c:c + 2] + xv, 0)
                            sm.b[d:d + 4] = o.astype(np.float16).view(np.uint8)
        ob = out[img].reshape(-1).view(np.uint8)
        for q in range(PIX * 8):
            s = s_cur + map_offset(q >> 3, q & 7)
            ob[q * 16:q * 16 + 16] = sm.b[s:s + 16]
        cur ^= 1
    return out, sm.worst_conflict


def reference(x, w1, w2, b1a, b1b, b2a, scale, b2b, fc1w, fc1b, fc2w, fc2b):
    """SEFixupBasicBlock.forward in float64, NHWC; w as KRSC [64, 3, 3, 64]."""
    def conv(a, w):
        p = np.pad(a, ((0, 0), (1, 1), (1, 1), (0, 0)))
        y = np.zeros(a.shape[:3] + (C,))
        for r in range(3):
            for s in range(3):
                y += p[:, r:r + H, s:s + W, :] @ w[:, r, s, :].T
        return y
    x = x.astype(np.float64)
    h = np.maximum(conv(x + b1a, w1.astype(np.float64)) + b1b, 0)
    h = conv(h + b2a, w2.astype(np.float64)) * scale + b2b
    g = 1 / (1 + np.exp(-(np.maximum(h.mean((1, 2)) @ fc1w.T + fc1b, 0) @ fc2w.T + fc2b)))
    return np.maximum(h * g[:, None, None, :] + x, 0)


def main() -> int:
    rng = np.random.default_rng(0)
    n = 3
    x = np.maximum(rng.standard_normal((n, H, W, C)), 0).astype(np.float16)
    std = (2 / (C * 9)) ** 0.5
    w1 = (rng.standard_normal((C, 3, 3, C)) * std).astype(np.float16)
    w2 = (rng.standard_normal((C, 3, 3, C)) * std).astype(np.float16)
    b1a, b1b, b2a, b2b = 0.1 * rng.standard_normal(4)
    scale = 1 + 0.25 * rng.standard_normal()
    fc1w, fc1b = 0.5 * rng.standard_normal((HID, C)), 0.1 * rng.standard_normal(HID)
    fc2w, fc2b = 0.5 * rng.standard_normal((C, HID)), 0.1 * rng.standard_normal(C)
    args = (w1, w2, b1a, b1b, b2a, scale, b2b, fc1w, fc1b, fc2w, fc2b)
    out, conflict = kernel(x, *args)
    ref = reference(x, *args)
    err = np.linalg.norm(out.astype(np.float64) - ref) / np.linalg.norm(ref)
    finite = bool(np.isfinite(out).all())
    print(f"{n} images through one emulated CTA: rel err {err:.3e}, all finite {finite}, "
          f"worst ldmatrix bank-group multiplicity {conflict} (1 = conflict-free)")
    return 0 if finite and err < 2e-3 else 1


if __name__ == "__main__":
    sys.exit(main())
