// space_to_depth_conv's sm80 kernel (kernels/space_to_depth_conv/space_to_depth_conv_fast.cuh)
// on the CPU emulator, with the launch shape (warps a CTA, grid) and load mode given by the
// caller.  Built by tests/python/test_space_to_depth_conv_emulator.py:
//   g++ -I kernels -include cuda_emulate_prelude.h stem_harness.cpp
#include <cstdint>
#include <vector>

namespace cutlass_ops {
namespace space_to_depth_conv {
namespace fast {
#include "fmlp_emulate.h"  // mma_f16 / mma_bf16 (m16n8k16 fragment layouts)

// cp.async as the GPU may run it: each copy lands only at the wait that covers its group.
struct Copy {
  void* dst;
  void const* src;
  int bytes;
  bool valid;
};
struct Pending {
  std::vector<std::vector<Copy>> committed;
  std::vector<Copy> open;
};
inline std::vector<Pending>& pending() {
  static std::vector<Pending> p(1024);
  return p;
}
inline Pending& mine() { return pending()[cuda_emu::cta()->current]; }
template <int kBytes>
inline void copy_async(void* smem_dst, void const* gmem_src, bool valid) {
  mine().open.push_back({smem_dst, gmem_src, kBytes, valid});
}
inline void copy_async_commit() {
  Pending& p = mine();
  p.committed.push_back(std::move(p.open));
  p.open.clear();
}
template <int kPending>
inline void copy_async_wait() {
  Pending& p = mine();
  while (static_cast<int>(p.committed.size()) > kPending) {
    for (Copy& c : p.committed.front()) {
      if (c.valid) std::memcpy(c.dst, c.src, c.bytes); else std::memset(c.dst, 0, c.bytes);
    }
    p.committed.erase(p.committed.begin());
  }
}
template <typename T>
inline void mma16816(float* d, uint32_t const* a, uint32_t b0, uint32_t b1) {
  uint32_t const b[2] = {b0, b1};
  if constexpr (std::is_same<T, __half>::value) mma_f16(d, a, b); else mma_bf16(d, a, b);
}
inline uint32_t shfl_xor_u32(uint32_t v, int mask) {
  float f;
  std::memcpy(&f, &v, 4);
  f = cuda_emu::shfl_xor(0xffffffffu, f, mask);
  std::memcpy(&v, &f, 4);
  return v;
}
}  // namespace fast
}  // namespace space_to_depth_conv
}  // namespace cutlass_ops
#define CUTLASS_OPS_STEM_EMULATED

#include "space_to_depth_conv/space_to_depth_conv_fast.cuh"

using namespace cutlass_ops::space_to_depth_conv;

namespace {
template <typename T, int K>
int run(fast::FastParams const& p, unsigned grid, unsigned seed) {
  size_t const bytes = fast::smem_bytes(p.C, K, p.warps);
  std::vector<uint4> smem(bytes / sizeof(uint4) + 1);
  auto body = [&] {
    fast::pending()[cuda_emu::cta()->current] = fast::Pending();
    fast::fast_body<T, K>(p, reinterpret_cast<unsigned char*>(smem.data()), threadIdx.x);
    fast::Pending& left = fast::mine();
    for (auto& g : left.committed)
      if (!g.empty()) std::abort();  // a copy issued and never waited for
  };
  return cuda_emu::launch(body, grid, 32 * p.warps, reinterpret_cast<unsigned char*>(smem.data()), bytes, seed) ? 0
                                                                                                                 : 1;
}
template <typename T>
int run_k(fast::FastParams const& p, int K, unsigned grid, unsigned seed) {
  switch (K) {
    case 32: return run<T, 32>(p, grid, seed);
    case 64: return run<T, 64>(p, grid, seed);
    case 128: return run<T, 128>(p, grid, seed);
    default: return 2;
  }
}
}  // namespace

// Returns 0, 1 on a deadlock, 2 for an unsupported K.
extern "C" int emu_stem(int bf16, int N, int C, int H, int W, int K, int64_t sn, int64_t sc, int64_t sh, int64_t sw,
                        const void* x, const void* w, void* out, const float* post_bias, int relu, int warps,
                        unsigned grid, int mode, unsigned seed) {
  fast::FastParams p{};
  p.input = x; p.weight = w; p.output = out; p.post_bias = post_bias;
  p.stride_n = sn; p.stride_c = sc; p.stride_h = sh; p.stride_w = sw;
  p.C = C; p.P = H / kBlock; p.Q = W / kBlock; p.M = N * p.P * p.Q;
  p.warps = warps; p.mode = mode; p.relu = relu != 0;
  return bf16 ? run_k<__nv_bfloat16>(p, K, grid, seed) : run_k<__half>(p, K, grid, seed);
}
