"""CvT's model specs (microsoft/CvT ``experiments/imagenet/cvt/*.yaml``, ``MODEL.SPEC``, commit
f851e68) and their FLOP count; ``cvt.py`` builds the networks from them."""
from __future__ import annotations

# experiments/imagenet/cvt/cvt-13-224x224.yaml, MODEL.SPEC
CVT13_SPEC = {
    "INIT": "trunc_norm",
    "NUM_STAGES": 3,
    "PATCH_SIZE": [7, 3, 3],
    "PATCH_STRIDE": [4, 2, 2],
    "PATCH_PADDING": [2, 1, 1],
    "DIM_EMBED": [64, 192, 384],
    "NUM_HEADS": [1, 3, 6],
    "DEPTH": [1, 2, 10],
    "MLP_RATIO": [4.0, 4.0, 4.0],
    "ATTN_DROP_RATE": [0.0, 0.0, 0.0],
    "DROP_RATE": [0.0, 0.0, 0.0],
    "DROP_PATH_RATE": [0.0, 0.0, 0.1],
    "QKV_BIAS": [True, True, True],
    "CLS_TOKEN": [False, False, True],
    "POS_EMBED": [False, False, False],
    "QKV_PROJ_METHOD": ["dw_bn", "dw_bn", "dw_bn"],
    "KERNEL_QKV": [3, 3, 3],
    "PADDING_KV": [1, 1, 1],
    "STRIDE_KV": [2, 2, 2],
    "PADDING_Q": [1, 1, 1],
    "STRIDE_Q": [1, 1, 1],
}
# cvt-21-224x224.yaml / cvt-21-384x384.yaml: CvT-13 with depths 1/4/16
CVT21_SPEC = {**CVT13_SPEC, "DEPTH": [1, 4, 16]}
# cvt-w24-384x384.yaml: wider, stage 3 with 20 blocks and drop path 0.3
CVTW24_SPEC = {**CVT13_SPEC, "DIM_EMBED": [192, 768, 1024], "NUM_HEADS": [3, 12, 16], "DEPTH": [2, 2, 20],
               "DROP_PATH_RATE": [0.0, 0.0, 0.3]}


def cvt_flops(spec: dict, h: int, w: int, num_classes: int = 1000, in_chans: int = 3) -> float:
    """Multiply-adds x 2 of one image's forward (convs, linears, attention matmuls; not
    norms/softmax/activations)."""
    fl = 0.0
    c_in = in_chans
    for i in range(spec["NUM_STAGES"]):
        k, s, p, c = spec["PATCH_SIZE"][i], spec["PATCH_STRIDE"][i], spec["PATCH_PADDING"][i], spec["DIM_EMBED"][i]
        h, w = (h + 2 * p - k) // s + 1, (w + 2 * p - k) // s + 1
        fl += 2 * h * w * c * c_in * k * k
        kq, sq, skv = spec["KERNEL_QKV"][i], spec["STRIDE_Q"][i], spec["STRIDE_KV"][i]
        pq, pkv = spec["PADDING_Q"][i], spec["PADDING_KV"][i]
        hq, wq = (h + 2 * pq - kq) // sq + 1, (w + 2 * pq - kq) // sq + 1
        hk, wk = (h + 2 * pkv - kq) // skv + 1, (w + 2 * pkv - kq) // skv + 1
        cls = 1 if spec["CLS_TOKEN"][i] else 0
        tq, tk, t = hq * wq + cls, hk * wk + cls, h * w + cls
        hidden = int(c * spec["MLP_RATIO"][i])
        per_block = (2 * c * kq * kq * (hq * wq + 2 * hk * wk)       # depthwise q, k, v
                     + 2 * c * c * (tq + 2 * tk)                      # proj_q, proj_k, proj_v
                     + 2 * 2 * tq * tk * c                            # q k^T and attn v
                     + 2 * c * c * t + 2 * 2 * t * c * hidden)        # proj, mlp
        fl += spec["DEPTH"][i] * per_block
        c_in = c
    return fl + 2 * c_in * num_classes


__all__ = ["CVT13_SPEC", "CVT21_SPEC", "CVTW24_SPEC", "cvt_flops"]
