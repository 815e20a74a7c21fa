// Negative controls for tests/gpu_sanitize.sh: each mode plants one bug that a compute-sanitizer
// tool must report, so that a broken sanitizer setup (wrong binary, tool not attached, reports
// not reaching the log) cannot pass the run silently.  "clean" plants none: every tool must
// pass it (the check flags bugs, not every program).
//
//   oob     memcheck:  a __global__ write one element past the end of its cudaMalloc
//   race    racecheck: shared memory written and read by other warps with no barrier between
//   uninit  initcheck: a kernel reads a cudaMalloc that nothing wrote
//   clean   the same kernels, correct
//
// Build: nvcc -arch=native -lineinfo -o controls controls.cu; run: controls MODE.  The program
// itself exits 0 whatever the mode: the sanitizer's --error-exitcode decides.
#include <cstdio>
#include <cstring>
#include <cuda_runtime.h>

constexpr int kN = 256;

__global__ void fill(float* out, int n, int past_end) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) out[i + (i == n - 1 ? past_end : 0)] = float(i);  // past_end 1: writes out[n]
}

__global__ void rotate(float* out, int barrier) {
  __shared__ float s[kN];
  int t = threadIdx.x;
  s[t] = float(t);
  if (barrier) __syncthreads();
  out[t] = s[(t + 32) % kN];  // another warp's element: without the barrier a read-after-write race
}

__global__ void copy(float const* in, float* out, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) out[i] = in[i];
}

int main(int argc, char** argv) {
  char const* mode = argc > 1 ? argv[1] : "clean";
  float *a = nullptr, *b = nullptr;
  cudaMalloc(&a, kN * sizeof(float));
  cudaMalloc(&b, kN * sizeof(float));
  bool clean = std::strcmp(mode, "clean") == 0;
  fill<<<1, kN>>>(a, kN, std::strcmp(mode, "oob") == 0 ? 1 : 0);
  cudaDeviceSynchronize();
  rotate<<<1, kN>>>(b, std::strcmp(mode, "race") == 0 ? 0 : 1);
  cudaDeviceSynchronize();
  if (std::strcmp(mode, "uninit") == 0) {
    float* fresh = nullptr;  // never written
    cudaMalloc(&fresh, kN * sizeof(float));
    copy<<<1, kN>>>(fresh, b, kN);
    cudaDeviceSynchronize();
    cudaFree(fresh);
  } else {
    copy<<<1, kN>>>(a, b, kN);
    cudaDeviceSynchronize();
  }
  std::printf("control %s: %s\n", mode, clean ? "no bug planted" : "bug planted");
  cudaFree(a);
  cudaFree(b);
  return 0;
}
