// A CPU stand-in for the CUDA execution model, just enough to run this project's hand-written
// kernels unchanged on a machine without a GPU: FusedMLP's generated kernels
// (python/cutlass_ops_gen/mlp_kernel.cuh + mlp_emit.py; tests/python/test_mlp_emulator.py compiles
// one with g++ -DFMLP_EMULATE and -include this file), the LayerNorm kernel
// (kernels/layer_norm_rows/layer_norm_rows_device.cuh; tests/python/test_layer_norm.py) and others
// (dw_conv, se_gate: their *_harness.cpp).  Each CUDA thread
// of a CTA is a fiber (ucontext) on one OS thread; a fiber runs until it reaches __syncthreads,
// __syncwarp or a warp-collective instruction (__shfl_xor_sync here; ldmatrix and mma:
// fmlp_emulate.h), where it waits for the others.  CTAs run one after another, each with
// shared memory poisoned (0xFF bytes: NaN in fp16/bf16/fp32) so that reading what nobody wrote
// shows.  With a seed, the fibers run in a shuffled order and each round only a random half of
// the warps runs, so warps drift apart between block barriers: two seeds giving different
// results means a missing barrier (seed 0: every thread in turn, lockstep).  cp.async copies
// land only at cp.async.wait_group (as on the GPU, where they may land any time before it), so
// a read before the wait sees the poison.
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stdint.h>
#include <ucontext.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <random>
#include <vector>

// CUDA keywords as plain C++ (host_defines.h made them attributes g++ does not know)
#undef __global__
#undef __device__
#undef __host__
#undef __forceinline__
#undef __shared__
#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __shared__
#define __launch_bounds__(...)

namespace cuda_emu {

struct Barrier {
  int count = 0, arrived = 0;
  long phase = 0;
};

struct CopyGroup {
  std::vector<std::pair<void*, const void*>> copies;  // 16-byte cp.async copies, landing at wait
};

struct Fiber {
  ucontext_t ctx;
  std::vector<char> stack;
  dim3 tid;
  bool done = false;
  std::vector<CopyGroup> committed;
  CopyGroup open;
};

// the warp's exchange slots for collective instructions
struct WarpSlots {
  const void* addr[32];
  uint32_t a[32][4], b[32][2];
  float f[32];
};

struct Cta {
  std::vector<Fiber> fibers;
  std::vector<Barrier> warp_barriers;
  std::vector<WarpSlots> slots;
  Barrier block;
  int current = -1;
  long progress = 0;
  ucontext_t scheduler;
  std::function<void()> body;
  bool deadlock = false;
};

inline Cta*& cta() {
  static Cta* c = nullptr;
  return c;
}
inline dim3& block_idx() {
  static dim3 b;
  return b;
}
inline dim3& grid_dim() {
  static dim3 g;
  return g;
}

inline void yield() {
  Cta* c = cta();
  swapcontext(&c->fibers[c->current].ctx, &c->scheduler);
}

inline void arrive_and_wait(Barrier& b) {
  const long phase = b.phase;
  if (++b.arrived == b.count) {
    b.arrived = 0;
    ++b.phase;
    ++cta()->progress;
  } else {
    while (b.phase == phase) yield();
  }
}

inline void sync_block() { arrive_and_wait(cta()->block); }
inline void sync_warp() {
  Cta* c = cta();
  arrive_and_wait(c->warp_barriers[c->fibers[c->current].tid.x / 32]);
}
inline unsigned lane() { return cta()->fibers[cta()->current].tid.x & 31; }
inline WarpSlots& slots() {
  Cta* c = cta();
  return c->slots[c->fibers[c->current].tid.x / 32];
}

inline void trampoline() {
  Cta* c = cta();
  c->body();
  c->fibers[c->current].done = true;
  ++c->progress;
}

// Runs `body` as one CTA of `threads` threads (blockIdx = block); smem (bytes) poisoned first.
// Returns false on a deadlock (threads waiting at barriers that the others never reach).
inline bool run_cta(const std::function<void()>& body, int threads, dim3 block, unsigned char* smem, size_t smem_bytes,
                    unsigned seed) {
  Cta c;
  cta() = &c;
  block_idx() = block;
  c.body = body;
  std::memset(smem, 0xFF, smem_bytes);
  c.fibers.resize(threads);
  c.warp_barriers.resize((threads + 31) / 32);
  c.slots.resize((threads + 31) / 32);
  for (auto& b : c.warp_barriers) b.count = 32;
  c.block.count = threads;
  for (int i = 0; i < threads; ++i) {
    Fiber& f = c.fibers[i];
    f.tid = dim3(i, 0, 0);
    f.stack.resize(256 * 1024);
    getcontext(&f.ctx);
    f.ctx.uc_stack.ss_sp = f.stack.data();
    f.ctx.uc_stack.ss_size = f.stack.size();
    f.ctx.uc_link = &c.scheduler;
    makecontext(&f.ctx, trampoline, 0);
  }
  std::mt19937 rng(seed);
  std::vector<int> order(threads);
  for (int i = 0; i < threads; ++i) order[i] = i;
  const int warps = (threads + 31) / 32;
  std::vector<char> runs(warps, 1);
  long last = -1;
  int idle_rounds = 0;
  for (;;) {
    bool live = false;
    if (seed) {
      // a random half of the warps run this round: warps drift apart between block barriers,
      // as they do on the GPU, so a read of another warp's tile that a barrier should order
      // sees its data from before or after (the shuffle does the same for lanes of a warp)
      std::shuffle(order.begin(), order.end(), rng);
      bool any = false;
      for (auto& r : runs) any |= (r = (char)(rng() & 1));
      if (!any) runs[rng() % warps] = 1;
    }
    for (int i : order) {
      if (c.fibers[i].done || !runs[i / 32]) continue;
      live = true;
      c.current = i;
      swapcontext(&c.scheduler, &c.fibers[i].ctx);
    }
    if (!live) {
      bool all_done = true;
      for (auto& f : c.fibers) all_done &= f.done;
      if (all_done) break;
    }
    if (c.progress == last) {
      if (++idle_rounds > 200) {
        std::fprintf(stderr, "cuda_emu: deadlock in CTA %u (threads waiting at a barrier others never reach)\n",
                     block.x);
        cta() = nullptr;
        return false;
      }
    } else {
      idle_rounds = 0;
    }
    last = c.progress;
  }
  cta() = nullptr;
  return true;
}

// Runs a kernel over a grid, CTA by CTA.
inline bool launch(const std::function<void()>& body, unsigned grid, int threads, unsigned char* smem,
                   size_t smem_bytes, unsigned seed) {
  grid_dim() = dim3(grid, 1, 1);
  for (unsigned b = 0; b < grid; ++b)
    if (!run_cta(body, threads, dim3(b, 0, 0), smem, smem_bytes, seed ? seed + b : 0)) return false;
  return true;
}

}  // namespace cuda_emu

namespace cuda_emu {
// __shfl_xor_sync over the whole warp (the mask must name all 32 lanes, as this project's
// kernels pass): every lane posts its value, then reads its partner's.
inline float shfl_xor(unsigned mask, float v, int offset) {
  if (mask != 0xffffffffu) {
    std::fprintf(stderr, "cuda_emu: __shfl_xor_sync with a partial mask is not emulated\n");
    std::abort();
  }
  WarpSlots& s = slots();
  const unsigned l = lane();
  s.f[l] = v;
  sync_warp();
  const float out = s.f[l ^ (unsigned)offset];
  sync_warp();
  return out;
}
}  // namespace cuda_emu

#define __shfl_xor_sync(mask, v, offset) cuda_emu::shfl_xor(mask, v, offset)
// device math the kernels use that host C++ lacks
inline float rsqrtf(float x) { return 1.0f / std::sqrt(x); }
inline float __expf(float x) { return std::exp(x); }  // the fast exp, as exact here
#define threadIdx (cuda_emu::cta()->fibers[cuda_emu::cta()->current].tid)
#define blockIdx (cuda_emu::block_idx())
#define gridDim (cuda_emu::grid_dim())
#define __syncthreads() cuda_emu::sync_block()
#define __syncwarp() cuda_emu::sync_warp()
