"""Compile-check generated FusedMLP kernels with nvcc, no GPU needed.

    PYTHONPATH=python python tests/mlp_compile_check.py [--arch 80 --arch 90] [--quick] [--keep DIR]

Emits the CUDA source of a set of model specs (widths 1, 57, 127, 256; depths 1..8; every
activation the tracer knows; float16 and bfloat16), compiles each with nvcc for each arch
(sm_80 with sm80's 163 KB shared-memory limit, sm_90 with 227 KB), one compile at a time, and
prints ptxas's registers / spills / shared memory per kernel (fwd, fwd<SAVE>, bwd, and bwd_dw where
the weight gradients fit in registers).  Exits 1 on a compile error or a
spill (ptxas reporting non-zero spill stores or loads).  --quick: three specs only.
"""
from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

import torch.nn as nn
import torch.nn.functional as F

from cutlass_ops_gen.mlp_spec import trace_mlp
from cutlass_ops_gen.mlp_emit import emit, nvcc_command

SMEM_LIMIT = {"80": 166912, "86": 101376, "89": 101376, "90": 232448}


class Act(nn.Module):
    def __init__(self, fn):
        super().__init__()
        self.fn = fn

    def forward(self, x):
        return self.fn(x)


def chain(widths, act, last=None, bias=True):
    mods = []
    for i, (a, b) in enumerate(zip(widths[:-1], widths[1:])):
        mods.append(nn.Linear(a, b, bias=bias))
        f = act if i < len(widths) - 2 else last
        if f is not None:
            mods.append(f)
    return nn.Sequential(*mods)


def specs(quick: bool):
    out = [
        ("relu_64x4", chain([32, 64, 64, 64, 64, 16], nn.ReLU())),
        ("relu_128x6", chain([32] + [128] * 6 + [16], nn.ReLU())),
        ("odd_widths", chain([57, 127, 1, 256, 3], nn.GELU(), last=nn.Sigmoid())),
        ("siren_256", chain([3, 256, 256, 256, 256, 1], Act(lambda x: x.mul(30).sin()))),
    ]
    if quick:
        return out
    out += [
        ("depth1_w1", chain([1, 1], None, last=nn.Tanh())),
        ("depth1_256", chain([256, 256], None, bias=False)),
        ("depth8_57", chain([57] * 9, nn.SiLU(), last=nn.Softplus())),
        ("w127_mish_nobias", chain([127, 127, 127], nn.Mish(), bias=False)),
        ("w256_leaky", chain([256, 256, 256], nn.LeakyReLU(0.2))),
        ("elu_hardtanh", chain([8, 40, 40, 2], Act(lambda x: F.elu(F.hardtanh(x, -2.0, 3.0))))),
        ("gelu_tanh_sigmoid", chain([16, 64, 64, 8], nn.GELU(approximate="tanh"), last=nn.Sigmoid())),
        ("gauss_log1p", chain([2, 33, 33, 3], Act(lambda x: (-x * x).exp() + x.abs().log1p()))),
    ]
    return out


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--arch", action="append", help="80, 86, 89, 90 (default: 80 and 90)")
    ap.add_argument("--dtype", action="append", help="float16, bfloat16 (default: both)")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--keep", help="write the sources and libraries here")
    ap.add_argument("--nvcc", default=os.environ.get("CUDACXX") or shutil.which("nvcc") or "/usr/local/cuda/bin/nvcc")
    args = ap.parse_args()
    archs = args.arch or ["80", "90"]
    dtypes = args.dtype or ["float16", "bfloat16"]
    work = args.keep or tempfile.mkdtemp(prefix="mlp_compile_check_")
    os.makedirs(work, exist_ok=True)
    failed = 0
    for name, model in specs(args.quick):
        spec = trace_mlp(model, None)
        for dtype in dtypes:
            for arch, inplace in [(a, ip) for a in archs for ip in (True, False)]:
                # both shapes FusedMLP builds (mlp._inplace_allowed): the forwards' (in place where
                # it applies, relu_128x6 on sm90) and the backward's (never in place), where they differ
                src, cfg = emit(spec, dtype, SMEM_LIMIT[arch.rstrip("a")], inplace=inplace)
                if not inplace and not emit(spec, dtype, SMEM_LIMIT[arch.rstrip("a")], inplace=True)[1].inplace:
                    continue  # the same kernel as the row before
                base = os.path.join(work, f"{name}_{dtype}_sm{arch}{'_inplace' if cfg.inplace else ''}")
                with open(base + ".cu", "w") as f:
                    f.write(src)
                t0 = time.time()
                r = subprocess.run(nvcc_command(args.nvcc, base + ".cu", base + ".so", arch, verbose_ptxas=True),
                                   capture_output=True, text=True)
                dt = time.time() - t0
                log = r.stdout + r.stderr
                kernels = []
                for m in re.finditer(r"Compiling entry function '(\w+)' for '(\w+)'.*?"
                                     r"(\d+) bytes spill stores, (\d+) bytes spill loads.*?"
                                     r"Used (\d+) registers", log, re.S):
                    kern = "fwd<SAVE>" if "fwd_kernelILb1" in m.group(1) else \
                        "fwd" if "fwd_kernel" in m.group(1) else "bwd_dw" if "bwd_dw_kernel" in m.group(1) else "bwd"
                    kernels.append((kern, int(m.group(5)), int(m.group(3)), int(m.group(4))))
                spills = any(s or l for _, _, s, l in kernels)
                ok = r.returncode == 0 and not spills and len(kernels) == 3 + (cfg.dw_warps > 0)
                failed += not ok
                desc = ", ".join(f"{k}: {reg} regs, {s}/{l} B spill st/ld" for k, reg, s, l in kernels)
                print(f"{'ok  ' if ok else 'FAIL'} {name:18s} {dtype:8s} sm_{arch:3s} {'in place' if cfg.inplace else '        '} BM={cfg.bm:3d} "
                      f"smem fwd/bwd/bwd_dw {cfg.smem_fwd // 1024}/{cfg.smem_bwd // 1024}/{cfg.smem_dw // 1024} KiB  "
                      f"{dt:5.1f} s  {desc}",
                      flush=True)
                if r.returncode != 0:
                    print(log[-4000:])
    print(f"{failed} failed" if failed else "all compiled, no spills")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
