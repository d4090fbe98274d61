// kestrel/cpu/norm.hpp: RMS normalisation (llama's RMSNorm) and LayerNorm
// (GPT-2's).
#pragma once

#include <cmath>
#include <cstddef>

#include "kestrel/cpu/convert.hpp"
#include "kestrel/cpu/xsimd_compat.hpp"

namespace kestrel::cpu {

/// out = x / sqrt(mean(x^2) + eps) * weight. x, weight, out: (n); out may
/// alias x. The scale is computed once in float, then out = (x * scale) * w,
/// the same order as the scalar twin.
inline void rmsnorm(float* out, const float* x, const float* weight, std::size_t n, float eps) noexcept {
  if (n == 0) return;
  constexpr std::size_t W = simd::width;
  simd::fbatch acc0(0.0f), acc1(0.0f);
  std::size_t i = 0;
  for (; i + 2 * W <= n; i += 2 * W) {
    const auto a = simd::fbatch::load_unaligned(x + i), b = simd::fbatch::load_unaligned(x + i + W);
    acc0 = xsimd::fma(a, a, acc0);
    acc1 = xsimd::fma(b, b, acc1);
  }
  if (i + W <= n) {
    const auto a = simd::fbatch::load_unaligned(x + i);
    acc0 = xsimd::fma(a, a, acc0);
    i += W;
  }
  if (i < n) {
    const auto a = load_f32_partial(x + i, n - i);
    acc1 = xsimd::fma(a, a, acc1);
  }
  const float ss = simd::reduce_add(acc0 + acc1);
  const float scale = 1.0f / std::sqrt(ss / static_cast<float>(n) + eps);
  const simd::fbatch sb(scale);
  i = 0;
  for (; i + W <= n; i += W) {
    const auto v = simd::fbatch::load_unaligned(x + i) * sb * simd::fbatch::load_unaligned(weight + i);
    v.store_unaligned(out + i);
  }
  for (; i < n; ++i) out[i] = x[i] * scale * weight[i];
}

/// LayerNorm: out = (x - mean) / sqrt(var + eps) * weight + bias (bias may be
/// null). Two passes in float lanes (the scalar twin sums in double): the
/// mean, then the variance about it, so a large mean does not cancel.
inline void layernorm(float* out, const float* x, const float* weight, const float* bias, std::size_t n,
                      float eps) noexcept {
  if (n == 0) return;
  constexpr std::size_t W = simd::width;
  simd::fbatch acc(0.0f);
  std::size_t i = 0;
  for (; i + W <= n; i += W) acc += simd::fbatch::load_unaligned(x + i);
  float sum = simd::reduce_add(acc);
  for (; i < n; ++i) sum += x[i];
  const float mean = sum / static_cast<float>(n);
  const simd::fbatch mb(mean);
  acc = simd::fbatch(0.0f);
  i = 0;
  for (; i + W <= n; i += W) {
    const auto d = simd::fbatch::load_unaligned(x + i) - mb;
    acc = xsimd::fma(d, d, acc);
  }
  float ss = simd::reduce_add(acc);
  for (; i < n; ++i) ss += (x[i] - mean) * (x[i] - mean);
  const float scale = 1.0f / std::sqrt(ss / static_cast<float>(n) + eps);
  const simd::fbatch sb(scale);
  i = 0;
  for (; i + W <= n; i += W) {
    auto v = (simd::fbatch::load_unaligned(x + i) - mb) * sb * simd::fbatch::load_unaligned(weight + i);
    if (bias) v += simd::fbatch::load_unaligned(bias + i);
    v.store_unaligned(out + i);
  }
  for (; i < n; ++i) out[i] = (x[i] - mean) * scale * weight[i] + (bias ? bias[i] : 0.0f);
}

}  // namespace kestrel::cpu
