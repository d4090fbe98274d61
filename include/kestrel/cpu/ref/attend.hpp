// kestrel/cpu/ref/attend.hpp: scalar twins of attend and attend_block.
#pragma once

#include <cstddef>
#include <vector>

#include "kestrel/cpu/attend_block.hpp"
#include "kestrel/cpu/ref/elementwise.hpp"
#include "kestrel/cpu/ref/linear.hpp"

namespace kestrel::cpu::ref {

/// k, v: f32 or f16 (each element converted exactly).
template <class T>
inline void attend(const float* q, const T* k, const T* v, std::size_t n_kv, std::size_t head_dim,
                   std::size_t kv_stride, float scale, float* out, float* scratch) {
  for (std::size_t t = 0; t < n_kv; ++t) {
    float s = 0.0f;
    for (std::size_t d = 0; d < head_dim; ++d) s += q[d] * to_float(k[t * kv_stride + d]);
    scratch[t] = scale * s;
  }
  softmax(scratch, n_kv);
  for (std::size_t j = 0; j < head_dim; ++j) {
    float a = 0.0f;
    for (std::size_t t = 0; t < n_kv; ++t) a += scratch[t] * to_float(v[t * kv_stride + j]);
    out[j] = a;
  }
}

/// attend() of each (query, head) row on its own, over exactly its keys:
/// the definition attend_block's rows are tested against.
template <class T>
inline void attend_block(const basic_attend_block_args<T>& a) {
  std::vector<float> scratch(a.pos0 + a.nq);
  for (std::size_t i = 0; i < a.nq; ++i) {
    const std::size_t pos = a.pos0 + i;
    const std::size_t first = attend_first(pos, a.window);
    for (std::size_t g = 0; g < a.group; ++g)
      attend(a.q + i * a.q_stride + g * a.head_dim, a.k + first * a.kv_stride, a.v + first * a.kv_stride, pos + 1 - first,
             a.head_dim, a.kv_stride, a.scale, a.out + i * a.out_stride + g * a.head_dim, scratch.data());
  }
}

}  // namespace kestrel::cpu::ref
