// Torch extension entry point for the block-0 fused kernel (block0_fused_kernel.cuh).
// Built by run.py with torch.utils.cpp_extension.load; the kernel header has no torch
// dependency, so it can also be compile-checked alone (see README.md).
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/extension.h>

#include "block0_fused_kernel.cuh"

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

}  // namespace

// x: (N, 64, 16, 16) fp16 channels_last (NHWC in memory); w1, w2: (64, 64, 3, 3) fp16 (any
// layout: taken as channels_last, a no-op for FusedResNet's weights); FixUp scalars and SE
// weights float32.  `out`, when given, is written (a (N, 64, 16, 16) fp16 channels_last
// tensor); else a new one is returned.
torch::Tensor block0_forward(torch::Tensor x, torch::Tensor w1, torch::Tensor w2, torch::Tensor b1a,
                             torch::Tensor b1b, torch::Tensor b2a, torch::Tensor scale, torch::Tensor b2b,
                             torch::Tensor fc1_w, torch::Tensor fc1_b, torch::Tensor fc2_w,
                             torch::Tensor fc2_b, c10::optional<torch::Tensor> out_opt) {
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

  const c10::cuda::CUDAGuard guard(x.device());
  // KRSC: channels_last of (K, C, R, S); a view when the weight is channels_last already.
  auto w1k = w1.permute({0, 2, 3, 1}).contiguous();
  auto w2k = w2.permute({0, 2, 3, 1}).contiguous();

  torch::Tensor out;
  if (out_opt.has_value()) {
    out = *out_opt;
    TORCH_CHECK(out.sizes() == x.sizes() && out.scalar_type() == torch::kHalf && out.device() == x.device() &&
                    out.is_contiguous(at::MemoryFormat::ChannelsLast),
                "block0_fused: out must be like x (float16, channels_last)");
  } else {
    out = torch::empty_like(x, x.options(), at::MemoryFormat::ChannelsLast);
  }
  const int n = static_cast<int>(x.size(0));
  if (n == 0) return out;
  TORCH_CHECK(aligned16(x.data_ptr()) && aligned16(out.data_ptr()) && aligned16(w1k.data_ptr()) &&
                  aligned16(w2k.data_ptr()),
              "block0_fused: x, out and the weights must be 16-byte aligned");

  int dev = x.get_device(), sms = 0, smem_optin = 0;
  C10_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
  C10_CUDA_CHECK(cudaDeviceGetAttribute(&smem_optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev));
  TORCH_CHECK(smem_optin >= kSmemBytes, "block0_fused: needs ", kSmemBytes,
              " bytes of shared memory per block, this GPU allows ", smem_optin, " (an sm_90 part has 232448)");
  static bool attribute_set = false;  // (one device per process is enough for the experiment)
  if (!attribute_set) {
    C10_CUDA_CHECK(cudaFuncSetAttribute(block0_fused_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                        kSmemBytes));
    attribute_set = true;
  }

  Params p;
  p.x = reinterpret_cast<const __half*>(x.data_ptr<at::Half>());
  p.out = reinterpret_cast<__half*>(out.data_ptr<at::Half>());
  p.w1 = reinterpret_cast<const __half*>(w1k.data_ptr<at::Half>());
  p.w2 = reinterpret_cast<const __half*>(w2k.data_ptr<at::Half>());
  p.b1a = b1a.data_ptr<float>();
  p.b1b = b1b.data_ptr<float>();
  p.b2a = b2a.data_ptr<float>();
  p.scale = scale.data_ptr<float>();
  p.b2b = b2b.data_ptr<float>();
  p.fc1_w = fc1_w.data_ptr<float>();
  p.fc1_b = fc1_b.data_ptr<float>();
  p.fc2_w = fc2_w.data_ptr<float>();
  p.fc2_b = fc2_b.data_ptr<float>();
  p.n = n;
  const int grid = n < sms ? n : sms;  // persistent: one CTA per SM, each loops over images
  block0_fused_kernel<<<grid, kThreads, kSmemBytes, at::cuda::getCurrentCUDAStream()>>>(p);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  return out;
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("forward", &block0_forward, "SE-ResNet9-FixUp block 0 as one kernel (fp16 NHWC)",
        py::arg("x"), py::arg("w1"), py::arg("w2"), py::arg("b1a"), py::arg("b1b"), py::arg("b2a"),
        py::arg("scale"), py::arg("b2b"), py::arg("fc1_w"), py::arg("fc1_b"), py::arg("fc2_w"),
        py::arg("fc2_b"), py::arg("out") = py::none());
  m.attr("smem_bytes") = block0::kSmemBytes;
}
