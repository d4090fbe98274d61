// kestrel/cpu/attend.hpp: attention of one query head over cached K/V
// positions (decode; prefill per token with causal n_kv = pos + 1).
#pragma once

#include <algorithm>
#include <cstddef>

#include "kestrel/cpu/convert.hpp"
#include "kestrel/cpu/dot.hpp"
#include "kestrel/cpu/prefetch.hpp"
#include "kestrel/cpu/softmax.hpp"
#include "kestrel/cpu/xsimd_compat.hpp"

namespace kestrel::cpu {

/// scores[t] = scale * dot(q, k_t); p = softmax(scores);
/// out = sum_t p[t] * v_t.
/// q: (head_dim); k, v: (n_kv, kv_stride), first head_dim of each row used
/// (kv_stride = head_dim for a cache that keeps each KV head's positions in
/// one run, kv/contiguous.hpp), of f32 or f16 (an f16 cache: each element
/// converted exactly as it is loaded); out: (head_dim); scratch: (n_kv),
/// receives p. n_kv == 0 gives out = 0.
template <class T>
inline void attend(const float* q, const T* k, const T* v, std::size_t n_kv, std::size_t head_dim,
                   std::size_t kv_stride, float scale, float* out, float* scratch) noexcept {
  // The keys 8 rows ahead, and each value row as its key is scored: read
  // once per token, after the weights streamed between two layers have
  // evicted them, they come from memory, and without a hint each value
  // row, read after the scores, waited for it. Measured (one thread, Zen 3, f16
  // cache, head_dim 64, 12 layers x 12 heads, caches evicted before each
  // token, medians of 200): 64 keys 298 -> 242 us, 128 keys 483 -> 405 us;
  // in cache 83 -> 84 us. The values' hint is most of it.
  constexpr std::size_t ahead = 8;
  for (std::size_t t = 0; t < n_kv; ++t) {
    if (t + ahead < n_kv) detail::prefetch_elements(k + (t + ahead) * kv_stride, head_dim);
    detail::prefetch_elements(v + t * kv_stride, head_dim);
    scratch[t] = scale * detail::dot_any(k + t * kv_stride, q, head_dim);
  }
  softmax(scratch, n_kv);

  // out accumulates one v row at a time, a register-width strip of out per
  // pass, so out stays in registers while the v rows stream through.
  constexpr std::size_t W = simd::width;
  std::size_t j = 0;
  for (; j + 2 * W <= head_dim; j += 2 * W) {
    simd::fbatch a0(0.0f), a1(0.0f);
    for (std::size_t t = 0; t < n_kv; ++t) {
      const simd::fbatch p(scratch[t]);
      const T* vt = v + t * kv_stride + j;
      a0 = xsimd::fma(p, load_f32(vt), a0);
      a1 = xsimd::fma(p, load_f32(vt + W), a1);
    }
    a0.store_unaligned(out + j);
    a1.store_unaligned(out + j + W);
  }
  for (; j + W <= head_dim; j += W) {
    simd::fbatch a(0.0f);
    for (std::size_t t = 0; t < n_kv; ++t)
      a = xsimd::fma(simd::fbatch(scratch[t]), load_f32(v + t * kv_stride + j), a);
    a.store_unaligned(out + j);
  }
  if (j < head_dim) {  // the last partial strip (all of it when head_dim < W, e.g. 8)
    const std::size_t m = head_dim - j;
    simd::fbatch a(0.0f);
    for (std::size_t t = 0; t < n_kv; ++t)
      a = xsimd::fma(simd::fbatch(scratch[t]), load_f32_partial(v + t * kv_stride + j, m), a);
    alignas(64) float tmp[W];
    a.store_aligned(tmp);
    for (std::size_t i = 0; i < m; ++i) out[j + i] = tmp[i];
  }
}

}  // namespace kestrel::cpu
