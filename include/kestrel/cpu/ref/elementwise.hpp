// kestrel/cpu/ref/elementwise.hpp: scalar twins of rmsnorm, layernorm,
// softmax, rope, swiglu, gelu and add, written as the formulas read. exp is std::exp.
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

/// Same angles as the fast kernel (cpu::rope_cos_sin), recomputed per head
/// and pair; the pairing from cpu::rope_pair.
inline void rope(float* x, std::size_t n_heads, std::size_t head_dim, std::size_t pos, const rope_spec& r) {
  for (std::size_t h = 0; h < n_heads; ++h)
    for (std::size_t i = 0; i < r.n_rot / 2; ++i) {
      float c, s;
      rope_cos_sin(pos, i, r, c, s);
      std::size_t ia, ib;
      rope_pair(r, i, ia, ib);
      float* v = x + h * head_dim;
      const float a = v[ia], b = v[ib];
      v[ia] = a * c - b * s;
      v[ib] = a * s + b * c;
    }
}

inline void rope(float* x, std::size_t n_heads, std::size_t head_dim, std::size_t n_rot, std::size_t pos,
                 float theta) {
  ref::rope(x, n_heads, head_dim, pos, rope_spec{n_rot, theta});
}

/// LayerNorm: out = (x - mean) / sqrt(var + eps) * weight + bias, with the
/// mean and the (biased) variance in double.
inline void layernorm(float* out, const float* x, const float* weight, const float* bias, std::size_t n, float eps) {
  if (n == 0) return;
  double mean = 0.0;
  for (std::size_t i = 0; i < n; ++i) mean += x[i];
  mean /= static_cast<double>(n);
  double var = 0.0;
  for (std::size_t i = 0; i < n; ++i) var += (x[i] - mean) * (x[i] - mean);
  var /= static_cast<double>(n);
  const float m = static_cast<float>(mean);
  const float scale = static_cast<float>(1.0 / std::sqrt(var + eps));
  for (std::size_t i = 0; i < n; ++i) out[i] = (x[i] - m) * scale * weight[i] + (bias ? bias[i] : 0.0f);
}

/// GELU, tanh approximation (GPT-2's "gelu_new"):
/// 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))).
inline void gelu(float* out, const float* x, std::size_t n) {
  constexpr float k = 0.7978845608028654f;  // sqrt(2 / pi)
  for (std::size_t i = 0; i < n; ++i) {
    const float v = x[i];
    out[i] = 0.5f * v * (1.0f + std::tanh(k * (v + 0.044715f * v * v * v)));
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
