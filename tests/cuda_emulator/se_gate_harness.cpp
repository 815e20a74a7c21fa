// cutlass_ops::se_gate's kernel (kernels/se_gate/se_gate_device.cuh) on the CPU emulator, with
// the launch shape given by the caller (images per CTA, W2 staged, maps cached) so that a test
// covers every shape the launcher may pick.  Built by tests/python/test_se_gate_emulator.py:
//   g++ -I kernels -include cuda_emulate_prelude.h se_gate_harness.cpp
#include <algorithm>

using std::min;  // the kernel's device min(int, int)

// cp.async as the GPU may run it: each copy lands only at the wait that covers its group, so a
// read of shared memory before that wait sees the emulator's poison.
namespace cutlass_ops {
namespace se_gate {
inline void copy16_async(void* smem_dst, void const* gmem_src) {
  cuda_emu::Cta* c = cuda_emu::cta();
  c->fibers[c->current].open.copies.emplace_back(smem_dst, gmem_src);
}
inline void copy_async_commit() {
  cuda_emu::Fiber& f = cuda_emu::cta()->fibers[cuda_emu::cta()->current];
  f.committed.push_back(std::move(f.open));
  f.open = cuda_emu::CopyGroup();
}
template <int kPending>
inline void copy_async_wait() {
  cuda_emu::Fiber& f = cuda_emu::cta()->fibers[cuda_emu::cta()->current];
  while (static_cast<int>(f.committed.size()) > kPending) {
    for (auto& copy : f.committed.front().copies) std::memcpy(copy.first, copy.second, 16);
    f.committed.erase(f.committed.begin());
  }
}
}  // namespace se_gate
}  // namespace cutlass_ops
#define CUTLASS_OPS_EMULATED_CP_ASYNC

#include "se_gate/se_gate_device.cuh"

using namespace cutlass_ops::se_gate;

namespace {
template <typename T, int kImages>
int run(SeGateArgs const& a, unsigned seed) {
  size_t const bytes = sizeof(float) * SmemLayout(a.C, a.R, kImages, a.stage_w2, a.H * a.W, a.cache_maps).total;
  std::vector<float4> smem(bytes / sizeof(float4) + 1);  // 16-byte aligned
  auto body = [&] { se_gate_body<T, kImages>(a, reinterpret_cast<float*>(smem.data())); };
  unsigned const grid = static_cast<unsigned>((a.N + kImages - 1) / kImages);
  return cuda_emu::launch(body, grid, kThreads, reinterpret_cast<unsigned char*>(smem.data()), bytes, seed) ? 0 : 1;
}

template <typename T>
int run_images(SeGateArgs const& a, int images, unsigned seed) {
  switch (images) {
    case 1: return run<T, 1>(a, seed);
    case 2: return run<T, 2>(a, seed);
    case 4: return run<T, 4>(a, seed);
    case 8: return run<T, 8>(a, seed);
    default: return 2;
  }
}
}  // namespace

// Returns 0, 1 on a deadlock, 2 for an images_per_cta the kernel has no instance for.
// Optional pointers may be null (pooled, the scalars, means_out, gate_in, the excite weights
// in gate_in mode).
extern "C" int emu_se_gate(int bf16, int N, int H, int W, int C, int R, const void* h, const void* identity,
                           void* out, void* pooled, const float* w1, const float* b1, const float* w2,
                           const float* b2, const float* identity_bias, const float* post_bias, const float* h_bias,
                           void* means_out, const void* gate_in, int images_per_cta, int stage_w2, int cache_maps,
                           unsigned seed) {
  SeGateArgs a{};
  a.dtype = bf16 ? DType::kBF16 : DType::kF16;
  a.N = N; a.H = H; a.W = W; a.C = C; a.R = R;
  a.h = h; a.identity = identity; a.out = out; a.pooled = pooled;
  a.w1 = w1; a.b1 = b1; a.w2 = w2; a.b2 = b2;
  a.identity_bias = identity_bias; a.post_bias = post_bias; a.h_bias = h_bias;
  a.means_out = means_out; a.gate_in = gate_in;
  a.stage_w2 = stage_w2 != 0;
  a.cache_maps = cache_maps != 0;
  a.programmatic_launch = false;
  return bf16 ? run_images<__nv_bfloat16>(a, images_per_cta, seed) : run_images<__half>(a, images_per_cta, seed);
}
