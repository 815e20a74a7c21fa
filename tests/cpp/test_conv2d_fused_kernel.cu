// ctest: runs generated conv2d_fused kernels through the dispatch table on random data and
// checks them against CUTLASS's host reference conv plus the epilogue evaluated in double.
// Exits 77 (reported as skipped by ctest) when there is no CUDA device.
#include <cuda_runtime.h>

#include <cmath>
#include <cstdio>
#include <random>
#include <vector>

#include "cuda_test_util.h"
#include "conv2d_fused/conv2d_fused_dispatch.h"
#include "cutlass/conv/conv2d_problem_size.h"
#include "cutlass/layout/tensor.h"
#include "cutlass/numeric_types.h"
#include "cutlass/util/reference/host/convolution.h"

using namespace cutlass_ops::conv2d_fused;

struct Case {
  int N, H, W, C, K, R, S, pad, stride;
  int act;  // Activation: 0 identity, 1 ReLU, 2 SiLU
  bool residual, bias;
};

// Returns true when the kernel output matches; prints the case, the kernel and the errors.
bool run_case(Case const& c, int cc, int sms, std::mt19937& rng) {
  using Element = cutlass::half_t;
  using Layout = cutlass::layout::TensorNHWC;
  int P = (c.H + 2 * c.pad - c.R) / c.stride + 1, Q = (c.W + 2 * c.pad - c.S) / c.stride + 1;
  std::normal_distribution<float> normal(0.f, 1.f);
  auto fill = [&](size_t n, float std) {
    std::vector<Element> v(n);
    for (auto& e : v) e = Element(normal(rng) * std);
    return v;
  };
  size_t nx = size_t(c.N) * c.H * c.W * c.C, nw = size_t(c.K) * c.R * c.S * c.C,
         ny = size_t(c.N) * P * Q * c.K;
  auto x = fill(nx, 1.f), w = fill(nw, 1.f / std::sqrt(float(c.C * c.R * c.S))), res = fill(ny, 1.f);
  std::vector<float> bias(c.K);
  for (auto& b : bias) b = normal(rng);
  // Random non-zero scalars: neutral values would hide a dropped term.
  float scale = 0.5f + std::abs(normal(rng)), bias_s = normal(rng), post = normal(rng);

  Conv2dFusedArgs a{};
  a.dtype = DType::kF16;
  a.N = c.N; a.H = c.H; a.W = c.W; a.C = c.C; a.K = c.K; a.R = c.R; a.S = c.S; a.P = P; a.Q = Q;
  a.pad_h = a.pad_w = c.pad; a.stride_h = a.stride_w = c.stride;
  a.input = to_device(x);
  a.weight = to_device(w);
  a.residual = c.residual ? to_device(res) : nullptr;
  Element* d_out = to_device(std::vector<Element>(ny, Element(NAN)));  // poisoned
  a.output = d_out;
  float scalars[3] = {scale, bias_s, post};
  float* d_scalars = to_device(std::vector<float>(scalars, scalars + 3));
  a.scale = d_scalars; a.bias_scalar = d_scalars + 1; a.post_bias = d_scalars + 2;
  a.bias = c.bias ? to_device(bias) : nullptr;
  a.act = static_cast<Activation>(c.act);
  std::vector<int> semaphores(4096, 0);
  a.workspace = to_device(semaphores);  // lets the dispatcher use serial split-K
  a.workspace_bytes = semaphores.size() * sizeof(int);

  LaunchResult r = launch(a, cc, sms, nullptr);
  if (!r.kernel || r.status != cutlass::Status::kSuccess) {
    std::printf("FAIL no kernel ran: %s\n", r.why_not.c_str());
    return false;
  }
  CHECK_CUDA(cudaDeviceSynchronize());
  std::vector<Element> y(ny);
  CHECK_CUDA(cudaMemcpy(y.data(), d_out, ny * sizeof(Element), cudaMemcpyDeviceToHost));

  // CUTLASS host reference for the conv, float accumulation into a float tensor.
  std::vector<float> acc(ny, 0.f);
  cutlass::conv::Conv2dProblemSize problem(c.N, c.H, c.W, c.C, c.K, c.R, c.S, P, Q, c.pad, c.pad,
                                           c.stride, c.stride, 1, 1,
                                           cutlass::conv::Mode::kCrossCorrelation);
  cutlass::reference::host::Conv2dFprop<Element, Layout, Element, Layout, float, Layout, float, float>(
      problem, {x.data(), Layout::packed({c.N, c.H, c.W, c.C})},
      {w.data(), Layout::packed({c.K, c.R, c.S, c.C})}, {acc.data(), Layout::packed({c.N, P, Q, c.K})},
      {acc.data(), Layout::packed({c.N, P, Q, c.K})}, 1.f, 0.f);

  double err2 = 0, ref2 = 0, max_err = 0;
  for (size_t i = 0; i < ny; ++i) {
    double v = double(scale) * acc[i] + bias_s + (c.bias ? bias[i % c.K] : 0.0) +
               (c.residual ? double(float(res[i])) : 0.0);
    if (c.act == 1) v = v < 0 ? 0 : v;
    if (c.act == 2) v = v / (1 + std::exp(-v));
    v += post;
    double got = float(y[i]);
    double e = std::isfinite(got) ? std::abs(got - v) : INFINITY;
    err2 += e * e; ref2 += v * v; max_err = std::max(max_err, e);
  }
  double rel = std::sqrt(err2 / ref2);
  bool ok = rel < 2e-3 && std::isfinite(max_err);
  std::printf("%s N%d %dx%d C%d->K%d %dx%d pad%d stride%d act%d res%d bias%d: %s split_k %d rel %.2e max %.2e\n",
              ok ? "ok  " : "FAIL", c.N, c.H, c.W, c.C, c.K, c.R, c.S, c.pad, c.stride, c.act,
              c.residual, c.bias, r.kernel->name, r.split_k_slices, rel, max_err);
  cudaFree(const_cast<void*>(a.input)); cudaFree(const_cast<void*>(a.weight));
  cudaFree(const_cast<void*>(a.residual)); cudaFree(d_out); cudaFree(d_scalars);
  cudaFree(const_cast<float*>(a.bias)); cudaFree(a.workspace);
  return ok;
}

int main() {
  cudaDeviceProp const prop = device_or_skip();
  int cc = prop.major * 10 + prop.minor;
  std::printf("device: %s (sm%d), %d kernels in the table\n", prop.name, cc, kNumKernels);
  std::mt19937 rng(1234);
  Case cases[] = {
      {3, 11, 13, 16, 24, 3, 3, 1, 2, 1, true, true},    // odd spatial, strided, residual
      {2, 16, 16, 64, 64, 3, 3, 1, 1, 1, false, true},   // ResNet block shape
      {1, 9, 9, 3, 8, 4, 4, 0, 4, 0, false, false},      // 3 channels: alignment-1 kernel
      {5, 7, 7, 24, 40, 1, 1, 0, 1, 0, true, true},      // 1x1
      {1, 4, 4, 256, 128, 3, 3, 1, 1, 1, false, true},   // tiny M, long K: serial split-K
      {3, 13, 1, 64, 256, 1, 1, 0, 1, 2, false, true},   // SiLU: FusedCvT's MLP fc1 on tokens
  };
  int failed = 0;
  for (auto const& c : cases) failed += !run_case(c, cc, prop.multiProcessorCount, rng);
  std::printf("%d passed, %d failed\n", int(sizeof(cases) / sizeof(cases[0])) - failed, failed);
  return failed ? 1 : 0;
}
