// Interface between sweep_main.cu (problems, reference, checking, timing) and the sweep_variant.cu
// translation units (one CUTLASS 3.x sm90 ConvUniversal configuration each). Each variant TU registers
// itself through a static initializer; sweep_main.cu runs every registered variant on every problem.
#pragma once
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <string>
#include <vector>

namespace sweep {

struct Problem {
  int n, h, w, c, k, r, stride, pad;
  __host__ __device__ int p() const { return (h + 2 * pad - r) / stride + 1; }
  __host__ __device__ int q() const { return (w + 2 * pad - r) / stride + 1; }
  double flops() const { return 2.0 * n * p() * q() * double(k) * c * r * r; }
};

// Static facts about one compiled configuration (filled by the variant TU).
struct VariantInfo {
  std::string name;        // short id, e.g. "t128x64_s3_tma"
  std::string desc;        // human readable configuration
  int tm, tn, tk;          // CTA tile
  int cm, cn;              // cluster shape
  int stages;              // mainloop pipeline stages actually used
  int smem_bytes;          // Kernel::SharedStorageSize (dynamic smem per CTA)
  int threads;             // Kernel::MaxThreadsPerBlock
  int min_blocks;          // __launch_bounds__ min blocks per SM
  int regs;                // cudaFuncGetAttributes numRegs   (filled at run time)
  int local_bytes;         // cudaFuncGetAttributes localSizeBytes (spills; run time)
  int ctas_per_sm;         // cudaOccupancyMaxActiveBlocksPerMultiprocessor (run time)
};

// What a variant does for one problem: build arguments for the given device buffers, report
// whether CUTLASS can implement it, then run `launches` back-to-back launches on `stream`.
struct Runner {
  virtual ~Runner() = default;
  virtual bool init(Problem const& p, half const* x, half const* w, half* y, std::string& why) = 0;
  virtual long long grid_ctas() const = 0;
  virtual cudaError_t run(cudaStream_t stream, int launches) = 0;
};

struct Variant {
  char const* name;              // same as VariantInfo::name; available without touching the GPU
  VariantInfo (*info)();         // static info + run-time attributes
  Runner* (*make_runner)();
};

inline std::vector<Variant>& registry() {
  static std::vector<Variant> r;
  return r;
}

struct Registrar {
  Registrar(Variant v) { registry().push_back(v); }
};

}  // namespace sweep
