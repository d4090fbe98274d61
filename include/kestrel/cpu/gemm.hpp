// kestrel/cpu/gemm.hpp: the float prefill GEMM, Y = X W^T with W of f32,
// f16 or bf16, for more tokens than the skinny kernel takes.
//
// W is packed, per thread, a panel of 2 SIMD widths of rows at a time (32
// rows on AVX-512) into k-major order, converted to f32: panel[k][j] =
// W[r + j][k]. The micro-kernel then holds a tile of MR tokens x 32 rows of
// Y in registers (MR = 8 on AVX-512: 16 accumulators + 2 weight vectors)
// and, per k, loads two weight vectors and broadcasts MR values of X, so
// each loaded weight serves MR tokens and each X value 32 rows: 16 FMAs per
// 10 loads, most of them embedded broadcasts. The panel
// (32 x cols floats: 96 KiB at cols 768, 704 KiB at 5632) stays in L2 while
// every token tile passes over it; X is read in place (row-major), MR rows
// at a time.
//
// Why not Eigen (the path before this one): its f32 kernel is a 48 x 4
// tile that keeps 12 accumulators, re-packs X in every call, and reached
// about 68% of the FMA peak here (TOOLCHAIN.md); this kernel reaches
// 88-97 GFLOP/s on one core, ~85% of its peak (numbers at gemm_mr).
//
// Rounding: each output is ONE fma chain over k in order (y = fma(x_k, w_k,
// y) from 0), the same for every tile, thread count and token count, so a
// token's row of Y does not depend on the tokens computed beside it; against
// the exact sum the error is within gamma_cols * sum |x_k w_k|, the bound the
// tests hold matmul to.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

#include "kestrel/cpu/convert.hpp"
#include "kestrel/cpu/transpose.hpp"
#include "kestrel/cpu/xsimd_compat.hpp"

namespace kestrel::cpu::detail {

inline constexpr std::size_t gemm_nr = 2 * simd::width;               // rows of W per panel
// Tokens per register tile. Measured on AVX-512 (one thread, f32, 512
// tokens, 2048x768 / 5632x2048 / 2048x5632 / 768x2048, GFLOP/s): 6 tokens
// 89 / 96 / 92 / 97, 8 tokens 93 / 95 / 88 / 97, 10 tokens 92 / 95 / 85 / 85,
// 12 tokens 88 / 67 / 85 / 91, 14 tokens spill: fewer X rows in flight
// beat the extra reuse of each weight load.
inline constexpr std::size_t gemm_mr = simd::width >= 16 ? 8 : 6;

#if defined(__AVX512F__) || defined(__AVX2__)
/// The packing's in-register transpose of a simd::width x simd::width block.
#if defined(__AVX512F__)
using pack_reg = __m512;
inline void pack_transpose(pack_reg* r) noexcept { transpose16x16(r); }
inline void pack_store(float* p, pack_reg v) noexcept { _mm512_store_ps(p, v); }
#else
using pack_reg = __m256;
inline void pack_transpose(pack_reg* r) noexcept { transpose8x8(r); }
inline void pack_store(float* p, pack_reg v) noexcept { _mm256_store_ps(p, v); }
#endif
#endif

/// Packs n <= gemm_nr rows of w (cols values each, row i at w + i * ld) into
/// panel[k * gemm_nr + j], converted to f32; the panel's rows past n are
/// left as they are. With AVX-512 or AVX2, full W x W blocks go through
/// registers (transpose16x16, transpose8x8): the scalar scatter took ~8% of
/// a TinyLlama-shape f16 prefill on Zen 4, ~6% on Zen 2.
template <class T>
inline void gemm_pack_block(const T* w, std::size_t ld, std::size_t n, std::size_t cols, float* panel) noexcept {
  constexpr std::size_t W = simd::width;
  std::size_t j = 0;
#if defined(__AVX512F__) || defined(__AVX2__)
  static_assert(sizeof(pack_reg) == W * sizeof(float) && gemm_nr == 2 * W);
  const std::size_t k_done = cols - cols % W;
  for (; j + W <= n; j += W) {
    const T* rows = w + j * ld;
    for (std::size_t k = 0; k < k_done; k += W) {
      pack_reg b[W];
      for (std::size_t i = 0; i < W; ++i) b[i] = load_f32(rows + i * ld + k);
      pack_transpose(b);
      for (std::size_t i = 0; i < W; ++i) pack_store(panel + (k + i) * gemm_nr + j, b[i]);
    }
    for (std::size_t i = 0; i < W; ++i)
      for (std::size_t k = k_done; k < cols; ++k) panel[k * gemm_nr + j + i] = to_float(rows[i * ld + k]);
  }
#endif
  // The rest (rows of a partial block; every row without AVX2): convert W
  // values of a row, then scatter them down the panel's columns.
  alignas(64) float tmp[W];
  for (; j < n; ++j) {
    const T* row = w + j * ld;
    std::size_t k = 0;
    for (; k + W <= cols; k += W) {
      load_f32(row + k).store_aligned(tmp);
      for (std::size_t i = 0; i < W; ++i) panel[(k + i) * gemm_nr + j] = tmp[i];
    }
    for (; k < cols; ++k) panel[k * gemm_nr + j] = to_float(row[k]);
  }
}

/// Packs rows [r, r + n) (n <= gemm_nr) of w (rows of `cols`) into the
/// panel; rows past n are zeros.
template <class T>
inline void gemm_pack_panel(const T* w, std::size_t cols, std::size_t r, std::size_t n, float* panel) noexcept {
  if (n < gemm_nr) std::fill(panel, panel + cols * gemm_nr, 0.0f);
  gemm_pack_block(w + r * cols, cols, n, cols, panel);
}

/// y[t * ldy + j] (t < MR, j < n_rows <= gemm_nr) = sum_k x[t * ldx + k] *
/// panel[k][j]: the register tile. The token loop is unrolled by a pack
/// expansion, not left to the optimizer: GCC at -O2 kept the 2 MR
/// accumulators of a plain loop in memory (half Eigen's speed).
/// Columns [k0, k1) of the sum; for k0 > 0 the tile continues the partial
/// sums already in y (the same fma chain, so blocking k changes nothing).
template <std::size_t MR>
inline void gemm_tile(const float* panel, std::size_t k0, std::size_t k1, const float* x, std::size_t ldx, float* y,
                      std::size_t ldy, std::size_t n_rows) noexcept {
  constexpr std::size_t W = simd::width;
  [&]<std::size_t... T>(std::index_sequence<T...>) {
    simd::fbatch a0[MR], a1[MR];
    if (k0 == 0) {
      ((a0[T] = simd::fbatch(0.0f), a1[T] = simd::fbatch(0.0f)), ...);
    } else if (n_rows == gemm_nr) {
      ((a0[T] = simd::fbatch::load_unaligned(y + T * ldy), a1[T] = simd::fbatch::load_unaligned(y + T * ldy + W)), ...);
    } else {
      auto get = [&](std::size_t t, simd::fbatch& lo, simd::fbatch& hi) {
        alignas(64) float tmp[2 * W] = {};
        std::copy(y + t * ldy, y + t * ldy + n_rows, tmp);
        lo = simd::fbatch::load_aligned(tmp);
        hi = simd::fbatch::load_aligned(tmp + W);
      };
      (get(T, a0[T], a1[T]), ...);
    }
    const float* xr[MR] = {(x + T * ldx)...};
    for (std::size_t k = k0; k < k1; ++k) {
      const simd::fbatch w0 = simd::fbatch::load_aligned(panel + k * gemm_nr);
      const simd::fbatch w1 = simd::fbatch::load_aligned(panel + k * gemm_nr + W);
      ((a0[T] = xsimd::fma(simd::fbatch(xr[T][k]), w0, a0[T]),
        a1[T] = xsimd::fma(simd::fbatch(xr[T][k]), w1, a1[T])), ...);
    }
    if (n_rows == gemm_nr) {
      ((a0[T].store_unaligned(y + T * ldy), a1[T].store_unaligned(y + T * ldy + W)), ...);
    } else {
      alignas(64) float tmp[2 * W];
      auto put = [&](std::size_t t, const simd::fbatch& lo, const simd::fbatch& hi) {
        lo.store_aligned(tmp);
        hi.store_aligned(tmp + W);
        std::copy(tmp, tmp + n_rows, y + t * ldy);
      };
      (put(T, a0[T], a1[T]), ...);
    }
  }(std::make_index_sequence<MR>{});
}

/// The tile for the last m < gemm_mr tokens.
template <std::size_t M = gemm_mr - 1>
inline void gemm_tile_tail(std::size_t m, const float* panel, std::size_t k0, std::size_t k1, const float* x,
                           std::size_t ldx, float* y, std::size_t ldy, std::size_t n_rows) noexcept {
  if constexpr (M > 0) {
    if (m == M) return gemm_tile<M>(panel, k0, k1, x, ldx, y, ldy, n_rows);
    gemm_tile_tail<M - 1>(m, panel, k0, k1, x, ldx, y, ldy, n_rows);
  }
}

/// Columns per pass over the token tiles: one pass (every column) with
/// AVX-512, at most 6144 with AVX2. Each pass ends with the tile's
/// accumulators stored to Y and reloaded by the next, and a pass reads the
/// tile's rows of X as one long stream each; the panel (32 x cols floats
/// with AVX-512, at most 704 KiB at TinyLlama's 5632) stays in L2 (1-2 MiB
/// per core on Zen 4 and Emerald Rapids). AVX2: the slice (6144 x 16
/// floats, 384 KiB) stays in a 512 KiB L2, and every matrix of TinyLlama's
/// shape takes one pass. Measured, speed over kc 128:
/// - Zen 2 (2 threads, TinyLlama-shape f32 pp512, alternated, t/s) kc 128 /
///   256 / 512 / 1024 / one pass: 68 / 77 / 82 / 85 / 88; 110M f32 128 /
///   one pass: 740 / 870.
/// - Zen 4 (one thread, 512 tokens, medians of 9 alternated runs, /tmp
///   harness of gemm_rows): one pass 1.04-1.14x over kc 128 on all six of
///   the 110M and TinyLlama shapes, f32 and f16 alike (2048x2048 1.13,
///   5632x2048 1.07-1.12, 2048x5632 1.10-1.14, 768x768 1.05); kc 512 and
///   1024 fell between. End to end, TinyLlama f16 pp256 (2 threads, 3
///   alternated rounds) 84.7 -> 98.9 t/s.
/// - Emerald Rapids (the same harness): 2048x2048 kc 256 / 512 / 1024 /
///   2048 / one pass 1.26 / 1.48 / 1.50 / 1.72 / 1.73; 5632x2048 1.19 /
///   1.39 / 1.54 / 1.63 / 1.68; 2048x5632 1.16 / 1.31 / 1.42 / 1.52 / 1.58;
///   768x768 one pass 1.19, 2048x768 1.29, 768x2048 1.69: 128-column pieces
///   of X's rows are too short for its hardware prefetcher.
/// (kc 128 with AVX-512, until 2026-12-02, had been chosen so the panel's
/// slice stayed in L1, not measured against one pass.) The bits do not
/// depend on kc (above; tests/cpu/test_linear.cpp).
inline constexpr std::size_t gemm_kc = simd::width >= 16 ? std::size_t(-1) : 6144;

/// Per-thread scratch of n values of V, 64-byte aligned; grows, never
/// shrinks, so steady-state prefill allocates nothing. Each Tag is a buffer
/// of its own, for uses that hold theirs while another runs (the bf16
/// tiles, cpu/gemm_amx.hpp, take tags 1 and 2).
template <class V, int Tag>
inline V* scratch(std::size_t n) {
  thread_local std::vector<V> buf;
  const std::size_t need = n + 64 / sizeof(V);
  if (buf.size() < need) buf.resize(need);
  auto p = reinterpret_cast<std::uintptr_t>(buf.data());
  return reinterpret_cast<V*>((p + 63) & ~std::uintptr_t{63});
}

/// Per-thread f32 scratch of n floats (the GEMM's panels, the Eigen path's
/// converted tiles).
inline float* float_scratch(std::size_t n) { return scratch<float, 0>(n); }

/// Y[:, r0:r1) = X W[r0:r1)^T, each panel of W made by pack(r, n, panel)
/// (rows [r, r + n) of W as gemm_pack_panel lays them out, zeros past n).
/// x: (n_tokens, cols); y: (n_tokens, rows). r0 is a multiple of gemm_nr
/// except at r1. Columns in passes of kc (0: gemm_kc).
template <class Pack>
inline void gemm_panels(Pack&& pack, std::size_t rows, std::size_t cols, const float* x, std::size_t n_tokens,
                        float* y, std::size_t r0, std::size_t r1, std::size_t kc = 0) {
  float* panel = float_scratch(cols * gemm_nr);
  if (kc == 0) kc = std::min(cols, gemm_kc);  // no pass when cols == 0
  for (std::size_t r = r0; r < r1; r += gemm_nr) {
    const std::size_t n = std::min(gemm_nr, r1 - r);
    pack(r, n, panel);
    for (std::size_t k0 = 0; k0 < cols; k0 += kc) {
      const std::size_t k1 = std::min(cols, k0 + kc);
      std::size_t t = 0;
      for (; t + gemm_mr <= n_tokens; t += gemm_mr)
        gemm_tile<gemm_mr>(panel, k0, k1, x + t * cols, cols, y + t * rows + r, rows, n);
      if (t < n_tokens) gemm_tile_tail(n_tokens - t, panel, k0, k1, x + t * cols, cols, y + t * rows + r, rows, n);
    }
  }
}

/// Y[:, r0:r1) = X W[r0:r1)^T. w: (rows, cols); x: (n_tokens, cols);
/// y: (n_tokens, rows). r0 is a multiple of gemm_nr except at r1.
template <class T>
inline void gemm_rows(const T* w, std::size_t rows, std::size_t cols, const float* x, std::size_t n_tokens, float* y,
                      std::size_t r0, std::size_t r1, std::size_t kc = 0) {
  gemm_panels([&](std::size_t r, std::size_t n, float* panel) { gemm_pack_panel(w, cols, r, n, panel); }, rows, cols,
              x, n_tokens, y, r0, r1, kc);
}

}  // namespace kestrel::cpu::detail
