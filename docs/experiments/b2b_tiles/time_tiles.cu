// Times conv2d_b2b's shipped tile shapes against 128-row (4 or 8 warp) ones on the problems
// of `cutlass_ops bench b2b` (fp16, N=128), and checks each variant's output against the shipped
// one's (which tests/python/test_conv2d_b2b.py checks against float64).  See README.md.
#include <cuda_runtime.h>

#include <cmath>
#include <cstdio>
#include <random>
#include <vector>

#include "conv2d_b2b/conv2d_b2b_instance.cuh"
#include "cuda_test_util.h"

using namespace cutlass_ops::conv2d_b2b;
using cutlass::gemm::GemmShape;
using Half = cutlass::half_t;

// 128 GEMM rows per CTA.  RF-resident (K1 <= 64): 4 warps of 32 x K rows.  Smem-resident:
// 8 warps, the shipped warp shapes.
template <int K0, int K1>
struct RfM128 {
  using ThreadblockShape0 = GemmShape<128, K0, 32>;
  using WarpShape0 = GemmShape<32, K0, 32>;
  using ThreadblockShape1 = GemmShape<128, K1, 32>;
  using WarpShape1 = GemmShape<32, K1, 32>;
  static constexpr bool kSmemAccumulator = false;
};
template <int K0, int K1>
struct SmemM128 {
  using ThreadblockShape0 = GemmShape<128, K0, 32>;
  using WarpShape0 = GemmShape<32, 32, 32>;
  using ThreadblockShape1 = GemmShape<128, K1, 32>;
  using WarpShape1 = GemmShape<64, K1 / 4, 32>;
  static constexpr bool kSmemAccumulator = true;
};

using RunFn = cutlass::Status (*)(Conv2dB2bArgs const&, cudaStream_t, int);
struct Variant {
  char const* name;
  int k0, k1;
  RunFn run;
};
Variant const kVariants[] = {
    {"64->64 shipped: RF, 64 rows, 2 warps", 64, 64, &run_b2b<Half, 64, 64>},
    {"64->64 RF, 128 rows, 4 warps", 64, 64, &run_b2b<Half, 64, 64, RfM128<64, 64>>},
    {"64->128 shipped: smem, 64 rows, 4 warps", 64, 128, &run_b2b<Half, 64, 128>},
    {"64->128 smem, 128 rows, 8 warps", 64, 128, &run_b2b<Half, 64, 128, SmemM128<64, 128>>},
    {"64->256 shipped: smem, 64 rows, 4 warps", 64, 256, &run_b2b<Half, 64, 256>},
    {"64->256 smem, 128 rows, 8 warps", 64, 256, &run_b2b<Half, 64, 256, SmemM128<64, 256>>},
};

int main() {
  cudaDeviceProp const prop = device_or_skip();
  std::printf("device: %s\n", prop.name);
  std::mt19937 rng(7);
  std::normal_distribution<float> normal(0.f, 1.f);
  auto fill = [&](size_t n, float std) {
    std::vector<Half> v(n);
    for (auto& e : v) e = Half(normal(rng) * std);
    return v;
  };
  cudaStream_t stream;
  CHECK_CUDA(cudaStreamCreate(&stream));
  cudaEvent_t start, stop;
  CHECK_CUDA(cudaEventCreate(&start));
  CHECK_CUDA(cudaEventCreate(&stop));
  int const kLaunches = 200;
  // (K1, H = W): bench b2b's problems, N=128, C=K0=64, 3x3 pad 1.
  for (auto [k1, hw] : {std::pair<int, int>{64, 56}, {128, 28}, {256, 56}}) {
    int const N = 128, C = 64, K0 = 64, R = 3;
    Conv2dB2bArgs a{};
    a.dtype = DType::kF16;
    a.N = N; a.H = a.W = a.P = a.Q = hw; a.C = C; a.K0 = K0; a.R = a.S = R; a.K1 = k1;
    a.pad_h = a.pad_w = 1; a.stride_h = a.stride_w = 1;
    size_t const ny = size_t(N) * hw * hw * k1;
    a.input = to_device(fill(size_t(N) * hw * hw * C, 1.f));
    a.w0 = to_device(fill(size_t(K0) * R * R * C, 1.f / std::sqrt(float(C * R * R))));
    std::vector<float> b0(K0);
    for (auto& b : b0) b = 0.5f * normal(rng);
    a.bias0 = to_device(b0);
    a.w1 = to_device(fill(size_t(k1) * K0, 1.f / std::sqrt(float(K0))));
    a.bias1 = to_device(fill(k1, 0.5f));
    Half* out = to_device(std::vector<Half>(ny));
    a.output = out;
    std::vector<Half> shipped, got(ny);
    std::printf("\nN=%d %dx%d C=%d 3x3 -> %d, 1x1 -> %d, fp16; ms per launch over %d back-to-back launches\n", N,
                hw, hw, C, K0, k1, kLaunches);
    for (Variant const& v : kVariants) {
      if (v.k1 != k1) continue;
      CHECK_CUDA(cudaMemset(out, 0xff, ny * sizeof(Half)));  // NaN: a tile left unwritten shows
      cutlass::Status s = v.run(a, stream, 1);
      if (s != cutlass::Status::kSuccess) {
        std::printf("  %-44s %s\n", v.name, cutlass::cutlassGetStatusString(s));
        continue;
      }
      CHECK_CUDA(cudaStreamSynchronize(stream));
      CHECK_CUDA(cudaMemcpy(got.data(), out, ny * sizeof(Half), cudaMemcpyDeviceToHost));
      if (shipped.empty()) shipped = got;
      double e2 = 0, r2 = 0;
      for (size_t i = 0; i < ny; ++i) {
        double d = double(float(got[i])) - double(float(shipped[i]));
        e2 += std::isfinite(d) ? d * d : INFINITY;
        r2 += double(float(shipped[i])) * double(float(shipped[i]));
      }
      v.run(a, stream, 20);  // warm-up
      float best = INFINITY;
      for (int rep = 0; rep < 5; ++rep) {
        CHECK_CUDA(cudaEventRecord(start, stream));
        v.run(a, stream, kLaunches);
        CHECK_CUDA(cudaEventRecord(stop, stream));
        CHECK_CUDA(cudaEventSynchronize(stop));
        float ms = 0;
        CHECK_CUDA(cudaEventElapsedTime(&ms, start, stop));
        best = std::min(best, ms / kLaunches);
      }
      std::printf("  %-44s %.4f ms   vs shipped: rel %.1e\n", v.name, best, std::sqrt(e2 / r2));
    }
    for (void const* p : {a.input, a.w0, static_cast<void const*>(a.bias0), a.w1, a.bias1}) cudaFree(const_cast<void*>(p));
    cudaFree(out);
  }
  return 0;
}
