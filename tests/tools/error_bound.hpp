// tests/tools/error_bound.hpp: how far converted tensor data may be from its
// source, derived from each type's format rather than picked.
//
// Float types round each value: |error| <= 2^-11 |x| for F16 and 2^-8 |x|
// for BF16 (half an ulp of the 11- / 8-bit significand; plus the smallest
// subnormal for F16), checked value by value.
//
// Block types round each value of a group of G values to a grid of step
// D: for a symmetric format D = absmax / L (q8_0: L = 127, q4_0: 8, q5_0:
// 16, q6_K: 32, q3_K: 4), for an affine one D = (max - min) / L (q4_1 /
// q4_K: 15, q5_1 / q5_K: 31, q2_K: 3). Rounding to the nearest grid point
// errs by D/2 at most and, over many values, by D/sqrt(12) in RMS. The
// bound is 1.5 x the RMS of D/sqrt(12) over all groups: the margin covers
// the scales themselves being rounded (to f16, and to 6- or 4-bit codes in
// the k-quants, which move the grid by up to 1/30 of a step per code) and
// the k-quant quantizers trading a larger error on an outlier for a
// finer grid elsewhere.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <span>

#include "kestrel/io/gguf.hpp"

namespace kestrel::test {

struct conversion_error_stats {
  double rms_err = 0, rms_bound = 0;  // over all values
  double max_err = 0, max_bound = 0;  // float types: the largest |error| and its per-value bound there
  bool ok = true;                     // float types: every value within its bound
};

struct grid_rule {
  std::size_t group = 1;
  double levels = 0;  // L above; 0: a float type
  bool affine = false;
};

inline grid_rule grid_of(io::ggml_type t) {
  using T = io::ggml_type;
  switch (t) {
    case T::q8_0: return {32, 127, false};
    case T::q4_0: return {32, 8, false};
    case T::q5_0: return {32, 16, false};
    case T::q4_1: return {32, 15, true};
    case T::q5_1: return {32, 31, true};
    case T::q2_k: return {16, 3, true};
    case T::q3_k: return {16, 4, false};
    case T::q4_k: return {32, 15, true};
    case T::q5_k: return {32, 31, true};
    case T::q6_k: return {16, 32, false};
    default: return {};
  }
}

/// Error of `y` (the data after conversion to `t` and back) against `x`;
/// rows of `n_per_row` values (groups never straddle rows).
inline conversion_error_stats conversion_error(io::ggml_type t, std::span<const float> x, std::span<const float> y,
                                               std::size_t n_per_row) {
  conversion_error_stats s;
  const std::size_t n = x.size();
  double sum_err2 = 0, sum_bound2 = 0;
  const grid_rule g = grid_of(t);
  if (g.levels == 0) {
    const double rel = t == io::ggml_type::f16 ? 0x1.0p-11 : t == io::ggml_type::bf16 ? 0x1.0p-8 : 0.0;
    const double abs = t == io::ggml_type::f16 ? 0x1.0p-25 : 0.0;
    for (std::size_t i = 0; i < n; ++i) {
      const double e = std::abs(static_cast<double>(y[i]) - x[i]);
      const double b = rel * std::abs(static_cast<double>(x[i])) + abs;
      sum_err2 += e * e;
      sum_bound2 += b * b;
      if (e > b) s.ok = false;
      if (e >= s.max_err) {
        s.max_err = e;
        s.max_bound = b;
      }
    }
  } else {
    for (std::size_t row = 0; row < n; row += n_per_row) {
      for (std::size_t g0 = row; g0 < row + n_per_row; g0 += g.group) {
        float lo = x[g0], hi = x[g0], amax = 0;
        for (std::size_t i = g0; i < g0 + g.group; ++i) {
          lo = std::min(lo, x[i]);
          hi = std::max(hi, x[i]);
          amax = std::max(amax, std::abs(x[i]));
          const double e = static_cast<double>(y[i]) - x[i];
          sum_err2 += e * e;
          s.max_err = std::max(s.max_err, std::abs(e));
        }
        const double step = (g.affine ? static_cast<double>(hi) - lo : amax) / g.levels;
        sum_bound2 += static_cast<double>(g.group) * step * step / 12.0;
        s.max_bound = std::max(s.max_bound, step);
      }
    }
    sum_bound2 *= 1.5 * 1.5;
  }
  s.rms_err = std::sqrt(sum_err2 / static_cast<double>(n));
  s.rms_bound = std::sqrt(sum_bound2 / static_cast<double>(n));
  return s;
}

}  // namespace kestrel::test
