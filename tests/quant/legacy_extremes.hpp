// tests/quant/legacy_extremes.hpp: legacy-format weight and activation
// blocks at their extremes, for the tests of the integer sums of the tile
// and decode kernels (test_legacy_tokens.cpp, test_amx.cpp): every weight
// code at one end (q = 127 / -127 for q8_0; codes 15 / 31 or 0 for the
// nibble types), activations alternately 127 and a_min (0x80 = -128 below
// quantize_row's -127, or 0x81), the scales at their f16 extremes.
#pragma once

#include <cstddef>
#include <cstring>
#include <type_traits>
#include <vector>

#include "kestrel/quant/legacy.hpp"
#include "kestrel/quant/legacy_tokens.hpp"

namespace kestrel::test {

/// n weight blocks of pattern 0..3: odd patterns every code at its top,
/// even ones at its bottom; patterns 0, 1 the largest f16 scale, 2, 3 the
/// smallest subnormal; the _1 types' offset -3.
template <class W>
std::vector<W> extreme_weights(std::size_t n, int pattern) {
  std::vector<W> w(n);
  for (auto& b : w) {
    std::memset(&b, pattern % 2 ? 0xff : 0x00, sizeof b);
    if constexpr (std::is_same_v<W, quant::block_q8_0>) std::memset(b.qs, pattern % 2 ? 0x7f : 0x81, 32);
    b.d = to_f16(pattern < 2 ? 65504.0f : 6.0e-8f);
    if constexpr (quant::has_offset_m<W>) b.m = to_f16(-3.0f);
  }
  return w;
}

/// n activation blocks for weights of pattern `pattern`: block i all 127
/// (odd i) or all a_min as a byte; scales 1e-3 (patterns 0, 1) or 65504.
template <class A>
std::vector<A> extreme_acts(std::size_t n, int pattern, int a_min = 0x80) {
  std::vector<A> a(n);
  for (std::size_t i = 0; i < a.size(); ++i) {
    std::memset(a[i].qs, i % 2 ? 0x7f : a_min, 32);
    a[i].d = to_f16(pattern < 2 ? 1.0e-3f : 65504.0f);
    if constexpr (std::is_same_v<A, quant::block_q8_1>) a[i].s = to_f16(0.5f);
  }
  return a;
}

}  // namespace kestrel::test
