// kestrel/cpu/matvec.hpp: y = W x, the decode-time product of a weight
// matrix with one activation vector.
//
// Decode is bound by memory bandwidth (every weight is read once per token),
// so the kernel streams each weight row exactly once, converts f16 / bf16 to
// f32 in registers (no temporary row), and processes four rows per pass so
// each load of x serves four rows. Rows are split across the thread pool.
#pragma once

#include <algorithm>
#include <cstddef>
#include <span>

#include "kestrel/core/error.hpp"
#include "kestrel/core/tensor.hpp"
#include "kestrel/cpu/convert.hpp"
#include "kestrel/cpu/dot.hpp"
#include "kestrel/cpu/quantized.hpp"
#include "kestrel/cpu/thread_pool.hpp"
#include "kestrel/cpu/activation.hpp"
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
      if constexpr (sizeof(T) == 2) {
        // Prefetch the next 4-row block (every other line; the adjacent-line
        // prefetcher takes the pair) as this one streams: 2-byte rows are
        // short streams (1.5 KB at n_embd 768) that the hardware prefetcher
        // barely ramps up on. Measured single-thread on Zen 4 (thread CPU
        // time, 2048 x 768 f16, 300 MB of matrices): 7.5 -> 8.3 GB/s median;
        // for f32 it cost 3-5%, so only 2-byte types do it.
        __builtin_prefetch(reinterpret_cast<const char*>(w3 + cols) + 4 * i * sizeof(T), 0, 3);  // never faults
      }
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

/// One product of a fused matvec: y = (*w) x. y: (w->rows)
struct matvec_job {
  const weight_view* w;
  float* y;
};

namespace detail {

/// y[r0, r1) = rows [r0, r1) of W times x, on the calling thread. Float
/// rows go through matvec_rows; block-quantized ones through a view of just
/// those rows (the activations are quantized per call: a few hundred
/// nanoseconds per thread, less than a synchronization).
inline void matvec_row_range(const weight_view& w, const float* x, float* y, std::size_t r0, std::size_t r1) {
  if (r0 >= r1) return;
  if (is_quantized(w.type)) {
    weight_view sub = w;
    sub.data = w.row(r0);
    sub.rows = r1 - r0;
    return quantized_linear(sub, x, 1, y + r0, nullptr, /*reference=*/false);
  }
  visit_weight(w, [&](const auto* data) { matvec_rows(data, w.cols, x, y, r0, r1); });
}

inline std::size_t matvec_blocks(const weight_view& w) noexcept {
  return (w.rows + matvec_row_block - 1) / matvec_row_block;
}

/// Runs the row blocks [b0, b1) of the jobs' concatenated blocks (each job
/// contributes ceil(rows / 4) blocks, so a block never straddles two
/// matrices and every row lands in the same 4-row group as in matvec()).
inline void matvec_jobs_blocks(std::span<const matvec_job> jobs, const float* x, std::size_t b0, std::size_t b1) {
  std::size_t base = 0;
  for (const matvec_job& j : jobs) {
    const std::size_t nb = matvec_blocks(*j.w);
    const std::size_t lo = std::max(b0, base), hi = std::min(b1, base + nb);
    if (lo < hi)
      matvec_row_range(*j.w, x, j.y, (lo - base) * matvec_row_block,
                       std::min(j.w->rows, (hi - base) * matvec_row_block));
    base += nb;
  }
}

}  // namespace detail

/// y_j = W_j x for every job, in ONE parallel region: decode's q, k and v
/// (or any products of the same input) pay one wake-up and one join instead
/// of three. Rows of all matrices are split together, so threads stay
/// balanced when the matrices differ in size (GQA's small k and v). Each
/// y_j equals matvec(*w_j, x) bit for bit, whatever the pool size. No y may
/// alias x.
inline void matvec_fused(std::span<const matvec_job> jobs, const float* x, thread_pool* pool) {
  std::size_t blocks = 0, work = 0;
  for (const matvec_job& j : jobs) {
    blocks += detail::matvec_blocks(*j.w);
    work += j.w->rows * j.w->cols;
  }
  parallel_for(pool, blocks, [&](std::size_t b0, std::size_t b1) { detail::matvec_jobs_blocks(jobs, x, b0, b1); },
               work);
}

/// h = silu(gate x) * (up x), the SwiGLU feed-forward's first half, in one
/// parallel region: each thread computes the same rows of gate and up and
/// applies swiglu to them, so the activation needs no second pass over
/// threads. h, up_scratch: (gate.rows); gate and up have the same shape.
/// Equals swiglu(matvec(gate), matvec(up)) bit for bit.
inline void matvec_swiglu(const weight_view& gate, const weight_view& up, const float* x, float* h, float* up_scratch,
                          thread_pool* pool) {
  require(gate.rows == up.rows && gate.cols == up.cols, "matvec_swiglu: gate and up differ in shape");
  const std::size_t rows = gate.rows;
  parallel_for(pool, detail::matvec_blocks(gate), [&](std::size_t b0, std::size_t b1) {
    const std::size_t r0 = b0 * detail::matvec_row_block, r1 = std::min(rows, b1 * detail::matvec_row_block);
    detail::matvec_row_range(gate, x, h, r0, r1);
    detail::matvec_row_range(up, x, up_scratch, r0, r1);
    swiglu(h + r0, h + r0, up_scratch + r0, r1 - r0);
  }, 2 * rows * gate.cols);
}

}  // namespace kestrel::cpu
