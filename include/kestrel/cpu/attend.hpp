// kestrel/cpu/attend.hpp: attention of one query head over cached K/V
// positions (decode; prefill per token with causal n_kv = pos + 1), and of
// several consecutive heads at once (attend_heads, decode without grouped
// query attention).
#pragma once

#include <algorithm>
#include <cstddef>

#include "kestrel/cpu/convert.hpp"
#include "kestrel/cpu/dot.hpp"
#include "kestrel/cpu/softmax.hpp"
#include "kestrel/cpu/xsimd_compat.hpp"

namespace kestrel::cpu {

/// scores[t] = scale * dot(q, k_t); p = softmax(scores);
/// out = sum_t p[t] * v_t.
/// q: (head_dim); k, v: (n_kv, kv_stride), first head_dim of each row used
/// (kv_stride lets the caller point into an interleaved cache of all kv
/// heads); out: (head_dim); scratch: (n_kv), receives p.
/// n_kv == 0 gives out = 0.
inline void attend(const float* q, const float* k, const float* v, std::size_t n_kv, std::size_t head_dim,
                   std::size_t kv_stride, float scale, float* out, float* scratch) noexcept {
  for (std::size_t t = 0; t < n_kv; ++t) scratch[t] = scale * dot(q, k + t * kv_stride, head_dim);
  softmax(scratch, n_kv);

  // out accumulates one v row at a time, a register-width strip of out per
  // pass, so out stays in registers while the v rows stream through.
  constexpr std::size_t W = simd::width;
  std::size_t j = 0;
  for (; j + 2 * W <= head_dim; j += 2 * W) {
    simd::fbatch a0(0.0f), a1(0.0f);
    for (std::size_t t = 0; t < n_kv; ++t) {
      const simd::fbatch p(scratch[t]);
      const float* vt = v + t * kv_stride + j;
      a0 = xsimd::fma(p, simd::fbatch::load_unaligned(vt), a0);
      a1 = xsimd::fma(p, simd::fbatch::load_unaligned(vt + W), a1);
    }
    a0.store_unaligned(out + j);
    a1.store_unaligned(out + j + W);
  }
  for (; j + W <= head_dim; j += W) {
    simd::fbatch a(0.0f);
    for (std::size_t t = 0; t < n_kv; ++t)
      a = xsimd::fma(simd::fbatch(scratch[t]), simd::fbatch::load_unaligned(v + t * kv_stride + j), a);
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

/// attend() of n_heads consecutive query heads, each over its own KV head
/// (multi-head attention, no grouping), for one query: head h's query at q
/// + h head_dim, its keys and values at k, v + h head_dim (rows kv_stride
/// apart, as the cache stores every head of a position together), its
/// output at out + h head_dim, its weights p at scratch + h scratch_stride
/// (scratch_stride >= n_kv). Each head's output and p equal attend()'s bit
/// for bit: every score is the same dot, every softmax the same call, and
/// every output element the same chain of fmas over t in order.
///
/// Why: attend() per head reads a head's head_dim floats of each cached
/// row, rows kv_stride floats apart; the rows of n_heads heads lie side by
/// side, so here each position's keys (and then values) of all the heads
/// are read as one contiguous run. Measured (/tmp prototype, the 110M
/// shape: 12 layers x 12 heads of 64, 128 cached positions, the cache
/// evicted before each pass as decode's weight stream does, one thread):
/// 0.81-0.96 ms against 1.10-1.31 ms for attend() per head, the same bits.
/// head_dim not a multiple of the SIMD width takes attend() per head.
inline void attend_heads(const float* q, const float* k, const float* v, std::size_t n_kv, std::size_t head_dim,
                         std::size_t kv_stride, std::size_t n_heads, float scale, float* out, float* scratch,
                         std::size_t scratch_stride) noexcept {
  constexpr std::size_t W = simd::width;
  if (head_dim % W != 0) {
    for (std::size_t h = 0; h < n_heads; ++h)
      attend(q + h * head_dim, k + h * head_dim, v + h * head_dim, n_kv, head_dim, kv_stride, scale,
             out + h * head_dim, scratch + h * scratch_stride);
    return;
  }
  for (std::size_t t = 0; t < n_kv; ++t)
    for (std::size_t h = 0; h < n_heads; ++h)
      scratch[h * scratch_stride + t] = scale * dot(q + h * head_dim, k + t * kv_stride + h * head_dim, head_dim);
  for (std::size_t h = 0; h < n_heads; ++h) softmax(scratch + h * scratch_stride, n_kv);
  // The outputs of all the heads, n_heads * head_dim floats, as vectors m,
  // C at a time in registers while the value rows stream through (a run of
  // C W floats of each row).
  constexpr std::size_t C = 16;
  const std::size_t per_head = head_dim / W, total = n_heads * per_head;
  for (std::size_t m0 = 0; m0 < total; m0 += C) {
    const std::size_t nm = std::min(C, total - m0);
    simd::fbatch acc[C];
    const float* p[C];  // vector m's head's weights
    for (std::size_t i = 0; i < nm; ++i) {
      acc[i] = simd::fbatch(0.0f);
      p[i] = scratch + (m0 + i) / per_head * scratch_stride;
    }
    const float* vm = v + m0 * W;  // vector m sits at m W in a row: heads side by side, head_dim apart
    for (std::size_t t = 0; t < n_kv; ++t)
      for (std::size_t i = 0; i < nm; ++i)
        acc[i] = xsimd::fma(simd::fbatch(p[i][t]), simd::fbatch::load_unaligned(vm + t * kv_stride + i * W), acc[i]);
    for (std::size_t i = 0; i < nm; ++i) acc[i].store_unaligned(out + (m0 + i) * W);
  }
}

}  // namespace kestrel::cpu
