// Block 0 of SE-ResNet9-FixUp (16x16 maps, 64 -> 64 channels, stride 1) as one persistent
// kernel on Hopper's warpgroup MMA (wgmma, sm_90a), fp16 NHWC in and out, float32 accumulation:
//
//   xa  = x + b1a
//   h1  = relu(conv1(xa) + b1b) + b2a            (both convs 3x3, pad 1)
//   h   = conv2(h1) * scale + b2b
//   g   = sigmoid(fc2(relu(fc1(mean_hw(h)))))    (SE, 64 -> 4 -> 64)
//   out = relu(h * g + x)
//
// Same math and arguments as block0_fused_kernel.cuh (the mma.sync version); this one has
// the tensor cores read both GEMM operands from shared memory through wgmma descriptors, so
// the filters are read once per warpgroup and m64 tile instead of once per warp (the
// mma.sync kernel is bound by its ldmatrix traffic).
//
// ---- Padded maps: a 3x3 tap is one descriptor ----
// Each map is kept zero-padded to 18 x 18 pixels, one pixel = 64 fp16 = 128 bytes, pixel
// P = y*18 + x (y, x in 0..17; the image occupies y, x in 1..16).  The GEMM rows are
// "padded output positions" q = r*18 + c (r in 0..15, c in 0..17): row q of tap (dr, ds)
// is pixel q + dr*18 + ds, which is image pixel (r + dr - 1, c + ds - 1) for c < 16, the
// zero border where the 3x3 window leaves the image.  So the A operand of tap (dr, ds)
// for rows q0..q0+63 is 64 consecutive pixels starting at pixel q0 + dr*18 + ds: one K-major
// wgmma operand (rows 128 bytes apart, 8-row groups 1024 bytes apart).  Rows with c = 16, 17
// are garbage (they straddle two image rows): computed, then masked in the epilogues and
// the SE sums.  Valid outputs: q <= 15*18 + 15 = 285, i.e. 286 rows -> five m64 tiles, at
// q0 = 0, 64, 128, 192 and 222 (the last overlaps the fourth so that its reads end at the
// map's last pixel, 285 + 38 = 323; its rows q < 256 are masked: the fourth tile has them).
// Cost: 5 x 64 = 320 GEMM rows for 256 pixels, 1.25x the MACs.
//
// ---- Swizzle and descriptors ----
// Map and filter buffers start at 1024-byte boundaries; 16-byte chunk c (channels 8c..8c+7)
// of pixel P is stored at byte P*128 + ((c ^ (P & 7)) << 4): the 128-byte swizzle as a
// function of the absolute shared-memory address (bits [4,7) ^= bits [7,10)), the layout
// CuTe writes as Swizzle<3,4,3> o smem_ptr (GMMA::Layout_K_SW128_Atom).  A descriptor's start
// address is base + (q0 + dr*18 + ds)*128 + kk*32 (kk = k16 step within the tap's 64
// channels), 128-byte aligned but, for 7 of the 9 taps, not 1024-byte aligned.
//   Descriptor (PTX ISA, "Matrix Descriptor Format" of wgmma): bits 0-13 start >> 4,
//   16-29 leading byte offset >> 4 (not used by swizzled K-major layouts; 1 as in CUTLASS),
//   32-45 stride byte offset >> 4 (1024: 8 rows of 128 bytes), 49-51 matrix base offset,
//   62-63 layout (1 = 128-byte swizzle).
//   Base offset: the PTX ISA says it is 0 when the swizzle's repeating pattern starts at a
//   1024-byte boundary and otherwise (pattern start addr >> 7) & 7.  Here every pattern starts
//   at a 1024-byte boundary (the data are swizzled by absolute address), so base_offset = 0
//   for every descriptor, whatever its start address: the hardware's swizzle is taken to be a
//   function of the absolute address it generates (as CuTe's canonical GMMA layouts
//   Swizzle<3,4,3> o smem_ptr assume; CuTe's make_gmma_desc always writes base_offset 0).
//   Params::desc_base_offset_mode = 1 instead writes (start >> 7) & 7 (the reading "the
//   pattern starts at the matrix start"): a switch for a one-run check on a GPU
//   (run.py tries it when mode 0 fails).  emulate_wgmma.py models both readings.
// Filters: per conv 9 taps x [64 out][64 in] fp16, K-major, 8192 bytes a tap (1024-aligned),
// row n = output channel, swizzled the same way; B descriptor start = W + tap*8192 +
// n0*128 + kk*32.
//
// ---- Warpgroups and tiles ----
// 256 threads = 2 warpgroups, both consumers (everything is resident in shared memory: no
// producer).  Warpgroup g owns m64 tiles q0 = 128g and 128g + 64 at n = 64
// (wgmma.m64n64k16) and half of the fifth tile (q0 = 222) at n = 32 (wgmma.m64n32k16,
// output channels 32g..32g+31): 2.5 tiles each, 80 fp32 accumulators per thread, no
// divergent wgmma.  Per conv a warpgroup issues 36 k16 steps x 3 wgmma (all operands in
// shared memory), one commit group, one wait.  Accumulator layout (PTX ISA, wgmma D
// fragment): warp w of the warpgroup, lane l, register 4j + 2i + e holds row 16w + l/4 + 8i,
// column 8j + 2(l%4) + e.
//
// ---- The loop, per CTA (grid = min(N, SMs), images b, b + grid, ...) ----
// A = input map (padded, xa = x + b1a), B = conv1 output map (padded) and output staging.
//   1. cp.async.wait; each thread adds b1a to the chunks it loaded (fp16, as PyTorch's fp16
//      block computes x + b1a); fence.proxy.async; barrier.
//   2. conv1 (A, W1) -> epilogue relu(acc + b1b) + b2a -> fp16 -> B (valid rows only: B's
//      border is zeroed once and never written).  fence.proxy.async; barrier.
//   3. cp.async the next image into A (A's border is never written).
//   4. conv2 (B, W2); h = acc*scale + b2b stays in registers; SE column sums (shuffles, then
//      shared-memory atomics into 64 floats).  Barrier.
//   5. fc1 (4 warps), barrier, fc2 + sigmoid (64 threads), barrier.
//   6. out = relu(h*g + x) with x re-read from global memory (L2: the input map in A holds
//      xa, not x, and is already overwritten by the prefetch), written to B.  Barrier.
//   7. Coalesced 16-byte copy of B's interior to the output.
// Generic-proxy writes (cp.async, st.shared) that a wgmma reads are ordered by
// fence.proxy.async.shared::cta in each writing thread before the barrier; shared memory a
// wgmma read is rewritten only after that warpgroup's wgmma.wait_group 0 and a barrier.
//
// ---- Shared memory (bytes) ----
//   W1, W2    2 x 9 x 64 x 64 fp16           147456   [tap][n][c], swizzled
//   A         18 x 18 x 64 fp16               41472   at 147456 (1024-aligned)
//   (gap)                                       512   so that B starts 1024-aligned
//   B         18 x 18 x 64 fp16               41472   at 189440
//   SE        sum[64], gate[64], hidden[8] fp32   544
//   total                                    231456   (opt-in limit 232448 on sm_90)
//
// ---- Where the time should go ----
// A wgmma m64n64k16 with both operands in shared memory reads 2 KB of A and 2 KB of B for
// 65536 MACs: 128 B/clk at the tensor cores' dense rate (~2048 fp16 MAC/clk/SM), i.e. at
// shared memory's 128 B/clk; the fifth tile's two n32 halves read its A twice.  Per image
// 2 convs x 36 k16 steps x 22 KB = 1.58 MB of operand reads, ~12700 clk (~6.9 us at
// 1.83 GHz) if the shared-memory pipe is the limit, against ~13800 clk estimated the same
// way (15.3 us measured an image) for the mma.sync kernel's ldmatrix traffic.
#pragma once

#include <cuda_fp16.h>
#include <stdint.h>

// wgmma needs the sm_90a feature set; elsewhere the kernel compiles to a trap (the host
// entry point refuses GPUs other than sm_90).
#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define BLOCK0_WGMMA_ENABLED 1
#else
#define BLOCK0_WGMMA_ENABLED 0
#endif

namespace block0_wgmma {

constexpr int kC = 64, kH = 16, kW = 16, kPix = kH * kW;
constexpr int kHidden = kC / 16;
constexpr int kPW = 18;                       // padded map width and height
constexpr int kPadPix = kPW * kPW;            // 324
constexpr int kThreads = 256;                 // 2 warpgroups
constexpr int kTapBytes = kC * kC * 2;        // 8192: one tap's [64][64] fp16 filter block
constexpr int kWeightBytes = 9 * kTapBytes;   // 73728 per conv
constexpr int kMapBytes = kPadPix * kC * 2;   // 41472
constexpr int kLastQ = (kH - 1) * kPW + (kW - 1);  // 285: the last valid padded output row
constexpr int kTile4Q0 = kLastQ + 1 - 64;          // 222: the fifth tile ends at row 285

constexpr int kOffW1 = 0;
constexpr int kOffW2 = kOffW1 + kWeightBytes;                 // 73728
constexpr int kOffA = kOffW2 + kWeightBytes;                  // 147456
constexpr int kOffB = (kOffA + kMapBytes + 1023) / 1024 * 1024;  // 189440
constexpr int kOffSum = kOffB + kMapBytes;                    // 230912
constexpr int kOffGate = kOffSum + kC * 4;
constexpr int kOffHidden = kOffGate + kC * 4;
constexpr int kSmemBytes = kOffHidden + 8 * 4;                // 231456
static_assert(kSmemBytes == 231456, "shared-memory budget changed: update the table above");
static_assert(kSmemBytes <= 232448, "more than sm_90's opt-in shared memory per block");
static_assert(kOffW2 % 1024 == 0 && kOffA % 1024 == 0 && kOffB % 1024 == 0,
              "swizzled buffers must start at 1024-byte boundaries");
static_assert(kTile4Q0 + 63 + 2 * kPW + 2 == kPadPix - 1, "the fifth tile's last read is the map's last pixel");

struct Params {
  const __half* x;      // [N, 16, 16, 64]
  __half* out;          // [N, 16, 16, 64]
  const __half* w1;     // [64, 3, 3, 64] KRSC
  const __half* w2;
  const float* b1a;     // FixUp scalars, one float each
  const float* b1b;
  const float* b2a;
  const float* scale;
  const float* b2b;
  const float* fc1_w;   // [4, 64]
  const float* fc1_b;   // [4]
  const float* fc2_w;   // [64, 4]
  const float* fc2_b;   // [64]
  int n;                // images
  int desc_base_offset_mode;  // 0: base_offset 0 (the design); 1: (start >> 7) & 7 (check)
  // nullptr, or [gridDim.x][kPhases]: per CTA, the clock64() cycles thread 0 spent in each
  // phase of the loop (the kPhases below), summed over the CTA's images -- its own warpgroup's MMAs
  // and every barrier's wait included: where an image's time goes, for the next design step.
  long long* phase_clk;
};

// The phases phase_clk counts, in loop order (the prologue once per CTA).
constexpr int kPhases = 9;
// 0 input landed (cp.async wait), xa = x + b1a; 1 conv1 (wgmma issue and wait); 2 conv1's
// epilogue to B; 3 prefetch issue + conv2 (wgmma); 4 conv2's epilogue and the SE sums;
// 5 excite (fc1, fc2, sigmoid); 6 gate + residual (x from global) to B; 7 copy-out;
// 8 prologue (zero the maps, issue the filter and first-image loads).

// ---- small helpers ----
__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}
__device__ __forceinline__ void cp_async_16(uint32_t dst, const void* src) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(dst), "l"(src));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
__device__ __forceinline__ void cp_async_wait_all() { asm volatile("cp.async.wait_all;\n" ::: "memory"); }
// Orders this thread's generic-proxy shared-memory writes before later async-proxy (wgmma) reads.
__device__ __forceinline__ void fence_proxy_async() {
#if BLOCK0_WGMMA_ENABLED
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
#endif
}

// Padded pixel of image pixel (y, x) in 0..15.
__device__ __forceinline__ int padded_pixel(int y, int x) { return (y + 1) * kPW + (x + 1); }
// Byte offset of (padded pixel P, 16-byte chunk c) in a map buffer (1024-aligned base).
__device__ __forceinline__ int map_offset(int P, int c) { return P * 128 + ((c ^ (P & 7)) << 4); }
// Byte offset of (tap, output channel n, 16-byte chunk c of the input channels) in a filter buffer.
__device__ __forceinline__ int weight_offset(int tap, int n, int c) {
  return tap * kTapBytes + n * 128 + ((c ^ (n & 7)) << 4);
}

// Image pixels of one image -> interior of a padded map (cp.async, 16 bytes per step).
__device__ __forceinline__ void load_map_async(uint32_t map, const __half* src) {
  const char* g = reinterpret_cast<const char*>(src);
#pragma unroll
  for (int q = threadIdx.x; q < kPix * 8; q += kThreads) {
    const int pix = q >> 3;
    cp_async_16(map + map_offset(padded_pixel(pix >> 4, pix & 15), q & 7), g + q * 16);
  }
}
// The same chunks this thread loaded: += b1a (fp16).  Only this thread's own cp.async
// writes are read, so cp.async.wait_all alone orders them.
__device__ __forceinline__ void add_bias_own_chunks(unsigned char* map, __half2 b) {
#pragma unroll
  for (int q = threadIdx.x; q < kPix * 8; q += kThreads) {
    const int pix = q >> 3;
    uint4* p = reinterpret_cast<uint4*>(map + map_offset(padded_pixel(pix >> 4, pix & 15), q & 7));
    uint4 v = *p;
    __half2* h = reinterpret_cast<__half2*>(&v);
#pragma unroll
    for (int k = 0; k < 4; ++k) h[k] = __hadd2(h[k], b);
    *p = v;
  }
}
// global KRSC [64][9][64] -> [tap][n][c] swizzled.
__device__ __forceinline__ void load_weight_async(uint32_t buf, const __half* src) {
  const char* g = reinterpret_cast<const char*>(src);
  for (int q = threadIdx.x; q < kC * 9 * 8; q += kThreads) {  // q = (n*9 + tap)*8 + c
    const int c = q & 7, nt = q >> 3, tap = nt % 9, n = nt / 9;
    cp_async_16(buf + weight_offset(tap, n, c), g + q * 16);
  }
}

// ---- wgmma ----
// Descriptor of a K-major operand with 128-byte swizzle (rows 128 B apart, 8-row groups
// 1024 B apart) starting at shared address `start`.
__device__ __forceinline__ uint64_t make_desc(uint32_t start, int base_offset_mode) {
  const uint32_t lo = ((start & 0x3FFFFu) >> 4) | (1u << 16);   // start; LBO = 1 (unused)
  uint32_t hi = (1024u >> 4) | (1u << 30);                      // SBO = 1024 B; 128B swizzle
  if (base_offset_mode) hi |= ((start >> 7) & 7u) << (49 - 32);
  return (static_cast<uint64_t>(hi) << 32) | lo;
}

__device__ __forceinline__ void wgmma_fence() {
#if BLOCK0_WGMMA_ENABLED
  asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
#endif
}
__device__ __forceinline__ void wgmma_commit() {
#if BLOCK0_WGMMA_ENABLED
  asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
#endif
}
__device__ __forceinline__ void wgmma_wait_all() {
#if BLOCK0_WGMMA_ENABLED
  asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory");
#endif
}
template <int N>
__device__ __forceinline__ void fence_operands(float (&d)[N]) {
#pragma unroll
  for (int i = 0; i < N; ++i) asm volatile("" : "+f"(d[i])::"memory");
}

// D[64x64] += A[64x16] * B[16x64], both K-major in shared memory (descriptors), fp16 -> fp32.
__device__ __forceinline__ void wgmma_m64n64k16(float (&d)[32], uint64_t da, uint64_t db) {
#if BLOCK0_WGMMA_ENABLED
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.f16.f16 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
      "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, "
      "%32, %33, p, 1, 1, 0, 0;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
        "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]),
        "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]),
        "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]),
        "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
      : "l"(da), "l"(db), "r"(1));
#endif
}
// D[64x32] += A[64x16] * B[16x32].
__device__ __forceinline__ void wgmma_m64n32k16(float (&d)[16], uint64_t da, uint64_t db) {
#if BLOCK0_WGMMA_ENABLED
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %18, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n32k16.f32.f16.f16 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15}, "
      "%16, %17, p, 1, 1, 0, 0;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
        "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]),
        "+f"(d[15])
      : "l"(da), "l"(db), "r"(1));
#endif
}

// One 3x3 conv for this warpgroup's 2.5 tiles: acc0/acc1 = tiles q0 = 128g, 128g + 64 (all
// 64 channels), acc2 = tile q0 = 222, channels 32g..32g+31.
__device__ __forceinline__ void conv3x3(float (&acc0)[32], float (&acc1)[32], float (&acc2)[16],
                                        uint32_t map, uint32_t w, int wg, int mode) {
#pragma unroll
  for (int i = 0; i < 32; ++i) acc0[i] = acc1[i] = 0.f;
#pragma unroll
  for (int i = 0; i < 16; ++i) acc2[i] = 0.f;
  // (CUTLASS's order: the zeroing is pinned before wgmma.fence, which orders these register
  // writes before the wgmma that accumulate into them.)
  fence_operands(acc0);
  fence_operands(acc1);
  fence_operands(acc2);
  wgmma_fence();
  const uint32_t a0 = map + (wg * 128) * 128, a1 = a0 + 64 * 128, a2 = map + kTile4Q0 * 128;
  const uint32_t b_half = w + (wg * 32) * 128;
#pragma unroll
  for (int tap = 0; tap < 9; ++tap) {
    const uint32_t shift = ((tap / 3) * kPW + tap % 3) * 128;
#pragma unroll
    for (int kk = 0; kk < 4; ++kk) {
      const uint32_t a_off = shift + kk * 32, b_off = tap * kTapBytes + kk * 32;
      const uint64_t db = make_desc(w + b_off, mode), dbh = make_desc(b_half + b_off, mode);
      wgmma_m64n64k16(acc0, make_desc(a0 + a_off, mode), db);
      wgmma_m64n64k16(acc1, make_desc(a1 + a_off, mode), db);
      wgmma_m64n32k16(acc2, make_desc(a2 + a_off, mode), dbh);
    }
  }
  wgmma_commit();
  wgmma_wait_all();
  fence_operands(acc0);
  fence_operands(acc1);
  fence_operands(acc2);
}

// Tile t of a warpgroup: 0, 1 = q0 128g, 128g + 64 (64 channels); 2 = q0 222, channels
// 32g..32g+31.  Register group i of the accumulator (0: row l/4, 1: l/4 + 8) is row q; an
// output this warpgroup owns when q is an image column (q % 18 < 16), q <= 285 and, in the
// fifth tile, q >= 256 (the fourth tile has rows 222..255).
template <int T>
__device__ __forceinline__ int tile_row(int wg, int wrow, int i) {
  return (T == 2 ? kTile4Q0 : wg * 128 + T * 64) + wrow + 8 * i;
}
template <int T>
__device__ __forceinline__ bool row_valid(int q) {
  return (q % kPW) < kW && q <= kLastQ && (T != 2 || q >= 256);
}
// 16-byte channel chunk of 8-column block j of tile T.
template <int T>
__device__ __forceinline__ int tile_chunk(int wg, int j) { return T == 2 ? 4 * wg + j : j; }

// conv1 epilogue for tile T: relu(acc + b1b) + b2a -> fp16 -> map B at padded pixel q + 19.
template <int T, int NR>
__device__ __forceinline__ void conv1_epilogue(const float (&a)[NR], unsigned char* map_b, int wg, int wrow,
                                               int ccol, float b1b, float b2a) {
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    const int q = tile_row<T>(wg, wrow, i);
    if (!row_valid<T>(q)) continue;
    const int P = q + kPW + 1;  // (r, c) -> padded pixel (r + 1, c + 1)
#pragma unroll
    for (int j = 0; j < NR / 4; ++j) {
      const float v0 = fmaxf(a[4 * j + 2 * i] + b1b, 0.f) + b2a;
      const float v1 = fmaxf(a[4 * j + 2 * i + 1] + b1b, 0.f) + b2a;
      *reinterpret_cast<__half2*>(map_b + map_offset(P, tile_chunk<T>(wg, j)) + 2 * ccol) =
          __floats2half2_rn(v0, v1);
    }
  }
}

// conv2 epilogue for tile T: h = acc*scale + b2b in place; this warp's column sums of the
// valid rows (shuffles over the 8 lanes of equal l % 4) -> shared-memory atomics.
template <int T, int NR>
__device__ __forceinline__ void conv2_epilogue(float (&a)[NR], float* sum, int wg, int wrow, int ccol, int lane,
                                               float scale, float b2b) {
  bool ok[2];
#pragma unroll
  for (int i = 0; i < 2; ++i) ok[i] = row_valid<T>(tile_row<T>(wg, wrow, i));
#pragma unroll
  for (int j = 0; j < NR / 4; ++j) {
    float s0 = 0.f, s1 = 0.f;
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      a[4 * j + 2 * i] = a[4 * j + 2 * i] * scale + b2b;
      a[4 * j + 2 * i + 1] = a[4 * j + 2 * i + 1] * scale + b2b;
      if (ok[i]) {
        s0 += a[4 * j + 2 * i];
        s1 += a[4 * j + 2 * i + 1];
      }
    }
#pragma unroll
    for (int off = 4; off < 32; off <<= 1) {
      s0 += __shfl_xor_sync(0xffffffffu, s0, off);
      s1 += __shfl_xor_sync(0xffffffffu, s1, off);
    }
    if (lane < 4) {
      const int c = 8 * tile_chunk<T>(wg, j) + ccol;
      atomicAdd(sum + c, s0);
      atomicAdd(sum + c + 1, s1);
    }
  }
}

// Output for tile T: relu(h * gate + x) -> fp16 -> map B (x read from global memory).
template <int T, int NR>
__device__ __forceinline__ void output_epilogue(const float (&a)[NR], unsigned char* map_b, const float* gate,
                                                const __half* ximg, int wg, int wrow, int ccol) {
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    const int q = tile_row<T>(wg, wrow, i);
    if (!row_valid<T>(q)) continue;
    const int r = q / kPW, cx = q % kPW, P = q + kPW + 1;
#pragma unroll
    for (int j = 0; j < NR / 4; ++j) {
      const int chunk = tile_chunk<T>(wg, j), c = 8 * chunk + ccol;
      const float2 xv =
          __half22float2(__ldg(reinterpret_cast<const __half2*>(ximg + (r * kW + cx) * kC + c)));
      const float o0 = fmaxf(a[4 * j + 2 * i] * gate[c] + xv.x, 0.f);
      const float o1 = fmaxf(a[4 * j + 2 * i + 1] * gate[c + 1] + xv.y, 0.f);
      *reinterpret_cast<__half2*>(map_b + map_offset(P, chunk) + 2 * ccol) = __floats2half2_rn(o0, o1);
    }
  }
}

// The epilogues over this warpgroup's three tiles (acc0, acc1: 64 channels; acc2: its 32).
__device__ __forceinline__ void conv1_epilogues(const float (&acc0)[32], const float (&acc1)[32],
                                                const float (&acc2)[16], unsigned char* map_b, int wg, int wrow,
                                                int ccol, float b1b, float b2a) {
  conv1_epilogue<0>(acc0, map_b, wg, wrow, ccol, b1b, b2a);
  conv1_epilogue<1>(acc1, map_b, wg, wrow, ccol, b1b, b2a);
  conv1_epilogue<2>(acc2, map_b, wg, wrow, ccol, b1b, b2a);
}
__device__ __forceinline__ void conv2_epilogues(float (&acc0)[32], float (&acc1)[32], float (&acc2)[16], float* sum,
                                                int wg, int wrow, int ccol, int lane, float scale, float b2b) {
  conv2_epilogue<0>(acc0, sum, wg, wrow, ccol, lane, scale, b2b);
  conv2_epilogue<1>(acc1, sum, wg, wrow, ccol, lane, scale, b2b);
  conv2_epilogue<2>(acc2, sum, wg, wrow, ccol, lane, scale, b2b);
}
__device__ __forceinline__ void output_epilogues(const float (&acc0)[32], const float (&acc1)[32],
                                                 const float (&acc2)[16], unsigned char* map_b, const float* gate,
                                                 const __half* ximg, int wg, int wrow, int ccol) {
  output_epilogue<0>(acc0, map_b, gate, ximg, wg, wrow, ccol);
  output_epilogue<1>(acc1, map_b, gate, ximg, wg, wrow, ccol);
  output_epilogue<2>(acc2, map_b, gate, ximg, wg, wrow, ccol);
}

// The CTA's next image (img + gridDim.x), if any, into map A (cp.async, one commit group).
__device__ __forceinline__ void prefetch_next(uint32_t map_a, const __half* x, int img, int n) {
  if (img + (int)gridDim.x < n) {
    load_map_async(map_a, x + (size_t)(img + gridDim.x) * kPix * kC);
    cp_async_commit();
  }
}

// SE excite from the column sums: gate[c] = sigmoid(fc2(relu(fc1(sum / 256)))); 4 warps the
// fc1 rows, a barrier, 64 threads fc2, a barrier.
__device__ __forceinline__ void excite(const float* fc1_w, const float* fc1_b, const float* fc2_w,
                                       const float* fc2_b, const float* sum, float* hidden, float* gate) {
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  if (warp < kHidden) {
    float s = (__ldg(fc1_w + warp * kC + lane) * sum[lane] + __ldg(fc1_w + warp * kC + lane + 32) * sum[lane + 32]) *
              (1.f / kPix);
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) s += __shfl_xor_sync(0xffffffffu, s, off);
    if (lane == 0) hidden[warp] = fmaxf(s + __ldg(fc1_b + warp), 0.f);
  }
  __syncthreads();
  if (tid < kC) {
    float s = __ldg(fc2_b + tid);
#pragma unroll
    for (int j = 0; j < kHidden; ++j) s += __ldg(fc2_w + tid * kHidden + j) * hidden[j];
    gate[tid] = 1.f / (1.f + __expf(-s));
  }
  __syncthreads();
}

// Coalesced 16-byte copy of a padded map's interior to one image of the output.
__device__ __forceinline__ void copy_out(const unsigned char* map, __half* out_img) {
  char* dst = reinterpret_cast<char*>(out_img);
#pragma unroll
  for (int q = threadIdx.x; q < kPix * 8; q += kThreads) {
    const int pix = q >> 3;
    *reinterpret_cast<uint4*>(dst + q * 16) =
        *reinterpret_cast<const uint4*>(map + map_offset(padded_pixel(pix >> 4, pix & 15), q & 7));
  }
}

__global__ void __launch_bounds__(kThreads, 1) block0_wgmma_kernel(Params p) {
#if BLOCK0_WGMMA_ENABLED
  extern __shared__ __align__(1024) unsigned char smem[];
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int wg = warp >> 2;                        // warpgroup 0, 1
  const int wrow = (warp & 3) * 16 + (lane >> 2);  // accumulator row in the tile (+8 for i = 1)
  const int ccol = 2 * (lane & 3);                 // accumulator column in an 8-column block
  const uint32_t s_base = smem_addr(smem);
  if (s_base & 1023) __trap();  // the swizzle is by absolute address: needs a 1024-aligned base
  const uint32_t s_w1 = s_base + kOffW1, s_w2 = s_base + kOffW2, s_a = s_base + kOffA, s_b = s_base + kOffB;
  unsigned char* map_a = smem + kOffA;
  unsigned char* map_b = smem + kOffB;
  float* sum = reinterpret_cast<float*>(smem + kOffSum);
  float* gate = reinterpret_cast<float*>(smem + kOffGate);
  float* hidden = reinterpret_cast<float*>(smem + kOffHidden);
  const int mode = p.desc_base_offset_mode;

  int img = blockIdx.x;
  if (img >= p.n) return;
  const bool timed = p.phase_clk != nullptr && tid == 0;
  long long clk[kPhases] = {}, t_mark = clock64();
  auto mark = [&](int phase) {  // (constant phases after inlining: clk stays in registers)
    if (timed) {
      const long long now = clock64();
      clk[phase] += now - t_mark;
      t_mark = now;
    }
  };

  // Once: zero both maps (their borders stay zero: nothing writes a border pixel), load
  // both filters and the first image.
  for (int i = tid; i < kMapBytes / 16; i += kThreads) {
    *reinterpret_cast<uint4*>(map_a + 16 * i) = make_uint4(0, 0, 0, 0);
    *reinterpret_cast<uint4*>(map_b + 16 * i) = make_uint4(0, 0, 0, 0);
  }
  __syncthreads();  // the zeros land before the cp.async writes of the interior
  load_weight_async(s_w1, p.w1);
  load_weight_async(s_w2, p.w2);
  load_map_async(s_a, p.x + (size_t)img * kPix * kC);
  cp_async_commit();

  const float b1b = *p.b1b, b2a = *p.b2a, scale = *p.scale, b2b = *p.b2b;
  const __half2 b1a_h2 = __float2half2_rn(*p.b1a);
  mark(8);

  float acc0[32], acc1[32], acc2[16];
  for (; img < p.n; img += gridDim.x) {
    // ---- 1. the input has landed: xa = x + b1a in place; publish to the async proxy ----
    cp_async_wait_all();
    add_bias_own_chunks(map_a, b1a_h2);
    if (tid < kC) sum[tid] = 0.f;
    fence_proxy_async();
    __syncthreads();
    mark(0);

    // ---- 2. conv1 -> h1 = relu(acc + b1b) + b2a -> B ----
    conv3x3(acc0, acc1, acc2, s_a, s_w1, wg, mode);
    mark(1);
    conv1_epilogues(acc0, acc1, acc2, map_b, wg, wrow, ccol, b1b, b2a);
    fence_proxy_async();
    __syncthreads();  // B complete; both warpgroups are done reading A
    mark(2);

    // ---- 3. prefetch the next image into A ----
    prefetch_next(s_a, p.x, img, p.n);

    // ---- 4. conv2 -> h = acc*scale + b2b (registers); SE column sums ----
    conv3x3(acc0, acc1, acc2, s_b, s_w2, wg, mode);
    mark(3);
    conv2_epilogues(acc0, acc1, acc2, sum, wg, wrow, ccol, lane, scale, b2b);
    __syncthreads();  // sums complete; both warpgroups are done reading B
    mark(4);

    // ---- 5. excite ----
    excite(p.fc1_w, p.fc1_b, p.fc2_w, p.fc2_b, sum, hidden, gate);
    mark(5);

    // ---- 6. out = relu(h * g + x) -> B (x from global memory) ----
    output_epilogues(acc0, acc1, acc2, map_b, gate, p.x + (size_t)img * kPix * kC, wg, wrow, ccol);
    __syncthreads();
    mark(6);

    // ---- 7. coalesced copy of B's interior to the output ----
    copy_out(map_b, p.out + (size_t)img * kPix * kC);
    // (The next iteration's first barrier orders these reads of B before conv1's epilogue
    // writes it again.)
    mark(7);
  }
  if (timed) {
#pragma unroll
    for (int i = 0; i < kPhases; ++i) p.phase_clk[blockIdx.x * kPhases + i] = clk[i];
  }
#else
  __trap();  // built without sm_90a
#endif
}

}  // namespace block0_wgmma
