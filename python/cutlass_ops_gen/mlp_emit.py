"""FusedMLP code emitter: ``MlpSpec`` -> one self-contained CUDA source.

``emit(spec, dtype, smem_limit)`` returns the text of a ``.cu`` file that holds, for one model
and one dtype (float16 or bfloat16):

- ``fwd_kernel<SAVE>``: the whole chain of Linear layers in one kernel (``mlp_kernel.cuh``: per
  layer a warp-level tensor-core GEMM from shared memory, fp32 accumulation, bias and the
  activation in the epilogue, the result back into shared memory as the next layer's input; only
  the last layer writes global memory).  ``SAVE`` also writes each hidden layer's activation
  ``a`` to global memory for the backward pass, and the pre-activation ``z`` of the last layer
  and of each hidden layer whose activation's derivative needs it (``saves_pre_activation``:
  not ReLU, leaky ReLU, tanh, sigmoid or identity, whose backward reads ``a``).
- ``bwd_kernel``: the input-gradient chain, also one kernel: per layer (last first)
  ``dz = g * act'(z)`` (written to global memory: the weight gradients are GEMMs over the batch,
  which the Python side runs; the bias gradient's column sums per warp tile are written as
  float32 partials) and ``g = dz . W`` in shared memory; ``dx`` at the end.
- Two shapes of both kernels (``Config.resident_warps``): where every layer's weight fits in
  shared memory beside the warps' activation tiles, the weights are loaded once per CTA and stay
  (``fwd_layer_resident``): CTAs of 4-16 warps, as many as fit on the GPU, each warp taking
  32-row tiles from a grid-stride loop with no block barrier after the weight load; where two
  tiles per warp do not fit but one does (widths up to 128, e.g. 32-128x6-16 on sm90), each
  layer computes in place (``Config.inplace``: its input's A fragments in registers first).
  Otherwise (wide models) the weight streams through shared memory chunk by chunk for each
  128-row CTA (``fwd_layer``).
- ``bwd_dw_kernel`` (resident models whose weight gradients fit in registers, ``Config.dw_warps``):
  the backward with dW_l = dz_l^T a_(l-1) accumulated in the kernel over each CTA's rows and
  written as one float32 partial per CTA, so no dz goes to global memory
  (docs/experiments/mlp_fused_dw).
- ``extern "C"`` host entry points (``fmlp_init``, ``fmlp_fwd``, ``fmlp_bwd``, ``fmlp_error``;
  ``fmlp_bwd_dw`` and ``fmlp_bwd_dw_ctas`` with bwd_dw_kernel) that the Python side calls
  through ctypes, with the CUDA stream to launch on.  Under ``FMLP_EMULATE`` the host side drops
  out and the kernels build with g++ for the CPU emulator (tests/cuda_emulator);
  ``emit(..., device_only=True)`` leaves it out for NVRTC, whose caller launches the kernels
  through the CUDA driver API (cutlass_ops.mlp_nvrtc).

No torch and no CUTLASS headers are needed: the MMA is inline PTX (``mma.sync.m16n8k16``), which
keeps a model's first-use compile to seconds.  Runs on sm_80 and newer (sm_90 included).

This module is pure Python (no torch import) and ships in the wheel with the rest of
``cutlass_ops_gen`` (see pyproject.toml), because the installed ``cutlass_ops.mlp_jit`` generates and
compiles a model's kernel at first use.
"""
from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass
from pathlib import Path

from .mlp_spec import MlpSpec, padded

THREADS = 128
WARPS = 4
KERNEL_HEADER = Path(__file__).with_name("mlp_kernel.cuh")
# A streamed-weights CTA's threads, as the header defines them (a launcher without the host
# side, cutlass_ops.mlp_nvrtc, sizes its launches by it)
FMLP_THREADS = int(re.search(r"^#define FMLP_THREADS (\d+)$", KERNEL_HEADER.read_text(), re.M).group(1))
EMITTER_VERSION = 5  # bump when the emitted code changes in a way the header text does not show

CTYPES = {"float16": "__half", "bfloat16": "__nv_bfloat16"}


def pad16(v: int) -> int:
    return -(-v // 16) * 16


@dataclass(frozen=True)
class Config:
    mt: int          # 16-row MMA tiles per warp: BM = 16 * MT * 4 rows per CTA
    nc: int          # output columns per weight chunk
    sa: int          # row stride (elements) of the activation / gradient tiles
    sw_fwd: int      # row stride of the forward weight chunk (ws[n][k])
    nc_fwd: int      # rows of the forward weight chunk buffer
    sw_bwd: int      # row stride of the backward weight chunk (ws[j][i])
    jg_bwd: int      # rows of the backward weight chunk buffer
    smem_fwd: int    # dynamic shared memory, bytes
    smem_bwd: int
    resident_warps: int = 0   # > 0: weights resident in shared memory, this many warps per CTA
    resident: tuple = ()      # per layer (offset, rows, row stride) of its weight, in elements
    dw_warps: int = 0         # > 0: bwd_dw_kernel (weight gradients fused) with this many warps per CTA
    dw_units: tuple = ()      # per layer (G, units, units per warp): dW dealt in 16 x 8G stripes
    smem_dw: int = 0
    inplace: bool = False     # resident with one tile per warp: each layer overwrites its input

    @property
    def bm(self) -> int:
        """Rows per CTA (streamed) or per warp tile (resident)."""
        return 16 * self.mt * (1 if self.resident_warps else WARPS)


RESIDENT_WARPS = (16, 12, 8, 4)
RESIDENT_MT = 2  # 32-row warp tiles
# In-place resident layers hold their input's A fragments in registers: K / 16 x MT x 4 of them
# (64 at K = 128), so only models no wider than this get them.
INPLACE_MAX_K = 128


def resident_layout(spec: MlpSpec, nc: int) -> tuple[tuple, int]:
    """Per layer (offset, rows, row stride) of its whole weight in shared memory, and the total
    (elements).  The rows and columns cover what the forward's and the backward's column chunks
    of ``nc`` read (zero-filled past the weight), and rows are 16-byte aligned with 8 columns of
    skew (conflict-free ldmatrix)."""
    layout, total = [], 0
    for l in spec.layers:
        n_pad, k_pad = l.out_padded, l.in_padded
        ncl_f = min(nc, n_pad)
        ncl_b = min(nc, k_pad)
        rows = max(-(-n_pad // ncl_f) * ncl_f, pad16(n_pad))
        cols = max(pad16(l.in_features), -(-k_pad // ncl_b) * ncl_b)
        layout.append((total, rows, cols + 8))
        total += rows * (cols + 8)
    return tuple(layout), total


DW_WARPS = (4, 8)
# float32 dW accumulators per thread the fused weight-gradient kernel may hold (beside about 90
# working registers: 2 CTAs of 4 warps per SM stay within 256 registers a thread)
DW_ACC_BUDGET = 160


def dw_units(spec: MlpSpec, warps: int) -> tuple:
    """Per layer (G, units, units per warp): dW_l (out x in, padded to 16 x 8 tiles) split into
    units of one 16-row stripe x G column tiles, G as wide as leaves every warp a unit (G up to
    8: the stripe's A fragment is loaded once for G MMAs); unit u goes to warp u % warps."""
    out = []
    for l in spec.layers:
        mt, nt = pad16(l.out_padded) // 16, l.in_padded // 8
        g = min(8, nt)
        while g > 1 and mt * -(-nt // g) < warps:
            g = -(-g // 2)
        units = mt * -(-nt // g)
        out.append((g, units, -(-units // warps)))
    return tuple(out)


def choose_dw(spec: MlpSpec, total: int, sa: int, smem_limit: int) -> tuple[int, tuple, int]:
    """The fused weight-gradient kernel's warps per CTA, units and shared memory (weights, and
    3 tiles per warp: g, the next g and a_prev), or (0, (), 0) where the accumulators would not
    fit in registers (wide models: their dW stays GEMMs over saved dz)."""
    for warps in DW_WARPS:
        units = dw_units(spec, warps)
        acc = sum(g * per_warp * 4 for g, _, per_warp in units)
        smem = 2 * (total + warps * 3 * 16 * RESIDENT_MT * sa)
        if acc <= DW_ACC_BUDGET and smem <= smem_limit:
            return warps, units, smem
    return 0, (), 0


def choose_config(spec: MlpSpec, smem_limit: int, resident: bool = True, inplace: bool = False) -> Config:
    """Resident weights with the most warps that fit ``smem_limit`` bytes (a GPU's opt-in
    per-block limit: 232448 on sm90, 166912 on sm80, 101376 on sm86/89), at least 4; with
    ``inplace``, where two tiles per warp do not fit, resident with one tile per warp computed in
    place (FusedMLP's forwards ask for it, its backward not: cutlass_ops.mlp_jit);
    else (or with ``resident=False``) streamed weights with the largest row tile and weight
    chunk that fit.  Resident models whose
    weight gradients fit in registers also get the fused-dW backward."""
    widths = [spec.in_features] + [l.out_features for l in spec.layers]
    sa = pad16(max(padded(w) for w in widths)) + 8
    if resident:
        layout, total = resident_layout(spec, 64)
        for warps in RESIDENT_WARPS:
            smem = 2 * (total + warps * 2 * 16 * RESIDENT_MT * sa)
            if smem <= smem_limit:
                dw_warps, units, smem_dw = choose_dw(spec, total, sa, smem_limit)
                return Config(RESIDENT_MT, 64, sa, 0, 0, 0, 0, smem, smem, warps, layout, dw_warps, units, smem_dw)
        # one tile per warp (e.g. 32-128x6-16: 184 KB of weights): 4 warps still fit on sm90
        if inplace and max(max(pad16(l.in_padded), pad16(l.out_padded)) for l in spec.layers) <= INPLACE_MAX_K:
            for warps in RESIDENT_WARPS:
                smem = 2 * (total + warps * 16 * RESIDENT_MT * sa)
                if smem <= smem_limit:
                    return Config(RESIDENT_MT, 64, sa, 0, 0, 0, 0, smem, smem, warps, layout, inplace=True)
    kmax = max(pad16(l.in_padded) for l in spec.layers)
    nmax = max(l.out_padded for l in spec.layers)
    kpmax = max(l.in_padded for l in spec.layers)
    jgmax = max(pad16(l.out_padded) for l in spec.layers)
    for mt, nc in ((2, 64), (1, 64), (1, 32), (1, 16), (1, 8)):
        bm = 16 * mt * WARPS
        nc_fwd = min(nc, nmax)
        sw_fwd = kmax + 8
        sw_bwd = min(nc, kpmax) + 8
        smem_fwd = 2 * (2 * bm * sa + 2 * nc_fwd * sw_fwd)
        smem_bwd = 2 * (2 * bm * sa + 2 * jgmax * sw_bwd)
        if max(smem_fwd, smem_bwd) <= smem_limit:
            return Config(mt, nc, sa, sw_fwd, nc_fwd, sw_bwd, jgmax, smem_fwd, smem_bwd)
    raise ValueError(f"the FusedMLP kernel for widths {widths} needs more than {smem_limit} bytes "
                     f"of shared memory per block")


def _act_struct(i: int, layer) -> str:
    dfy = layer.activation.cuda_grad_from_output
    return (f"struct Act{i} {{  // {layer.name}\n"
            f"  static __device__ __forceinline__ float f(float x) {{ return {layer.activation.cuda}; }}\n"
            f"  static __device__ __forceinline__ float df(float x) {{ return {layer.activation.cuda_grad}; }}\n"
            + ("" if dfy is None else
               f"  // the derivative from the output (the variable x stands for it)\n"
               f"  static __device__ __forceinline__ float dfy(float x) {{ return {dfy}; }}\n")
            + "};\n")


def _cbool(v: bool) -> str:
    return "true" if v else "false"


def _fwd_layer_args(spec: MlpSpec, i: int) -> str:
    """Layer i's template arguments shared by fwd_layer and fwd_layer_resident (all but the
    weight's row stride): activation, widths, bias, and which tensors a saving forward writes."""
    l = spec.layers[i]
    return (f"T, Act{i}, {l.in_features}, {l.out_features}, {_cbool(l.bias)}, SAVE, "
            f"{_cbool(spec.saves_pre_activation(i))}, {_cbool(i < len(spec.layers) - 1)}, MT, NC, SA")


def _bwd_elementwise(spec: MlpSpec, i: int, tile: str, indent: str, load_batch: int) -> str:
    """Layer i's dz = g * act'(.) on the warp's tile (from z, or from the saved activation where
    the derivative comes from the output; its vectors loaded ``load_batch`` at a time) and, with
    a bias, its per-tile column sums."""
    l = spec.layers[i]
    text = (f"{indent}fmlp::bwd_act<T, Act{i}, {l.out_features}, MT, SA, {_cbool(not spec.saves_pre_activation(i))}, "
            f"{load_batch}>({tile}, p.z[{i}], p.dz[{i}], wrow0, p.M);\n")
    if l.bias:
        text += f"{indent}fmlp::bwd_bias_partial<T, {l.out_features}, MT, SA, DB_STRIDE>({tile}, p.db[{i}], wrow0, p.M);\n"
    return text


def _streamed_kernels(spec: MlpSpec, cfg: Config) -> str:
    """fwd_kernel<SAVE> and bwd_kernel with streamed weights: one CTA of 4 warps per BM rows."""
    layers, L = spec.layers, len(spec.layers)
    k0, nl = spec.in_features, spec.out_features
    out = [f"""
template <bool SAVE>
__global__ void __launch_bounds__(FMLP_THREADS) fwd_kernel(const FwdParams p) {{
  extern __shared__ __align__(16) unsigned char smem[];
  T* act0 = reinterpret_cast<T*>(smem);
  T* act1 = act0 + BM * SA;
  T* wb0 = act1 + BM * SA;
  T* wb1 = wb0 + NCF * SWF;
  const int warp = threadIdx.x / 32;
  const int64_t row0 = (int64_t)blockIdx.x * BM, wrow0 = row0 + warp * 16 * MT;
  T* a0 = act0 + warp * 16 * MT * SA;
  T* a1 = act1 + warp * 16 * MT * SA;
  fmlp::load_rows<T, BM, {k0}, fmlp::pad16(fmlp::pad8({k0})), SA>(act0, p.x, row0, p.M);
"""]
    for i in range(L):
        src, dst = ("a0", "a1") if i % 2 == 0 else ("a1", "a0")
        out.append(f"  fmlp::fwd_layer<{_fwd_layer_args(spec, i)}, SWF>({src}, {dst}, wb0, wb1, p.w[{i}], p.b[{i}], "
                   f"p.z[{i}], p.a[{i}], wrow0, p.M);\n")
    last = "act1" if L % 2 == 1 else "act0"
    out.append(f"""  __syncthreads();
  fmlp::store_rows<T, BM, {nl}, SA>(p.y, {last}, row0, p.M);
}}

__global__ void __launch_bounds__(FMLP_THREADS) bwd_kernel(const BwdParams p) {{
  extern __shared__ __align__(16) unsigned char smem[];
  T* g0 = reinterpret_cast<T*>(smem);
  T* g1 = g0 + BM * SA;
  T* wb0 = g1 + BM * SA;
  T* wb1 = wb0 + JGB * SWB;
  const int warp = threadIdx.x / 32;
  const int64_t row0 = (int64_t)blockIdx.x * BM, wrow0 = row0 + warp * 16 * MT;
  T* w0 = g0 + warp * 16 * MT * SA;
  T* w1 = g1 + warp * 16 * MT * SA;
  fmlp::load_rows<T, BM, {nl}, fmlp::pad16(fmlp::pad8({nl})), SA>(g0, p.dy, row0, p.M);
  __syncthreads();
""")
    cur, nxt = "w0", "w1"
    for i in reversed(range(L)):
        l = layers[i]
        # 4 vectors at a time (on an H100, 32-128x6-16's backward: 4.01 ms; 16 at a time: 8.29)
        out.append(_bwd_elementwise(spec, i, cur, "  ", 4))
        gemm = (f"fmlp::bwd_gemm<T, {l.in_features}, {l.out_features}, MT, NC, SA, SWB>({cur}, {nxt}, wb0, wb1, "
                f"p.w[{i}]);")
        if i > 0:
            out.append(f"  {gemm}\n")
        else:
            gbuf = "g1" if nxt == "w1" else "g0"
            out.append(f"  if (p.dx != nullptr) {{\n    {gemm}\n    __syncthreads();\n"
                       f"    fmlp::store_rows<T, BM, {k0}, SA>(p.dx, {gbuf}, row0, p.M);\n  }}\n")
        cur, nxt = nxt, cur
    out.append("}\n")
    return "".join(out)


def _resident_kernels(spec: MlpSpec, cfg: Config) -> str:
    """fwd_kernel<SAVE> and bwd_kernel with resident weights: every layer's weight loaded once per
    CTA (RESIDENT_WARPS warps; as many CTAs as fit on the GPU), then each warp runs BM-row tiles of a grid-stride
    loop on its own, between its two activation tiles."""
    layers, L = spec.layers, len(spec.layers)
    k0, nl = spec.in_features, spec.out_features
    total = sum(rows * stride for _, rows, stride in cfg.resident)
    load = []
    for i, (l, (off, rows, stride)) in enumerate(zip(layers, cfg.resident)):
        load.append(f"  fmlp::load_w_resident<T, {l.in_features}, {l.out_features}, {rows}, {stride - 8}, {stride}, "
                    f"THREADS>(wres + {off}, p.w[{i}]);\n")
    head = f"""  extern __shared__ __align__(16) unsigned char smem[];
  T* wres = reinterpret_cast<T*>(smem);
{"".join(load)}  fmlp::cp_commit();
  fmlp::cp_wait<0>();
  __syncthreads();
  const int warp = threadIdx.x / 32, lane = threadIdx.x & 31;
  T* t0 = wres + {total} + warp * {1 if cfg.inplace else 2} * BM * SA;
  T* t1 = {"t0;  // in place: one tile per warp" if cfg.inplace else "t0 + BM * SA;"}
  const int64_t tiles = (p.M + BM - 1) / BM;
#pragma unroll 1
  for (int64_t t = (int64_t)blockIdx.x * RESIDENT_WARPS + warp; t < tiles; t += (int64_t)gridDim.x * RESIDENT_WARPS) {{
    const int64_t wrow0 = t * BM;
"""
    out = [f"""
template <bool SAVE>
__global__ void __launch_bounds__(THREADS, 1) fwd_kernel(const FwdParams p) {{
{head}    fmlp::load_rows<T, BM, {k0}, fmlp::pad16(fmlp::pad8({k0})), SA, 32>(t0, p.x, wrow0, p.M, lane);
    __syncwarp();
"""]
    for i, (off, _, stride) in enumerate(cfg.resident):
        src, dst = ("t0", "t1") if i % 2 == 0 else ("t1", "t0")
        out.append(f"    fmlp::fwd_layer_resident<{_fwd_layer_args(spec, i)}, {stride}, {_cbool(cfg.inplace)}>("
                   f"{src}, {dst}, wres + {off}, p.b[{i}], p.z[{i}], p.a[{i}], wrow0, p.M);\n")
    last = "t1" if L % 2 == 1 else "t0"
    out.append(f"""    fmlp::store_rows<T, BM, {nl}, SA, 32>(p.y, {last}, wrow0, p.M, lane);
    __syncwarp();
  }}
}}

__global__ void __launch_bounds__(THREADS, 1) bwd_kernel(const BwdParams p) {{
{head}    fmlp::load_rows<T, BM, {nl}, fmlp::pad16(fmlp::pad8({nl})), SA, 32>(t0, p.dy, wrow0, p.M, lane);
    __syncwarp();
""")
    cur, nxt = "t0", "t1"
    for i in reversed(range(L)):
        # 4 at a time: 16 warps of a resident CTA get 128 registers a thread
        out.append(_bwd_elementwise(spec, i, cur, "    ", 4))
        out.append(_resident_bwd_gemm(cfg, layers[i], i, cur, nxt, k0, cfg.inplace))
        cur, nxt = nxt, cur
    out.append("""    __syncwarp();
  }
}
""")
    return "".join(out)


def _resident_bwd_gemm(cfg: Config, layer, i: int, cur: str, nxt: str, k0: int, inplace: bool) -> str:
    """Layer i's g = dz . W_i from tile cur into nxt (resident weight); for the first layer only
    where dx is wanted, then dx to global."""
    off, _, stride = cfg.resident[i]
    gemm = (f"fmlp::bwd_gemm_resident<T, {layer.in_features}, {layer.out_features}, MT, NC, SA, {stride}, "
            f"{_cbool(inplace)}>({cur}, {nxt}, wres + {off});")
    if i > 0:
        return f"    {gemm}\n"
    return (f"    if (p.dx != nullptr) {{\n      {gemm}\n"
            f"      fmlp::store_rows<T, BM, {k0}, SA, 32>(p.dx, {nxt}, wrow0, p.M, lane);\n    }}\n")


def _dw_units_loop(layer, units_cfg: tuple, indent: str, body: str) -> str:
    """A loop over the warp's dW units of a layer (unit = warp + u * DW_WARPS) with the unit's
    16-row stripe m0, first column n0 and column tiles ntiles in scope for ``body``."""
    g, units, per_warp = units_cfg
    groups = -(-(layer.in_padded // 8) // g)  # column groups per stripe
    return (f"{indent}#pragma unroll\n{indent}for (int u = 0; u < {per_warp}; ++u) {{\n"
            f"{indent}  const int unit = warp + u * DW_WARPS;\n"
            f"{indent}  if (unit < {units}) {{\n"
            f"{indent}    const int m0 = (unit / {groups}) * 16, n0 = (unit % {groups}) * {8 * g};\n"
            f"{indent}    const int ntiles = fmlp::cmin({g}, ({layer.in_padded} - n0) / 8);\n"
            f"{indent}    {body}\n"
            f"{indent}  }}\n{indent}}}\n")


def _resident_dw_kernel(spec: MlpSpec, cfg: Config) -> str:
    """bwd_dw_kernel: the resident backward with the weight gradients inside (no dz to global).
    CTAs of DW_WARPS warps take DW_WARPS * BM-row tiles of a grid-stride loop; per layer (last
    first) each warp: dz = g * act'(.) (from the a_l tile already in shared memory where the
    derivative comes from the output), a barrier, cp.async of a_(l-1) (x for the first layer)
    into its a tile while it computes g = dz . W_l, a barrier, then every warp its units of
    dW_l over all the CTA's rows; a barrier ends the tile.  Each CTA writes its dW partials at
    the end."""
    layers, L = spec.layers, len(spec.layers)
    k0, nl = spec.in_features, spec.out_features
    total = sum(rows * stride for _, rows, stride in cfg.resident)
    tile = {"t0": "0", "t1": "BM * SA", "ta": "2 * BM * SA"}
    out = ["""
__global__ void __launch_bounds__(DW_WARPS * 32, DW_WARPS == 4 ? 2 : 1) bwd_dw_kernel(const BwdDwParams p) {
  extern __shared__ __align__(16) unsigned char smem[];
  T* wres = reinterpret_cast<T*>(smem);
"""]
    for i, (l, (off, rows, stride)) in enumerate(zip(layers, cfg.resident)):
        out.append(f"  fmlp::load_w_resident<T, {l.in_features}, {l.out_features}, {rows}, {stride - 8}, {stride}, "
                   f"DW_WARPS * 32>(wres + {off}, p.w[{i}]);\n")
    out.append(f"""  fmlp::cp_commit();
  fmlp::cp_wait<0>();
  __syncthreads();
  constexpr int WSTRIDE = 3 * BM * SA;  // one warp's three tiles
  const int warp = threadIdx.x / 32, lane = threadIdx.x & 31;
  T* tiles = wres + {total};
  T* t0 = tiles + warp * WSTRIDE;
  T* t1 = t0 + BM * SA;
  T* ta = t1 + BM * SA;
""")
    for i, (g, units, per_warp) in enumerate(cfg.dw_units):
        out.append(f"  float dw{i}[{per_warp}][{g}][4];  // layer {i}: {units} units of 16 x {8 * g}\n")
    out.append("""#pragma unroll
  for (int e = 0; e < 4; ++e) {
""")
    for i, (g, units, per_warp) in enumerate(cfg.dw_units):
        out.append(f"    for (int u = 0; u < {per_warp}; ++u)\n"
                   f"      for (int j = 0; j < {g}; ++j) dw{i}[u][j][e] = 0.0f;\n")
    out.append(f"""  }}
  const int64_t ctiles = (p.M + DW_WARPS * BM - 1) / (DW_WARPS * BM);
#pragma unroll 1
  for (int64_t ct = blockIdx.x; ct < ctiles; ct += gridDim.x) {{
    const int64_t wrow0 = (ct * DW_WARPS + warp) * BM;
    fmlp::load_rows<T, BM, {nl}, fmlp::pad16(fmlp::pad8({nl})), SA, 32>(t0, p.dy, wrow0, p.M, lane);
    __syncwarp();
""")
    cur, nxt = "t0", "t1"
    for i in reversed(range(L)):
        l = layers[i]
        g = cfg.dw_units[i][0]
        if spec.saves_pre_activation(i):
            out.append(f"    fmlp::bwd_act_rows<T, Act{i}, {l.out_features}, MT, SA, false, {l.out_padded}, false>"
                       f"({cur}, p.z[{i}] + wrow0 * {l.out_padded}, nullptr, wrow0, p.M);\n")
        else:  # a_i is in ta: layer i + 1's weight gradient loaded it
            out.append(f"    fmlp::bwd_act_rows<T, Act{i}, {l.out_features}, MT, SA, true, SA, false>"
                       f"({cur}, ta, nullptr, wrow0, p.M);\n")
        if l.bias:
            out.append(f"    fmlp::bwd_bias_partial<T, {l.out_features}, MT, SA, DB_STRIDE>({cur}, p.db[{i}], wrow0, p.M);\n")
        src, cols = ("p.x", k0) if i == 0 else (f"p.a[{i - 1}]", l.in_padded)
        out.append(f"    __syncthreads();  // every warp is done with the tiles of layer {i + 1}'s dW\n"
                   f"    fmlp::warp_load_rows_async<T, BM, {cols}, fmlp::pad16({l.in_padded}), SA>"
                   f"(ta, {src}, wrow0, p.M);\n    fmlp::cp_commit();\n")
        out.append(_resident_bwd_gemm(cfg, l, i, cur, nxt, k0, inplace=False))
        out.append("    fmlp::cp_wait<0>();\n    __syncthreads();\n")
        out.append(_dw_units_loop(l, cfg.dw_units[i], "    ",
                                  f"fmlp::dw_unit<T, {g}, MT, DW_WARPS, SA, WSTRIDE>(dw{i}[u], tiles + {tile[cur]}, "
                                  f"tiles + {tile['ta']}, m0, n0, ntiles);"))
        cur, nxt = nxt, cur
    out.append("""    __syncthreads();  // the next tile's dy goes into t0, which other warps may still be reading
  }
  // this CTA's partials: p.dw[l] + blockIdx.x * DW_STRIDE (every layer's in one row per CTA)
""")
    for i, l in enumerate(layers):
        g = cfg.dw_units[i][0]
        out.append(_dw_units_loop(l, cfg.dw_units[i], "  ", f"fmlp::dw_store<{g}, {l.out_features}, {l.in_features}>("
                                  f"dw{i}[u], p.dw[{i}] + (int64_t)blockIdx.x * DW_STRIDE, "
                                  f"m0, n0, ntiles);"))
    out.append("}\n")
    return "".join(out)


# The kernels' parameters from the host entry points' arguments (the CUDA host side below and
# the CPU emulator's harness, tests/cuda_emulator/mlp_harness.cpp, both build them here).
PARAMS = """
static inline FwdParams fwd_params(const void* x, void* y, const void* const* w, const void* const* b, void* const* z,
                                   void* const* a, long long M, int save) {
  FwdParams p;
  p.x = static_cast<const T*>(x);
  p.y = static_cast<T*>(y);
  p.M = M;
  for (int i = 0; i < L; ++i) {
    p.w[i] = static_cast<const T*>(w[i]);
    p.b[i] = static_cast<const T*>(b[i]);
    p.z[i] = save ? static_cast<T*>(z[i]) : nullptr;
    p.a[i] = save ? static_cast<T*>(a[i]) : nullptr;
  }
  return p;
}

static inline BwdParams bwd_params(const void* dy, void* dx, const void* const* z, const void* const* w,
                                   void* const* dz, void* const* db, long long M) {
  BwdParams p;
  p.dy = static_cast<const T*>(dy);
  p.dx = static_cast<T*>(dx);
  p.M = M;
  for (int i = 0; i < L; ++i) {
    p.z[i] = static_cast<const T*>(z[i]);
    p.w[i] = static_cast<const T*>(w[i]);
    p.dz[i] = static_cast<T*>(dz[i]);
    p.db[i] = static_cast<float*>(db[i]);
  }
  return p;
}

static inline BwdDwParams bwd_dw_params(const void* dy, void* dx, const void* x, const void* const* z,
                                        const void* const* a, const void* const* w, void* const* dw, void* const* db,
                                        long long M) {
  BwdDwParams p;
  p.dy = static_cast<const T*>(dy);
  p.dx = static_cast<T*>(dx);
  p.x = static_cast<const T*>(x);
  p.M = M;
  for (int i = 0; i < L; ++i) {
    p.z[i] = static_cast<const T*>(z[i]);
    p.a[i] = static_cast<const T*>(a[i]);
    p.w[i] = static_cast<const T*>(w[i]);
    p.dw[i] = static_cast<float*>(dw[i]);
    p.db[i] = static_cast<float*>(db[i]);
  }
  return p;
}
"""


DW_HOST = """
// The fused weight-gradient backward (bwd_dw_kernel): its grid for M rows (the host sizes the
// dW partials by it), and the launch.  dw[l]: layer l's block in a (ctas, DW_STRIDE) float32
// buffer (partial_layout); a[l]: layer l's saved activation (l < L - 1); db as fmlp_bwd.
static int dw_grid(int device, long long M, unsigned* grid) {
  int sms = 0, per_sm = 0;
  int e = (int)cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device);
  if (e) return e;
  e = (int)cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, bwd_dw_kernel, DW_WARPS * 32, SMEM_DW);
  if (e) return e;
  const long long ctas = (M + DW_WARPS * BM - 1) / (DW_WARPS * BM), most = (long long)sms * (per_sm > 0 ? per_sm : 1);
  *grid = (unsigned)(ctas < most ? ctas : most);
  return 0;
}

extern "C" int fmlp_bwd_dw_ctas(int device, long long M, long long* ctas) {
  *ctas = 0;
  if (M <= 0) return 0;
  int e = ensure_device(device);
  if (e) return e;
  unsigned grid = 0;
  e = dw_grid(device, M, &grid);
  *ctas = grid;
  return e;
}

extern "C" int fmlp_bwd_dw(int device, const void* dy, void* dx, const void* x, const void* const* z,
                           const void* const* a, const void* const* w, void* const* dw, void* const* db, long long M,
                           void* stream) {
  if (M <= 0) return 0;
  int e = ensure_device(device);
  if (e) return e;
  const BwdDwParams p = bwd_dw_params(dy, dx, x, z, a, w, dw, db, M);
  unsigned grid = 0;
  e = dw_grid(device, M, &grid);
  if (e) return e;
  bwd_dw_kernel<<<grid, DW_WARPS * 32, SMEM_DW, static_cast<cudaStream_t>(stream)>>>(p);
  return (int)cudaGetLastError();
}
"""


# The end of the kernels' namespace: where the device-only source (emit's device_only) ends.
DEVICE_END = """
}  // namespace fmlp_model
"""


def partial_layout(spec: MlpSpec) -> tuple[tuple, int, tuple, int]:
    """Where the backward's float32 partials go: the bias gradients' (one row per warp tile) as
    per layer its first column in a row of ``db_stride`` (pad8(out) columns each; None for a
    layer without bias), and the fused weight gradients' (one row per CTA) as per layer the
    offset of its (out x in) block in a row of ``dw_stride``.  One buffer each, so the host
    sums every layer's partials with one reduction: (db_offsets, db_stride, dw_offsets,
    dw_stride)."""
    db_offsets, db_stride, dw_offsets, dw_stride = [], 0, [], 0
    for l in spec.layers:
        db_offsets.append(db_stride if l.bias else None)
        db_stride += l.out_padded if l.bias else 0
        dw_offsets.append(dw_stride)
        dw_stride += l.out_features * l.in_features
    return tuple(db_offsets), db_stride, tuple(dw_offsets), dw_stride


def emit(spec: MlpSpec, dtype: str, smem_limit: int, resident: bool = True,
         inplace: bool = False, device_only: bool = False) -> tuple[str, Config]:
    """The CUDA source for ``spec`` in ``dtype`` ("float16" or "bfloat16") and its config
    (``resident=False``: streamed weights even where they would fit; ``inplace``: see
    choose_config).  ``device_only``: the same text up to the end of the kernels (closing
    their namespace) less the host helpers (PARAMS) and the host side, for NVRTC
    (cutlass_ops.mlp_nvrtc), which launches ``fmlp_model::fwd_kernel<true>`` etc. itself; the
    full source (nvcc's, and the one every cache and ahead-of-time key hashes) is unchanged by
    it."""
    if dtype not in CTYPES:
        raise ValueError(f"FusedMLP kernels exist for float16 and bfloat16, not {dtype}")
    cfg = choose_config(spec, smem_limit, resident, inplace)
    _, db_stride, _, dw_stride = partial_layout(spec)
    layers = spec.layers
    L = len(layers)
    out = [f"// FusedMLP kernel generated by cutlass_ops_gen.mlp_emit (version {EMITTER_VERSION})\n"
           f"// structure: {spec.structure_key()}\n// dtype: {dtype}\n",
           KERNEL_HEADER.read_text(),
           "\nnamespace fmlp_model {\n",
           f"typedef {CTYPES[dtype]} T;\n"]
    out += [_act_struct(i, l) for i, l in enumerate(layers)]
    out.append(f"""
constexpr int L = {L}, MT = {cfg.mt}, BM = {cfg.bm}, NC = {cfg.nc}, SA = {cfg.sa};
constexpr int SWF = {cfg.sw_fwd}, NCF = {cfg.nc_fwd}, SWB = {cfg.sw_bwd}, JGB = {cfg.jg_bwd};
constexpr int SMEM_FWD = {cfg.smem_fwd}, SMEM_BWD = {cfg.smem_bwd};
constexpr int RESIDENT_WARPS = {cfg.resident_warps};
constexpr int THREADS = RESIDENT_WARPS ? RESIDENT_WARPS * 32 : FMLP_THREADS;
constexpr int DW_WARPS = {cfg.dw_warps}, SMEM_DW = {cfg.smem_dw};
// row strides (float32 elements) of the bias-gradient partials (per warp tile) and the dW
// partials (per CTA): every layer's in one buffer (partial_layout)
constexpr int DB_STRIDE = {max(db_stride, 1)}, DW_STRIDE = {max(dw_stride, 1)};

struct FwdParams {{ const T* x; T* y; const T* w[L]; const T* b[L]; T* z[L]; T* a[L]; long long M; }};
// z[i]: layer i's saved pre-activation, or its saved activation where the backward takes the
// derivative from the output (spec.saves_pre_activation(i) false: bwd_act<..., FROM_OUT>)
struct BwdParams {{ const T* dy; T* dx; const T* z[L]; const T* w[L]; T* dz[L]; float* db[L]; long long M; }};
struct BwdDwParams {{ const T* dy; T* dx; const T* x; const T* z[L]; const T* a[L]; const T* w[L]; float* dw[L];
                      float* db[L]; long long M; }};
""")
    if not device_only:  # host helpers (NVRTC's caller fills the structs itself)
        out.append(PARAMS)
    out.append(_resident_kernels(spec, cfg) if cfg.resident_warps else _streamed_kernels(spec, cfg))
    if cfg.dw_warps:
        out.append(_resident_dw_kernel(spec, cfg))
    if device_only:
        out.append(DEVICE_END)
        return "".join(out), cfg
    host = DEVICE_END + """
using namespace fmlp_model;

#ifndef FMLP_EMULATE  // the CUDA host side (tests/cuda_emulator launches the kernels on the CPU itself)
static int ensure_device(int device) {
  int cur = -1;
  cudaError_t e = cudaGetDevice(&cur);
  if (e != cudaSuccess) return (int)e;
  if (cur != device) e = cudaSetDevice(device);
  return (int)e;
}

extern "C" int fmlp_init(int device) {
  int e = ensure_device(device);
  if (e) return e;
  e = (int)cudaFuncSetAttribute(fwd_kernel<false>, cudaFuncAttributeMaxDynamicSharedMemorySize, SMEM_FWD);
  if (e) return e;
  e = (int)cudaFuncSetAttribute(fwd_kernel<true>, cudaFuncAttributeMaxDynamicSharedMemorySize, SMEM_FWD);
  if (e) return e;
  e = (int)cudaFuncSetAttribute(bwd_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, SMEM_BWD);
  if (e) return e;
@DW_INIT@  return 0;
}

extern "C" const char* fmlp_error(int e) { return cudaGetErrorString((cudaError_t)e); }

// Streamed: one CTA per BM rows.  Resident: as many CTAs as fit on the GPU at once (the
// weight load is per CTA), or fewer where the warps' BM-row tiles are fewer.
template <class Kernel>
static int grid_size(Kernel kernel, int smem, int device, long long M, unsigned* grid) {
  const long long tiles = (M + BM - 1) / BM;
  if (!RESIDENT_WARPS) {
    *grid = (unsigned)tiles;
    return 0;
  }
  int sms = 0, per_sm = 0;
  int e = (int)cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device);
  if (e) return e;
  e = (int)cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, THREADS, smem);
  if (e) return e;
  constexpr long long warps = RESIDENT_WARPS > 0 ? RESIDENT_WARPS : 1;  // (streamed returned above)
  const long long ctas = (tiles + warps - 1) / warps, most = (long long)sms * (per_sm > 0 ? per_sm : 1);
  *grid = (unsigned)(ctas < most ? ctas : most);
  return 0;
}

extern "C" int fmlp_fwd(int device, const void* x, void* y, const void* const* w, const void* const* b,
                        void* const* z, void* const* a, long long M, int save, void* stream) {
  if (M <= 0) return 0;
  int e = ensure_device(device);
  if (e) return e;
  const FwdParams p = fwd_params(x, y, w, b, z, a, M, save);
  unsigned grid = 0;
  e = save ? grid_size(fwd_kernel<true>, SMEM_FWD, device, M, &grid) : grid_size(fwd_kernel<false>, SMEM_FWD, device, M, &grid);
  if (e) return e;
  if (save)
    fwd_kernel<true><<<grid, THREADS, SMEM_FWD, static_cast<cudaStream_t>(stream)>>>(p);
  else
    fwd_kernel<false><<<grid, THREADS, SMEM_FWD, static_cast<cudaStream_t>(stream)>>>(p);
  return (int)cudaGetLastError();
}

// db[i]: layer i's first column in a (tiles, DB_STRIDE) float32 buffer (tiles = ceil(M / (16 *
// MT))) for a layer with bias: each warp tile's column sums of dz; null for a layer without.
extern "C" int fmlp_bwd(int device, const void* dy, void* dx, const void* const* z, const void* const* w,
                        void* const* dz, void* const* db, long long M, void* stream) {
  if (M <= 0) return 0;
  int e = ensure_device(device);
  if (e) return e;
  const BwdParams p = bwd_params(dy, dx, z, w, dz, db, M);
  unsigned grid = 0;
  e = grid_size(bwd_kernel, SMEM_BWD, device, M, &grid);
  if (e) return e;
  bwd_kernel<<<grid, THREADS, SMEM_BWD, static_cast<cudaStream_t>(stream)>>>(p);
  return (int)cudaGetLastError();
}
"""
    dw_init = ("  e = (int)cudaFuncSetAttribute(bwd_dw_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, SMEM_DW);\n"
               "  if (e) return e;\n")
    out.append(host.replace("@DW_INIT@", dw_init if cfg.dw_warps else ""))
    if cfg.dw_warps:
        out.append(DW_HOST)
    out.append("#endif  // FMLP_EMULATE\n")
    return "".join(out), cfg


# Each arch's opt-in shared-memory limit per block (the value torch reports as
# shared_memory_per_block_optin): what an ahead-of-time build emits for (mlp_aot).
SMEM_LIMIT = {"80": 166912, "86": 101376, "87": 166912, "89": 101376, "90": 232448}


def aot_key(source: str, arch: str) -> str:
    """The name of an ahead-of-time kernel's folder (cutlass_ops/mlp_aot/<key>/fused_mlp.so):
    the generated source (structure, dtype, tile config) and the arch; the runtime computes it
    from the source it would compile, so a build-time kernel is found exactly when it is the
    same code."""
    ident = {"source_sha256": hashlib.sha256(source.encode()).hexdigest(), "arch": arch,
             "emitter": EMITTER_VERSION}
    return hashlib.sha256(json.dumps(ident, sort_keys=True).encode()).hexdigest()[:24]


def nvcc_command(nvcc: str, source: str, output: str, arch: str, verbose_ptxas: bool = False) -> list[str]:
    """The nvcc command that builds ``source`` into the shared library ``output`` for ``arch``
    ("80", "86", "90", "90a", ...).  The CUDA runtime is linked shared: in a torch process the
    library then uses torch's already loaded libcudart (one runtime, one current device)."""
    num = arch.rstrip("a")
    cmd = [nvcc, "-O3", "-std=c++17", "-shared", "-Xcompiler", "-fPIC", "-cudart", "shared",
           "-lineinfo", f"-gencode=arch=compute_{arch},code=sm_{arch}", "-o", output, source]
    if not arch.endswith("a"):
        cmd[-3:-3] = [f"-gencode=arch=compute_{num},code=compute_{num}"]  # PTX for newer GPUs
    if verbose_ptxas:
        cmd[1:1] = ["-Xptxas", "-v"]
    return cmd
