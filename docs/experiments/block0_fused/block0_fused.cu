// Torch extension entry points for the block-0 fused kernels: `forward` runs the mma.sync
// kernel (block0_fused_kernel.cuh), `forward_wgmma` the wgmma one (block0_wgmma_kernel.cuh,
// sm_90a only), `forward_stream` the wgmma one with its filters streamed, two CTAs an SM
// (block0_stream_kernel.cuh, sm_90a only).  Built by run.py with torch.utils.cpp_extension.load; the kernel headers
// have no torch dependency, so they can also be compile-checked alone (see README.md).
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/extension.h>

#include "block0_fused_kernel.cuh"
#include "block0_stream_kernel.cuh"
#include "block0_wgmma_kernel.cuh"

namespace {

void check_scalar(const torch::Tensor& t, const char* name) {
  TORCH_CHECK(t.is_cuda() && t.scalar_type() == torch::kFloat32 && t.numel() == 1,
              "block0_fused: ", name, " must be a one-element float32 CUDA tensor");
}

void check_f32(const torch::Tensor& t, const char* name, std::vector<int64_t> shape) {
  TORCH_CHECK(t.is_cuda() && t.scalar_type() == torch::kFloat32 && t.is_contiguous() &&
                  t.sizes() == torch::IntArrayRef(shape),
              "block0_fused: ", name, " must be a contiguous float32 CUDA tensor of shape ",
              torch::IntArrayRef(shape), ", got ", t.sizes());
}

bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15) == 0; }

// Arguments as both kernels take them: checked, the weights as KRSC, the output tensor.
struct Block0Args {
  torch::Tensor x, w1k, w2k, out;
  int n = 0, sms = 0, smem_optin = 0;
};

// x: (N, 64, 16, 16) fp16 channels_last (NHWC in memory); w1, w2: (64, 64, 3, 3) fp16 (any
// layout: taken as channels_last, a no-op for FusedResNet's weights); FixUp scalars and SE
// weights float32.  `out`, when given, is written (a (N, 64, 16, 16) fp16 channels_last
// tensor); else a new one is returned.
Block0Args check_args(const torch::Tensor& x, const torch::Tensor& w1, const torch::Tensor& w2,
                      const torch::Tensor& b1a, const torch::Tensor& b1b, const torch::Tensor& b2a,
                      const torch::Tensor& scale, const torch::Tensor& b2b, const torch::Tensor& fc1_w,
                      const torch::Tensor& fc1_b, const torch::Tensor& fc2_w, const torch::Tensor& fc2_b,
                      const c10::optional<torch::Tensor>& out_opt) {
  using namespace block0;
  TORCH_CHECK(x.is_cuda() && x.scalar_type() == torch::kHalf && x.dim() == 4 && x.size(1) == kC &&
                  x.size(2) == kH && x.size(3) == kW,
              "block0_fused: x must be (N, 64, 16, 16) float16 on CUDA, got ", x.sizes());
  TORCH_CHECK(x.is_contiguous(at::MemoryFormat::ChannelsLast), "block0_fused: x must be channels_last");
  for (auto* w : {&w1, &w2})
    TORCH_CHECK(w->is_cuda() && w->scalar_type() == torch::kHalf &&
                    w->sizes() == torch::IntArrayRef({kC, kC, 3, 3}),
                "block0_fused: conv weights must be (64, 64, 3, 3) float16 on CUDA");
  check_scalar(b1a, "fixup_bias1a");
  check_scalar(b1b, "fixup_bias1b");
  check_scalar(b2a, "fixup_bias2a");
  check_scalar(scale, "fixup_scale");
  check_scalar(b2b, "fixup_bias2b");
  check_f32(fc1_w, "fc1 weight", {kHidden, kC});
  check_f32(fc1_b, "fc1 bias", {kHidden});
  check_f32(fc2_w, "fc2 weight", {kC, kHidden});
  check_f32(fc2_b, "fc2 bias", {kC});

  Block0Args a;
  a.x = x;
  // KRSC: channels_last of (K, C, R, S); a view when the weight is channels_last already.
  a.w1k = w1.permute({0, 2, 3, 1}).contiguous();
  a.w2k = w2.permute({0, 2, 3, 1}).contiguous();
  if (out_opt.has_value()) {
    a.out = *out_opt;
    TORCH_CHECK(a.out.sizes() == x.sizes() && a.out.scalar_type() == torch::kHalf && a.out.device() == x.device() &&
                    a.out.is_contiguous(at::MemoryFormat::ChannelsLast),
                "block0_fused: out must be like x (float16, channels_last)");
  } else {
    a.out = torch::empty_like(x, x.options(), at::MemoryFormat::ChannelsLast);
  }
  a.n = static_cast<int>(x.size(0));
  if (a.n == 0) return a;
  TORCH_CHECK(aligned16(x.data_ptr()) && aligned16(a.out.data_ptr()) && aligned16(a.w1k.data_ptr()) &&
                  aligned16(a.w2k.data_ptr()),
              "block0_fused: x, out and the weights must be 16-byte aligned");
  const int dev = x.get_device();
  C10_CUDA_CHECK(cudaDeviceGetAttribute(&a.sms, cudaDevAttrMultiProcessorCount, dev));
  C10_CUDA_CHECK(cudaDeviceGetAttribute(&a.smem_optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev));
  return a;
}

// The fields every kernel's Params has (the filters are set by each entry point: resident
// kernels take w1, w2 as KRSC, the stream kernel its packed taps).
template <class P>
void fill_common(P& p, const Block0Args& a, const torch::Tensor& b1a, const torch::Tensor& b1b,
                 const torch::Tensor& b2a, const torch::Tensor& scale, const torch::Tensor& b2b,
                 const torch::Tensor& fc1_w, const torch::Tensor& fc1_b, const torch::Tensor& fc2_w,
                 const torch::Tensor& fc2_b) {
  p.x = reinterpret_cast<const __half*>(a.x.data_ptr<at::Half>());
  p.out = reinterpret_cast<__half*>(a.out.data_ptr<at::Half>());
  p.b1a = b1a.data_ptr<float>();
  p.b1b = b1b.data_ptr<float>();
  p.b2a = b2a.data_ptr<float>();
  p.scale = scale.data_ptr<float>();
  p.b2b = b2b.data_ptr<float>();
  p.fc1_w = fc1_w.data_ptr<float>();
  p.fc1_b = fc1_b.data_ptr<float>();
  p.fc2_w = fc2_w.data_ptr<float>();
  p.fc2_b = fc2_b.data_ptr<float>();
  p.n = a.n;
}

// ... and the resident filters, KRSC.
template <class P>
void fill_params(P& p, const Block0Args& a, const torch::Tensor& b1a, const torch::Tensor& b1b,
                 const torch::Tensor& b2a, const torch::Tensor& scale, const torch::Tensor& b2b,
                 const torch::Tensor& fc1_w, const torch::Tensor& fc1_b, const torch::Tensor& fc2_w,
                 const torch::Tensor& fc2_b) {
  fill_common(p, a, b1a, b1b, b2a, scale, b2b, fc1_w, fc1_b, fc2_w, fc2_b);
  p.w1 = reinterpret_cast<const __half*>(a.w1k.data_ptr<at::Half>());
  p.w2 = reinterpret_cast<const __half*>(a.w2k.data_ptr<at::Half>());
}

// nullptr, or the checked phase_clk tensor's data: int64, at least [grid][kPhases] on x's GPU.
long long* phase_clk_ptr(const c10::optional<torch::Tensor>& phase_clk, const torch::Tensor& x, int grid) {
  using block0_wgmma::kPhases;
  if (!phase_clk.has_value()) return nullptr;
  const torch::Tensor& t = *phase_clk;
  TORCH_CHECK(t.is_cuda() && t.get_device() == x.get_device() && t.scalar_type() == torch::kLong &&
                  t.is_contiguous() && t.numel() >= static_cast<int64_t>(grid) * kPhases,
              "block0_fused: phase_clk must be a contiguous int64 tensor on x's GPU with at least ", grid, " x ",
              kPhases, " elements (CTAs x phases)");
  return reinterpret_cast<long long*>(t.data_ptr<int64_t>());
}

void require_sm90(const torch::Tensor& x, const char* what, int smem_optin, int smem_bytes) {
  const auto* prop = at::cuda::getDeviceProperties(x.get_device());
  TORCH_CHECK(prop->major == 9 && prop->minor == 0, "block0_fused: ", what,
              " needs an sm_90 GPU (wgmma, built for sm_90a), this is sm_", prop->major, prop->minor);
  TORCH_CHECK(smem_optin >= smem_bytes, "block0_fused: ", what, " needs ", smem_bytes,
              " bytes of shared memory per block, this GPU allows ", smem_optin);
}

// Both convs' filters, KRSC, as the stream kernel's ring reads them: [conv][tap][n][16-byte
// chunk j][8], chunk j of row n holding input channels 8(j ^ (n & 7)).. (the 128-byte swizzle
// of a 1024-aligned slot), one contiguous 8192-byte block a tap.
torch::Tensor pack_taps(const torch::Tensor& w1k, const torch::Tensor& w2k) {
  using namespace block0_wgmma;
  auto opt = torch::TensorOptions().dtype(torch::kLong).device(w1k.device());
  const auto n = torch::arange(kC, opt).unsqueeze(1), j = torch::arange(8, opt).unsqueeze(0);
  const auto src_chunk = torch::bitwise_xor(j, torch::bitwise_and(n, 7));  // [64, 8]
  std::vector<torch::Tensor> convs;
  for (const auto* wk : {&w1k, &w2k}) {
    auto t = wk->reshape({kC, 9, 8, 8}).permute({1, 0, 2, 3});  // [tap][n][chunk][8]
    convs.push_back(t.index({torch::indexing::Slice(), n, src_chunk}));
  }
  return torch::cat(convs).contiguous();  // [18][64][8][8]
}

}  // namespace

torch::Tensor block0_forward(torch::Tensor x, torch::Tensor w1, torch::Tensor w2, torch::Tensor b1a,
                             torch::Tensor b1b, torch::Tensor b2a, torch::Tensor scale, torch::Tensor b2b,
                             torch::Tensor fc1_w, torch::Tensor fc1_b, torch::Tensor fc2_w,
                             torch::Tensor fc2_b, c10::optional<torch::Tensor> out_opt) {
  using namespace block0;
  const c10::cuda::CUDAGuard guard(x.device());
  Block0Args a = check_args(x, w1, w2, b1a, b1b, b2a, scale, b2b, fc1_w, fc1_b, fc2_w, fc2_b, out_opt);
  if (a.n == 0) return a.out;
  TORCH_CHECK(a.smem_optin >= kSmemBytes, "block0_fused: needs ", kSmemBytes,
              " bytes of shared memory per block, this GPU allows ", a.smem_optin, " (an sm_90 part has 232448)");
  static bool attribute_set = false;  // (one device per process is enough for the experiment)
  if (!attribute_set) {
    C10_CUDA_CHECK(cudaFuncSetAttribute(block0_fused_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                        kSmemBytes));
    attribute_set = true;
  }
  Params p;
  fill_params(p, a, b1a, b1b, b2a, scale, b2b, fc1_w, fc1_b, fc2_w, fc2_b);
  const int grid = a.n < a.sms ? a.n : a.sms;  // persistent: one CTA per SM, each loops over images
  block0_fused_kernel<<<grid, kThreads, kSmemBytes, at::cuda::getCurrentCUDAStream()>>>(p);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  return a.out;
}

// The wgmma kernel, same arguments.  `desc_base_offset_mode` (default 0, the design) selects
// what the wgmma descriptors' base-offset field holds: 0, or 1 for (start >> 7) & 7 (see
// block0_wgmma_kernel.cuh); run.py uses 1 only to diagnose a failure of 0.  `phase_clk`
// (optional, int64 [CTAs, kPhases] on x's GPU): the cycles each CTA's thread 0 spent per phase.
torch::Tensor block0_forward_wgmma(torch::Tensor x, torch::Tensor w1, torch::Tensor w2, torch::Tensor b1a,
                                   torch::Tensor b1b, torch::Tensor b2a, torch::Tensor scale, torch::Tensor b2b,
                                   torch::Tensor fc1_w, torch::Tensor fc1_b, torch::Tensor fc2_w,
                                   torch::Tensor fc2_b, c10::optional<torch::Tensor> out_opt,
                                   int64_t desc_base_offset_mode, c10::optional<torch::Tensor> phase_clk) {
  using namespace block0_wgmma;
  const c10::cuda::CUDAGuard guard(x.device());
  Block0Args a = check_args(x, w1, w2, b1a, b1b, b2a, scale, b2b, fc1_w, fc1_b, fc2_w, fc2_b, out_opt);
  if (a.n == 0) return a.out;
  require_sm90(x, "forward_wgmma", a.smem_optin, kSmemBytes);
  TORCH_CHECK(desc_base_offset_mode == 0 || desc_base_offset_mode == 1,
              "block0_fused: desc_base_offset_mode must be 0 or 1");
  static bool attribute_set = false;
  if (!attribute_set) {
    C10_CUDA_CHECK(cudaFuncSetAttribute(block0_wgmma_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                        kSmemBytes));
    attribute_set = true;
  }
  Params p;
  fill_params(p, a, b1a, b1b, b2a, scale, b2b, fc1_w, fc1_b, fc2_w, fc2_b);
  p.desc_base_offset_mode = static_cast<int>(desc_base_offset_mode);
  const int grid = a.n < a.sms ? a.n : a.sms;
  p.phase_clk = phase_clk_ptr(phase_clk, x, grid);
  block0_wgmma_kernel<<<grid, kThreads, kSmemBytes, at::cuda::getCurrentCUDAStream()>>>(p);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  return a.out;
}

// CTAs of the stream kernel an SM of the current GPU holds (2 is the design; the timed and
// untimed builds alike).  Sets the kernels' shared-memory attribute once a process.
int64_t block0_stream_ctas_per_sm() {
  namespace bs = block0_stream;
  static int ctas = -1;
  if (ctas < 0) {
    int timed = 0;
    for (auto* k : {bs::block0_stream_kernel<false>, bs::block0_stream_kernel<true>}) {
      C10_CUDA_CHECK(cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, bs::kSmemBytes));
      // all of the unified L1/shared storage as shared memory: two CTAs need 220 KB of it
      C10_CUDA_CHECK(cudaFuncSetAttribute(k, cudaFuncAttributePreferredSharedMemoryCarveout,
                                          cudaSharedmemCarveoutMaxShared));
    }
    C10_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&ctas, bs::block0_stream_kernel<false>, bs::kThreads,
                                                                 bs::kSmemBytes));
    C10_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&timed, bs::block0_stream_kernel<true>, bs::kThreads,
                                                                 bs::kSmemBytes));
    ctas = ctas < timed ? ctas : timed;
  }
  return ctas;
}

// The stream kernel, same arguments (no descriptor mode: base offset 0, as the H100 run settled).
// Its grid: as many CTAs as fit the GPU at once (two an SM when its registers and shared memory
// allow), each looping over images.
torch::Tensor block0_forward_stream(torch::Tensor x, torch::Tensor w1, torch::Tensor w2, torch::Tensor b1a,
                                    torch::Tensor b1b, torch::Tensor b2a, torch::Tensor scale, torch::Tensor b2b,
                                    torch::Tensor fc1_w, torch::Tensor fc1_b, torch::Tensor fc2_w,
                                    torch::Tensor fc2_b, c10::optional<torch::Tensor> out_opt,
                                    c10::optional<torch::Tensor> phase_clk, c10::optional<torch::Tensor> taps_opt) {
  namespace bs = block0_stream;
  const c10::cuda::CUDAGuard guard(x.device());
  Block0Args a = check_args(x, w1, w2, b1a, b1b, b2a, scale, b2b, fc1_w, fc1_b, fc2_w, fc2_b, out_opt);
  if (a.n == 0) return a.out;
  require_sm90(x, "forward_stream", a.smem_optin, bs::kSmemBytes);
  const int ctas_per_sm = static_cast<int>(block0_stream_ctas_per_sm());
  TORCH_CHECK(ctas_per_sm > 0, "block0_fused: forward_stream's kernel cannot be resident on this GPU");
  // The packed filters: given (packed once by the caller, as a model would at load time), or packed here.
  const torch::Tensor taps = taps_opt.has_value() ? *taps_opt : pack_taps(a.w1k, a.w2k);
  TORCH_CHECK(taps.device() == x.device() && taps.scalar_type() == torch::kHalf && taps.is_contiguous() &&
                  taps.sizes() == torch::IntArrayRef({18, 64, 8, 8}),
              "block0_fused: taps must be pack_taps(w1, w2): (18, 64, 8, 8) float16, contiguous, on x's GPU");
  bs::Params p;
  fill_common(p, a, b1a, b1b, b2a, scale, b2b, fc1_w, fc1_b, fc2_w, fc2_b);
  p.wtaps = reinterpret_cast<const __half*>(taps.data_ptr<at::Half>());
  const int slots = ctas_per_sm * a.sms;
  const int grid = a.n < slots ? a.n : slots;
  p.phase_clk = phase_clk_ptr(phase_clk, x, grid);
  // (the timed build spills a few registers: its times are of a slightly slower kernel)
  if (p.phase_clk != nullptr)
    bs::block0_stream_kernel<true><<<grid, bs::kThreads, bs::kSmemBytes, at::cuda::getCurrentCUDAStream()>>>(p);
  else
    bs::block0_stream_kernel<false><<<grid, bs::kThreads, bs::kSmemBytes, at::cuda::getCurrentCUDAStream()>>>(p);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  return a.out;
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("forward", &block0_forward, "SE-ResNet9-FixUp block 0 as one kernel (fp16 NHWC)",
        py::arg("x"), py::arg("w1"), py::arg("w2"), py::arg("b1a"), py::arg("b1b"), py::arg("b2a"),
        py::arg("scale"), py::arg("b2b"), py::arg("fc1_w"), py::arg("fc1_b"), py::arg("fc2_w"),
        py::arg("fc2_b"), py::arg("out") = py::none());
  m.def("forward_wgmma", &block0_forward_wgmma,
        "SE-ResNet9-FixUp block 0 as one wgmma kernel (fp16 NHWC, sm_90a)", py::arg("x"), py::arg("w1"),
        py::arg("w2"), py::arg("b1a"), py::arg("b1b"), py::arg("b2a"), py::arg("scale"), py::arg("b2b"),
        py::arg("fc1_w"), py::arg("fc1_b"), py::arg("fc2_w"), py::arg("fc2_b"), py::arg("out") = py::none(),
        py::arg("desc_base_offset_mode") = 0, py::arg("phase_clk") = py::none());
  m.def("forward_stream", &block0_forward_stream,
        "SE-ResNet9-FixUp block 0 as one wgmma kernel, filters streamed, two CTAs an SM (fp16 NHWC, sm_90a)",
        py::arg("x"), py::arg("w1"), py::arg("w2"), py::arg("b1a"), py::arg("b1b"), py::arg("b2a"),
        py::arg("scale"), py::arg("b2b"), py::arg("fc1_w"), py::arg("fc1_b"), py::arg("fc2_w"), py::arg("fc2_b"),
        py::arg("out") = py::none(), py::arg("phase_clk") = py::none(), py::arg("taps") = py::none());
  m.def("pack_taps",
        [](const torch::Tensor& w1, const torch::Tensor& w2) {
          return pack_taps(w1.permute({0, 2, 3, 1}).contiguous(), w2.permute({0, 2, 3, 1}).contiguous());
        },
        "both convs' (64, 64, 3, 3) filters packed as forward_stream's ring reads them", py::arg("w1"), py::arg("w2"));
  m.def("stream_ctas_per_sm", &block0_stream_ctas_per_sm,
        "CTAs of the stream kernel one SM of the current GPU holds");
  m.attr("stream_smem_bytes") = block0_stream::kSmemBytes;
  m.attr("smem_bytes") = block0::kSmemBytes;
  m.attr("wgmma_phases") = block0_wgmma::kPhases;
  m.attr("wgmma_smem_bytes") = block0_wgmma::kSmemBytes;
}
