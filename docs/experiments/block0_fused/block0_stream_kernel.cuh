// Block 0 as one kernel, two CTAs an SM: the wgmma kernel (block0_wgmma_kernel.cuh) with its
// filters streamed through a ring of shared-memory slots instead of resident, so that two
// CTAs fit on an SM and one's epilogues, SE and copies run beside the other's MMAs.
//
// Why: on an H100 the wgmma kernel's MMAs run near the tensor cores' rate, but 55% of an
// image's cycles are epilogue, SE and copy work that nothing overlaps (README.md, its phase
// table): one CTA an SM (231 KB of shared memory, 147 KB of it the two filters) and one image
// in flight.  Streamed, a CTA needs its two padded maps and the ring: ~107 KB, so two CTAs
// share an SM and the warp schedulers interleave them (the hardware's ping-pong, no explicit
// ordering between the two).
//
// What changes against the wgmma kernel (everything else -- padded maps, descriptors, tiles,
// epilogues, SE, the image prefetch, the copy-out -- is that kernel's code, included):
// - Filters: one tap of one conv is [64 out][64 in] fp16, 8192 bytes.  The host packs both
//   convs' 18 taps in the order the loop reads them, each already swizzled as a slot holds it
//   (16-byte chunk c of output channel n at n*128 + ((c ^ (n & 7)) << 4): the 128-byte swizzle
//   of a 1024-aligned slot, as the maps are swizzled by absolute address), so a tap arrives
//   with one 1-D bulk copy (cp.async.bulk, the TMA unit's copy engine; no tensor map).
// - The ring: kSlots slots of 8192 bytes, a "full" mbarrier per slot (the bulk copy's bytes
//   complete it) and an "empty" one (one arrival per warpgroup once its wgmmas that read the
//   slot are done).  Taps are numbered over the CTA's whole run, T = 18*iteration + 9*conv +
//   tap: tap T in slot T % kSlots, its full barrier's phase parity (T / kSlots) & 1.
// - The producer is thread 0 (no producer warp: a 9th warp would cost 32 registers a thread of
//   the 128 that two CTAs of 256 threads leave): it issues the first kSlots taps in the
//   prologue, and tap T + kSlots once both warpgroups released slot T % kSlots.
// - Per tap a warpgroup waits for its slot, issues its 12 wgmma (4 k16 steps x 3 tiles),
//   commits them as one group and waits until at most that group is in flight: the previous
//   tap's wgmmas are done, so it releases the previous tap's slot.  One tap of MMAs stays in
//   flight while the next tap's slot is waited for; the ring keeps kSlots - 1 taps of loads
//   ahead.
// - __launch_bounds__(256, 2): at most 128 registers a thread (80 accumulators).
//
// ---- Shared memory (bytes) per CTA ----
//   A         18 x 18 x 64 fp16               41472   at 0
//   B         18 x 18 x 64 fp16               41472   at 41984 (1024-aligned)
//   ring      kSlots x 8192                   24576   at 83968 (1024-aligned)
//   SE        sum[64], gate[64], hidden[8]       544
//   mbarriers full[kSlots], empty[kSlots]        48
//   total                                    109136   (two CTAs: 218272 + 2 x 1024 reserved of 233472)
//
// ---- Cost ----
// Every image reads both filters from L2 (147 KB; 302 MB at N=2048, next to 134 MB of
// compulsory HBM traffic), instead of each CTA reading them once.
#pragma once

#include "block0_wgmma_kernel.cuh"

namespace block0_stream {

using namespace block0_wgmma;  // the maps, descriptors, wgmma wrappers, tiles and epilogues

constexpr int kSlots = 3;
constexpr int kTapsPerImage = 18;               // conv1's 9 taps, then conv2's
constexpr int kOffA = 0;
constexpr int kOffB = (kOffA + kMapBytes + 1023) / 1024 * 1024;        // 41984
constexpr int kOffRing = (kOffB + kMapBytes + 1023) / 1024 * 1024;     // 83968
constexpr int kOffSum = kOffRing + kSlots * kTapBytes;                // 108544
constexpr int kOffGate = kOffSum + kC * 4;
constexpr int kOffHidden = kOffGate + kC * 4;
constexpr int kOffBar = kOffHidden + 8 * 4;                           // 8-byte aligned
constexpr int kSmemBytes = kOffBar + 2 * kSlots * 8;                  // 109136
static_assert(kSmemBytes == 109136, "shared-memory budget changed: update the table above");
static_assert(2 * (kSmemBytes + 1024) <= 233472, "two CTAs no longer fit an sm_90 SM's shared memory");
static_assert(kOffB % 1024 == 0 && kOffRing % 1024 == 0 && kTapBytes % 1024 == 0,
              "swizzled buffers must start at 1024-byte boundaries");
static_assert(kOffBar % 8 == 0, "mbarriers are 8-byte aligned");

struct Params {
  const __half* x;        // [N, 16, 16, 64]
  __half* out;            // [N, 16, 16, 64]
  const __half* wtaps;    // [2 convs][9 taps][64 out][64 in] fp16, each tap swizzled as a slot holds it
  const float* b1a;       // FixUp scalars, one float each
  const float* b1b;
  const float* b2a;
  const float* scale;
  const float* b2b;
  const float* fc1_w;     // [4, 64]
  const float* fc1_b;     // [4]
  const float* fc2_w;     // [64, 4]
  const float* fc2_b;     // [64]
  int n;                  // images
  long long* phase_clk;   // [gridDim.x][kPhases] as in the wgmma kernel (block0_stream_kernel<true> only)
};

// ---- mbarriers and the bulk copy (PTX ISA: mbarrier, cp.async.bulk) ----
__device__ __forceinline__ void mbar_init(uint32_t bar, uint32_t count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count));
}
__device__ __forceinline__ void mbar_fence_init() {
#if BLOCK0_WGMMA_ENABLED
  asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
#endif
}
__device__ __forceinline__ void mbar_arrive(uint32_t bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(bar) : "memory");
}
__device__ __forceinline__ void mbar_arrive_expect_tx(uint32_t bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes) : "memory");
}
// Waits until the phase of parity `parity` has completed.
__device__ __forceinline__ void mbar_wait(uint32_t bar, uint32_t parity) {
  // (PTX labels are local to the braces: every inlined copy may use the same ones, as CUTLASS's)
  asm volatile(
      "{\n.reg .pred done;\n"
      "LAB_WAIT:\n"
      "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
      "@done bra DONE;\n"
      "bra LAB_WAIT;\n"
      "DONE:\n}\n" ::"r"(bar),
      "r"(parity)
      : "memory");
}
// Global -> shared, `bytes` (a multiple of 16, both addresses 16-byte aligned), completing
// `bytes` transactions on mbarrier `bar`.
__device__ __forceinline__ void bulk_load(uint32_t dst, const void* src, uint32_t bytes, uint32_t bar) {
#if BLOCK0_WGMMA_ENABLED
  asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::"r"(dst),
      "l"(src), "r"(bytes), "r"(bar)
      : "memory");
#endif
}
template <int N>
__device__ __forceinline__ void wgmma_wait_le() {
#if BLOCK0_WGMMA_ENABLED
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
#endif
}

// The ring, as every thread sees it.  Producer calls (thread 0 only): issue(T).
struct Ring {
  uint32_t slots, full, empty;  // shared addresses: slot 0, full[0], empty[0]
  const char* taps;             // global: the packed taps of one image (18 x 8192 bytes)
  int total;                    // taps in this CTA's whole run (18 x its images)

  __device__ __forceinline__ uint32_t slot(int t) const { return slots + (t % kSlots) * kTapBytes; }
  __device__ __forceinline__ uint32_t full_bar(int t) const { return full + (t % kSlots) * 8; }
  __device__ __forceinline__ uint32_t empty_bar(int t) const { return empty + (t % kSlots) * 8; }
  // Load tap t into its slot; a slot's earlier use (tap t - kSlots) must be released first.
  __device__ __forceinline__ void issue(int t) const {
    if (t >= total) return;  // nothing past the CTA's last image: no copy outlives the CTA
    if (t >= kSlots) mbar_wait(empty_bar(t), ((t / kSlots) - 1) & 1);
    mbar_arrive_expect_tx(full_bar(t), kTapBytes);
    bulk_load(slot(t), taps + (t % kTapsPerImage) * kTapBytes, kTapBytes, full_bar(t));
  }
};

// One 3x3 conv for this warpgroup's 2.5 tiles (as block0_wgmma::conv3x3), its filter taps
// t0..t0+8 from the ring.
__device__ __forceinline__ void conv3x3_ring(float (&acc0)[32], float (&acc1)[32], float (&acc2)[16],
                                             uint32_t map, const Ring& ring, int t0, int wg, bool producer,
                                             bool releaser) {
#pragma unroll
  for (int i = 0; i < 32; ++i) acc0[i] = acc1[i] = 0.f;
#pragma unroll
  for (int i = 0; i < 16; ++i) acc2[i] = 0.f;
  fence_operands(acc0);
  fence_operands(acc1);
  fence_operands(acc2);
  const uint32_t a0 = map + (wg * 128) * 128, a1 = a0 + 64 * 128, a2 = map + kTile4Q0 * 128;
#pragma unroll 1
  for (int tap = 0; tap < 9; ++tap) {
    const int t = t0 + tap;
    mbar_wait(ring.full_bar(t), (t / kSlots) & 1);
    wgmma_fence();  // (the accumulators' zeroing, then each tap's: orders register use before the wgmma)
    const uint32_t w = ring.slot(t), w_half = w + (wg * 32) * 128;
    const uint32_t shift = ((tap / 3) * kPW + tap % 3) * 128;
#pragma unroll
    for (int kk = 0; kk < 4; ++kk) {
      const uint32_t a_off = shift + kk * 32;
      const uint64_t db = make_desc(w + kk * 32, 0), dbh = make_desc(w_half + kk * 32, 0);
      wgmma_m64n64k16(acc0, make_desc(a0 + a_off, 0), db);
      wgmma_m64n64k16(acc1, make_desc(a1 + a_off, 0), db);
      wgmma_m64n32k16(acc2, make_desc(a2 + a_off, 0), dbh);
    }
    wgmma_commit();
    if (tap > 0) {
      wgmma_wait_le<1>();  // the previous tap's wgmmas are done: its slot is free
      if (releaser) mbar_arrive(ring.empty_bar(t - 1));
      if (producer) ring.issue(t - 1 + kSlots);
      __syncwarp();  // warp 0 converged again before the next .aligned wgmma instruction
    }
  }
  wgmma_wait_le<0>();
  fence_operands(acc0);
  fence_operands(acc1);
  fence_operands(acc2);
  if (releaser) mbar_arrive(ring.empty_bar(t0 + 8));
  if (producer) ring.issue(t0 + 8 + kSlots);
  __syncwarp();
}

// kTimed: count the cycles by phase into p.phase_clk (its 18 registers of counters would push
// the untimed kernel over the 128-register budget into spills, so they are compiled in only here).
template <bool kTimed>
__global__ void __launch_bounds__(kThreads, 2) block0_stream_kernel(Params p) {
#if BLOCK0_WGMMA_ENABLED
  extern __shared__ __align__(1024) unsigned char smem[];
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int wg = warp >> 2;
  const int wrow = (warp & 3) * 16 + (lane >> 2);
  const int ccol = 2 * (lane & 3);
  const uint32_t s_base = smem_addr(smem);
  if (s_base & 1023) __trap();  // the swizzle is by absolute address: needs a 1024-aligned base
  const uint32_t s_a = s_base + kOffA, s_b = s_base + kOffB;
  unsigned char* map_a = smem + kOffA;
  unsigned char* map_b = smem + kOffB;
  float* sum = reinterpret_cast<float*>(smem + kOffSum);
  float* gate = reinterpret_cast<float*>(smem + kOffGate);
  float* hidden = reinterpret_cast<float*>(smem + kOffHidden);
  const bool producer = tid == 0, releaser = (tid & 127) == 0;

  int img = blockIdx.x;
  if (img >= p.n) return;
  const int iterations = (p.n - 1 - img) / gridDim.x + 1;
  Ring ring;
  ring.slots = s_base + kOffRing;
  ring.full = s_base + kOffBar;
  ring.empty = ring.full + kSlots * 8;
  ring.taps = reinterpret_cast<const char*>(p.wtaps);
  ring.total = iterations * kTapsPerImage;

  const bool timed = kTimed && p.phase_clk != nullptr && tid == 0;
  long long clk[kPhases] = {}, t_mark = kTimed ? clock64() : 0;
  auto mark = [&](int phase) {
    if (kTimed && timed) {
      const long long now = clock64();
      clk[phase] += now - t_mark;
      t_mark = now;
    }
  };

  // Once: the barriers, zero both maps (their borders stay zero), the first taps and image.
  if (tid == 0) {
    for (int s = 0; s < kSlots; ++s) {
      mbar_init(ring.full + s * 8, 1);   // the producer's arrive.expect_tx (+ the copy's bytes)
      mbar_init(ring.empty + s * 8, 2);  // one arrival per warpgroup
    }
    mbar_fence_init();
  }
  for (int i = tid; i < kMapBytes / 16; i += kThreads) {
    *reinterpret_cast<uint4*>(map_a + 16 * i) = make_uint4(0, 0, 0, 0);
    *reinterpret_cast<uint4*>(map_b + 16 * i) = make_uint4(0, 0, 0, 0);
  }
  __syncthreads();  // the zeros land before the cp.async writes of the interior; barriers initialized
  if (producer)
    for (int t = 0; t < kSlots; ++t) ring.issue(t);
  load_map_async(s_a, p.x + (size_t)img * kPix * kC);
  cp_async_commit();

  const float b1b = *p.b1b, b2a = *p.b2a, scale = *p.scale, b2b = *p.b2b;
  const __half2 b1a_h2 = __float2half2_rn(*p.b1a);
  mark(8);

  float acc0[32], acc1[32], acc2[16];
  for (int it = 0; img < p.n; img += gridDim.x, ++it) {
    const int t0 = it * kTapsPerImage;
    // ---- 1. the input has landed: xa = x + b1a in place; publish to the async proxy ----
    cp_async_wait_all();
    add_bias_own_chunks(map_a, b1a_h2);
    if (tid < kC) sum[tid] = 0.f;
    fence_proxy_async();
    __syncthreads();
    mark(0);

    // ---- 2. conv1 -> h1 = relu(acc + b1b) + b2a -> B ----
    conv3x3_ring(acc0, acc1, acc2, s_a, ring, t0, wg, producer, releaser);
    mark(1);
    conv1_epilogues(acc0, acc1, acc2, map_b, wg, wrow, ccol, b1b, b2a);
    fence_proxy_async();
    __syncthreads();  // B complete; both warpgroups are done reading A
    mark(2);

    // ---- 3. prefetch the next image into A ----
    prefetch_next(s_a, p.x, img, p.n);

    // ---- 4. conv2 -> h = acc*scale + b2b (registers); SE column sums ----
    conv3x3_ring(acc0, acc1, acc2, s_b, ring, t0 + 9, wg, producer, releaser);
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
    mark(7);
  }
  if (kTimed && timed) {
#pragma unroll
    for (int i = 0; i < kPhases; ++i) p.phase_clk[blockIdx.x * kPhases + i] = clk[i];
  }
#else
  __trap();  // built without sm_90a
#endif
}

template __global__ void block0_stream_kernel<false>(Params);
template __global__ void block0_stream_kernel<true>(Params);

}  // namespace block0_stream
