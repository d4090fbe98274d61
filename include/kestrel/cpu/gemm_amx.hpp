// kestrel/cpu/gemm_amx.hpp: the float prefill GEMM on AMX bf16 tiles, Y = X
// W^T with W of f32, f16 or bf16, where the CPU has AMX-BF16
// (amx_bf16_enabled), W's rows are whole 32-column chunks and the call has
// gemm_amx_min_tokens tokens or more (gemm_amx_takes).
//
// Each operand is split into two bf16 and a product taken as three tile
// products, hi*hi + hi*lo + lo*hi (cpu/amx_bf16.hpp): every output within
// bf16_split_rel sum_k |x_k w_k| of the exact product, plus the f32
// accumulation's rounding, the bound tests/cpu/test_linear.cpp derives
// (amx_tol). An f16 weight is exactly its two halves, a bf16 weight its hi
// half alone: bf16 matrices take two tile products per product, hi*hi +
// hi*lo.
//
// Layout. W's rows are the A tiles (16 rows x 32 columns, row-major as W
// is, so a panel is only split, not transposed) and X's tokens the B tiles
// (16 column pairs x 16 tokens), laid out once per call of up to
// block_tokens tokens and shared by every thread; a C tile holds 16 rows x
// 16 tokens, transposed into Y at the end. The kernel holds 2 row tiles x 2
// token tiles in the four C tiles and loads 9 operand tiles per 12 tile
// products.
//
// Blocking. A thread takes a range of 32-row panels, group_panels at a
// time. For each pass of kc_chunks 32-column chunks, each panel's slice is
// split (16 KiB, stays in L1) and every token pair passes over it, reading
// its slice of X's layout (128 columns x 512 tokens x 4 bytes, 256 KiB,
// stays in L2 across the group's panels); the C tiles go to a scratch of
// the group's results (L2) between passes, each call asking for the next
// call's C tiles into L1 and for a few rows of the next slice into L2. The
// tile products themselves run at about 4.4 ns each on one core here (11.4
// TSC cycles); in this kernel, with both operand streams passing through
// L2, at about 30 TSC cycles: 1.7-2.5x the packed-panel GEMM on one thread
// on the 110M and TinyLlama shapes (bench/README.md, "float prompts on
// bf16 tiles").
//
// Rounding: each output's sum runs over the chunks in order, three tile
// products per chunk in the same order for every tile, token count and
// thread count, so a token's row of Y does not depend on the tokens beside
// it in the call (above gemm_amx_min_tokens; below it the float GEMM's
// rounding applies). Operands are finite and below bf16's largest value
// (a model's are): an infinity would split into inf and NaN, and give NaN
// where the float GEMM gives inf.
#pragma once

#include <algorithm>
#include <cassert>
#include <cstddef>
#include <cstdint>
#include <type_traits>
#include <vector>

#include "kestrel/cpu/amx_bf16.hpp"
#include "kestrel/cpu/gemm.hpp"
#include "kestrel/cpu/thread_pool.hpp"
#include "kestrel/cpu/transpose.hpp"

namespace kestrel::cpu {

/// Tokens from which matmul's float products take the bf16 tiles: below
/// it, the padding to 16-token tiles, X's layout and the splits of W cost
/// more than the tiles save. Measured (2048 x 2048, 2 threads, GFLOP/s
/// packed-panel GEMM / tiles): f32 24 tokens 210 / 215, 32 tokens 226 /
/// 301; f16 24 tokens 234 / 253, 32 tokens 258 / 319 (bench/README.md,
/// "float prompts on bf16 tiles").
inline constexpr std::size_t gemm_amx_min_tokens = 32;

/// Whether gemm_amx runs here for W of cols columns.
inline bool gemm_amx_available(std::size_t cols) noexcept {
  return cols > 0 && cols % 32 == 0 && amx_bf16_enabled();
}

/// Whether matmul's float product of n_tokens tokens with W of cols
/// columns takes the bf16 tiles.
inline bool gemm_amx_takes(std::size_t cols, std::size_t n_tokens) noexcept {
  return n_tokens >= gemm_amx_min_tokens && gemm_amx_available(cols);
}

#if defined(KESTREL_AMX_BF16)

namespace detail::amx_gemm {

namespace S = detail::amx_bf16;

inline constexpr std::size_t tile_u16 = 512;       // one tile: 16 rows x 64 bytes, in bf16
inline constexpr std::size_t kc_chunks = 4;        // 32-column chunks per pass
inline constexpr std::size_t group_panels = 8;     // 32-row panels sharing each pass over X
inline constexpr std::size_t block_tokens = 512;   // tokens laid out at a time (a multiple of 32)

/// Token tiles [tt0, tt1) of x (n_tokens rows of cols; tiles past n_tokens
/// are zeros) as B tiles: tile tt, chunk c at xt + (tt nc + c) 2 tile_u16,
/// hi then lo, row p = column pair p of the chunk for the tile's 16 tokens.
inline void layout_tokens(const float* x, std::size_t n_tokens, std::size_t cols, std::size_t tt0, std::size_t tt1,
                          std::uint16_t* xt) noexcept {
  const std::size_t nc = cols / 32;
  for (std::size_t tt = tt0; tt < tt1; ++tt)
    for (std::size_t c = 0; c < nc; ++c) {
      __m512 h[16], l[16];
      for (std::size_t i = 0; i < 16; ++i) {
        const std::size_t t = tt * 16 + i;
        __m512i hi = _mm512_setzero_si512(), lo = _mm512_setzero_si512();
        if (t < n_tokens) S::split32(x + t * cols + 32 * c, hi, lo);
        h[i] = _mm512_castsi512_ps(hi);
        l[i] = _mm512_castsi512_ps(lo);
      }
      transpose16x16(h);  // lane i of row p: token i's pair p
      transpose16x16(l);
      std::uint16_t* dst = xt + (tt * nc + c) * 2 * tile_u16;
      for (std::size_t p = 0; p < 16; ++p) {
        _mm512_store_ps(reinterpret_cast<float*>(dst + p * 32), h[p]);
        _mm512_store_ps(reinterpret_cast<float*>(dst + tile_u16 + p * 32), l[p]);
      }
    }
}

/// Whether a weight of type T is exactly its hi half (bf16: its lo half
/// is zero, and the products that read it are left out).
template <class T>
inline constexpr bool hi_exact = std::is_same_v<T, kestrel::bf16>;

/// Rows [r, r + n) (n <= 32; zeros past n) of w, chunks [c0, c1), as A
/// tiles: chunk c - c0 at panel + (c - c0) 4 tile_u16, row tile 0's hi and
/// lo, then row tile 1's (the lo tiles left unwritten where hi_exact<T>).
template <class T>
inline void split_panel(const T* w, std::size_t cols, std::size_t r, std::size_t n, std::size_t c0, std::size_t c1,
                        std::uint16_t* panel) noexcept {
  for (std::size_t c = c0; c < c1; ++c)
    for (std::size_t j = 0; j < 32; ++j) {
      __m512i hi = _mm512_setzero_si512(), lo = _mm512_setzero_si512();
      if (j < n) S::split32(w + (r + j) * cols + 32 * c, hi, lo);
      std::uint16_t* dst = panel + ((c - c0) * 4 + (j / 16) * 2) * tile_u16 + (j % 16) * 32;
      _mm512_store_si512(dst, hi);
      if constexpr (!hi_exact<T>) _mm512_store_si512(dst + tile_u16, lo);
    }
}

/// Asks for rows [r, r + n) of w, chunks [c0, c1), into L2: the slice
/// split_panel takes next, fetched while the tiles work on this one (a
/// slice's rows are 32 runs of 128 columns, too short for the hardware
/// prefetcher: without this, splitting took 2 cycles a weight, a third of
/// the tiles' time).
template <class T>
inline void prefetch_slice(const T* w, std::size_t cols, std::size_t r, std::size_t n, std::size_t c0,
                           std::size_t c1) noexcept {
  const std::size_t bytes = (c1 - c0) * 32 * sizeof(T);
  for (std::size_t j = 0; j < n; ++j) {
    const char* row = reinterpret_cast<const char*>(w + (r + j) * cols + 32 * c0);
    for (std::size_t b = 0; b < bytes; b += 64) _mm_prefetch(row + b, _MM_HINT_T1);
  }
}

/// The four C tiles at c (row tile a, token tile b at c + (2a + b) 256) +=
/// chunks [0, n) of the panel slice at w (A tiles) and of token tiles x0,
/// x1 (B tiles): per chunk, hi*hi, hi*lo, lo*hi into each, in that order
/// (without lo*hi where W is exactly its hi halves: W_exact, 8 tile
/// products a chunk instead of 12, the same sums as adding lo*hi's zeros).
/// first: start from zeros instead of c. c_next: the C tiles the next call
/// loads, or null: asked for into L1 a tile per chunk, so that call does not
/// start by waiting on L2. With the slice's prefetch spread over the calls
/// (panels, below): 1.07-1.08x the tiles' GFLOP/s (kestrel-bench-gemm,
/// geometric mean of the 14 shapes), prompts of 512 tokens in 0.93x the
/// time (110M f32) and 0.89-0.96x (TinyLlama f16; bench/README.md).
template <bool W_exact>
inline void tiles_2x2(const std::uint16_t* w, const std::uint16_t* x0, const std::uint16_t* x1, std::size_t n,
                      float* c, bool first, const float* c_next = nullptr) noexcept {
  constexpr std::size_t T = tile_u16;
  if (first) {
    _tile_zero(0);
    _tile_zero(1);
    _tile_zero(2);
    _tile_zero(3);
  } else {
    _tile_loadd(0, c, 64);
    _tile_loadd(1, c + 256, 64);
    _tile_loadd(2, c + 512, 64);
    _tile_loadd(3, c + 768, 64);
  }
  for (std::size_t k = 0; k < n; ++k, w += 4 * T, x0 += 2 * T, x1 += 2 * T) {
    if (c_next && k < 4)  // C tile k (1 KiB, 16 lines) in chunk k
      for (std::size_t l = 0; l < 16; ++l)
        _mm_prefetch(reinterpret_cast<const char*>(c_next + k * S::tile_floats + 16 * l), _MM_HINT_T0);
    _tile_loadd(4, w, 64);          // row tile 0, hi
    _tile_loadd(5, w + 2 * T, 64);  // row tile 1, hi
    _tile_loadd(6, x0, 64);         // token tile 0, hi
    _tile_loadd(7, x0 + T, 64);     // token tile 0, lo
    _tile_dpbf16ps(0, 4, 6);
    _tile_dpbf16ps(2, 5, 6);
    _tile_dpbf16ps(0, 4, 7);
    _tile_dpbf16ps(2, 5, 7);
    _tile_loadd(6, x1, 64);
    _tile_loadd(7, x1 + T, 64);
    _tile_dpbf16ps(1, 4, 6);
    _tile_dpbf16ps(3, 5, 6);
    _tile_dpbf16ps(1, 4, 7);
    _tile_dpbf16ps(3, 5, 7);
    if constexpr (W_exact) continue;
    _tile_loadd(4, w + T, 64);      // row tile 0, lo
    _tile_loadd(5, w + 3 * T, 64);  // row tile 1, lo
    _tile_dpbf16ps(1, 4, 6);
    _tile_dpbf16ps(3, 5, 6);
    _tile_loadd(6, x0, 64);
    _tile_dpbf16ps(0, 4, 6);
    _tile_dpbf16ps(2, 5, 6);
  }
  _tile_stored(0, c, 64);
  _tile_stored(1, c + 256, 64);
  _tile_stored(2, c + 512, 64);
  _tile_stored(3, c + 768, 64);
}

/// A C tile (16 rows x 16 tokens at c) into Y: token t0 + i's outputs of
/// rows [r, r + n_rows) at y + (t0 + i) ldy + r, for the tile's tokens below
/// n_tokens. stream: n_rows >= 16 and every row 64-byte aligned, so the
/// lines go by non-temporal stores (written whole, once: no read of the
/// line first; the caller fences).
inline void store_tile(const float* c, std::size_t t0, std::size_t n_tokens, std::size_t r, std::size_t n_rows,
                       float* y, std::size_t ldy, bool stream) noexcept {
  __m512 v[16];
  for (std::size_t i = 0; i < 16; ++i) v[i] = _mm512_load_ps(c + 16 * i);
  transpose16x16(v);  // row i: token i
  const std::size_t n = std::min<std::size_t>(16, n_tokens - std::min(n_tokens, t0));
  if (stream) {
    for (std::size_t i = 0; i < n; ++i) _mm512_stream_ps(y + (t0 + i) * ldy + r, v[i]);
    return;
  }
  const __mmask16 m = n_rows >= 16 ? __mmask16(0xFFFF) : __mmask16((1u << n_rows) - 1);
  for (std::size_t i = 0; i < n; ++i) _mm512_mask_storeu_ps(y + (t0 + i) * ldy + r, m, v[i]);
}

/// Y[:, p0 32 : p1 32) (clipped to rows) for the token tiles laid out at
/// xt (n_pairs pairs, tokens [t0, t0 + n_tokens) of Y).
template <class T>
inline void panels(const T* w, std::size_t rows, std::size_t cols, const std::uint16_t* xt, std::size_t n_pairs,
                   std::size_t t0, std::size_t n_tokens, float* y, std::size_t p0, std::size_t p1) {
  const std::size_t nc = cols / 32, ntt = 2 * n_pairs;
  std::uint16_t* panel = scratch<std::uint16_t, 1>(kc_chunks * 4 * tile_u16);
  float* cs = scratch<float, 1>(group_panels * n_pairs * 4 * S::tile_floats);
  quant::detail::amx::tiles_on tiles(64, 16);  // every tile 16 rows x 64 bytes
  for (std::size_t g = p0; g < p1; g += group_panels) {
    const std::size_t gn = std::min(group_panels, p1 - g);
    for (std::size_t c0 = 0; c0 < nc; c0 += kc_chunks) {
      const std::size_t c1 = std::min(nc, c0 + kc_chunks);
      // the C tiles that call i (panel p, pair q: p n_pairs + q) of this pass
      // loads, i = gn n_pairs being the next pass's first; null where none
      auto c_of_call = [&](std::size_t i) -> const float* {
        if (i == gn * n_pairs) return c1 < nc ? cs : nullptr;
        return c0 > 0 ? cs + i * 4 * S::tile_floats : nullptr;
      };
      for (std::size_t p = 0; p < gn; ++p) {
        const std::size_t r = (g + p) * 32;
        split_panel(w, cols, r, std::min<std::size_t>(32, rows - r), c0, c1, panel);
        // the next slice split: the group's next panel, else its first at the next pass, else the next group's;
        // its rows asked for a few per call rather than all at once (a burst of 256 prefetches held up
        // the tile loads behind it: 1.04x the tiles' GFLOP/s spread so, kestrel-bench-gemm)
        const std::size_t nr = p + 1 < gn ? r + 32 : c1 < nc ? g * 32 : (g + gn) * 32;
        const std::size_t nc0 = p + 1 < gn ? c0 : c1 < nc ? c1 : 0;
        const std::size_t pn = nr < p1 * 32 && nr < rows ? std::min<std::size_t>(32, rows - nr) : 0;
        const std::size_t per = (pn + n_pairs - 1) / n_pairs;
        for (std::size_t q = 0; q < n_pairs; ++q) {
          const std::size_t j0 = std::min(pn, q * per), j1 = std::min(pn, j0 + per);
          if (j0 < j1) prefetch_slice(w, cols, nr + j0, j1 - j0, nc0, std::min(nc, nc0 + kc_chunks));
          tiles_2x2<hi_exact<T>>(panel, xt + (2 * q * nc + c0) * 2 * tile_u16, xt + ((2 * q + 1) * nc + c0) * 2 * tile_u16, c1 - c0,
                    cs + (p * n_pairs + q) * 4 * S::tile_floats, c0 == 0,
                    c_of_call(p * n_pairs + q + 1));
        }
      }
    }
    // Y token tile by token tile across the group's rows (each token's
    // piece of Y, up to 256 floats, written 16 at a time); streamed past the caches
    // where the call's output is large (quant/amx.hpp's store_token_tiles
    // does the same for the int8 tiles, and why)
    const bool stream = reinterpret_cast<std::uintptr_t>(y) % 64 == 0 && rows % 16 == 0 &&
                        n_tokens * rows * sizeof(float) >= quant::detail::amx::stream_output_bytes;
    for (std::size_t tt = 0; tt < ntt; ++tt)
      for (std::size_t p = 0; p < gn; ++p) {
        const std::size_t r = (g + p) * 32;
        for (std::size_t a = 0; a < 2 && r + 16 * a < rows; ++a) {
          const float* c = cs + ((p * n_pairs + tt / 2) * 4 + 2 * a + tt % 2) * S::tile_floats;
          const std::size_t n_rows = rows - r - 16 * a;
          store_tile(c, tt * 16, n_tokens, r + 16 * a, n_rows, y + t0 * rows, rows, stream && n_rows >= 16);
        }
      }
  }
  _mm_sfence();  // the streamed lines before the pool's signal that this share is done
}

}  // namespace detail::amx_gemm

/// For each block of up to block_tokens tokens of x (n_tokens rows of
/// cols): lays the block out as B tiles (in parallel, into the calling
/// thread's scratch), then calls f(t0, nt, xt, n_pairs) (the block's first
/// token, its tokens, the layout, its pairs of 16-token tiles). Products
/// with one X (prefill's q, k and v; gate and up) share the layout:
/// gemm_amx_block per matrix inside f.
template <class F>
inline void gemm_amx_token_blocks(const float* x, std::size_t n_tokens, std::size_t cols, thread_pool* pool, F&& f) {
  namespace D = detail::amx_gemm;
  const std::size_t nc = cols / 32;
  for (std::size_t t0 = 0; t0 < n_tokens; t0 += D::block_tokens) {
    const std::size_t nt = std::min(D::block_tokens, n_tokens - t0), n_pairs = (nt + 31) / 32;
    std::uint16_t* xt = detail::scratch<std::uint16_t, 2>(2 * n_pairs * nc * 2 * D::tile_u16);
    const float* xb = x + t0 * cols;
    parallel_for(pool, 2 * n_pairs, [&](std::size_t a, std::size_t b) { D::layout_tokens(xb, nt, cols, a, b, xt); },
                 nt * cols * 16);
    f(t0, nt, static_cast<const std::uint16_t*>(xt), n_pairs);
  }
}

/// Y's tokens [t0, t0 + nt) = that block of X (laid out at xt by
/// gemm_amx_token_blocks) times W^T; threads take the 32-row panels.
/// w: (rows, cols); y: (n_tokens, rows), the whole of Y.
template <class T>
inline void gemm_amx_block(const T* w, std::size_t rows, std::size_t cols, const std::uint16_t* xt,
                           std::size_t n_pairs, std::size_t t0, std::size_t nt, float* y, thread_pool* pool) {
  parallel_for(pool, (rows + 31) / 32, [&](std::size_t p0, std::size_t p1) {
    detail::amx_gemm::panels(w, rows, cols, xt, n_pairs, t0, nt, y, p0, p1);
  }, nt * rows * cols);
}

/// Y = X W^T on the bf16 tiles; gemm_amx_available(cols) must hold. w:
/// (rows, cols); x: (n_tokens, cols); y: (n_tokens, rows); row-major. pool
/// may be null.
template <class T>
inline void gemm_amx(const T* w, std::size_t rows, std::size_t cols, const float* x, std::size_t n_tokens, float* y,
                     thread_pool* pool) {
  if (rows == 0 || n_tokens == 0) return;
  gemm_amx_token_blocks(x, n_tokens, cols, pool,
                        [&](std::size_t t0, std::size_t nt, const std::uint16_t* xt, std::size_t n_pairs) {
                          gemm_amx_block(w, rows, cols, xt, n_pairs, t0, nt, y, pool);
                        });
}

#else

template <class T>
inline void gemm_amx(const T*, std::size_t, std::size_t, const float*, std::size_t, float*, thread_pool*) {
  assert(!"gemm_amx without AMX-BF16 in the build: gemm_amx_available() said false");
}
template <class F>
inline void gemm_amx_token_blocks(const float*, std::size_t, std::size_t, thread_pool*, F&&) {
  assert(!"gemm_amx_token_blocks without AMX-BF16 in the build: gemm_amx_available() said false");
}
template <class T>
inline void gemm_amx_block(const T*, std::size_t, std::size_t, const std::uint16_t*, std::size_t, std::size_t,
                           std::size_t, float*, thread_pool*) {
  assert(!"gemm_amx_block without AMX-BF16 in the build: gemm_amx_available() said false");
}

#endif

}  // namespace kestrel::cpu
