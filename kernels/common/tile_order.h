// How the dispatchers (conv2d_fused, conv2d_backward) pick kernels: the profile rule nearest
// a problem, and the order they try kernels of equal fit in.
#pragma once

#include <algorithm>
#include <cmath>
#include <vector>

namespace cutlass_ops {

// Candidate: has `ctas` (threadblocks it would launch) and `entry->tile_m`, `entry->tile_n`.
// Tiles that give every SM a CTA first; among them the least padded (a 128-wide tile on 64
// output channels computes half zeros), then the largest (fewer re-reads of A and B).
// Then the rest, most CTAs first.  Stable: ties keep the table's (profile) order.
template <typename Candidate>
void order_by_occupancy(std::vector<Candidate>& candidates, int num_sms, long long gemm_m, long long gemm_n) {
  auto utilization = [&](Candidate const& c) {
    double tiles = static_cast<double>(c.ctas) * c.entry->tile_m * c.entry->tile_n;
    return static_cast<double>(gemm_m) * gemm_n / tiles;
  };
  std::stable_sort(candidates.begin(), candidates.end(), [&](Candidate const& x, Candidate const& y) {
    bool fx = x.ctas >= num_sms, fy = y.ctas >= num_sms;
    if (fx != fy) return fx;
    if (!fx) return x.ctas > y.ctas;
    double ux = utilization(x), uy = utilization(y);
    if (ux > uy * 1.05 || uy > ux * 1.05) return ux > uy;
    return x.entry->tile_m * x.entry->tile_n > y.entry->tile_m * y.entry->tile_n;
  });
}

// The rule among rules[0..count) that `matches` accepts with the nearest gemm_m on a log
// scale (the measured batch closest to this one), or null.
template <typename Rule, typename Match>
Rule const* nearest_rule(Rule const* rules, int count, long long gemm_m, Match matches) {
  Rule const* best = nullptr;
  double best_distance = 0;
  for (int i = 0; i < count; ++i) {
    if (!matches(rules[i])) continue;
    double distance = std::fabs(std::log(double(gemm_m) / double(rules[i].gemm_m)));
    if (best == nullptr || distance < best_distance) {
      best = &rules[i];
      best_distance = distance;
    }
  }
  return best;
}

}  // namespace cutlass_ops
