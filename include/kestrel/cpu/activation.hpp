// kestrel/cpu/activation.hpp: SwiGLU, GELU and the residual add.
#pragma once

#include <cstddef>

#include "kestrel/cpu/math.hpp"
#include "kestrel/cpu/xsimd_compat.hpp"

namespace kestrel::cpu {

/// silu(g) * u lane by lane, silu(g) = g / (1 + exp(-g)): swiglu's step,
/// and that of prefill's fused gate and up products (matmul_swiglu), so
/// both give the same bits.
inline simd::fbatch swiglu_batch(const simd::fbatch& g, const simd::fbatch& u) noexcept {
  return g / (simd::fbatch(1.0f) + cpu::exp(-g)) * u;
}

/// out = silu(gate) * up with silu(g) = g / (1 + exp(-g)). gate, up, out: (n);
/// out may alias gate (or up): each element is read before it is written.
inline void swiglu(float* out, const float* gate, const float* up, std::size_t n) noexcept {
  constexpr std::size_t W = simd::width;
  // The bound computed up front (not "i + W <= n"), as in softmax: GCC 12
  // then sees the tail loop is finite and does not warn that it may not be.
  const std::size_t n_vec = n - n % W;
  for (std::size_t i = 0; i < n_vec; i += W)
    swiglu_batch(simd::fbatch::load_unaligned(gate + i), simd::fbatch::load_unaligned(up + i)).store_unaligned(out + i);
  for (std::size_t i = n_vec; i < n; ++i) {
    // Same vector exp for the tail, so every element has the same bound.
    const float e = cpu::exp(simd::fbatch(-gate[i])).get(0);
    out[i] = gate[i] / (1.0f + e) * up[i];
  }
}

/// GELU, tanh approximation (GPT-2's), in the equivalent logistic form
///   0.5 x (1 + tanh(y)) = x / (1 + e^(-2y)),  y = sqrt(2/pi) (x + 0.044715 x^3),
/// which has no cancellation for negative x (1 + tanh(y) does). out may
/// alias x. Relative error vs the scalar twin: exp's bound plus a few
/// roundings (tests/cpu derives it).
inline void gelu(float* out, const float* x, std::size_t n) noexcept {
  constexpr std::size_t W = simd::width;
  const simd::fbatch one(1.0f), k2(-2.0f * 0.7978845608028654f), c(0.044715f);
  auto f = [&](const simd::fbatch& v) { return v / (one + cpu::exp(k2 * (v + c * v * v * v))); };
  std::size_t i = 0;
  for (; i + W <= n; i += W) f(simd::fbatch::load_unaligned(x + i)).store_unaligned(out + i);
  for (; i < n; ++i) out[i] = f(simd::fbatch(x[i])).get(0);
}

/// y += x (the residual connection). x, y: (n).
inline void add(float* y, const float* x, std::size_t n) noexcept {
  constexpr std::size_t W = simd::width;
  std::size_t i = 0;
  for (; i + W <= n; i += W)
    (simd::fbatch::load_unaligned(y + i) + simd::fbatch::load_unaligned(x + i)).store_unaligned(y + i);
  for (; i < n; ++i) y[i] += x[i];
}

}  // namespace kestrel::cpu
