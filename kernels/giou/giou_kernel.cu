#include "giou/giou_kernel.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

namespace cutlass_ops {
namespace giou {

namespace {

constexpr int kThreads = 256;
constexpr int kMaxBlocks = 1024;  // grid-stride beyond: bounds the forward's workspace

// Math type: float for every input dtype but double.
template <typename T> struct MathOf { using type = float; };
template <> struct MathOf<double> { using type = double; };
template <typename T> using Math = typename MathOf<T>::type;

__device__ float to_math(float v) { return v; }
__device__ double to_math(double v) { return v; }
__device__ float to_math(__half v) { return __half2float(v); }
__device__ float to_math(__nv_bfloat16 v) { return __bfloat162float(v); }

template <typename T> __device__ T from_math(Math<T> v) { return v; }
template <> __device__ __half from_math<__half>(float v) { return __float2half_rn(v); }
template <> __device__ __nv_bfloat16 from_math<__nv_bfloat16>(float v) { return __float2bfloat16_rn(v); }

// Products rounded on their own, as torch's elementwise ops round them (nvcc would otherwise
// fuse a * b + c into one FMA and the loss of identical boxes would not come out as torch's).
__device__ float mul(float a, float b) { return __fmul_rn(a, b); }
__device__ double mul(double a, double b) { return __dmul_rn(a, b); }

template <typename M> struct Box { M x1, y1, x2, y2; };

template <typename T>
__device__ Box<Math<T>> load_box(T const* p) {
  return {to_math(p[0]), to_math(p[1]), to_math(p[2]), to_math(p[3])};
}

template <typename T>
__device__ void store_box(T* p, Box<Math<T>> const& b) {
  p[0] = from_math<T>(b.x1); p[1] = from_math<T>(b.y1);
  p[2] = from_math<T>(b.x2); p[3] = from_math<T>(b.y2);
}

// The loss and its intermediates, in torchvision's order of operations.
template <typename M>
struct Giou {
  M xi1, yi1, xi2, yi2;  // intersection corners
  bool overlap;
  M inter, uni;
  M xc1, yc1, xc2, yc2;  // smallest enclosing box
  M enclose, loss;

  __device__ Giou(Box<M> const& a, Box<M> const& b, M eps) {
    xi1 = a.x1 > b.x1 ? a.x1 : b.x1;
    yi1 = a.y1 > b.y1 ? a.y1 : b.y1;
    xi2 = a.x2 < b.x2 ? a.x2 : b.x2;
    yi2 = a.y2 < b.y2 ? a.y2 : b.y2;
    overlap = yi2 > yi1 && xi2 > xi1;
    inter = overlap ? mul(xi2 - xi1, yi2 - yi1) : M(0);
    uni = mul(a.x2 - a.x1, a.y2 - a.y1) + mul(b.x2 - b.x1, b.y2 - b.y1) - inter;
    xc1 = a.x1 < b.x1 ? a.x1 : b.x1;
    yc1 = a.y1 < b.y1 ? a.y1 : b.y1;
    xc2 = a.x2 > b.x2 ? a.x2 : b.x2;
    yc2 = a.y2 > b.y2 ? a.y2 : b.y2;
    enclose = mul(xc2 - xc1, yc2 - yc1);
    M iou = inter / (uni + eps);
    loss = M(1) - (iou - (enclose - uni) / (enclose + eps));
  }
};

// d max(a, b) / da and d min(a, b) / da as torch.maximum/minimum define them: ties take half.
template <typename M> __device__ M dmax(M a, M b) { return a > b ? M(1) : a == b ? M(0.5) : M(0); }
template <typename M> __device__ M dmin(M a, M b) { return a < b ? M(1) : a == b ? M(0.5) : M(0); }

// g * d loss / d (a, b).
template <typename M>
__device__ void giou_grad(Box<M> const& a, Box<M> const& b, M eps, M g, Box<M>& ga, Box<M>& gb) {
  Giou<M> f(a, b, eps);
  M ue = f.uni + eps, ce = f.enclose + eps;
  // loss = 1 - inter / ue + (enclose - union) / ce, union = area_a + area_b - inter
  M d_union = g * (f.inter / ue / ue - M(1) / ce);
  M d_inter = -g / ue - d_union;
  M d_enclose = g * (ue / ce / ce);

  M wa = a.x2 - a.x1, ha = a.y2 - a.y1, wb = b.x2 - b.x1, hb = b.y2 - b.y1;
  ga = {-d_union * ha, -d_union * wa, d_union * ha, d_union * wa};
  gb = {-d_union * hb, -d_union * wb, d_union * hb, d_union * wb};
  if (f.overlap) {  // torchvision's intersection is 0 (no gradient) without overlap
    M d_iw = d_inter * (f.yi2 - f.yi1), d_ih = d_inter * (f.xi2 - f.xi1);
    ga.x1 -= d_iw * dmax(a.x1, b.x1); gb.x1 -= d_iw * dmax(b.x1, a.x1);
    ga.x2 += d_iw * dmin(a.x2, b.x2); gb.x2 += d_iw * dmin(b.x2, a.x2);
    ga.y1 -= d_ih * dmax(a.y1, b.y1); gb.y1 -= d_ih * dmax(b.y1, a.y1);
    ga.y2 += d_ih * dmin(a.y2, b.y2); gb.y2 += d_ih * dmin(b.y2, a.y2);
  }
  M d_cw = d_enclose * (f.yc2 - f.yc1), d_ch = d_enclose * (f.xc2 - f.xc1);
  ga.x1 -= d_cw * dmin(a.x1, b.x1); gb.x1 -= d_cw * dmin(b.x1, a.x1);
  ga.x2 += d_cw * dmax(a.x2, b.x2); gb.x2 += d_cw * dmax(b.x2, a.x2);
  ga.y1 -= d_ch * dmin(a.y1, b.y1); gb.y1 -= d_ch * dmin(b.y1, a.y1);
  ga.y2 += d_ch * dmax(a.y2, b.y2); gb.y2 += d_ch * dmax(b.y2, a.y2);
}

__device__ bool is_valid(GiouInputs const& in, int64_t i) {
  switch (in.validity) {
    case Validity::kMask: return in.mask[i];
    case Validity::kCounts: return i % in.per_image < in.counts[i / in.per_image];
    case Validity::kRange: return i >= in.offsets[0] && i < in.offsets[in.num_images];
    default: return true;
  }
}

// Sum over the block in a fixed order (deterministic); the result is valid in thread 0.
template <typename V>
__device__ V block_sum(V v) {
  __shared__ V warp_sums[kThreads / 32];
  for (int offset = 16; offset > 0; offset /= 2) v += __shfl_down_sync(0xffffffffu, v, offset);
  if (threadIdx.x % 32 == 0) warp_sums[threadIdx.x / 32] = v;
  __syncthreads();
  if (threadIdx.x == 0) {
    for (int w = 1; w < kThreads / 32; ++w) v += warp_sums[w];
  }
  return v;
}

template <typename T>
__global__ void __launch_bounds__(kThreads) giou_forward_kernel(GiouForwardArgs a) {
  using M = Math<T>;
  GiouInputs const& in = a.in;
  auto const* boxes1 = static_cast<T const*>(in.boxes1);
  auto const* boxes2 = static_cast<T const*>(in.boxes2);
  auto* loss = static_cast<M*>(a.loss);
  M const eps = M(in.eps);
  M sum = 0;
  int64_t count = 0;
  for (int64_t i = int64_t(blockIdx.x) * kThreads + threadIdx.x; i < in.n; i += int64_t(gridDim.x) * kThreads) {
    M value = 0;
    if (is_valid(in, i)) {
      value = Giou<M>(load_box(boxes1 + 4 * i), load_box(boxes2 + 4 * i), eps).loss;
      sum += value;
      ++count;
    }
    if (in.reduction == Reduction::kNone) loss[i] = value;
  }
  sum = block_sum(sum);
  count = block_sum(count);
  if (threadIdx.x == 0) {
    static_cast<M*>(a.partial_loss)[blockIdx.x] = sum;
    a.partial_count[blockIdx.x] = count;
  }
}

// One block: sums the per-block partials, writes num_valid and the reduced loss.
template <typename M>
__global__ void __launch_bounds__(kThreads) giou_finalize_kernel(GiouForwardArgs a, int blocks) {
  M sum = 0;
  int64_t count = 0;
  for (int i = threadIdx.x; i < blocks; i += kThreads) {
    sum += static_cast<M const*>(a.partial_loss)[i];
    count += a.partial_count[i];
  }
  sum = block_sum(sum);
  count = block_sum(count);
  if (threadIdx.x == 0) {
    *a.num_valid = count;
    auto* loss = static_cast<M*>(a.loss);
    if (a.in.reduction == Reduction::kSum) *loss = sum;
    if (a.in.reduction == Reduction::kMean) *loss = sum / M(count > 0 ? count : 1);
  }
}

template <typename T>
__global__ void __launch_bounds__(kThreads) giou_backward_kernel(GiouBackwardArgs a) {
  using M = Math<T>;
  GiouInputs const& in = a.in;
  auto const* boxes1 = static_cast<T const*>(in.boxes1);
  auto const* boxes2 = static_cast<T const*>(in.boxes2);
  auto const* grad_loss = static_cast<M const*>(a.grad_loss);
  M const eps = M(in.eps);
  M scale = 0;  // the gradient of every valid slot's loss for mean/sum
  if (in.reduction != Reduction::kNone) {
    scale = grad_loss[0];
    if (in.reduction == Reduction::kMean) scale /= M(*a.num_valid > 0 ? *a.num_valid : 1);
  }
  for (int64_t i = int64_t(blockIdx.x) * kThreads + threadIdx.x; i < in.n; i += int64_t(gridDim.x) * kThreads) {
    Box<M> g1{0, 0, 0, 0}, g2{0, 0, 0, 0};
    if (is_valid(in, i)) {
      M g = in.reduction == Reduction::kNone ? grad_loss[i] : scale;
      giou_grad(load_box(boxes1 + 4 * i), load_box(boxes2 + 4 * i), eps, g, g1, g2);
    }
    store_box(static_cast<T*>(a.grad1) + 4 * i, g1);
    store_box(static_cast<T*>(a.grad2) + 4 * i, g2);
  }
}

template <typename T>
cudaError_t forward(GiouForwardArgs const& a, cudaStream_t stream) {
  int blocks = giou_blocks(a.in.n);
  if (blocks > 0) giou_forward_kernel<T><<<blocks, kThreads, 0, stream>>>(a);
  giou_finalize_kernel<Math<T>><<<1, kThreads, 0, stream>>>(a, blocks);
  return cudaGetLastError();
}

template <typename T>
cudaError_t backward(GiouBackwardArgs const& a, cudaStream_t stream) {
  int blocks = giou_blocks(a.in.n);
  if (blocks > 0) giou_backward_kernel<T><<<blocks, kThreads, 0, stream>>>(a);
  return cudaGetLastError();
}

}  // namespace

int giou_blocks(int64_t n) {
  int64_t blocks = (n + kThreads - 1) / kThreads;
  return int(blocks < kMaxBlocks ? blocks : kMaxBlocks);
}

cudaError_t launch_giou_forward(GiouForwardArgs const& a, cudaStream_t stream) {
  switch (a.in.dtype) {
    case DType::kF64: return forward<double>(a, stream);
    case DType::kF16: return forward<__half>(a, stream);
    case DType::kBF16: return forward<__nv_bfloat16>(a, stream);
    default: return forward<float>(a, stream);
  }
}

cudaError_t launch_giou_backward(GiouBackwardArgs const& a, cudaStream_t stream) {
  switch (a.in.dtype) {
    case DType::kF64: return backward<double>(a, stream);
    case DType::kF16: return backward<__half>(a, stream);
    case DType::kBF16: return backward<__nv_bfloat16>(a, stream);
    default: return backward<float>(a, stream);
  }
}

}  // namespace giou
}  // namespace cutlass_ops
