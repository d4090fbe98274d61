// kestrel/cpu/activation.hpp: SwiGLU and the residual add.
#pragma once

#include <cstddef>

#include "kestrel/cpu/math.hpp"
#include "kestrel/cpu/xsimd_compat.hpp"

namespace kestrel::cpu {

/// out = silu(gate) * up with silu(g) = g / (1 + exp(-g)). gate, up, out: (n);
/// out may alias gate (or up): each element is read before it is written.
inline void swiglu(float* out, const float* gate, const float* up, std::size_t n) noexcept {
  constexpr std::size_t W = simd::width;
  const simd::fbatch one(1.0f);
  std::size_t i = 0;
  for (; i + W <= n; i += W) {
    const auto g = simd::fbatch::load_unaligned(gate + i);
    const auto u = simd::fbatch::load_unaligned(up + i);
    (g / (one + cpu::exp(-g)) * u).store_unaligned(out + i);
  }
  for (; i < n; ++i) {
    // Same vector exp for the tail, so every element has the same bound.
    const float e = cpu::exp(simd::fbatch(-gate[i])).get(0);
    out[i] = gate[i] / (1.0f + e) * up[i];
  }
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
