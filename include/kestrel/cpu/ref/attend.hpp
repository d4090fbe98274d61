// kestrel/cpu/ref/attend.hpp: scalar twin of attend.
#pragma once

#include <cstddef>

#include "kestrel/cpu/ref/elementwise.hpp"
#include "kestrel/cpu/ref/linear.hpp"

namespace kestrel::cpu::ref {

inline void attend(const float* q, const float* k, const float* v, std::size_t n_kv, std::size_t head_dim,
                   std::size_t kv_stride, float scale, float* out, float* scratch) {
  for (std::size_t t = 0; t < n_kv; ++t) scratch[t] = scale * dot(q, k + t * kv_stride, head_dim);
  softmax(scratch, n_kv);
  for (std::size_t j = 0; j < head_dim; ++j) {
    float a = 0.0f;
    for (std::size_t t = 0; t < n_kv; ++t) a += scratch[t] * v[t * kv_stride + j];
    out[j] = a;
  }
}

}  // namespace kestrel::cpu::ref
