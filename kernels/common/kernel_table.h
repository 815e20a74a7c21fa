// What the generated dispatch tables (conv2d_fused, conv2d_backward) share on the host.
#pragma once

#include <string>
#include <vector>

namespace cutlass_ops {

// The names of a table's kernels that this build compiled (an entry with no run function
// was generated for an arch the build left out).
template <typename Entry>
std::vector<std::string> built_kernel_names(Entry const* table, int count) {
  std::vector<std::string> names;
  for (int i = 0; i < count; ++i) {
    if (table[i].run != nullptr) names.emplace_back(table[i].name);
  }
  return names;
}

}  // namespace cutlass_ops
