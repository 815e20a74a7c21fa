// Which GPU's profile rules a dispatcher follows.
//
// The generator keys every profile rule by the GPU that measured it: its profiles/<gpu>/ folder,
// named by gpu_slug() of the device name (the same function as cutlass_ops/tools/profiler.py's
// gpu_slug, which names the folder when it writes a profile).  A generated dispatch table lists
// its GPUs in kProfileGpus, each with its slice of kProfileRules; the dispatchers
// (conv2d_fused_dispatch.cpp, conv2d_backward_dispatch.cpp) look up the running device's slug
// once per device and follow that GPU's slice only, so two GPUs' measurements never compete.
#pragma once

#include <cuda_runtime.h>

#include <atomic>
#include <cstring>
#include <map>
#include <mutex>
#include <string>

namespace cutlass_ops {

// One GPU's rules in a dispatch table: kProfileRules[first, first + count).
struct ProfileGpu {
  char const* slug;  // profiles/<slug>/
  int first;
  int count;
};

// 'NVIDIA H200' -> 'h200', 'NVIDIA H100 80GB HBM3' -> 'h100-80gb-hbm3', 'NVIDIA A100-SXM4-80GB'
// -> 'a100-sxm4-80gb': lower case, every "nvidia" removed, each run of other characters than
// [a-z0-9] one '-', none at either end (cutlass_ops/tools/profiler.py's gpu_slug).
inline std::string gpu_slug(std::string const& name) {
  std::string lower;
  for (char c : name) lower += (c >= 'A' && c <= 'Z') ? static_cast<char>(c - 'A' + 'a') : c;
  std::string kept;  // every "nvidia" removed in one left-to-right pass, as Python's replace
  for (size_t at = 0; at < lower.size();) {
    if (lower.compare(at, 6, "nvidia") == 0) {
      at += 6;
    } else {
      kept += lower[at++];
    }
  }
  lower = kept;
  std::string slug;
  bool gap = false;
  for (char c : lower) {
    if ((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9')) {
      if (gap && !slug.empty()) slug += '-';
      slug += c;
      gap = false;
    } else {
      gap = true;
    }
  }
  return slug;
}

// gpu_slug() of device `device`'s name, or "" when the device cannot be queried (no GPU).
// cudaGetDeviceProperties is slow, so each device's slug is looked up once and cached
// (thread-safe; the returned string lives as long as the process).
inline char const* device_gpu_slug(int device) {
  constexpr int kCached = 64;  // lock-free reads for device indices below this
  static std::atomic<std::string const*> cache[kCached] = {};
  static std::mutex mutex;
  static std::map<int, std::string> slugs;  // never erased: pointers into it stay valid
  if (device < 0) return "";
  if (device < kCached) {
    if (std::string const* slug = cache[device].load(std::memory_order_acquire)) return slug->c_str();
  }
  std::lock_guard<std::mutex> lock(mutex);
  auto it = slugs.find(device);
  if (it == slugs.end()) {
    cudaDeviceProp prop;
    if (cudaGetDeviceProperties(&prop, device) != cudaSuccess) {
      (void)cudaGetLastError();  // not sticky: clear it so that no later check reports it
      return "";
    }
    it = slugs.emplace(device, gpu_slug(prop.name)).first;
  }
  if (device < kCached) cache[device].store(&it->second, std::memory_order_release);
  return it->second.c_str();
}

// The current device's slug ("" without a device).
inline char const* current_gpu_slug() {
  int device = -1;
  if (cudaGetDevice(&device) != cudaSuccess) {
    (void)cudaGetLastError();
    return "";
  }
  return device_gpu_slug(device);
}

// The rules of GPU `slug` (null: the current device's) among `gpus[0, count)`.
//
// THE DEFAULT: a GPU the table has no profile for gets an empty slice, {slug, 0, 0}: no rule
// covers any problem, so the dispatchers make the same choice as a build without profiles
// (family 80's kernels ordered by occupancy; family 90 only when forced or CUTLASS_OPS_SM90=1;
// conv2d_dgrad/wgrad never choose cuDNN while one of our kernels fits).  Another GPU's rules
// are never borrowed, and a GPU with a profile but no rule for a problem (or for one kernel
// family) gets the same default for it.  profiles/README.md documents this.
inline ProfileGpu find_profile_gpu(ProfileGpu const* gpus, int count, char const* slug = nullptr) {
  if (slug == nullptr) slug = current_gpu_slug();
  for (int i = 0; i < count; ++i) {
    if (std::strcmp(gpus[i].slug, slug) == 0) return gpus[i];
  }
  return {slug, 0, 0};
}

}  // namespace cutlass_ops
