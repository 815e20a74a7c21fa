// ctest: runs every generated conv2d_b2b instance of the build (the dispatch table) on random
// data and checks it against CUTLASS's host reference convs, with the first conv's output
// rounded to the element type between the two as the fused kernel rounds it.  Exits 77
// (reported as skipped by ctest) when there is no CUDA device of sm80 or newer.
#include <cuda_runtime.h>

#include <array>
#include <cmath>
#include <cstdio>
#include <random>
#include <vector>

#include "cuda_test_util.h"
#include "conv2d_b2b/conv2d_b2b_args.h"
#include "cutlass/conv/conv2d_problem_size.h"
#include "cutlass/layout/tensor.h"
#include "cutlass/numeric_types.h"
#include "cutlass/util/reference/host/convolution.h"

using namespace cutlass_ops::conv2d_b2b;

// One case for one instance: N images of H x W with C channels, a RxR conv (pad, stride) to
// the instance's K0, then its 1x1 conv to K1.
template <typename Element>
bool run_case(KernelEntry const& k, int N, int H, int W, int C, int R, int pad, int stride, std::mt19937& rng) {
  using Layout = cutlass::layout::TensorNHWC;
  int const K0 = k.k0, K1 = k.k1;
  int const P = (H + 2 * pad - R) / stride + 1, Q = (W + 2 * pad - R) / stride + 1;
  std::normal_distribution<float> normal(0.f, 1.f);
  auto fill = [&](size_t n, float std) {
    std::vector<Element> v(n);
    for (auto& e : v) e = Element(normal(rng) * std);
    return v;
  };
  size_t const nx = size_t(N) * H * W * C, ny0 = size_t(N) * P * Q * K0, ny = size_t(N) * P * Q * K1;
  auto x = fill(nx, 1.f), w0 = fill(size_t(K0) * R * R * C, 1.f / std::sqrt(float(C * R * R)));
  auto w1 = fill(size_t(K1) * K0, 1.f / std::sqrt(float(K0)));
  std::vector<float> b0(K0);
  for (auto& b : b0) b = 0.5f * normal(rng);  // non-zero: a dropped bias shows
  auto b1 = fill(K1, 0.5f);

  Conv2dB2bArgs a{};
  a.dtype = k.dtype;
  a.N = N; a.H = H; a.W = W; a.C = C; a.K0 = K0; a.R = R; a.S = R; a.P = P; a.Q = Q; a.K1 = K1;
  a.pad_h = a.pad_w = pad; a.stride_h = a.stride_w = stride;
  a.input = to_device(x); a.w0 = to_device(w0); a.bias0 = to_device(b0); a.w1 = to_device(w1);
  a.bias1 = to_device(b1);
  Element* d_out = to_device(std::vector<Element>(ny, Element(NAN)));  // poisoned
  a.output = d_out;
  cutlass::Status status = k.run(a, nullptr);
  if (status != cutlass::Status::kSuccess) {
    std::printf("FAIL %s: %s\n", k.name, cutlass::cutlassGetStatusString(status));
    return false;
  }
  CHECK_CUDA(cudaDeviceSynchronize());
  std::vector<Element> y(ny);
  CHECK_CUDA(cudaMemcpy(y.data(), d_out, ny * sizeof(Element), cudaMemcpyDeviceToHost));

  // Reference: conv0 in float, + bias0, ReLU, rounded to Element; conv1 in float, + bias1, ReLU.
  std::vector<float> acc0(ny0, 0.f), acc1(ny, 0.f);
  cutlass::conv::Conv2dProblemSize p0(N, H, W, C, K0, R, R, P, Q, pad, pad, stride, stride, 1, 1,
                                      cutlass::conv::Mode::kCrossCorrelation);
  cutlass::reference::host::Conv2dFprop<Element, Layout, Element, Layout, float, Layout, float, float>(
      p0, {x.data(), Layout::packed({N, H, W, C})}, {w0.data(), Layout::packed({K0, R, R, C})},
      {acc0.data(), Layout::packed({N, P, Q, K0})}, {acc0.data(), Layout::packed({N, P, Q, K0})}, 1.f, 0.f);
  std::vector<Element> y0(ny0);
  for (size_t i = 0; i < ny0; ++i) y0[i] = Element(std::max(0.f, acc0[i] + b0[i % K0]));
  cutlass::conv::Conv2dProblemSize p1(N, P, Q, K0, K1, 1, 1, P, Q, 0, 0, 1, 1, 1, 1,
                                      cutlass::conv::Mode::kCrossCorrelation);
  cutlass::reference::host::Conv2dFprop<Element, Layout, Element, Layout, float, Layout, float, float>(
      p1, {y0.data(), Layout::packed({N, P, Q, K0})}, {w1.data(), Layout::packed({K1, 1, 1, K0})},
      {acc1.data(), Layout::packed({N, P, Q, K1})}, {acc1.data(), Layout::packed({N, P, Q, K1})}, 1.f, 0.f);

  double err2 = 0, ref2 = 0, max_err = 0;
  for (size_t i = 0; i < ny; ++i) {
    double v = std::max(0.0, double(acc1[i]) + double(float(b1[i % K1])));
    double got = float(y[i]);
    double e = std::isfinite(got) ? std::abs(got - v) : INFINITY;
    err2 += e * e; ref2 += v * v; max_err = std::max(max_err, e);
  }
  double const rel = std::sqrt(err2 / ref2);
  double const bound = k.dtype == DType::kF16 ? 2e-3 : 1e-2;
  bool const ok = rel < bound && std::isfinite(max_err);
  std::printf("%s %s N%d %dx%d C%d %dx%d pad%d stride%d: rel %.2e max %.2e\n", ok ? "ok  " : "FAIL", k.name, N, H,
              W, C, R, R, pad, stride, rel, max_err);
  cudaFree(const_cast<void*>(a.input)); cudaFree(const_cast<void*>(a.w0)); cudaFree(const_cast<float*>(a.bias0));
  cudaFree(const_cast<void*>(a.w1)); cudaFree(const_cast<void*>(a.bias1)); cudaFree(d_out);
  return ok;
}

int main() {
  cudaDeviceProp const prop = device_or_skip();
  if (prop.major < 8) {
    std::printf("SKIPPED: %s is sm%d%d; the B2B instances need sm80+\n", prop.name, prop.major, prop.minor);
    return 77;
  }
  std::printf("device: %s, %d B2B instances in the table\n", prop.name, kNumKernels);
  std::mt19937 rng(4321);
  int failed = 0, ran = 0;
  for (int i = 0; i < kNumKernels; ++i) {
    KernelEntry const& k = kKernels[i];
    if (k.run == nullptr) continue;
    for (auto [n, hw, c, r, pad, stride] : {std::array<int, 6>{3, 9, 16, 3, 1, 1}, std::array<int, 6>{2, 13, 64, 3, 1, 2},
                                            std::array<int, 6>{5, 7, 8, 1, 0, 1}}) {
      bool const ok = k.dtype == DType::kF16 ? run_case<cutlass::half_t>(k, n, hw, hw + 2, c, r, pad, stride, rng)
                                             : run_case<cutlass::bfloat16_t>(k, n, hw, hw + 2, c, r, pad, stride, rng);
      failed += !ok;
      ++ran;
    }
  }
  std::printf("%d passed, %d failed\n", ran - failed, failed);
  return failed ? 1 : 0;
}
