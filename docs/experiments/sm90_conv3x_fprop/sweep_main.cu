// Driver for the sm90 conv fprop sweep: problems, random inputs, a GPU reference (checked on the host at
// sampled points), full-output verification of every variant, CUDA-event timing, JSON-lines output.
//
//   sweep_bench --list                      variant names linked into this binary
//   sweep_bench [--variant NAME[,NAME..]] [--out results.jsonl] [--reps R] [--launches L] [--warmup W]
//               [--n 512|2048]
//
// Timing: W warm-up launches, then R batches of L back-to-back launches between two events; the
// reported time is the median (and min) over batches of batch_time / L. Inputs are not rotated, so
// at N=512 they sit in L2 between launches, as in cudnn_fprop.py.
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "sweep_common.h"

using sweep::Problem;

#define CK(x)                                                                                   \
  do {                                                                                          \
    cudaError_t e_ = (x);                                                                       \
    if (e_ != cudaSuccess) {                                                                    \
      fprintf(stderr, "CUDA error %s at %s:%d: %s\n", cudaGetErrorString(e_), __FILE__, __LINE__, #x); \
      exit(3);                                                                                  \
    }                                                                                           \
  } while (0)

// Deterministic inputs: multiples of 1/2048 in [-1, 1), exact in fp16, so the host can recompute them.
__host__ __device__ inline float hval(uint32_t seed, uint64_t i) {
  uint64_t z = i * 0x9E3779B97F4A7C15ull + (uint64_t(seed) + 1) * 0xD1B54A32D192ED03ull;
  z ^= z >> 31;
  z *= 0xBF58476D1CE4E5B9ull;
  z ^= z >> 29;
  z *= 0x94D049BB133111EBull;
  z ^= z >> 32;
  return float(int(z & 0xFFF) - 2048) / 2048.f;
}

__global__ void fill(half* p, size_t n, uint32_t seed) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x)
    p[i] = __float2half_rn(hval(seed, i));
}

// Direct convolution, fp32 accumulation, one thread per output (n, p, q, k); C % 8 == 0.
__global__ void ref_conv(half const* __restrict__ x, half const* __restrict__ w, float* __restrict__ y, Problem pb) {
  int const P = pb.p(), Q = pb.q();
  size_t const total = size_t(pb.n) * P * Q * pb.k;
  for (size_t idx = blockIdx.x * size_t(blockDim.x) + threadIdx.x; idx < total;
       idx += size_t(gridDim.x) * blockDim.x) {
    int k = int(idx % pb.k);
    size_t t = idx / pb.k;
    int q = int(t % Q);
    t /= Q;
    int p = int(t % P);
    int n = int(t / P);
    float acc = 0.f;
    for (int r = 0; r < pb.r; ++r) {
      int ih = p * pb.stride - pb.pad + r;
      if (ih < 0 || ih >= pb.h) continue;
      for (int s = 0; s < pb.r; ++s) {
        int iw = q * pb.stride - pb.pad + s;
        if (iw < 0 || iw >= pb.w) continue;
        uint4 const* xr = reinterpret_cast<uint4 const*>(x + ((size_t(n) * pb.h + ih) * pb.w + iw) * pb.c);
        uint4 const* wr = reinterpret_cast<uint4 const*>(w + ((size_t(k) * pb.r + r) * pb.r + s) * pb.c);
        for (int c8 = 0; c8 < pb.c / 8; ++c8) {
          uint4 a = xr[c8], b = wr[c8];
          half2 const* ah = reinterpret_cast<half2 const*>(&a);
          half2 const* bh = reinterpret_cast<half2 const*>(&b);
#pragma unroll
          for (int j = 0; j < 4; ++j) {
            float2 fa = __half22float2(ah[j]), fb = __half22float2(bh[j]);
            acc = fmaf(fa.x, fb.x, acc);
            acc = fmaf(fa.y, fb.y, acc);
          }
        }
      }
    }
    y[idx] = acc;
  }
}

struct CheckStats {
  unsigned long long nonfinite, bad;
  double sum_sq_err, sum_sq_ref;
  unsigned int max_abs_err_bits;  // non-negative float bits: integer max == float max
};

// Elementwise check: |y - ref| <= atol + rtol |ref| (fp16 output: half-ulp is 2^-11 relative).
__global__ void check(half const* __restrict__ y, float const* __restrict__ ref, size_t n, float atol, float rtol,
                      CheckStats* st) {
  unsigned long long nf = 0, bad = 0;
  double se = 0, sr = 0;
  float mx = 0;
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
    float v = __half2float(y[i]), r = ref[i];
    if (!isfinite(v)) {
      ++nf;
      continue;
    }
    float e = fabsf(v - r);
    if (e > atol + rtol * fabsf(r)) ++bad;
    mx = fmaxf(mx, e);
    se += double(e) * e;
    sr += double(r) * r;
  }
  for (int o = 16; o > 0; o >>= 1) {
    nf += __shfl_down_sync(0xffffffffu, nf, o);
    bad += __shfl_down_sync(0xffffffffu, bad, o);
    se += __shfl_down_sync(0xffffffffu, se, o);
    sr += __shfl_down_sync(0xffffffffu, sr, o);
    mx = fmaxf(mx, __shfl_down_sync(0xffffffffu, mx, o));
  }
  if ((threadIdx.x & 31) == 0) {
    atomicAdd(&st->nonfinite, nf);
    atomicAdd(&st->bad, bad);
    atomicAdd(&st->sum_sq_err, se);
    atomicAdd(&st->sum_sq_ref, sr);
    atomicMax(&st->max_abs_err_bits, __float_as_uint(mx));
  }
}

static double host_ref(Problem const& pb, uint32_t sx, uint32_t sw, int n, int p, int q, int k) {
  double acc = 0;
  for (int r = 0; r < pb.r; ++r) {
    int ih = p * pb.stride - pb.pad + r;
    if (ih < 0 || ih >= pb.h) continue;
    for (int s = 0; s < pb.r; ++s) {
      int iw = q * pb.stride - pb.pad + s;
      if (iw < 0 || iw >= pb.w) continue;
      for (int c = 0; c < pb.c; ++c) {
        uint64_t xi = ((uint64_t(n) * pb.h + ih) * pb.w + iw) * pb.c + c;
        uint64_t wi = ((uint64_t(k) * pb.r + r) * pb.r + s) * pb.c + c;
        acc += double(hval(sx, xi)) * double(hval(sw, wi));
      }
    }
  }
  return acc;
}

static std::string pstr(Problem const& p) {
  char b[96];
  snprintf(b, sizeof b, "n%d h%d c%d k%d r%d s%d", p.n, p.h, p.c, p.k, p.r, p.stride);
  return b;
}

static std::string jesc(std::string const& s) {
  std::string o;
  for (char c : s) {
    if (c == '"' || c == '\\') o += '\\';
    if (c == '\n') { o += "\\n"; continue; }
    o += c;
  }
  return o;
}

int main(int argc, char** argv) {
  std::vector<std::string> want;
  std::string out_path;
  int reps = 15, launches = 10, warmup = 10, only_n = 0;
  bool list = false;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) { fprintf(stderr, "missing value for %s\n", a.c_str()); exit(2); }
      return argv[++i];
    };
    if (a == "--list") list = true;
    else if (a == "--variant") {
      std::stringstream ss(next());
      std::string t;
      while (std::getline(ss, t, ',')) if (!t.empty()) want.push_back(t);
    } else if (a == "--out") out_path = next();
    else if (a == "--reps") reps = std::max(1, atoi(next().c_str()));
    else if (a == "--launches") launches = std::max(1, atoi(next().c_str()));
    else if (a == "--warmup") warmup = std::max(0, atoi(next().c_str()));
    else if (a == "--n") only_n = atoi(next().c_str());
    else { fprintf(stderr, "unknown argument %s\n", a.c_str()); return 2; }
  }
  auto& reg = sweep::registry();
  std::sort(reg.begin(), reg.end(), [](auto const& a, auto const& b) { return strcmp(a.name, b.name) < 0; });
  if (list) {
    for (auto const& v : reg) printf("%s\n", v.name);
    return 0;
  }
  std::vector<sweep::Variant const*> sel;
  for (auto const& v : reg)
    if (want.empty() || std::find(want.begin(), want.end(), std::string(v.name)) != want.end()) sel.push_back(&v);
  if (sel.empty()) { fprintf(stderr, "no variant selected\n"); return 2; }

  FILE* out = nullptr;
  if (!out_path.empty()) {
    out = fopen(out_path.c_str(), "a");
    if (!out) { perror(out_path.c_str()); return 2; }
  }
  auto emit = [&](std::string const& line) {
    if (out) { fprintf(out, "%s\n", line.c_str()); fflush(out); }
  };

  cudaDeviceProp prop{};
  CK(cudaGetDeviceProperties(&prop, 0));
  int const sms = prop.multiProcessorCount;

  std::vector<sweep::VariantInfo> infos;
  for (auto const* v : sel) {
    infos.push_back(v->info());
    auto const& vi = infos.back();
    char b[1024];
    snprintf(b, sizeof b,
             "{\"kind\":\"variant\",\"name\":\"%s\",\"desc\":\"%s\",\"tm\":%d,\"tn\":%d,\"tk\":%d,\"cm\":%d,\"cn\":%d,"
             "\"stages\":%d,\"smem_bytes\":%d,\"threads\":%d,\"min_blocks\":%d,\"regs\":%d,\"local_bytes\":%d,"
             "\"ctas_per_sm\":%d,\"device\":\"%s\",\"sms\":%d}",
             vi.name.c_str(), jesc(vi.desc).c_str(), vi.tm, vi.tn, vi.tk, vi.cm, vi.cn, vi.stages, vi.smem_bytes,
             vi.threads, vi.min_blocks, vi.regs, vi.local_bytes, vi.ctas_per_sm, jesc(prop.name).c_str(), sms);
    emit(b);
    printf("# %-22s %s | regs %d spill %dB smem %.1fKB CTAs/SM %d\n", vi.name.c_str(), vi.desc.c_str(), vi.regs,
           vi.local_bytes, vi.smem_bytes / 1024.0, vi.ctas_per_sm);
  }

  std::vector<Problem> ps;
  for (int n : {512, 2048}) {
    if (only_n && n != only_n) continue;
    ps.push_back({n, 16, 16, 64, 64, 3, 1, 1});
    ps.push_back({n, 16, 16, 64, 128, 3, 2, 1});
    ps.push_back({n, 8, 8, 128, 128, 3, 1, 1});
    ps.push_back({n, 8, 8, 128, 256, 3, 2, 1});
    ps.push_back({n, 4, 4, 256, 256, 3, 1, 1});
    ps.push_back({n, 4, 4, 256, 512, 3, 2, 1});
    ps.push_back({n, 2, 2, 512, 512, 3, 1, 1});
    ps.push_back({n, 8, 8, 64, 128, 1, 1, 0});
  }

  cudaStream_t stream;
  CK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  cudaEvent_t e0, e1;
  CK(cudaEventCreate(&e0));
  CK(cudaEventCreate(&e1));
  CheckStats* dstats;
  CK(cudaMalloc(&dstats, sizeof(CheckStats)));

  int exit_code = 0;
  for (size_t pi = 0; pi < ps.size(); ++pi) {
    Problem const& pb = ps[pi];
    uint32_t const sx = 1000 + 2 * uint32_t(pi), sw = sx + 1;
    size_t const nx = size_t(pb.n) * pb.h * pb.w * pb.c, nw = size_t(pb.k) * pb.r * pb.r * pb.c,
                 ny = size_t(pb.n) * pb.p() * pb.q() * pb.k;
    half *x, *w, *y;
    float* ref;
    CK(cudaMalloc(&x, nx * sizeof(half)));
    CK(cudaMalloc(&w, nw * sizeof(half)));
    CK(cudaMalloc(&y, ny * sizeof(half)));
    CK(cudaMalloc(&ref, ny * sizeof(float)));
    fill<<<1024, 256, 0, stream>>>(x, nx, sx);
    fill<<<256, 256, 0, stream>>>(w, nw, sw);
    ref_conv<<<int(std::min<size_t>((ny + 255) / 256, 1 << 20)), 256, 0, stream>>>(x, w, ref, pb);
    CK(cudaGetLastError());
    CK(cudaStreamSynchronize(stream));

    // Check the GPU reference itself at the corners and at pseudo-random points.
    int ref_bad = 0;
    double ref_max_err = 0;
    {
      int const P = pb.p(), Q = pb.q();
      std::vector<std::array<int, 4>> pts = {{0, 0, 0, 0}, {pb.n - 1, P - 1, Q - 1, pb.k - 1}, {0, P - 1, 0, pb.k - 1},
                                             {pb.n - 1, 0, Q - 1, 0}};
      uint64_t z = 12345 + pi;
      for (int i = 0; i < 60; ++i) {
        auto rnd = [&](int m) { z = z * 6364136223846793005ull + 1442695040888963407ull; return int((z >> 33) % m); };
        pts.push_back({rnd(pb.n), rnd(P), rnd(Q), rnd(pb.k)});
      }
      for (auto const& t : pts) {
        size_t idx = ((size_t(t[0]) * P + t[1]) * Q + t[2]) * pb.k + t[3];
        float g;
        CK(cudaMemcpy(&g, ref + idx, sizeof(float), cudaMemcpyDeviceToHost));
        double h = host_ref(pb, sx, sw, t[0], t[1], t[2], t[3]);
        double e = std::fabs(g - h);
        ref_max_err = std::max(ref_max_err, e);
        if (e > 5e-3 + 1e-5 * std::fabs(h)) ++ref_bad;
      }
      if (ref_bad) {
        fprintf(stderr, "GPU reference disagrees with the host at %d of %zu points for %s (max err %g)\n", ref_bad,
                pts.size(), pstr(pb).c_str(), ref_max_err);
        exit_code = 4;
      }
    }

    for (size_t vi = 0; vi < sel.size(); ++vi) {
      auto const& info = infos[vi];
      std::unique_ptr<sweep::Runner> rn(sel[vi]->make_runner());
      std::string why;
      char b[2048];
      auto base = [&]() {
        char h[512];
        snprintf(h, sizeof h,
                 "{\"kind\":\"result\",\"variant\":\"%s\",\"problem\":\"%s\",\"n\":%d,\"h\":%d,\"w\":%d,\"c\":%d,"
                 "\"k\":%d,\"r\":%d,\"stride\":%d,\"pad\":%d,\"gflop\":%.4f",
                 info.name.c_str(), pstr(pb).c_str(), pb.n, pb.h, pb.w, pb.c, pb.k, pb.r, pb.stride, pb.pad,
                 pb.flops() * 1e-9);
        return std::string(h);
      };
      if (!rn->init(pb, x, w, y, why)) {
        printf("%-22s %-28s cannot implement (%s)\n", info.name.c_str(), pstr(pb).c_str(), why.c_str());
        snprintf(b, sizeof b, "%s,\"status\":\"cannot\",\"why\":\"%s\"}", base().c_str(), jesc(why).c_str());
        emit(b);
        continue;
      }
      // Poison the output (0xFFFF is a NaN in fp16), run once, verify every element.
      CK(cudaMemsetAsync(y, 0xFF, ny * sizeof(half), stream));
      cudaError_t err = rn->run(stream, 1);
      if (err == cudaSuccess) err = cudaStreamSynchronize(stream);
      if (err != cudaSuccess) {
        printf("%-22s %-28s launch error %s\n", info.name.c_str(), pstr(pb).c_str(), cudaGetErrorString(err));
        snprintf(b, sizeof b, "%s,\"status\":\"error\",\"why\":\"%s\"}", base().c_str(), cudaGetErrorString(err));
        emit(b);
        if (cudaGetLastError() != cudaSuccess || cudaDeviceSynchronize() != cudaSuccess) {
          fprintf(stderr, "sticky CUDA error after %s on %s: giving up on this process\n", info.name.c_str(),
                  pstr(pb).c_str());
          return 5;
        }
        exit_code = 5;
        continue;
      }
      auto verify = [&]() {
        CheckStats r{};
        CK(cudaMemsetAsync(dstats, 0, sizeof(CheckStats), stream));
        check<<<1024, 256, 0, stream>>>(y, ref, ny, 1e-2f, 4e-3f, dstats);
        CK(cudaGetLastError());
        CK(cudaMemcpyAsync(&r, dstats, sizeof r, cudaMemcpyDeviceToHost, stream));
        CK(cudaStreamSynchronize(stream));
        return r;
      };
      CheckStats hs = verify();
      float max_abs;
      memcpy(&max_abs, &hs.max_abs_err_bits, sizeof max_abs);
      double rel_l2 = hs.sum_sq_ref > 0 ? std::sqrt(hs.sum_sq_err / hs.sum_sq_ref) : 0;
      bool ok = hs.nonfinite == 0 && hs.bad == 0 && ref_bad == 0;

      err = rn->run(stream, warmup);
      if (err == cudaSuccess) err = cudaStreamSynchronize(stream);
      std::vector<float> t;
      for (int rep = 0; rep < reps && err == cudaSuccess; ++rep) {
        CK(cudaEventRecord(e0, stream));
        err = rn->run(stream, launches);
        CK(cudaEventRecord(e1, stream));
        CK(cudaEventSynchronize(e1));
        float ms;
        CK(cudaEventElapsedTime(&ms, e0, e1));
        t.push_back(ms * 1000.f / launches);
      }
      if (err != cudaSuccess) {
        printf("%-22s %-28s timing error %s\n", info.name.c_str(), pstr(pb).c_str(), cudaGetErrorString(err));
        snprintf(b, sizeof b, "%s,\"status\":\"error\",\"why\":\"%s\"}", base().c_str(), cudaGetErrorString(err));
        emit(b);
        return 5;
      }
      // Check again the output of the last timed launch (back-to-back launches of the persistent kernels
      // must not depend on state a previous launch left behind).
      {
        CheckStats h2 = verify();
        if (h2.nonfinite != 0 || h2.bad != 0) {
          if (ok) printf("%-22s %-28s output of the last timed launch is WRONG\n", info.name.c_str(), pstr(pb).c_str());
          ok = false;
          hs.nonfinite += h2.nonfinite;
          hs.bad += h2.bad;
        }
      }
      std::sort(t.begin(), t.end());
      float med = t[t.size() / 2], mn = t[0];
      long long ctas = rn->grid_ctas();
      double waves = info.ctas_per_sm > 0 ? double(ctas) / (double(info.ctas_per_sm) * sms) : -1;
      double tflops = pb.flops() / (med * 1e-6) * 1e-12;
      printf("%-22s %-28s %8.1f us (min %7.1f) %6.1f TFLOP/s  %s  ctas %lld waves %.1f relL2 %.1e\n",
             info.name.c_str(), pstr(pb).c_str(), med, mn, tflops, ok ? "ok" : "WRONG", ctas, waves, rel_l2);
      snprintf(b, sizeof b,
               "%s,\"status\":\"%s\",\"us_median\":%.3f,\"us_min\":%.3f,\"tflops\":%.2f,\"ctas\":%lld,\"waves\":%.2f,"
               "\"nonfinite\":%llu,\"bad\":%llu,\"max_abs_err\":%.4g,\"rel_l2\":%.3g,\"ref_bad\":%d,\"reps\":%d,"
               "\"launches\":%d}",
               base().c_str(), ok ? "ok" : "wrong", med, mn, tflops, ctas, waves, hs.nonfinite, hs.bad, max_abs,
               rel_l2, ref_bad, reps, launches);
      emit(b);
      if (!ok && exit_code == 0) exit_code = 6;
    }
    CK(cudaFree(x));
    CK(cudaFree(w));
    CK(cudaFree(y));
    CK(cudaFree(ref));
  }
  if (out) fclose(out);
  return exit_code;
}
