// CUDA implementation of cutlass_ops::linear_residual: one cuBLASLt matmul with beta = 1 (the
// residual as its C input) and the bias as its epilogue, for fp16/bf16 with K and N multiples of
// 8; ATen's path (linear_residual_op.cpp) otherwise.  cuBLASLt rather than a CUTLASS instance:
// these are the GEMMs torch.nn.Linear runs (cuBLAS's kernels and heuristics, on an H100 faster
// than this project's sm90 GEMMs at CvT's shapes), with the add moved into their epilogue.
#include <cublasLt.h>

#include <cstdint>
#include <map>
#include <mutex>
#include <tuple>
#include <vector>

#include "common/cuda_device.h"
#include "linear_residual/linear_residual_op.h"

namespace cutlass_ops {
namespace linear_residual {

namespace {

#define LINEAR_RESIDUAL_LT(expr)                                                                    \
  do {                                                                                              \
    cublasStatus_t status_ = (expr);                                                                \
    CUTLASS_OPS_CHECK(status_ == CUBLAS_STATUS_SUCCESS, "linear_residual: ", #expr, " failed: ",   \
                      cublasLtGetStatusString(status_));                                            \
  } while (0)

constexpr size_t kWorkspaceBytes = 4u << 20;

// Owns cuBLASLt descriptors: destroyed with the call's scope.
struct Descriptors {
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t w = nullptr, x = nullptr, out = nullptr;
  ~Descriptors() {
    if (out) cublasLtMatrixLayoutDestroy(out);
    if (x) cublasLtMatrixLayoutDestroy(x);
    if (w) cublasLtMatrixLayoutDestroy(w);
    if (op) cublasLtMatmulDescDestroy(op);
  }
};

uint32_t alignment(void const* p) {  // the largest power of two <= 256 dividing the address
  uint32_t a = 256;
  while (a > 1 && reinterpret_cast<uintptr_t>(p) % a != 0) a /= 2;
  return a;
}

std::mutex& cache_mutex() {
  static std::mutex mutex;
  return mutex;
}

// One handle per device (created with that device current, as torch's), kept for the process.
cublasLtHandle_t handle(int dev) {
  static std::map<int, cublasLtHandle_t> handles;
  std::lock_guard<std::mutex> lock(cache_mutex());
  auto found = handles.find(dev);
  if (found != handles.end()) return found->second;
  cublasLtHandle_t created = nullptr;
  LINEAR_RESIDUAL_LT(cublasLtCreate(&created));
  return handles.emplace(dev, created).first->second;
}

using Problem = std::tuple<int, int, int64_t, int64_t, int64_t, bool, uint32_t, uint32_t, uint32_t, uint32_t>;

}  // namespace

Tensor linear_residual_cuda(Tensor const& x, Tensor const& weight, std::optional<Tensor> const& bias,
                            Tensor const& residual, double alpha) {
  check_inputs(x, weight, bias, residual, alpha);
  ScalarType const dtype = x.scalar_type();
  int64_t const k = x.size(x.dim() - 1), n = weight.size(0), m = k > 0 ? x.numel() / k : 0;
  bool const lt = (dtype == kHalf || dtype == kBFloat16) && m > 0 && n > 0 && k > 0 && k % 8 == 0 &&
                  n % 8 == 0 && m <= INT32_MAX && n <= INT32_MAX && k <= INT32_MAX;
  if (!lt) return linear_residual_aten(x, weight, bias, residual, alpha);
  int const dev = x.get_device_index();
  DeviceGuard guard(dev);
  Tensor xc = torch::stable::contiguous(x), wc = torch::stable::contiguous(weight);
  Tensor rc = torch::stable::contiguous(residual);
  Tensor bc;
  if (bias) bc = torch::stable::contiguous(to_dtype(*bias, dtype));  // the epilogue reads it in out's dtype
  Tensor out = empty(residual.sizes(), dtype, x.device());
  cudaDataType_t const type = dtype == kHalf ? CUDA_R_16F : CUDA_R_16BF;

  // Row-major out (m, n) = x (m, k) . weight (n, k)^T is column-major out^T (n, m) =
  // weight^T (n, k) . x^T (k, m): cuBLAS's A is the weight, transposed; B is x.
  Descriptors d;
  LINEAR_RESIDUAL_LT(cublasLtMatmulDescCreate(&d.op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  cublasOperation_t const transpose = CUBLAS_OP_T;
  LINEAR_RESIDUAL_LT(cublasLtMatmulDescSetAttribute(d.op, CUBLASLT_MATMUL_DESC_TRANSA, &transpose, sizeof(transpose)));
  cublasLtEpilogue_t const epilogue = bias ? CUBLASLT_EPILOGUE_BIAS : CUBLASLT_EPILOGUE_DEFAULT;
  LINEAR_RESIDUAL_LT(cublasLtMatmulDescSetAttribute(d.op, CUBLASLT_MATMUL_DESC_EPILOGUE, &epilogue, sizeof(epilogue)));
  if (bias) {
    void const* b = bc.data_ptr();
    LINEAR_RESIDUAL_LT(cublasLtMatmulDescSetAttribute(d.op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &b, sizeof(b)));
  }
  LINEAR_RESIDUAL_LT(cublasLtMatrixLayoutCreate(&d.w, type, k, n, k));
  LINEAR_RESIDUAL_LT(cublasLtMatrixLayoutCreate(&d.x, type, k, m, k));
  LINEAR_RESIDUAL_LT(cublasLtMatrixLayoutCreate(&d.out, type, n, m, n));

  // the heuristic's first algorithm for this problem and these pointer alignments, once (the
  // heuristic call costs tens of microseconds on the host)
  cublasLtHandle_t const lt_handle = handle(dev);
  Problem const key{dev, static_cast<int>(dtype), m, n, k, bias.has_value(), alignment(wc.data_ptr()),
                    alignment(xc.data_ptr()), alignment(rc.data_ptr()), alignment(out.data_ptr())};
  static std::map<Problem, cublasLtMatmulAlgo_t> algos;
  cublasLtMatmulAlgo_t algo;
  {
    std::lock_guard<std::mutex> lock(cache_mutex());
    auto found = algos.find(key);
    if (found == algos.end()) {
      cublasLtMatmulPreference_t pref = nullptr;
      LINEAR_RESIDUAL_LT(cublasLtMatmulPreferenceCreate(&pref));
      size_t const workspace = kWorkspaceBytes;
      uint32_t const aligns[4] = {std::get<6>(key), std::get<7>(key), std::get<8>(key), std::get<9>(key)};
      cublasStatus_t status = cublasLtMatmulPreferenceSetAttribute(
          pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &workspace, sizeof(workspace));
      cublasLtMatmulPreferenceAttributes_t const which[4] = {
          CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
          CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES};
      for (int i = 0; i < 4 && status == CUBLAS_STATUS_SUCCESS; ++i)
        status = cublasLtMatmulPreferenceSetAttribute(pref, which[i], &aligns[i], sizeof(aligns[i]));
      cublasLtMatmulHeuristicResult_t result{};
      int found_count = 0;
      if (status == CUBLAS_STATUS_SUCCESS)
        status = cublasLtMatmulAlgoGetHeuristic(lt_handle, d.op, d.w, d.x, d.out, d.out, pref, 1, &result, &found_count);
      cublasLtMatmulPreferenceDestroy(pref);
      LINEAR_RESIDUAL_LT(status);
      // no algorithm for this problem (not seen with 16-byte aligned 16-bit matrices): ATen's path
      if (found_count == 0) return linear_residual_aten(x, weight, bias, residual, alpha);
      found = algos.emplace(key, result.algo).first;
    }
    algo = found->second;
  }
  Tensor workspace = empty({static_cast<int64_t>(kWorkspaceBytes)}, kByte, x.device());
  float const a = static_cast<float>(alpha), beta = 1.0f;
  LINEAR_RESIDUAL_LT(cublasLtMatmul(lt_handle, d.op, &a, wc.data_ptr(), d.w, xc.data_ptr(), d.x, &beta, rc.data_ptr(),
                                    d.out, out.data_ptr(), d.out, &algo, workspace.data_ptr(), kWorkspaceBytes,
                                    current_cuda_stream(dev)));
  return out;
}

}  // namespace linear_residual
}  // namespace cutlass_ops

STABLE_TORCH_LIBRARY_IMPL(cutlass_ops, CUDA, m) {
  m.impl("linear_residual", TORCH_BOX(&cutlass_ops::linear_residual::linear_residual_cuda));
}
