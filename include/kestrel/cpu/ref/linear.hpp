// kestrel/cpu/ref/linear.hpp: scalar twins of dot, matvec and matmul.
// Plain loops, summation in index order.
#pragma once

#include <cstddef>

#include "kestrel/core/tensor.hpp"
#include "kestrel/cpu/ref/weights.hpp"
#include "kestrel/cpu/thread_pool.hpp"

namespace kestrel::cpu::ref {

inline float dot(const float* a, const float* b, std::size_t n) {
  float s = 0.0f;
  for (std::size_t i = 0; i < n; ++i) s += a[i] * b[i];
  return s;
}

/// y[r] = sum_c w(r, c) * x[c]. The pool is ignored: the twin is serial.
inline void matvec(const weight_view& w, const float* x, float* y, thread_pool* /*pool*/) {
  if (is_quantized(w.type)) return cpu::detail::quantized_linear(w, x, 1, y, nullptr, /*reference=*/true);
  for (std::size_t r = 0; r < w.rows; ++r) {
    float s = 0.0f;
    for (std::size_t c = 0; c < w.cols; ++c) s += weight_at(w, r, c) * x[c];
    y[r] = s;
  }
}

/// y(t, r) = sum_c x(t, c) * w(r, c). x: (n_tokens, cols), y: (n_tokens, rows)
inline void matmul(const weight_view& w, const float* x, std::size_t n_tokens, float* y, thread_pool* /*pool*/) {
  if (is_quantized(w.type)) return cpu::detail::quantized_linear(w, x, n_tokens, y, nullptr, /*reference=*/true);
  for (std::size_t t = 0; t < n_tokens; ++t)
    for (std::size_t r = 0; r < w.rows; ++r) {
      float s = 0.0f;
      for (std::size_t c = 0; c < w.cols; ++c) s += x[t * w.cols + c] * weight_at(w, r, c);
      y[t * w.rows + r] = s;
    }
}

}  // namespace kestrel::cpu::ref
