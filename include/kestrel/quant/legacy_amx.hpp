// kestrel/quant/legacy_amx.hpp: the legacy types' prefill (q4_0, q4_1,
// q5_0, q5_1, q8_0 weights against q8_0 / q8_1 activations) on Intel AMX
// tiles, where the CPU has AMX-INT8 and Linux lets the process use it
// (amx_enabled, quant/amx.hpp):
//
//   amx::pack_panel<W>(rows, row_bytes, n_rows, nb, panel);   // 16 rows -> nb amx_blocks
//   amx::pack_acts(a, n_tokens, nb, k, acts + k * nb);        // tokens 16k .. 16k + 15 -> nb act_blocks
//   amx::configure();  amx::panel_tiles<W>(panel, n_rows, acts, nb, k0, k1, n_tokens, out, out_stride);  amx::release();
//   // out[t * out_stride + r] = ref::dot_fused(row r, token t), bit for bit
//
// ---- the arithmetic: the legacy panels' (legacy_tokens.hpp), bit for bit ----
//
// One TDPBSSD multiplies a tile of 16 tokens x 32 activation bytes (one
// block of each token, A, packed once per call) by a block of 16 rows' 32
// values (B, in the tile's 4-byte group layout: row k / 4 of the tile holds
// value k of every row in the 4 bytes of its column), leaving in C[t][r]
// the exact integer block sum isum_b of token t and row r. Values are
// signed bytes: q8_0's as stored, q4_0 / q5_0's code minus 8 / 16, q4_1 /
// q5_1's codes (0 .. 31) as they are, so no offset term; |isum_b| <= 32 *
// 128 * 128 = 2^19, exact in int32 and in float. C goes to memory (1 KiB)
// and every token's row of it, 16 rows' sums in one zmm, takes the
// per-block step of ref::dot_fused:
//   y = fma(d_w d_a, float(isum_b), y);  y = fma(m_w, s_a, y) (_1 types)
// the same instructions, in the same block order, as the VNNI panels, so
// every output equals theirs and ref::dot_fused's bit for bit.
//
// ---- why it pays ----
//
// With VNNI a (token, block) of a 16-row panel costs 8 vpdpbusd and 3 float
// operations; here the 8 x 16 vpdpbusd of 16 tokens are one TDPBSSD (16 x 16
// x 32 multiply-adds), and what is left per token is the float step: a
// convert, a multiply and an FMA per block. A tile product cannot be summed
// over blocks (each block has its own scales), so that step and the tile
// store per block bound the kernel. Measured, and what else was tried:
// bench/README.md, "Intel with AMX".
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <vector>

#include "kestrel/core/diagnostics.hpp"
#include "kestrel/quant/legacy_tokens.hpp"

#include "kestrel/quant/amx.hpp"

#if defined(KESTREL_AMX) && defined(KESTREL_LEGACY_PANEL)
#define KESTREL_LEGACY_AMX 1
#endif

KESTREL_INTRINSICS_BEGIN  // GCC 12 (core/diagnostics.hpp)

namespace kestrel::quant {

#if defined(KESTREL_LEGACY_AMX)

namespace detail::amx {

inline constexpr std::size_t panel_rows = 16;

/// One weight block of a 16-row panel as a B tile: b[k / 4][4 r + k % 4] =
/// value k of row r (signed, offset removed); d, m the rows' scales and
/// offsets as floats (0 for rows past the matrix).
struct alignas(64) amx_block {
  std::int8_t b[8][64];
  float d[16], m[16];
};
static_assert(sizeof(amx_block) == 640);

/// Rows [0, n_rows) (1 <= n_rows <= 16, row_bytes apart) of a matrix, its
/// blocks [0, nb), as nb amx_blocks. The VNNI panels' gather (codes value +
/// o in the same 4-byte layout) with the offset taken back out.
template <class W>
inline void pack_panel(const std::byte* rows, std::size_t row_bytes, std::size_t n_rows, std::size_t nb,
                       amx_block* dst) noexcept {
  const lp::panel_rows_at at = lp::rows_at(rows, row_bytes, n_rows);
  const __m512i o = _mm512_set1_epi8(static_cast<char>(code_offset<W>));
  lp::panel_block pb;
  for (std::size_t b = 0; b < nb; ++b) {
    lp::gather_block<W>(at, b * sizeof(W), pb);
    for (int g = 0; g < 8; ++g) _mm512_store_si512(dst[b].b[g], _mm512_sub_epi8(pb.codes[g], o));
    _mm512_store_ps(dst[b].d, pb.d);
    _mm512_store_ps(dst[b].m, pb.m);
  }
}

/// One block of a tile of 16 tokens, as the A tile and the float step take
/// it: q[i] token i's 32 activation bytes, d[i] and s[i] its d_a and s_a
/// (s for q8_1 only) as floats; tokens past the call's are zero.
struct alignas(64) act_block {
  std::int8_t q[16][32];
  float d[16], s[16];
};
static_assert(sizeof(act_block) == 640);

/// Tokens [0, n_tokens) of a call (activation blocks a, nb per token) as
/// ceil(n_tokens / 16) tiles of nb act_blocks each, tile k's at dst + k nb.
template <class A>
inline void pack_acts(const A* a, std::size_t n_tokens, std::size_t nb, std::size_t tile, act_block* dst) noexcept {
  const std::size_t t0 = tile * token_tile, n = std::min(token_tile, n_tokens - t0);
  for (std::size_t b = 0; b < nb; ++b) {
    act_block& o = dst[b];
    alignas(32) std::uint16_t d[16] = {}, s[16] = {};  // f16 bits; the lanes past n stay 0
    for (std::size_t i = 0; i < n; ++i) {
      const A& x = a[(t0 + i) * nb + b];
      _mm256_store_si256(reinterpret_cast<__m256i*>(o.q[i]), _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x.qs)));
      d[i] = x.d.bits;
      if constexpr (requires { x.s; }) s[i] = x.s.bits;
    }
    for (std::size_t i = n; i < token_tile; ++i) _mm256_store_si256(reinterpret_cast<__m256i*>(o.q[i]), _mm256_setzero_si256());
    // f16 -> f32 exactly, as to_f32 (and the VNNI panels' scales) convert
    _mm512_store_ps(o.d, _mm512_cvtph_ps(_mm256_load_si256(reinterpret_cast<const __m256i*>(d))));
    _mm512_store_ps(o.s, _mm512_cvtph_ps(_mm256_load_si256(reinterpret_cast<const __m256i*>(s))));
  }
}

/// The tile shapes: C in tiles 0 and 1 (16 x 16 int32), A in 2 and 3 (16
/// tokens x 32 bytes), B in 4 and 5 (8 x 64 bytes).
inline void configure() noexcept { configure_tiles(32, 8); }

/// A panel's nb packed blocks against a tile of 16 tokens (nb act_blocks):
/// acc[i] lane r = the fused loop for row r and token i.
template <class W>
inline void tile_16x16(const amx_block* p, const act_block* x, std::size_t nb, __m512* acc) noexcept {
  alignas(64) std::int32_t c[2][2][16][16];  // [buffer][block of the pair]
  // GCC's tileloadd names no memory operand: everything stored before
  // (the packed panel and tokens) must be in memory before the loads.
  asm volatile("" ::: "memory");
  __m512 y[token_tile];  // in registers: the loops over it are unrolled
#pragma GCC unroll 16
  for (std::size_t i = 0; i < token_tile; ++i) y[i] = _mm512_setzero_ps();
  auto step = [&](std::size_t b, const std::int32_t (*ci)[16]) {
    const __m512 dw = _mm512_load_ps(p[b].d);
#pragma GCC unroll 16
    for (std::size_t i = 0; i < token_tile; ++i) {
      y[i] = _mm512_fmadd_ps(_mm512_mul_ps(dw, _mm512_set1_ps(x[b].d[i])), _mm512_cvtepi32_ps(_mm512_load_si512(ci[i])),
                             y[i]);
      if constexpr (has_offset_m<W>) y[i] = _mm512_fmadd_ps(_mm512_load_ps(p[b].m), _mm512_set1_ps(x[b].s[i]), y[i]);
    }
  };
  // Two blocks' products at a time (C in tiles 0 and 1), stored to one of
  // two buffers while the float step reads the pair before from the other:
  // a vector load of a tile store's lines right after it waits for the
  // store to reach L1 (no forwarding).
  auto products = [&](std::size_t b, std::int32_t (*ci)[16][16]) {
    _tile_zero(0);
    _tile_zero(1);
    _tile_loadd(2, x[b].q, 32);
    _tile_loadd(4, p[b].b, 64);
    _tile_loadd(3, x[b + 1].q, 32);
    _tile_loadd(5, p[b + 1].b, 64);
    _tile_dpbssd(0, 2, 4);
    _tile_dpbssd(1, 3, 5);
    _tile_stored(0, ci[0], 64);
    _tile_stored(1, ci[1], 64);
  };
  const std::size_t pairs = nb / 2;
  if (pairs > 0) products(0, c[0]);
  for (std::size_t i = 1; i < pairs; ++i) {
    products(2 * i, c[i % 2]);
    step(2 * i - 2, c[(i - 1) % 2][0]);
    step(2 * i - 1, c[(i - 1) % 2][1]);
  }
  if (pairs > 0) {
    step(2 * pairs - 2, c[(pairs - 1) % 2][0]);
    step(2 * pairs - 1, c[(pairs - 1) % 2][1]);
  }
  if (nb % 2) {
    const std::size_t b = nb - 1;
    _tile_zero(0);
    _tile_loadd(2, x[b].q, 32);
    _tile_loadd(4, p[b].b, 64);
    _tile_dpbssd(0, 2, 4);
    _tile_stored(0, c[0][0], 64);
    step(b, c[0][0]);
  }
#pragma GCC unroll 16
  for (std::size_t i = 0; i < token_tile; ++i) acc[i] = y[i];
}

/// A packed panel (n_rows of its 16 real) against the packed tokens' tiles
/// [k0, k1) of a call of n_tokens: out[t * out_stride + r].
template <class W>
inline void panel_tiles(const amx_block* p, std::size_t n_rows, const act_block* x, std::size_t nb, std::size_t k0,
                        std::size_t k1, std::size_t n_tokens, float* out, std::size_t out_stride) noexcept {
  store_token_tiles(n_rows, k0, k1, n_tokens, out, out_stride,
                    [&](std::size_t k, __m512* acc) { tile_16x16<W>(p, x + k * nb, nb, acc); });
}

/// Two packed panels of the same rows of two matrices (prefill's gate and
/// up) against the packed tokens' tiles [k0, k1): out[t * out_stride + r] =
/// combine(a_tr, b_tr) (16 rows at a time, as __m512), a and b each
/// panel_tiles' result bit for bit, so that the two products never go to
/// memory (cpu::matmul_swiglu).
template <class W, class Combine>
inline void panel_tiles_pair(const amx_block* pa, const amx_block* pb, std::size_t n_rows, const act_block* x,
                             std::size_t nb, std::size_t k0, std::size_t k1, std::size_t n_tokens, float* out,
                             std::size_t out_stride, Combine&& combine) noexcept {
  store_token_tiles_pair(n_rows, k0, k1, n_tokens, out, out_stride,
                         [&](std::size_t k, __m512* acc) { tile_16x16<W>(pa, x + k * nb, nb, acc); },
                         [&](std::size_t k, __m512* acc) { tile_16x16<W>(pb, x + k * nb, nb, acc); }, combine);
}

}  // namespace detail::amx

#endif

}  // namespace kestrel::quant
KESTREL_INTRINSICS_END
