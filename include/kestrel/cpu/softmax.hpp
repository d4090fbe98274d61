// kestrel/cpu/softmax.hpp: numerically stable softmax in place.
#pragma once

#include <cstddef>
#include <limits>

#include "kestrel/cpu/math.hpp"
#include "kestrel/cpu/xsimd_compat.hpp"

namespace kestrel::cpu {

/// x = exp(x - max x) / sum. x: (n); n == 0 is a no-op. Subtracting the
/// maximum keeps every exponent <= 0, so exp never overflows and the largest
/// term is exactly 1 (the sum is >= 1, the division is safe).
inline void softmax(float* x, std::size_t n) noexcept {
  if (n == 0) return;
  constexpr std::size_t W = simd::width;
  // Index bounds computed up front (not "i + W <= n"): GCC then sees the
  // loops are finite and does not warn about them.
  const std::size_t n_vec = n - n % W;
  float m = -std::numeric_limits<float>::infinity();
  if (n_vec) {
    simd::fbatch mb = simd::fbatch::load_unaligned(x);
    for (std::size_t i = W; i < n_vec; i += W) mb = xsimd::max(mb, simd::fbatch::load_unaligned(x + i));
    m = simd::reduce_max(mb);
  }
  for (std::size_t i = n_vec; i < n; ++i) m = x[i] > m ? x[i] : m;

  const simd::fbatch mb(m);
  simd::fbatch sum_b(0.0f);
  for (std::size_t i = 0; i < n_vec; i += W) {
    const auto e = cpu::exp(simd::fbatch::load_unaligned(x + i) - mb);
    e.store_unaligned(x + i);
    sum_b += e;
  }
  float sum = 0.0f;
  for (std::size_t i = n_vec; i < n; ++i) {
    // The tail goes through the same vector exp (one lane used), so every
    // element has the same error bound.
    x[i] = cpu::exp(simd::fbatch(x[i] - m)).get(0);
    sum += x[i];
  }
  sum += simd::reduce_add(sum_b);
  // One division, then multiplies: one extra rounding per element (u),
  // accounted for in the tests' tolerance.
  const float inv = 1.0f / sum;
  const simd::fbatch ib(inv);
  for (std::size_t i = 0; i < n_vec; i += W) (simd::fbatch::load_unaligned(x + i) * ib).store_unaligned(x + i);
  for (std::size_t i = n_vec; i < n; ++i) x[i] *= inv;
}

}  // namespace kestrel::cpu
