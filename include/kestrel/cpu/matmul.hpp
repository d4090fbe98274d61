// kestrel/cpu/matmul.hpp: Y = X W^T, the prefill product of a weight matrix
// with all prompt tokens at once.
//
// Prefill is compute-bound, so this is a real GEMM: Eigen's blocked kernel
// (which packs W into cache-sized panels and reuses each panel for every
// token) reaches about 68% of this machine's FMA peak in f32. Threads come
// from our pool, not OpenMP: the output features (rows of W) are split into
// contiguous column blocks of Y and each thread runs single-threaded Eigen on
// its block. (If the includer compiles with -fopenmp, define
// EIGEN_DONT_PARALLELIZE before including kestrel, or Eigen will start its
// own threads inside ours.)
//
// Eigen's f16/bf16 GEMM is slow, so f16/bf16 weights are converted to f32 a
// tile of rows at a time (a tile is ~256 KiB, so it stays in L2 while Eigen
// packs it) into a per-thread scratch buffer that only ever grows.
//
// A single token is a matrix-vector product, bound by bandwidth rather than
// compute; matmul hands it to matvec.
#pragma once

#include <algorithm>
#include <cstddef>
#include <vector>

#include <Eigen/Core>

#include "kestrel/core/tensor.hpp"
#include "kestrel/cpu/convert.hpp"
#include "kestrel/cpu/matvec.hpp"
#include "kestrel/cpu/thread_pool.hpp"

namespace kestrel::cpu {

namespace detail {

using row_major_matrix = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
using const_matrix_map = Eigen::Map<const row_major_matrix, Eigen::Unaligned, Eigen::OuterStride<>>;
using matrix_map = Eigen::Map<row_major_matrix, Eigen::Unaligned, Eigen::OuterStride<>>;

/// Y[:, r0:r1) = X * W[r0:r1, :]^T for f32 W, as one Eigen GEMM.
/// w_block: rows [r0, r1) of W, (r1 - r0, cols); x: (n_tokens, cols); y: (n_tokens, rows)
inline void matmul_block(const float* w_block, std::size_t rows, std::size_t cols, const float* x,
                         std::size_t n_tokens, float* y, std::size_t r0, std::size_t r1) {
  const auto n = static_cast<Eigen::Index>(n_tokens), k = static_cast<Eigen::Index>(cols);
  const auto m = static_cast<Eigen::Index>(r1 - r0);
  const_matrix_map xm(x, n, k, Eigen::OuterStride<>(k));
  const_matrix_map wm(w_block, m, k, Eigen::OuterStride<>(k));
  matrix_map ym(y + r0, n, m, Eigen::OuterStride<>(static_cast<Eigen::Index>(rows)));
  ym.noalias() = xm * wm.transpose();
}

/// Per-thread f32 scratch for converted weight tiles; grows, never shrinks,
/// so steady-state prefill allocates nothing.
inline float* tile_scratch(std::size_t n) {
  thread_local std::vector<float> buf;
  if (buf.size() < n) buf.resize(n);
  return buf.data();
}

/// Same as matmul_block for f16/bf16 W, converting tiles of rows to f32.
template <class T>
inline void matmul_block_converted(const T* w, std::size_t rows, std::size_t cols, const float* x, std::size_t n_tokens,
                                   float* y, std::size_t r0, std::size_t r1) {
  // ~64K floats (256 KiB) per tile, at least 16 rows so Eigen's panels stay wide.
  const std::size_t tile_rows = std::max<std::size_t>(16, (std::size_t{1} << 16) / std::max<std::size_t>(cols, 1));
  float* tile = tile_scratch(std::min(tile_rows, r1 - r0) * cols);  // (tile_rows, cols)
  for (std::size_t t0 = r0; t0 < r1; t0 += tile_rows) {
    const std::size_t t1 = std::min(r1, t0 + tile_rows);
    convert_to_f32(w + t0 * cols, tile, (t1 - t0) * cols);
    matmul_block(tile, rows, cols, x, n_tokens, y, t0, t1);
  }
}

}  // namespace detail

/// Y = X W^T. w: (rows, cols) of f32, f16 or bf16; x: (n_tokens, cols);
/// y: (n_tokens, rows); all row-major. pool may be null. y must not alias x.
inline void matmul(const weight_view& w, const float* x, std::size_t n_tokens, float* y, thread_pool* pool) {
  if (n_tokens == 0 || w.rows == 0) return;
  if (n_tokens == 1) return matvec(w, x, y, pool);
  const std::size_t rows = w.rows, cols = w.cols;
  if (cols == 0) {
    std::fill(y, y + n_tokens * rows, 0.0f);
    return;
  }
  // Blocks of 16 output features: a multiple of every SIMD width, so each
  // thread's slice of Y starts on a lane boundary of the packed panels.
  constexpr std::size_t block = 16;
  const std::size_t blocks = (rows + block - 1) / block;
  visit_weight(w, [&](const auto* data) {
    using T = std::remove_cv_t<std::remove_pointer_t<decltype(data)>>;
    parallel_for(pool, blocks, [&](std::size_t b0, std::size_t b1) {
      const std::size_t r0 = b0 * block, r1 = std::min(rows, b1 * block);
      if constexpr (std::is_same_v<T, float>)
        detail::matmul_block(data + r0 * cols, rows, cols, x, n_tokens, y, r0, r1);
      else
        detail::matmul_block_converted(data, rows, cols, x, n_tokens, y, r0, r1);
    });
  });
}

}  // namespace kestrel::cpu
