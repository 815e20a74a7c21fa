// ctest: conv2d_fused_se_gate's sm90 kernel (the halo conv with se_gate as its epilogue) through
// the dispatch library, no torch: random fp16 inputs, NaN-filled outputs, against a double host
// reference of the conv, the squeeze-excite gate, the residual and the pooling, for the first,
// second, middle and last image of batches that give each CTA one image, two (both consumer
// groups) or many.  Exits 77 (skipped) without a CUDA device or where the kernel does not run
// (not sm90, or a build without family 90), saying why.
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "conv2d_fused/conv2d_fused_sm90_halo.h"
#include "cuda_test_util.h"

using namespace cutlass_ops::conv2d_fused;

constexpr int H = 16, W = 16, C = 64, K = 64;

struct Data {
  std::vector<__half> x, idn, w;
  std::vector<float> w1, b1, w2, b2;
  float scalars[4] = {0.8f, 0.1f, -0.2f, 0.3f};  // scale, h_bias, identity_bias, post_bias
};

// The double reference for image n: out (H*W*K) and pooled (8*8*K).
void reference(Data const& d, int R, int n, std::vector<double>& out, std::vector<double>& pooled) {
  std::vector<double> h(H * W * K);
  for (int y = 0; y < H; ++y)
    for (int x = 0; x < W; ++x)
      for (int k = 0; k < K; ++k) {
        double acc = 0;
        for (int r = 0; r < 3; ++r)
          for (int s = 0; s < 3; ++s) {
            int const iy = y + r - 1, ix = x + s - 1;
            if (iy < 0 || iy >= H || ix < 0 || ix >= W) continue;
            __half const* xp = &d.x[((size_t(n) * H + iy) * W + ix) * C];
            __half const* wp = &d.w[((size_t(k) * 3 + r) * 3 + s) * C];
            for (int c = 0; c < C; ++c) acc += double(__half2float(xp[c])) * double(__half2float(wp[c]));
          }
        h[(y * W + x) * K + k] = d.scalars[0] * acc + d.scalars[1];
      }
  std::vector<double> mean(K, 0.0), hidden(R), gate(K);
  for (int p = 0; p < H * W; ++p)
    for (int k = 0; k < K; ++k) mean[k] += h[p * K + k] / (H * W);
  for (int r = 0; r < R; ++r) {
    double v = d.b1[r];
    for (int k = 0; k < K; ++k) v += d.w1[r * K + k] * mean[k];
    hidden[r] = v < 0 ? 0 : v;
  }
  for (int k = 0; k < K; ++k) {
    double v = d.b2[k];
    for (int r = 0; r < R; ++r) v += d.w2[k * R + r] * hidden[r];
    gate[k] = 1 / (1 + std::exp(-v));
  }
  out.assign(H * W * K, 0.0);
  for (int p = 0; p < H * W; ++p)
    for (int k = 0; k < K; ++k) {
      double const v = h[p * K + k] * gate[k] + __half2float(d.idn[(size_t(n) * H * W + p) * K + k]) + d.scalars[2];
      out[p * K + k] = (v < 0 ? 0 : v) + d.scalars[3];
    }
  pooled.assign(8 * 8 * K, 0.0);
  for (int py = 0; py < 8; ++py)
    for (int qx = 0; qx < 8; ++qx)
      for (int k = 0; k < K; ++k) {
        double s = 0;
        for (int dy = -1; dy <= 1; ++dy)
          for (int dx = -1; dx <= 1; ++dx) {
            int const y = 2 * py + dy, x = 2 * qx + dx;
            if (y >= 0 && y < H && x >= 0 && x < W) s += out[(y * W + x) * K + k];
          }
        pooled[(py * 8 + qx) * K + k] = s / 9;
      }
}

// ||got - want|| / ||want|| over the given values (NaN: infinite).
double rel_error(__half const* got, std::vector<double> const& want) {
  double num = 0, den = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    double const g = __half2float(got[i]);
    if (std::isnan(g)) return INFINITY;
    num += (g - want[i]) * (g - want[i]);
    den += want[i] * want[i];
  }
  return std::sqrt(num / den);
}

// Runs one batch; returns true when every checked image is right (or prints the skip and exits 77).
bool run_case(int N, int R, bool pool, int cc, std::mt19937& rng) {
  std::normal_distribution<float> normal(0.f, 1.f);
  Data d;
  size_t const px = size_t(N) * H * W;
  auto halves = [&](size_t n, float scale) {
    std::vector<__half> v(n);
    for (auto& e : v) e = __float2half(normal(rng) * scale);
    return v;
  };
  auto floats = [&](size_t n, float scale) {
    std::vector<float> v(n);
    for (auto& e : v) e = normal(rng) * scale;
    return v;
  };
  d.x = halves(px * C, 1.f);
  d.idn = halves(px * K, 1.f);
  d.w = halves(size_t(K) * 9 * C, 1.f / std::sqrt(9.f * C));
  d.w1 = floats(R * K, 1.f / std::sqrt(float(K)));
  d.b1 = floats(R, 1.f);
  d.w2 = floats(K * R, 1.f / std::sqrt(float(R)));
  d.b2 = floats(K, 1.f);
  __half* out = nullptr;
  __half* pooled = nullptr;
  CHECK_CUDA(cudaMalloc(&out, px * K * sizeof(__half)));
  CHECK_CUDA(cudaMalloc(&pooled, px / 4 * K * sizeof(__half)));
  CHECK_CUDA(cudaMemset(out, 0xff, px * K * sizeof(__half)));  // NaN
  CHECK_CUDA(cudaMemset(pooled, 0xff, px / 4 * K * sizeof(__half)));
  std::vector<float> scalars(d.scalars, d.scalars + 4);
  float* s = to_device(scalars);
  HaloSeGateArgs a{};
  a.dtype = DType::kF16;
  a.N = N; a.H = H; a.W = W; a.C = C; a.K = K; a.R = R;
  a.input = to_device(d.x); a.weight = to_device(d.w); a.identity = to_device(d.idn);
  a.output = out; a.pooled = pool ? pooled : nullptr;
  a.scale = s; a.h_bias = s + 1; a.identity_bias = s + 2; a.post_bias = s + 3;
  a.w1 = to_device(d.w1); a.b1 = to_device(d.b1); a.w2 = to_device(d.w2); a.b2 = to_device(d.b2);
  std::string why_not;
  cutlass::Status const status = run_halo_se_gate(a, cc, nullptr, why_not);
  if (status == cutlass::Status::kErrorNotSupported) {
    std::printf("SKIPPED: the kernel does not run here: %s\n", why_not.c_str());
    std::exit(77);
  }
  CHECK_CUDA(cudaGetLastError());
  CHECK_CUDA(cudaDeviceSynchronize());
  std::vector<__half> h_out(px * K), h_pooled(px / 4 * K);
  CHECK_CUDA(cudaMemcpy(h_out.data(), out, h_out.size() * sizeof(__half), cudaMemcpyDeviceToHost));
  CHECK_CUDA(cudaMemcpy(h_pooled.data(), pooled, h_pooled.size() * sizeof(__half), cudaMemcpyDeviceToHost));
  double worst = 0, worst_pooled = 0;
  int const images[] = {0, N > 1 ? 1 : 0, N / 2, N - 1};
  for (int n : images) {
    std::vector<double> want_out, want_pooled;
    reference(d, R, n, want_out, want_pooled);
    worst = std::fmax(worst, rel_error(&h_out[size_t(n) * H * W * K], want_out));
    if (pool) worst_pooled = std::fmax(worst_pooled, rel_error(&h_pooled[size_t(n) * 64 * K], want_pooled));
  }
  // fp16 output: the rounding of h and of the output give ~3e-4; PyTorch's fp16 block ~4e-4.
  bool const ok = worst < 1e-3 && worst_pooled < 1e-3;
  std::printf("N=%5d R=%2d pool=%d: rel err out %.2e pooled %.2e -> %s\n", N, R, int(pool), worst, worst_pooled,
              ok ? "ok" : "WRONG");
  for (void const* p : {a.input, a.weight, a.identity, static_cast<void const*>(s), static_cast<void const*>(a.w1),
                        static_cast<void const*>(a.b1), static_cast<void const*>(a.w2), static_cast<void const*>(a.b2)})
    CHECK_CUDA(cudaFree(const_cast<void*>(p)));
  CHECK_CUDA(cudaFree(out));
  CHECK_CUDA(cudaFree(pooled));
  return ok;
}

int main() {
  cudaDeviceProp const prop = device_or_skip();
  int const cc = prop.major * 10 + prop.minor, sms = prop.multiProcessorCount;
  std::printf("device: %s (sm%d, %d SMs)\n", prop.name, cc, sms);
  std::mt19937 rng(1234);
  struct { int N, R; bool pool; } const cases[] = {
      {1, 4, true}, {3, 16, false}, {sms, 4, true},  // one image a CTA (group 0 only)
      {sms + 1, 4, true}, {2 * sms, 1, false},       // two: both consumer groups
      {2 * sms + 1, 4, true}, {2048, 4, true},       // three (an odd count) and many
  };
  int failed = 0;
  for (auto const& c : cases) failed += !run_case(c.N, c.R, c.pool, cc, rng);
  std::printf("%d passed, %d failed\n", int(sizeof(cases) / sizeof(cases[0])) - failed, failed);
  return failed ? 1 : 0;
}
