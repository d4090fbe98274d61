// tests/cpu/helpers.hpp: seeded random data, the rounding-error constants the
// tolerances are derived from, and an element-wise comparison that reports
// the first mismatch.
#pragma once

#include <doctest/doctest.h>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <random>
#include <vector>

#include "kestrel/core/dtype.hpp"
#include "kestrel/core/tensor.hpp"

namespace kestrel::test {

/// Unit roundoff of float.
inline constexpr double u = 1.0 / 16777216.0;  // 2^-24

/// gamma_n = n u / (1 - n u): the relative bound of any summation order of n
/// floating-point terms (Higham, Accuracy and Stability, 3.1), and of a dot
/// product of length n, with or without FMA: |fl(sum) - sum| <= gamma_n sum |terms|.
inline double gamma_n(std::size_t n) { return static_cast<double>(n) * u / (1.0 - static_cast<double>(n) * u); }

/// The sizes every element-wise kernel is tried on: 0, 1, every size up to
/// 67 (not multiples of any SIMD width, and tails of every length for widths
/// 4, 8 and 16), around 128, and large.
inline std::vector<std::size_t> sizes() {
  std::vector<std::size_t> s;
  for (std::size_t n = 0; n <= 67; ++n) s.push_back(n);
  for (std::size_t n : {127, 128, 129, 255, 1000, 4099}) s.push_back(n);
  return s;
}

inline std::vector<float> random_floats(std::size_t n, std::uint32_t seed, float lo = -1.0f, float hi = 1.0f) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<float> v(n);
  for (auto& x : v) x = dist(rng);
  return v;
}

/// A weight matrix of dtype t, stored in `bytes`, with random values in
/// [-1, 1] rounded to t, and its exact float values in `values`.
struct random_weight {
  std::vector<std::uint16_t> half;  // (rows, cols) when f16 / bf16
  std::vector<float> values;        // (rows, cols), exact values of the weights
  weight_view view;

  random_weight(dtype t, std::size_t rows, std::size_t cols, std::uint32_t seed)
      : values(random_floats(rows * cols, seed)) {
    view.type = t;
    view.rows = rows;
    view.cols = cols;
    if (t == dtype::f32) {
      view.data = values.data();
      return;
    }
    half.resize(values.size());
    for (std::size_t i = 0; i < values.size(); ++i) {
      if (t == dtype::f16) {
        half[i] = to_f16(values[i]).bits;
        values[i] = to_f32(f16{half[i]});
      } else {
        half[i] = to_bf16(values[i]).bits;
        values[i] = to_f32(bf16{half[i]});
      }
    }
    view.data = half.data();
  }
  random_weight(const random_weight&) = delete;
};

/// Checks |got[i] - want[i]| <= tol[i] for every i; one doctest assertion per
/// call, naming the first failing index.
inline void check_within(const float* got, const float* want, const std::vector<double>& tol, std::size_t n) {
  std::size_t bad = 0, first = n;
  for (std::size_t i = 0; i < n; ++i) {
    const double d = std::fabs(static_cast<double>(got[i]) - static_cast<double>(want[i]));
    if (!(d <= tol[i]) && !(std::isnan(got[i]) && std::isnan(want[i])) && !(got[i] == want[i])) {
      if (first == n) first = i;
      ++bad;
    }
  }
  INFO("n = " << n << ", first bad index " << first << ": got " << (first < n ? got[first] : 0.0f) << ", want "
              << (first < n ? want[first] : 0.0f) << ", tol " << (first < n ? tol[first] : 0.0));
  CHECK(bad == 0);
}

}  // namespace kestrel::test
