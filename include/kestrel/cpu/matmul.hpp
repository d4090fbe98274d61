// kestrel/cpu/matmul.hpp: Y = X W^T, the prefill product of a weight matrix
// with all prompt tokens at once.
//
// Prefill is compute-bound, so this is a real GEMM. Thin products (a few
// tokens: short prompts, speculative verification) use our own register-tiled
// "skinny" kernel, 4 tokens x 4 weight rows per tile, f16/bf16 converted in
// registers, each weight block read from memory once. Larger ones use the
// packed-panel GEMM of cpu/gemm.hpp (8 tokens x 32 rows per register tile,
// W packed and converted to f32 a panel at a time per thread), which
// measured 1.1-2x Eigen's blocked kernel on this machine (one thread, 110M
// and TinyLlama shapes, 128-512 tokens). Threads come from our pool, not
// OpenMP: they split the output features (rows of W) in panels. Where the
// CPU has AMX-BF16, products of gemm_amx_min_tokens tokens or more run on
// bf16 tiles instead (cpu/gemm_amx.hpp), each operand split into two bf16.
//
// Eigen's kernel stays available at run time (KESTREL_EIGEN_GEMM=1) so one
// binary can compare the two; there each thread runs single-threaded Eigen
// on its block of Y (if the includer compiles with -fopenmp, define
// EIGEN_DONT_PARALLELIZE before including kestrel, or Eigen will start its
// own threads inside ours), and f16/bf16 weights are converted to f32 a
// tile of rows at a time (~256 KiB, in L2) into a grow-only scratch buffer.
//
// A single token is a matrix-vector product, bound by bandwidth rather than
// compute; matmul hands it to matvec. Block-quantized weights go to
// cpu/quantized.hpp's int8 kernels, except prefill on AVX2 without VNNI,
// which dequantizes panels into the GEMM above (dequant_gemm below).
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdlib>
#include <span>
#include <type_traits>
#include <vector>

#include "kestrel/core/diagnostics.hpp"
// Eigen's AVX-512 packets meet the same GCC 12 warnings in its own code,
// and Eigen 3.4's bf16 packets leave a variable unused: neither is the
// includer's to see under -Wall (found compiling examples/simple.cpp with
// -Wall -Wextra and Debian 12's Eigen on an AVX-512 host).
#if defined(__GNUC__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wunused-variable"
#endif
KESTREL_INTRINSICS_BEGIN
#include <Eigen/Core>
KESTREL_INTRINSICS_END
#if defined(__GNUC__)
#pragma GCC diagnostic pop
#endif

#include "kestrel/core/tensor.hpp"
#include "kestrel/cpu/convert.hpp"
#include "kestrel/cpu/gemm.hpp"
#include "kestrel/cpu/gemm_amx.hpp"
#include "kestrel/cpu/matvec.hpp"
#include "kestrel/cpu/thread_pool.hpp"
#include "kestrel/quant/dequantize_fast.hpp"

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

/// Same as matmul_block for f16/bf16 W, converting tiles of rows to f32.
template <class T>
inline void matmul_block_converted(const T* w, std::size_t rows, std::size_t cols, const float* x, std::size_t n_tokens,
                                   float* y, std::size_t r0, std::size_t r1) {
  // ~64K floats (256 KiB) per tile, at least 16 rows so Eigen's panels stay wide.
  const std::size_t tile_rows = std::max<std::size_t>(16, (std::size_t{1} << 16) / std::max<std::size_t>(cols, 1));
  float* tile = float_scratch(std::min(tile_rows, r1 - r0) * cols);  // (tile_rows, cols)
  for (std::size_t t0 = r0; t0 < r1; t0 += tile_rows) {
    const std::size_t t1 = std::min(r1, t0 + tile_rows);
    convert_to_f32(w + t0 * cols, tile, (t1 - t0) * cols);
    matmul_block(tile, rows, cols, x, n_tokens, y, t0, t1);
  }
}

/// The skinny-product kernel: a tile of T tokens x R weight rows, summed
/// over all cols in T*R register accumulators. Each weight vector loaded
/// (and converted from f16/bf16 in registers) serves T tokens and each x
/// vector R rows. w: R rows at w_rows[0..R), each (cols); x: T rows of
/// (cols) with stride x_stride; y: (T, y_stride), written at columns [0, R).
template <std::size_t T, std::size_t R, class Wt>
inline void skinny_tile(const Wt* w, std::size_t cols, const float* x, std::size_t x_stride, float* y,
                        std::size_t y_stride) noexcept {
  constexpr std::size_t W = simd::width;
  simd::fbatch acc[T][R];
  for (auto& row : acc)
    for (auto& a : row) a = simd::fbatch(0.0f);
  const std::size_t n_vec = cols - cols % W;
  for (std::size_t c = 0; c < n_vec; c += W) {
    simd::fbatch wv[R];
    for (std::size_t r = 0; r < R; ++r) wv[r] = load_f32(w + r * cols + c);
    for (std::size_t t = 0; t < T; ++t) {
      const simd::fbatch xv = simd::fbatch::load_unaligned(x + t * x_stride + c);
      for (std::size_t r = 0; r < R; ++r) acc[t][r] = xsimd::fma(xv, wv[r], acc[t][r]);
    }
  }
  if (n_vec < cols) {
    const std::size_t m = cols - n_vec;
    simd::fbatch wv[R];
    for (std::size_t r = 0; r < R; ++r) wv[r] = load_f32_partial(w + r * cols + n_vec, m);
    for (std::size_t t = 0; t < T; ++t) {
      const simd::fbatch xv = load_f32_partial(x + t * x_stride + n_vec, m);
      for (std::size_t r = 0; r < R; ++r) acc[t][r] = xsimd::fma(xv, wv[r], acc[t][r]);
    }
  }
  for (std::size_t t = 0; t < T; ++t)
    for (std::size_t r = 0; r < R; ++r) y[t * y_stride + r] = simd::reduce_add(acc[t][r]);
}

/// Y[:, r0:r1) = X W[r0:r1)^T with skinny tiles of 4 tokens x 4 rows: each
/// block of 4 weight rows is read from memory once and stays in L1/L2 while
/// every token tile passes over it. w: (rows, cols), x: (n_tokens, cols),
/// y: (n_tokens, rows).
template <std::size_t R, class Wt>
inline void skinny_rows(const Wt* w, std::size_t rows, std::size_t cols, const float* x, std::size_t n_tokens,
                        float* y, std::size_t r) noexcept {
  const Wt* wr = w + r * cols;
  const std::size_t t4 = n_tokens / 4 * 4;
  std::size_t t = 0;
  for (; t < t4; t += 4) skinny_tile<4, R>(wr, cols, x + t * cols, cols, y + t * rows + r, rows);
  switch (n_tokens - t) {
    case 3: skinny_tile<3, R>(wr, cols, x + t * cols, cols, y + t * rows + r, rows); break;
    case 2: skinny_tile<2, R>(wr, cols, x + t * cols, cols, y + t * rows + r, rows); break;
    case 1: skinny_tile<1, R>(wr, cols, x + t * cols, cols, y + t * rows + r, rows); break;
    default: break;
  }
}

template <class Wt>
inline void matmul_skinny(const Wt* w, std::size_t rows, std::size_t cols, const float* x, std::size_t n_tokens,
                          float* y, std::size_t r0, std::size_t r1) noexcept {
  const std::size_t r4 = r0 + (r1 - r0) / 4 * 4;  // bounds up front: GCC sees finite loops
  for (std::size_t r = r0; r < r4; r += 4) skinny_rows<4>(w, rows, cols, x, n_tokens, y, r);
  for (std::size_t r = r4; r < r1; ++r) skinny_rows<1>(w, rows, cols, x, n_tokens, y, r);
}

/// Up to this many tokens the skinny kernel beats Eigen's GEMM, whose
/// packing of W costs more than it saves when X is thin. Measured on Zen 4
/// (AVX-512, one thread, W 2048 x 4096), GFLOP/s skinny / Eigen:
///   f32: n=8 27/16, n=16 30/17, n=24 27/36, n=64 33/56;
///   f16 (Eigen after tile conversion): n=16 52/32, n=24 57/49, n=32 53/56, n=64 59/67.
/// For one token the skinny kernel is matvec's streaming loop (bandwidth).
template <class Wt>
inline constexpr std::size_t skinny_max_tokens = std::is_same_v<Wt, float> ? 16 : 24;

#if defined(KESTREL_LEGACY_TILES_AVX2)
/// Prefill without VNNI: W dequantized a panel at a time into the float
/// GEMM (cpu/gemm.hpp) against X in f32, no activations quantized.
///
/// Why: without VNNI the int8 products are no faster than f32 FMAs. On Zen
/// 2 one vpmaddubsw + vpmaddwd pair (32 products) issues every 2 cycles
/// per core, as do two 8-wide FMAs (16 products each): kestrel-bench's
/// probes read 190-199 GOP/s int8 and 161-215 GFLOP/s f32. The int8 kernels
/// also pay for the per-block scales and the activations' quantization,
/// and reached 0.56-0.73 of the int8 peak; the float GEMM reaches about
/// 0.9 of the f32 peak, and dequantizing a panel of 16 rows costs little
/// against the hundreds of tokens that meet it.
///
/// The result is the float product of the weights' dequantized values
/// (quant::dequantize_row_fast, the values the file encodes) with X: closer to
/// the exact product than the int8 path, which rounds X to 8 bits, and
/// held by the tests to the float GEMM's bound against ref::matmul on the
/// dequantized matrix. It is another rounding than decode's int8 kernels,
/// so calls from dequant_gemm_min_tokens tokens on give a token other bits
/// than a shorter call (as the VNNI prefill panels do from
/// quant::kpanel_min_tokens).
///
/// From 96 tokens on: dequantizing and packing a panel costs about 1.3
/// cycles per weight (from the 32- and 512-token rates below) against 2
/// cycles per weight for every 32 tokens of FMAs, while the int8 tiles
/// amortize their unpacking over 4 tokens. Measured
/// on Zen 2 (TinyLlama shape, 2 threads, t/s int8 tiles / this, alternated):
/// q4_0 32 tokens 75 / 57, 64 tokens 76 / 73, 96 tokens 77 / 82, 128
/// tokens 77 / 84, 512 tokens 75 / 90; Q4_K_M 64 tokens 75 / 70, 128
/// tokens 75 / 82.
#define KESTREL_DEQUANT_GEMM 1
inline constexpr std::size_t dequant_gemm_min_tokens = 96;

/// Y = X W^T for a row-major block type or a legacy x16 layout (the k-quant
/// x16 layouts and q4_0's keep their int8 kernels, takes_dequant_gemm);
/// cols a positive multiple of the block size.
inline void dequant_gemm(const weight_view& w, const float* x, std::size_t n_tokens, float* y, thread_pool* pool) {
  // row_blocks(row, b0, n, out): blocks [b0, b0 + n) of a row as floats
  auto run = [&](std::size_t qk, auto&& row_blocks) {
    const std::size_t rows = w.rows, cols = w.cols;
    constexpr std::size_t chunk = 256;  // columns dequantized at a time: 16 rows x 256 floats, 16 KiB in L1
    auto pack = [&](std::size_t r, std::size_t n, float* panel) {
      alignas(64) float tmp[gemm_nr * chunk];
      if (n < gemm_nr) std::fill(panel, panel + cols * gemm_nr, 0.0f);
      for (std::size_t k0 = 0; k0 < cols; k0 += chunk) {
        const std::size_t kn = std::min(chunk, cols - k0);  // whole blocks: 256 and cols are multiples of qk
        for (std::size_t j = 0; j < n; ++j) row_blocks(r + j, k0 / qk, kn / qk, tmp + j * chunk);
        gemm_pack_block(tmp, chunk, n, kn, panel + k0 * gemm_nr);
      }
    };
    parallel_for(pool, (rows + gemm_nr - 1) / gemm_nr, [&](std::size_t p0, std::size_t p1) {
      gemm_panels(pack, rows, cols, x, n_tokens, y, p0 * gemm_nr, std::min(rows, p1 * gemm_nr));
    }, n_tokens * rows * cols);
  };
  if (panel_rows(w.type) > 1) {
    visit_x16(w, [&](const auto* panels) {
      using X = std::remove_cv_t<std::remove_pointer_t<decltype(panels)>>;
      using B = typename quant::x16_source<X>::type;
      const std::size_t nb = w.cols / X::values;
      run(X::values, [&](std::size_t r, std::size_t b0, std::size_t n, float* out) {
        const X* p = panels + r / quant::x16_rows * nb + b0;
        for (std::size_t b = 0; b < n; ++b) {
          B blk;
          quant::unpack_x16(p + b, r % quant::x16_rows, 1, &blk);
          quant::dequantize_row_fast(&blk, out + b * X::values, X::values);
        }
      });
    });
    return;
  }
  visit_quantized(w, [&](const auto* blocks) {
    using B = std::remove_cv_t<std::remove_pointer_t<decltype(blocks)>>;
    const auto* base = reinterpret_cast<const std::byte*>(blocks);
    const std::size_t row_bytes = w.row_bytes(), qk = block_size(w.type);
    run(qk, [&](std::size_t r, std::size_t b0, std::size_t n, float* out) {
      quant::dequantize_row_fast(reinterpret_cast<const B*>(base + r * row_bytes) + b0, out, n * qk);
    });
  });
}

/// Whether matmul hands w with n_tokens tokens to dequant_gemm.
inline bool takes_dequant_gemm(const weight_view& w, std::size_t n_tokens) noexcept {
  // The x16 layouts keep their int8 kernel (quant/kquant_x16_avx2.hpp) at
  // every token count: measured on Zen 2 (TinyLlama Q4_K_M, 2 threads,
  // t/s dequantized into this GEMM / x16 kernel) 128 tokens 95 / 108, 256
  // tokens 96 / 107, 512 tokens 92 / 102; 110M 512 tokens 889 / 985.
#if defined(KESTREL_LEGACY_X16_AVX2)
  // q4_0 too, row-major or q4_0_x16 (quant/legacy_x16_avx2.hpp): TinyLlama q4_0, t/s int8 tiles
  // or this GEMM / the q4_0 panels: 16 tokens 72 / 74, 32 76 / 84, 64 77 /
  // 89, 512 90.5 / 90; 110M 512 tokens 874 / 874.
  if (w.type == dtype::q4_0) return false;
  // q4_1, q5_0 and q5_1 interleaved at load (q4_1_x16, q5_0_x16, q5_1_x16)
  // come here as they would row-major: TinyLlama, pp512, 2 threads,
  // alternated, t/s x16 kernel / this: q5_0 81.2-82.0 / 86.3-87.1, q4_1
  // 74.8-76.5 / 82.9-87.6.
  const bool legacy_x16 = w.type == dtype::q4_1_x16 || w.type == dtype::q5_0_x16 || w.type == dtype::q5_1_x16 ||
                          w.type == dtype::q8_0_x16;
#else
  const bool legacy_x16 = false;
#endif
  return n_tokens >= dequant_gemm_min_tokens && (panel_rows(w.type) == 1 || legacy_x16) && w.cols > 0 &&
         w.cols % block_size(w.type) == 0;
}
#else
// With VNNI (or without AVX2) the int8 kernels take every call.
inline constexpr std::size_t dequant_gemm_min_tokens = static_cast<std::size_t>(-1);
inline bool takes_dequant_gemm(const weight_view&, std::size_t) noexcept { return false; }
#endif

}  // namespace detail

/// Whether matmul's large products go to Eigen rather than cpu/gemm.hpp
/// (KESTREL_EIGEN_GEMM=1 in the environment; for comparing the two in one
/// binary, e.g. kestrel-bench).
inline bool eigen_gemm() {
  static const bool on = [] {
    const char* v = std::getenv("KESTREL_EIGEN_GEMM");
    return v && v[0] == '1';
  }();
  return on;
}

/// Whether matmul's float product of n_tokens tokens with W of cols columns
/// runs on the bf16 tiles (cpu/gemm_amx.hpp): where they run here, and not
/// when KESTREL_EIGEN_GEMM=1 asks for Eigen.
inline bool takes_bf16_tiles(std::size_t cols, std::size_t n_tokens) {
  return !eigen_gemm() && gemm_amx_takes(cols, n_tokens);
}

/// Y = X W^T. w: (rows, cols) of f32, f16 or bf16; x: (n_tokens, cols);
/// y: (n_tokens, rows); all row-major. pool may be null. y must not alias x.
inline void matmul(const weight_view& w, const float* x, std::size_t n_tokens, float* y, thread_pool* pool) {
  if (is_quantized(w.type)) {
#if defined(KESTREL_DEQUANT_GEMM)
    if (detail::takes_dequant_gemm(w, n_tokens)) return detail::dequant_gemm(w, x, n_tokens, y, pool);
#endif
    return detail::quantized_linear(w, x, n_tokens, y, pool, /*reference=*/false);
  }
  if (n_tokens == 0 || w.rows == 0) return;
  if (n_tokens == 1) return matvec(w, x, y, pool);
  const std::size_t rows = w.rows, cols = w.cols;
  if (cols == 0) {
    std::fill(y, y + n_tokens * rows, 0.0f);
    return;
  }
  visit_weight(w, [&](const auto* data) {
    using T = std::remove_cv_t<std::remove_pointer_t<decltype(data)>>;
    // Where the CPU has AMX-BF16: the bf16 tiles (cpu/gemm_amx.hpp),
    // 1.3-2.4x the packed-panel GEMM below on 512 tokens of the 110M and
    // TinyLlama shapes (2 threads), prompts of 512 tokens 1.6-2.3x as fast
    // (bench/README.md, "float prompts on bf16 tiles").
    if (takes_bf16_tiles(cols, n_tokens)) return gemm_amx(data, rows, cols, x, n_tokens, y, pool);
    const bool skinny = n_tokens <= detail::skinny_max_tokens<T>;
    if (!skinny && !eigen_gemm()) {
      // Our packed-panel GEMM (cpu/gemm.hpp): threads take panels of
      // gemm_nr rows in the pool's dynamic chunks (nothing of X is packed,
      // so finer chunks cost nothing).
      const std::size_t panels = (rows + detail::gemm_nr - 1) / detail::gemm_nr;
      parallel_for(pool, panels, [&](std::size_t p0, std::size_t p1) {
        detail::gemm_rows(data, rows, cols, x, n_tokens, y, p0 * detail::gemm_nr, std::min(rows, p1 * detail::gemm_nr));
      }, n_tokens * rows * cols);
      return;
    }
    // Blocks of 16 output features: a multiple of every SIMD width, so each
    // thread's slice of Y starts on a lane boundary of Eigen's packed
    // panels. Each Eigen call packs all of X again, so the Eigen path takes
    // one part per thread (the pool's dynamic chunks would cut it into 4 per
    // thread and pack X 4 times as often); the skinny path packs nothing
    // and takes the pool's finer chunks.
    constexpr std::size_t block = 16;
    const std::size_t blocks = (rows + block - 1) / block;
    const std::size_t parts = !skinny && pool ? std::min(blocks, pool->size()) : blocks;
    parallel_for(pool, parts, [&](std::size_t p0, std::size_t p1) {
      const std::size_t b0 = p0 * blocks / parts, b1 = p1 * blocks / parts;
      const std::size_t r0 = b0 * block, r1 = std::min(rows, b1 * block);
      if (skinny)
        detail::matmul_skinny(data, rows, cols, x, n_tokens, y, r0, r1);
      else if constexpr (std::is_same_v<T, float>)
        detail::matmul_block(data + r0 * cols, rows, cols, x, n_tokens, y, r0, r1);
      else
        detail::matmul_block_converted(data, rows, cols, x, n_tokens, y, r0, r1);
    }, n_tokens * rows * cols);
  });
}

namespace detail {
/// Whether matmul_shared's jobs are all float matrices (f32, f16, bf16) of
/// one width that matmul would hand to the bf16 tiles for n_tokens tokens.
inline bool float_tiles_shared(std::span<const matvec_job> jobs, std::size_t n_tokens) {
  if (jobs.size() < 2) return false;
  for (const matvec_job& j : jobs)
    if (is_quantized(j.w->type) || j.w->rows == 0 || j.w->cols != jobs[0].w->cols) return false;
  return takes_bf16_tiles(jobs[0].w->cols, n_tokens);
}
}  // namespace detail

/// Y_j = X W_j^T for each job {&w, y} (y: (n_tokens, w.rows)), over the same
/// n_tokens rows of x: one matmul per job, but with x quantized once for
/// all of them where every W is block-quantized with the same activation
/// blocks and width and takes the int8 kernels (prefill's q, k and v; gate
/// and up), or laid out for the bf16 tiles once where every W is a float
/// matrix of one width that takes them (cpu/gemm_amx.hpp). The same bits
/// as a matmul per job, each of which would quantize or lay out x the same
/// way. Measured in bench/README.md ("Zen 5 again"; "float prompts on bf16
/// tiles").
inline void matmul_shared(std::span<const matvec_job> jobs, const float* x, std::size_t n_tokens, thread_pool* pool) {
  if (detail::float_tiles_shared(jobs, n_tokens)) {
    // float matrices of one width on the bf16 tiles: X laid out once for all
    gemm_amx_token_blocks(x, n_tokens, jobs[0].w->cols, pool,
                          [&](std::size_t t0, std::size_t nt, const std::uint16_t* xt, std::size_t n_pairs) {
                            for (const matvec_job& j : jobs)
                              visit_weight(*j.w, [&](const auto* data) {
                                gemm_amx_block(data, j.w->rows, j.w->cols, xt, n_pairs, t0, nt, j.y, pool);
                              });
                          });
    return;
  }
  bool share = n_tokens > 1 && jobs.size() > 1;
#if defined(KESTREL_DEQUANT_GEMM)
  for (const matvec_job& j : jobs) share = share && !detail::takes_dequant_gemm(*j.w, n_tokens);
#endif
  const void* acts = share ? detail::shared_acts(jobs, x, n_tokens, pool) : nullptr;
  for (const matvec_job& j : jobs) {
    if (acts)
      detail::quantized_linear(*j.w, x, n_tokens, j.y, pool, /*reference=*/false, acts);
    else
      matmul(*j.w, x, n_tokens, j.y, pool);
  }
}

/// h = silu(X gate^T) * (X up^T): prefill's SwiGLU products, h and
/// up_scratch (n_tokens, gate.rows). Where both matrices are of one type
/// whose products take the legacy panels (AVX-512 VNNI or AMX) or the
/// k-quants' AMX tiles (detail::quantized_swiglu), each token group's two
/// products meet in registers and only h is written; elsewhere
/// matmul_shared into h and up_scratch, then swiglu. The same bits either
/// way. Measured (110M q4_0, prefill of 512 tokens): the separate swiglu
/// pass, reading both products back from memory, was 8% of the prefill's
/// time (bench/README.md, "SwiGLU in the tile kernels' epilogue").
inline void matmul_swiglu(const weight_view& gate, const weight_view& up, const float* x, std::size_t n_tokens,
                          float* h, float* up_scratch, thread_pool* pool) {
  bool fuse = n_tokens > 1 && is_quantized(gate.type);
#if defined(KESTREL_DEQUANT_GEMM)
  fuse = fuse && !detail::takes_dequant_gemm(gate, n_tokens) && !detail::takes_dequant_gemm(up, n_tokens);
#endif
  if (fuse && detail::quantized_swiglu(gate, up, x, n_tokens, h, pool)) return;
  const matvec_job jobs[2] = {{&gate, h}, {&up, up_scratch}};
  matmul_shared(jobs, x, n_tokens, pool);
  swiglu(h, h, up_scratch, n_tokens * gate.rows);
}

}  // namespace kestrel::cpu
