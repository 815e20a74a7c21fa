// FusedMLP kernel building blocks.  mlp_emit.py pastes this file, unchanged, at the
// top of each generated source and then instantiates it for one model (widths, bias, activation
// functors) and one dtype.  No CUTLASS and no torch headers: warp-level tensor-core MMA through
// inline PTX (ldmatrix + mma.sync.m16n8k16, fp32 accumulators; sm_80 and newer, sm_90 included),
// so a model compiles in seconds.
//
// Two kernel shapes share these pieces (mlp_emit.py picks one per model):
// - streamed weights: one CTA of FMLP_THREADS threads (4 warps) owns BM = 64 * MT rows; warp w
//   owns rows [16*MT*w, 16*MT*(w+1)).  A layer's weight streams through shared memory in chunks
//   of NC output columns (double-buffered cp.async), which all warps share (block barriers).
// - resident weights, where every layer's weight fits beside the warps' tiles: each CTA (4-16
//   warps, as many CTAs as fit on the GPU) loads all weights once; each warp then runs 16*MT-row
//   tiles of a grid-stride loop on its own, with no block barrier (fwd_layer_resident,
//   bwd_gemm_resident).
// Activations live in shared memory (two buffers, one layer's input and its output), each warp
// reading and writing only its own rows, so between layers a warp needs no block barrier.
// Widths are padded to multiples of 8 (the spec's padding) and, as a GEMM reduction length, to
// multiples of 16: padded weight rows and columns are zero-filled while loading, padded
// activation columns are written as zeros.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stdint.h>

#define FMLP_THREADS 128
#define FMLP_WARPS 4

namespace fmlp {

__host__ __device__ constexpr int pad8(int v) { return (v + 7) / 8 * 8; }
__host__ __device__ constexpr int pad16(int v) { return (v + 15) / 16 * 16; }
__host__ __device__ constexpr int cmin(int a, int b) { return a < b ? a : b; }

// ---------------------------------------------------------------------------------------------
// PTX wrappers: the only inline assembly.  FMLP_EMULATE (tests/cuda_emulator) swaps in CPU
// versions of these warp-collective instructions, so the same kernels run on the CPU there.
// ---------------------------------------------------------------------------------------------
#ifdef FMLP_EMULATE
#include "fmlp_emulate.h"
#else
__device__ __forceinline__ void mma_f16(float* c, const uint32_t* a, const uint32_t* b) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}
__device__ __forceinline__ void mma_bf16(float* c, const uint32_t* a, const uint32_t* b) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}
__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}
__device__ __forceinline__ void ldsm_x4(uint32_t* r, const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(smem_addr(p)));
}
__device__ __forceinline__ void ldsm_x2(uint32_t* r, const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0,%1}, [%2];\n"
               : "=r"(r[0]), "=r"(r[1]) : "r"(smem_addr(p)));
}
__device__ __forceinline__ void ldsm_x4_t(uint32_t* r, const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(smem_addr(p)));
}
__device__ __forceinline__ void ldsm_x2_t(uint32_t* r, const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x2.trans.shared.b16 {%0,%1}, [%2];\n"
               : "=r"(r[0]), "=r"(r[1]) : "r"(smem_addr(p)));
}
__device__ __forceinline__ void cp_async16(void* smem, const void* gmem) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(smem_addr(smem)), "l"(gmem));
}
__device__ __forceinline__ void cp_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N> __device__ __forceinline__ void cp_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}
#endif  // FMLP_EMULATE

// ---------------------------------------------------------------------------------------------
// dtype traits: the mma instruction and conversions
// ---------------------------------------------------------------------------------------------
template <class T> struct Traits;

template <> struct Traits<__half> {
  static __device__ __forceinline__ void mma(float* c, const uint32_t* a, const uint32_t* b) { mma_f16(c, a, b); }
  static __device__ __forceinline__ uint32_t pack(float lo, float hi) {
    __half2 h = __floats2half2_rn(lo, hi);
    return *reinterpret_cast<uint32_t*>(&h);
  }
  static __device__ __forceinline__ float2 unpack(uint32_t v) {
    return __half22float2(*reinterpret_cast<__half2*>(&v));
  }
  static __device__ __forceinline__ float to_float(__half v) { return __half2float(v); }
  static __device__ __forceinline__ __half from_float(float v) { return __float2half_rn(v); }
};

template <> struct Traits<__nv_bfloat16> {
  static __device__ __forceinline__ void mma(float* c, const uint32_t* a, const uint32_t* b) { mma_bf16(c, a, b); }
  static __device__ __forceinline__ uint32_t pack(float lo, float hi) {
    __nv_bfloat162 h = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<uint32_t*>(&h);
  }
  static __device__ __forceinline__ float2 unpack(uint32_t v) {
    return __bfloat1622float2(*reinterpret_cast<__nv_bfloat162*>(&v));
  }
  static __device__ __forceinline__ float to_float(__nv_bfloat16 v) { return __bfloat162float(v); }
  static __device__ __forceinline__ __nv_bfloat16 from_float(float v) { return __float2bfloat16_rn(v); }
};

template <class T> __device__ __forceinline__ T zero() { return Traits<T>::from_float(0.0f); }

// ---------------------------------------------------------------------------------------------
// Global <-> shared tiles
// ---------------------------------------------------------------------------------------------

// rows [row0, row0 + BM) x columns [0, COLS) of a row-major (M x COLS) global matrix into a
// shared tile of stride S, columns [COLS, CG) zero, rows >= M zero, by NT threads (`tid` of them:
// the CTA, or one warp's lanes).  Vector loads need COLS % 8 == 0 and a 16-byte aligned base (the
// host side guarantees it).
template <class T, int BM, int COLS, int CG, int S, int NT = FMLP_THREADS>
__device__ __forceinline__ void load_rows(T* dst, const T* __restrict__ src, int64_t row0, int64_t M,
                                          int tid = -1) {
  if (tid < 0) tid = threadIdx.x;
  if constexpr (COLS % 8 == 0) {
    constexpr int V = CG / 8;
    for (int i = tid; i < BM * V; i += NT) {
      const int r = i / V, c = (i % V) * 8;
      const int64_t g = row0 + r;
      uint4* d = reinterpret_cast<uint4*>(dst + r * S + c);
      if (g < M && c < COLS)
        *d = *reinterpret_cast<const uint4*>(src + g * COLS + c);
      else
        *d = make_uint4(0, 0, 0, 0);
    }
  } else {
    for (int i = tid; i < BM * CG; i += NT) {
      const int r = i / CG, c = i % CG;
      const int64_t g = row0 + r;
      dst[r * S + c] = (g < M && c < COLS) ? src[g * COLS + c] : zero<T>();
    }
  }
}

// the shared tile's rows [0, min(BM, M - row0)) x columns [0, COLS) to global (row stride COLS),
// by NT threads as load_rows
template <class T, int BM, int COLS, int S, int NT = FMLP_THREADS>
__device__ __forceinline__ void store_rows(T* __restrict__ dst, const T* src, int64_t row0, int64_t M,
                                           int tid = -1) {
  if (tid < 0) tid = threadIdx.x;
  if constexpr (COLS % 8 == 0) {
    constexpr int V = COLS / 8;
    for (int i = tid; i < BM * V; i += NT) {
      const int r = i / V, c = (i % V) * 8;
      const int64_t g = row0 + r;
      if (g < M) *reinterpret_cast<uint4*>(dst + g * COLS + c) = *reinterpret_cast<const uint4*>(src + r * S + c);
    }
  } else {
    for (int i = tid; i < BM * COLS; i += NT) {
      const int r = i / COLS, c = i % COLS;
      const int64_t g = row0 + r;
      if (g < M) dst[g * COLS + c] = src[r * S + c];
    }
  }
}

// Forward weight chunk: W is (N x K) row-major (nn.Linear).  ws[r][k] = W[n0 + r][k] for
// r < NC, k < KG; zero where n0 + r >= N or k >= K; by the CTA's NT threads.
template <class T, int K, int KG, int N, int NC, int SW, int NT = FMLP_THREADS>
__device__ __forceinline__ void load_w_nk(T* ws, const T* __restrict__ W, int n0) {
  if constexpr (K % 8 == 0) {
    constexpr int V = KG / 8;
    for (int i = threadIdx.x; i < NC * V; i += NT) {
      const int r = i / V, k = (i % V) * 8, n = n0 + r;
      T* d = ws + r * SW + k;
      if (n < N && k < K)
        cp_async16(d, W + (int64_t)n * K + k);
      else
        *reinterpret_cast<uint4*>(d) = make_uint4(0, 0, 0, 0);
    }
  } else {
    for (int i = threadIdx.x; i < NC * KG; i += NT) {
      const int r = i / KG, k = i % KG, n = n0 + r;
      ws[r * SW + k] = (n < N && k < K) ? W[(int64_t)n * K + k] : zero<T>();
    }
  }
}

// Backward weight chunk: the GEMM dA = dZ . W reduces over W's rows.  ws[j][c] = W[j][i0 + c]
// for j < JG, c < NC; zero where j >= N or i0 + c >= K.
template <class T, int K, int N, int JG, int NC, int SW>
__device__ __forceinline__ void load_w_kn(T* ws, const T* __restrict__ W, int i0) {
  if constexpr (K % 8 == 0) {
    constexpr int V = NC / 8;
    for (int i = threadIdx.x; i < JG * V; i += FMLP_THREADS) {
      const int j = i / V, c = (i % V) * 8;
      T* d = ws + j * SW + c;
      if (j < N && i0 + c < K)
        cp_async16(d, W + (int64_t)j * K + i0 + c);
      else
        *reinterpret_cast<uint4*>(d) = make_uint4(0, 0, 0, 0);
    }
  } else {
    for (int i = threadIdx.x; i < JG * NC; i += FMLP_THREADS) {
      const int j = i / NC, c = i % NC;
      ws[j * SW + c] = (j < N && i0 + c < K) ? W[(int64_t)j * K + i0 + c] : zero<T>();
    }
  }
}

// Resident weight: W (N x K, row-major) whole into ws (R rows, row stride SW): ws[n][k] = W[n][k]
// for n < N, k < K, zero for the rest of R rows x CW columns (the chunks of the forward and the
// backward GEMMs read up to there), by all NT threads of the CTA: one chunk of R rows.
template <class T, int K, int N, int R, int CW, int SW, int NT>
__device__ __forceinline__ void load_w_resident(T* ws, const T* __restrict__ W) {
  static_assert(CW % 8 == 0 && SW >= CW && R >= N, "resident weight tile");
  load_w_nk<T, K, CW, N, R, SW, NT>(ws, W, 0);
}

// ---------------------------------------------------------------------------------------------
// Warp GEMM: acc[MT][NC/8] (16x8 tiles) += A (the warp's 16*MT rows, columns [0, KG)) x B.
// TRANS_B = false: B from ws[n][k] (forward, W as stored); true: from ws[k][n] (backward).
// Only the first `ntiles` n8 tiles are computed (uniform across the warp).
// ---------------------------------------------------------------------------------------------

// one k16 step: acc += af (the A fragments of columns [k0, k0 + 16)) x B's rows k0..k0+15
template <class T, int MT, int NC, int SW, bool TRANS_B>
__device__ __forceinline__ void mma_k16(float (&acc)[MT][NC / 8][4], const uint32_t (&af)[MT][4], const T* ws, int k0,
                                        int ntiles) {
  const int lane = threadIdx.x & 31;
#pragma unroll
  for (int j = 0; j < NC / 8; j += 2) {
    if (j < ntiles) {
      uint32_t bf[4];
      const int m = lane >> 3, r = lane & 7;
      if constexpr (!TRANS_B) {
        if (j + 1 < NC / 8)
          ldsm_x4(bf, ws + (j * 8 + (m >> 1) * 8 + r) * SW + k0 + (m & 1) * 8);
        else
          ldsm_x2(bf, ws + (j * 8 + r) * SW + k0 + (m & 1) * 8);
      } else {
        if (j + 1 < NC / 8)
          ldsm_x4_t(bf, ws + (k0 + (m & 1) * 8 + r) * SW + j * 8 + (m >> 1) * 8);
        else
          ldsm_x2_t(bf, ws + (k0 + (m & 1) * 8 + r) * SW + j * 8);
      }
#pragma unroll
      for (int mt = 0; mt < MT; ++mt) {
        Traits<T>::mma(acc[mt][j], af[mt], bf);
        if (j + 1 < NC / 8) Traits<T>::mma(acc[mt][j + 1], af[mt], bf + 2);
      }
    }
  }
}

template <class T, int MT, int NC>
__device__ __forceinline__ void zero_acc(float (&acc)[MT][NC / 8][4]) {
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int j = 0; j < NC / 8; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[mt][j][e] = 0.0f;
}

// the A fragments of columns [k0, k0 + 16) of the warp's rows (tile stride SA)
template <class T, int MT, int SA>
__device__ __forceinline__ void load_a_k16(uint32_t (&af)[MT][4], const T* a, int k0) {
  const int lane = threadIdx.x & 31;
#pragma unroll
  for (int mt = 0; mt < MT; ++mt) ldsm_x4(af[mt], a + (mt * 16 + (lane & 15)) * SA + k0 + (lane >> 4) * 8);
}

// A from shared memory, k16 step by k16 step
template <class T, int MT, int NC, int KG, int SA, int SW, bool TRANS_B>
__device__ __forceinline__ void warp_gemm(float (&acc)[MT][NC / 8][4], const T* a, const T* ws, int ntiles) {
  zero_acc<T, MT, NC>(acc);
#pragma unroll 2
  for (int k0 = 0; k0 < KG; k0 += 16) {
    uint32_t af[MT][4];
    load_a_k16<T, MT, SA>(af, a, k0);
    mma_k16<T, MT, NC, SW, TRANS_B>(acc, af, ws, k0, ntiles);
  }
}

// A from registers (load_a_all): the in-place layers, whose output overwrites their input tile
template <class T, int MT, int KG, int SA>
__device__ __forceinline__ void load_a_all(uint32_t (&af)[KG / 16][MT][4], const T* a) {
#pragma unroll
  for (int ks = 0; ks < KG / 16; ++ks) load_a_k16<T, MT, SA>(af[ks], a, ks * 16);
  __syncwarp();  // every lane has read the tile before any lane writes it
}

template <class T, int MT, int NC, int KG, int SW, bool TRANS_B>
__device__ __forceinline__ void warp_gemm_regs(float (&acc)[MT][NC / 8][4], const uint32_t (&af)[KG / 16][MT][4],
                                               const T* ws, int ntiles) {
  zero_acc<T, MT, NC>(acc);
#pragma unroll
  for (int ks = 0; ks < KG / 16; ++ks) mma_k16<T, MT, NC, SW, TRANS_B>(acc, af[ks], ws, ks * 16, ntiles);
}

// zero columns [C0, C1) of the warp's rows (the 16-column GEMM padding of a layer's output)
template <class T, int MT, int C0, int C1, int S>
__device__ __forceinline__ void zero_cols(T* buf) {
  if constexpr (C1 > C0) {
    const int lane = threadIdx.x & 31;
    for (int i = lane; i < 16 * MT * (C1 - C0); i += 32) buf[(i / (C1 - C0)) * S + C0 + i % (C1 - C0)] = zero<T>();
  }
}

// ---------------------------------------------------------------------------------------------
// Forward layer: out = act(in . W^T + b) for the CTA's rows.  in/out point at the warp's first
// row.  SAVE: also write the pre-activation z (when Z_OUT) and the activation (when A_OUT) to
// global (row-major, row stride pad8(N)), rows < M.
// ---------------------------------------------------------------------------------------------

// The epilogue of one column chunk, columns [n0, n0 + 8 * ntiles) of the warp's rows, into its
// out tile: z = acc + b (Z) or act(z).
template <class T, class Act, int N, bool BIAS, bool Z, int MT, int NCL, int SA>
__device__ __forceinline__ void fwd_epilogue(float (&acc)[MT][NCL / 8][4], T* out, const T* __restrict__ bias,
                                             int n0, int ntiles) {
  const int lane = threadIdx.x & 31;
#pragma unroll
  for (int j = 0; j < NCL / 8; ++j) {
    if (j < ntiles) {
      const int col = n0 + j * 8 + 2 * (lane & 3);
      float b0 = 0.0f, b1 = 0.0f;
      if constexpr (BIAS) {
        if (col < N) b0 = Traits<T>::to_float(bias[col]);
        if (col + 1 < N) b1 = Traits<T>::to_float(bias[col + 1]);
      }
#pragma unroll
      for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const int r = mt * 16 + (lane >> 2) + h * 8;
          const float z0 = acc[mt][j][2 * h] + b0, z1 = acc[mt][j][2 * h + 1] + b1;
          uint32_t v;
          if constexpr (Z)
            v = Traits<T>::pack(z0, z1);
          else
            v = Traits<T>::pack(col < N ? Act::f(z0) : 0.0f, col + 1 < N ? Act::f(z1) : 0.0f);
          *reinterpret_cast<uint32_t*>(out + r * SA + col) = v;
        }
    }
  }
}

// Columns [c0, c0 + ncols) (ncols % 8 == 0) of the warp's ROWS-row tile (stride S) to global
// rows row0.. (row stride LD, 16-byte aligned), rows < M: whole 16-byte vectors, so the saved
// tensors are written in full sectors (the epilogue's fragments would write 4-byte pieces of 8
// rows at a time: the width-64 forward with saves took 4.9 ms instead of 0.89 on an H100).
template <class T, int ROWS, int S, int LD>
__device__ __forceinline__ void warp_store_cols(T* __restrict__ dst, const T* src, int c0, int ncols, int64_t row0,
                                                int64_t M) {
  const int lane = threadIdx.x & 31;
  const int v = ncols / 8;
  for (int i = lane; i < ROWS * v; i += 32) {
    const int r = i / v, c = c0 + (i % v) * 8;
    const int64_t g = row0 + r;
    if (g < M) *reinterpret_cast<uint4*>(dst + g * LD + c) = *reinterpret_cast<const uint4*>(src + r * S + c);
  }
}

// One column chunk's output.  Z_OUT: z passes through the out tile first (then written to global
// whole), and act(z) replaces it.
template <class T, class Act, int N, bool BIAS, bool Z_OUT, int MT, int NCL, int SA>
__device__ __forceinline__ void fwd_chunk(float (&acc)[MT][NCL / 8][4], T* out, const T* __restrict__ bias,
                                          T* __restrict__ zsave, int n0, int ntiles, int64_t wrow0, int64_t M) {
  if constexpr (Z_OUT) {
    fwd_epilogue<T, Act, N, BIAS, true, MT, NCL, SA>(acc, out, bias, n0, ntiles);
    __syncwarp();
    warp_store_cols<T, 16 * MT, SA, pad8(N)>(zsave, out, n0, 8 * ntiles, wrow0, M);
    __syncwarp();
  }
  fwd_epilogue<T, Act, N, BIAS, false, MT, NCL, SA>(acc, out, bias, n0, ntiles);
}

// After a layer: its activation (the warp's out tile, padded columns zero) to global.
template <class T, int N, bool SAVE, bool A_OUT, int MT, int SA>
__device__ __forceinline__ void fwd_save_activation(T* __restrict__ asave, const T* out, int64_t wrow0, int64_t M) {
  if constexpr (SAVE && A_OUT) {
    warp_store_cols<T, 16 * MT, SA, pad8(N)>(asave, out, 0, pad8(N), wrow0, M);
    __syncwarp();
  }
}

// Streamed weight: the CTA's warps load each chunk of W together (double-buffered cp.async,
// block barriers); any model size.
template <class T, class Act, int K, int N, bool BIAS, bool SAVE, bool Z_OUT, bool A_OUT, int MT, int NC, int SA,
          int SW>
__device__ __forceinline__ void fwd_layer(const T* in, T* out, T* wb0, T* wb1, const T* __restrict__ W,
                                          const T* __restrict__ bias, T* __restrict__ zsave,
                                          T* __restrict__ asave, int64_t wrow0, int64_t M) {
  constexpr int KG = pad16(K), NP = pad8(N), NCL = cmin(NC, NP), NCH = (NP + NCL - 1) / NCL;
  load_w_nk<T, K, KG, N, NCL, SW>(wb0, W, 0);
  cp_commit();
#pragma unroll 1
  for (int c = 0; c < NCH; ++c) {
    T* cur = (c & 1) ? wb1 : wb0;
    if (c + 1 < NCH) {
      load_w_nk<T, K, KG, N, NCL, SW>((c & 1) ? wb0 : wb1, W, (c + 1) * NCL);
      cp_commit();
      cp_wait<1>();
    } else {
      cp_wait<0>();
    }
    __syncthreads();
    const int n0 = c * NCL;
    const int ntiles = cmin(NCL, NP - n0) / 8;
    float acc[MT][NCL / 8][4];
    warp_gemm<T, MT, NCL, KG, SA, SW, false>(acc, in, cur, ntiles);
    fwd_chunk<T, Act, N, BIAS, SAVE && Z_OUT, MT, NCL, SA>(acc, out, bias, zsave, n0, ntiles, wrow0, M);
    __syncthreads();
  }
  zero_cols<T, MT, NP, pad16(NP), SA>(out);
  __syncwarp();
  fwd_save_activation<T, N, SAVE, A_OUT, MT, SA>(asave, out, wrow0, M);
}

// Resident weight: ws holds the whole W (load_w_resident), so the warp runs on its own: no
// barrier, no copy.  INPLACE: out == in (one tile per warp, where two do not fit beside the
// weights): the input's A fragments go to registers first (KG / 16 x MT x 4 of them).
template <class T, class Act, int K, int N, bool BIAS, bool SAVE, bool Z_OUT, bool A_OUT, int MT, int NC, int SA,
          int SW, bool INPLACE = false>
__device__ __forceinline__ void fwd_layer_resident(const T* in, T* out, const T* ws, const T* __restrict__ bias,
                                                   T* __restrict__ zsave, T* __restrict__ asave, int64_t wrow0,
                                                   int64_t M) {
  constexpr int KG = pad16(K), NP = pad8(N), NCL = cmin(NC, NP), NCH = (NP + NCL - 1) / NCL;
  if constexpr (INPLACE) {
    uint32_t af[KG / 16][MT][4];
    load_a_all<T, MT, KG, SA>(af, in);
#pragma unroll 1
    for (int c = 0; c < NCH; ++c) {
      const int n0 = c * NCL;
      const int ntiles = cmin(NCL, NP - n0) / 8;
      float acc[MT][NCL / 8][4];
      warp_gemm_regs<T, MT, NCL, KG, SW, false>(acc, af, ws + n0 * SW, ntiles);
      fwd_chunk<T, Act, N, BIAS, SAVE && Z_OUT, MT, NCL, SA>(acc, out, bias, zsave, n0, ntiles, wrow0, M);
    }
  } else {
#pragma unroll 1
    for (int c = 0; c < NCH; ++c) {
      const int n0 = c * NCL;
      const int ntiles = cmin(NCL, NP - n0) / 8;
      float acc[MT][NCL / 8][4];
      warp_gemm<T, MT, NCL, KG, SA, SW, false>(acc, in, ws + n0 * SW, ntiles);
      fwd_chunk<T, Act, N, BIAS, SAVE && Z_OUT, MT, NCL, SA>(acc, out, bias, zsave, n0, ntiles, wrow0, M);
    }
  }
  zero_cols<T, MT, NP, pad16(NP), SA>(out);
  __syncwarp();
  fwd_save_activation<T, N, SAVE, A_OUT, MT, SA>(asave, out, wrow0, M);
}

// ---------------------------------------------------------------------------------------------
// Backward, elementwise: g = g * act'(z) on the warp's rows, columns [0, pad8(N)) (zero for
// columns >= N and rows >= M); writes dz = g to global (row stride pad8(N)); zeroes the GEMM
// padding columns up to pad16.  FROM_OUT: z points at the saved activation y instead, and the
// derivative is Act::dfy(y) (activations whose output determines it: ReLU, tanh, ...).
// ---------------------------------------------------------------------------------------------

// The general form: zr points at the warp's first row of z (or y) with row stride ZS (global, or
// a shared tile); DZ_OUT: also write dz to global (dzr: the warp's first row, stride pad8(N)).
template <class T, class Act, int N, int MT, int SG, bool FROM_OUT, int ZS, bool DZ_OUT, int LB = 4>
__device__ __forceinline__ void bwd_act_rows(T* g, const T* zr, T* __restrict__ dzr, int64_t wrow0, int64_t M) {
  constexpr int NP = pad8(N), V = NP / 8, ITEMS = 16 * MT * V, PER_LANE = (ITEMS + 31) / 32;
  // z's 16-byte vectors are loaded in batches of B (up to LB: 4 registers each) before any is
  // used: one round trip to global memory per batch rather than per vector (the stores below
  // keep the compiler from hoisting later loads above them; on an H100 the streamed 32-128x6-16
  // backward took 5.97 ms one vector at a time, 4.01 in batches of 4).
  constexpr int B = PER_LANE < LB ? PER_LANE : LB;
  const int lane = threadIdx.x & 31;
#pragma unroll 1
  for (int i0 = 0; i0 < PER_LANE; i0 += B) {
    uint4 zb[B];
#pragma unroll
    for (int b = 0; b < B; ++b) {
      const int i = lane + (i0 + b) * 32, r = i / V, c = (i % V) * 8;
      zb[b] = make_uint4(0, 0, 0, 0);
      if (i0 + b < PER_LANE && i < ITEMS && wrow0 + r < M)
        zb[b] = *reinterpret_cast<const uint4*>(zr + (int64_t)r * ZS + c);
    }
#pragma unroll
    for (int b = 0; b < B; ++b) {
      const int i = lane + (i0 + b) * 32, r = i / V, c = (i % V) * 8;
      if (i0 + b >= PER_LANE || i >= ITEMS) continue;
      uint4* gp = reinterpret_cast<uint4*>(g + r * SG + c);
      uint4 out = make_uint4(0, 0, 0, 0);
      if (wrow0 + r < M) {
        const uint4 gv = *gp;
        const uint32_t* gw = reinterpret_cast<const uint32_t*>(&gv);
        const uint32_t* zw = reinterpret_cast<const uint32_t*>(&zb[b]);
        uint32_t* ow = reinterpret_cast<uint32_t*>(&out);
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const float2 gf = Traits<T>::unpack(gw[e]), zf = Traits<T>::unpack(zw[e]);
          const int col = c + 2 * e;
          float d0 = 0.0f, d1 = 0.0f;
          if constexpr (FROM_OUT) {
            if (col < N) d0 = gf.x * Act::dfy(zf.x);
            if (col + 1 < N) d1 = gf.y * Act::dfy(zf.y);
          } else {
            if (col < N) d0 = gf.x * Act::df(zf.x);
            if (col + 1 < N) d1 = gf.y * Act::df(zf.y);
          }
          ow[e] = Traits<T>::pack(d0, d1);
        }
        if constexpr (DZ_OUT) *reinterpret_cast<uint4*>(dzr + (int64_t)r * NP + c) = out;
      }
      *gp = out;
    }
  }
  zero_cols<T, MT, NP, pad16(NP), SG>(g);
  __syncwarp();
}

// z and dz in global memory, indexed by absolute row (the kernels without fused weight gradients)
template <class T, class Act, int N, int MT, int SG, bool FROM_OUT = false, int LB = 4>
__device__ __forceinline__ void bwd_act(T* g, const T* __restrict__ z, T* __restrict__ dz, int64_t wrow0, int64_t M) {
  constexpr int NP = pad8(N);
  bwd_act_rows<T, Act, N, MT, SG, FROM_OUT, NP, true, LB>(g, z + wrow0 * NP, dz + wrow0 * NP, wrow0, M);
}

// The bias gradient's share of the warp's tile: column sums of dz (in g, rows >= M zero) over its
// 16*MT rows, in float32, into part[tile * PSTRIDE + c] (tile = the tile's index; tiles =
// ceil(M / (16*MT)): a streamed CTA's warps past M write nothing).  Every layer's partials share
// one (tiles, PSTRIDE) buffer, part pointing at the layer's first column, so that the host sums
// all layers' tiles with one reduction.  Lanes read consecutive columns of one row: no bank
// conflict.
template <class T, int N, int MT, int SG, int PSTRIDE>
__device__ __forceinline__ void bwd_bias_partial(const T* g, float* __restrict__ part, int64_t wrow0, int64_t M) {
  constexpr int NP = pad8(N);
  const int lane = threadIdx.x & 31;
  if (wrow0 >= M) return;
  const int64_t tile = wrow0 / (16 * MT);
  for (int c = lane; c < NP; c += 32) {
    float sum = 0.0f;
#pragma unroll 8
    for (int r = 0; r < 16 * MT; ++r) sum += Traits<T>::to_float(g[r * SG + c]);
    part[tile * PSTRIDE + c] = sum;
  }
}

// Backward GEMM: out (the warp's rows, columns [0, pad8(K))) = g (columns [0, pad16(pad8(N))))
// . W, W (N x K) row-major; the GEMM padding columns up to pad16 are zeroed.

// one column chunk's result, columns [i0, i0 + 8 * ntiles), into out
template <class T, int MT, int NCL, int SG>
__device__ __forceinline__ void bwd_store(float (&acc)[MT][NCL / 8][4], T* out, int i0, int ntiles) {
  const int lane = threadIdx.x & 31;
#pragma unroll
  for (int j = 0; j < NCL / 8; ++j) {
    if (j < ntiles) {
      const int col = i0 + j * 8 + 2 * (lane & 3);
#pragma unroll
      for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const int r = mt * 16 + (lane >> 2) + h * 8;
          *reinterpret_cast<uint32_t*>(out + r * SG + col) = Traits<T>::pack(acc[mt][j][2 * h], acc[mt][j][2 * h + 1]);
        }
    }
  }
}

// streamed weight (as fwd_layer)
template <class T, int K, int N, int MT, int NC, int SG, int SW>
__device__ __forceinline__ void bwd_gemm(const T* g, T* out, T* wb0, T* wb1, const T* __restrict__ W) {
  constexpr int JG = pad16(pad8(N)), KP = pad8(K), NCL = cmin(NC, KP), NCH = (KP + NCL - 1) / NCL;
  load_w_kn<T, K, N, JG, NCL, SW>(wb0, W, 0);
  cp_commit();
#pragma unroll 1
  for (int c = 0; c < NCH; ++c) {
    T* cur = (c & 1) ? wb1 : wb0;
    if (c + 1 < NCH) {
      load_w_kn<T, K, N, JG, NCL, SW>((c & 1) ? wb0 : wb1, W, (c + 1) * NCL);
      cp_commit();
      cp_wait<1>();
    } else {
      cp_wait<0>();
    }
    __syncthreads();
    const int i0 = c * NCL;
    const int ntiles = cmin(NCL, KP - i0) / 8;
    float acc[MT][NCL / 8][4];
    warp_gemm<T, MT, NCL, JG, SG, SW, true>(acc, g, cur, ntiles);
    bwd_store<T, MT, NCL, SG>(acc, out, i0, ntiles);
    __syncthreads();
  }
  zero_cols<T, MT, KP, pad16(KP), SG>(out);
  __syncwarp();
}

// resident weight (as fwd_layer_resident): ws holds W whole, row stride SW; INPLACE: out == g
template <class T, int K, int N, int MT, int NC, int SG, int SW, bool INPLACE = false>
__device__ __forceinline__ void bwd_gemm_resident(const T* g, T* out, const T* ws) {
  constexpr int JG = pad16(pad8(N)), KP = pad8(K), NCL = cmin(NC, KP), NCH = (KP + NCL - 1) / NCL;
  if constexpr (INPLACE) {
    uint32_t af[JG / 16][MT][4];
    load_a_all<T, MT, JG, SG>(af, g);
#pragma unroll 1
    for (int c = 0; c < NCH; ++c) {
      const int i0 = c * NCL;
      const int ntiles = cmin(NCL, KP - i0) / 8;
      float acc[MT][NCL / 8][4];
      warp_gemm_regs<T, MT, NCL, JG, SW, true>(acc, af, ws + i0, ntiles);
      bwd_store<T, MT, NCL, SG>(acc, out, i0, ntiles);
    }
  } else {
#pragma unroll 1
    for (int c = 0; c < NCH; ++c) {
      const int i0 = c * NCL;
      const int ntiles = cmin(NCL, KP - i0) / 8;
      float acc[MT][NCL / 8][4];
      warp_gemm<T, MT, NCL, JG, SG, SW, true>(acc, g, ws + i0, ntiles);
      bwd_store<T, MT, NCL, SG>(acc, out, i0, ntiles);
    }
  }
  zero_cols<T, MT, KP, pad16(KP), SG>(out);
  __syncwarp();
}

// ---------------------------------------------------------------------------------------------
// Weight gradients inside the backward kernel (bwd_dw_kernel; docs/experiments/mlp_fused_dw):
// dW = dz^T . a_prev over the CTA's W warp tiles of 16*MT rows, accumulated in registers across
// the grid-stride loop, one float32 partial per CTA at the end (summed over CTAs in a fixed
// order by the host: deterministic).  dW's 16x8 MMA tiles are dealt to the warps in units of
// one 16-row stripe x G column tiles.
// ---------------------------------------------------------------------------------------------

// The warp's 16*MT rows x columns [0, CG) of a row-major (M x COLS) global matrix into its
// shared tile (stride S) with cp.async (the caller commits and waits), columns [COLS, CG) and
// rows >= M zero.  COLS % 8 != 0 (an input x of odd width) falls back to plain loads.
template <class T, int ROWS, int COLS, int CG, int S>
__device__ __forceinline__ void warp_load_rows_async(T* dst, const T* __restrict__ src, int64_t row0, int64_t M) {
  const int lane = threadIdx.x & 31;
  if constexpr (COLS % 8 == 0) {
    constexpr int V = CG / 8;
    for (int i = lane; i < ROWS * V; i += 32) {
      const int r = i / V, c = (i % V) * 8;
      const int64_t g = row0 + r;
      T* d = dst + r * S + c;
      if (g < M && c < COLS)
        cp_async16(d, src + g * COLS + c);
      else
        *reinterpret_cast<uint4*>(d) = make_uint4(0, 0, 0, 0);
    }
  } else {
    load_rows<T, ROWS, COLS, CG, S, 32>(dst, src, row0, M, lane);
  }
}

// acc[j] (the 16x8 tiles rows [m0, m0+16) x columns [n0 + 8j, n0 + 8j + 8), j < ntiles) +=
// dz^T . a over W warp tiles: warp s's dz tile at dz + s * WSTRIDE and its a tile at
// a + s * WSTRIDE (16*MT rows each, row stride SA).  A = dz^T comes from ldmatrix.trans of dz
// (8x8 blocks at dz rows k, columns m); B = a (rows k, columns n) as warp_gemm's TRANS_B load.
template <class T, int G, int MT, int W, int SA, int WSTRIDE>
__device__ __forceinline__ void dw_unit(float (&acc)[G][4], const T* dz, const T* a, int m0, int n0, int ntiles) {
  const int lane = threadIdx.x & 31;
  const int m = lane >> 3, r = lane & 7;
#pragma unroll 1
  for (int s = 0; s < W; ++s) {
    const T* dzs = dz + s * WSTRIDE;
    const T* as = a + s * WSTRIDE;
#pragma unroll
    for (int k0 = 0; k0 < 16 * MT; k0 += 16) {
      uint32_t af[4];
      ldsm_x4_t(af, dzs + (k0 + r + ((lane >> 4) & 1) * 8) * SA + m0 + ((lane >> 3) & 1) * 8);
#pragma unroll
      for (int j = 0; j < G; j += 2) {
        if (j < ntiles) {
          uint32_t bf[4];
          if (j + 1 < G)
            ldsm_x4_t(bf, as + (k0 + (m & 1) * 8 + r) * SA + n0 + j * 8 + (m >> 1) * 8);
          else
            ldsm_x2_t(bf, as + (k0 + (m & 1) * 8 + r) * SA + n0 + j * 8);
          Traits<T>::mma(acc[j], af, bf);
          if (j + 1 < G) Traits<T>::mma(acc[j + 1], af, bf + 2);
        }
      }
    }
  }
}

// One unit's accumulators to the CTA's float32 partial of dW (N x K, row-major): rows < N,
// columns < K.
template <int G, int N, int K>
__device__ __forceinline__ void dw_store(const float (&acc)[G][4], float* __restrict__ part, int m0, int n0,
                                         int ntiles) {
  const int lane = threadIdx.x & 31;
#pragma unroll
  for (int j = 0; j < G; ++j) {
    if (j < ntiles) {
      const int col = n0 + j * 8 + 2 * (lane & 3);
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int row = m0 + (lane >> 2) + h * 8;
        if (row < N) {
          if (col < K) part[row * K + col] = acc[j][2 * h];
          if (col + 1 < K) part[row * K + col + 1] = acc[j][2 * h + 1];
        }
      }
    }
  }
}

}  // namespace fmlp
