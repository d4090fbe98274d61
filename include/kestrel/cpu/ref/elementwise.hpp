// kestrel/cpu/ref/elementwise.hpp: scalar twins of rmsnorm, softmax, rope,
// swiglu and add, written as the formulas read. exp is std::exp.
#pragma once

#include <cmath>
#include <cstddef>

#include "kestrel/cpu/rope.hpp"

namespace kestrel::cpu::ref {

inline void rmsnorm(float* out, const float* x, const float* weight, std::size_t n, float eps) {
  if (n == 0) return;
  float ss = 0.0f;
  for (std::size_t i = 0; i < n; ++i) ss += x[i] * x[i];
  const float scale = 1.0f / std::sqrt(ss / static_cast<float>(n) + eps);
  for (std::size_t i = 0; i < n; ++i) out[i] = x[i] * scale * weight[i];
}

inline void softmax(float* x, std::size_t n) {
  if (n == 0) return;
  float m = x[0];
  for (std::size_t i = 1; i < n; ++i) m = x[i] > m ? x[i] : m;
  float sum = 0.0f;
  for (std::size_t i = 0; i < n; ++i) {
    x[i] = std::exp(x[i] - m);
    sum += x[i];
  }
  for (std::size_t i = 0; i < n; ++i) x[i] /= sum;
}

/// Same angles as the fast kernel (cpu::rope_cos_sin, float, llama2.c's
/// formula), recomputed per head and pair.
inline void rope(float* x, std::size_t n_heads, std::size_t head_dim, std::size_t n_rot, std::size_t pos,
                 float theta) {
  for (std::size_t h = 0; h < n_heads; ++h)
    for (std::size_t i = 0; i < n_rot / 2; ++i) {
      float c, s;
      rope_cos_sin(pos, i, n_rot, theta, c, s);
      float* v = x + h * head_dim + 2 * i;
      const float a = v[0], b = v[1];
      v[0] = a * c - b * s;
      v[1] = a * s + b * c;
    }
}

inline void swiglu(float* out, const float* gate, const float* up, std::size_t n) {
  for (std::size_t i = 0; i < n; ++i) {
    const float g = gate[i];
    out[i] = g / (1.0f + std::exp(-g)) * up[i];
  }
}

inline void add(float* y, const float* x, std::size_t n) {
  for (std::size_t i = 0; i < n; ++i) y[i] += x[i];
}

}  // namespace kestrel::cpu::ref
