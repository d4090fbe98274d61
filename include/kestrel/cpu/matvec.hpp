// kestrel/cpu/matvec.hpp: y = W x, the decode-time product of a weight
// matrix with one activation vector.
//
// Decode is bound by memory bandwidth (every weight is read once per token),
// so the kernel streams each weight row exactly once, converts f16 / bf16 to
// f32 in registers (no temporary row), and processes four rows per pass so
// each load of x serves four rows. Rows are split across the thread pool.
#pragma once

#include <cstddef>

#include "kestrel/core/error.hpp"
#include "kestrel/core/tensor.hpp"
#include "kestrel/cpu/convert.hpp"
#include "kestrel/cpu/dot.hpp"
#include "kestrel/cpu/quantized.hpp"
#include "kestrel/cpu/thread_pool.hpp"
#include "kestrel/cpu/xsimd_compat.hpp"

namespace kestrel::cpu {

namespace detail {

/// y[r] = dot(w row r, x) for r in [r0, r1). w: (rows, cols), x: (cols), y: (rows)
template <class T>
inline void matvec_rows(const T* w, std::size_t cols, const float* x, float* y, std::size_t r0, std::size_t r1) noexcept {
  constexpr std::size_t W = simd::width;
  std::size_t r = r0;
  for (; r + 4 <= r1; r += 4) {
    const T* w0 = w + r * cols;
    const T* w1 = w0 + cols;
    const T* w2 = w1 + cols;
    const T* w3 = w2 + cols;
    simd::fbatch a0(0.0f), a1(0.0f), a2(0.0f), a3(0.0f);
    std::size_t i = 0;
    for (; i + W <= cols; i += W) {
      const simd::fbatch xb = simd::fbatch::load_unaligned(x + i);
      a0 = xsimd::fma(load_f32(w0 + i), xb, a0);
      a1 = xsimd::fma(load_f32(w1 + i), xb, a1);
      a2 = xsimd::fma(load_f32(w2 + i), xb, a2);
      a3 = xsimd::fma(load_f32(w3 + i), xb, a3);
    }
    if (i < cols) {
      const std::size_t m = cols - i;
      const simd::fbatch xb = load_f32_partial(x + i, m);
      a0 = xsimd::fma(load_f32_partial(w0 + i, m), xb, a0);
      a1 = xsimd::fma(load_f32_partial(w1 + i, m), xb, a1);
      a2 = xsimd::fma(load_f32_partial(w2 + i, m), xb, a2);
      a3 = xsimd::fma(load_f32_partial(w3 + i, m), xb, a3);
    }
    y[r + 0] = simd::reduce_add(a0);
    y[r + 1] = simd::reduce_add(a1);
    y[r + 2] = simd::reduce_add(a2);
    y[r + 3] = simd::reduce_add(a3);
  }
  for (; r < r1; ++r) y[r] = dot_any(w + r * cols, x, cols);
}

/// Rows per parallel task: a multiple of 4 (the kernel's row block) so that
/// no thread ends with a ragged block except the last.
inline constexpr std::size_t matvec_row_block = 4;

}  // namespace detail

/// y = W x. w: (rows, cols) of f32, f16 or bf16; x: (cols); y: (rows).
/// pool may be null (single thread). y must not alias x. The result does not
/// depend on the pool's size: threads split rows, never a row's sum.
inline void matvec(const weight_view& w, const float* x, float* y, thread_pool* pool) {
  if (is_quantized(w.type)) return detail::quantized_linear(w, x, 1, y, pool, /*reference=*/false);
  visit_weight(w, [&](const auto* data) {
    const std::size_t rows = w.rows, cols = w.cols;
    const std::size_t blocks = (rows + detail::matvec_row_block - 1) / detail::matvec_row_block;
    parallel_for(pool, blocks, [&](std::size_t b0, std::size_t b1) {
      const std::size_t r0 = b0 * detail::matvec_row_block;
      const std::size_t r1 = std::min(rows, b1 * detail::matvec_row_block);
      detail::matvec_rows(data, cols, x, y, r0, r1);
    }, rows * cols);
  });
}

}  // namespace kestrel::cpu
