// bench/common.hpp: timing helpers for the benchmarks (medians, JSON lines).
#pragma once

#include <algorithm>
#include <chrono>
#include <vector>

namespace kestrel::bench {

inline double now_ms() {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

/// Median of a sample; the machine is shared and noisy, so benchmarks
/// report medians (and ratios measured in one run), never single times.
inline double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const std::size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

}  // namespace kestrel::bench
