// kestrel/cpu/dot.hpp: dot products of f32 activations with f32 / f16 / bf16
// data, the inner loop of matvec and of attention scores.
#pragma once

#include <cstddef>

#include "kestrel/cpu/convert.hpp"
#include "kestrel/cpu/xsimd_compat.hpp"

namespace kestrel::cpu {

namespace detail {

/// sum_i w[i] * x[i], w of any weight type. Two accumulators hide the FMA
/// latency; the order of summation differs from the scalar twin, which the
/// tests bound by gamma_n * sum |w_i x_i|.
template <class T>
inline float dot_any(const T* w, const float* x, std::size_t n) noexcept {
  constexpr std::size_t W = simd::width;
  simd::fbatch acc0(0.0f), acc1(0.0f);
  std::size_t i = 0;
  for (; i + 2 * W <= n; i += 2 * W) {
    acc0 = xsimd::fma(load_f32(w + i), simd::fbatch::load_unaligned(x + i), acc0);
    acc1 = xsimd::fma(load_f32(w + i + W), simd::fbatch::load_unaligned(x + i + W), acc1);
  }
  if (i + W <= n) {
    acc0 = xsimd::fma(load_f32(w + i), simd::fbatch::load_unaligned(x + i), acc0);
    i += W;
  }
  if (i < n) acc1 = xsimd::fma(load_f32_partial(w + i, n - i), load_f32_partial(x + i, n - i), acc1);
  return simd::reduce_add(acc0 + acc1);
}

}  // namespace detail

/// sum_i a[i] * b[i].
inline float dot(const float* a, const float* b, std::size_t n) noexcept { return detail::dot_any(a, b, n); }

}  // namespace kestrel::cpu
