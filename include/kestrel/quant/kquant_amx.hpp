// kestrel/quant/kquant_amx.hpp: the k-quants' prefill (q2_K .. q6_K weights
// against q8_K activations) on AMX tiles where amx_enabled(), equal bit for
// bit to the VNNI panels of kquant_panels.hpp:
//
//   kact_block x[nb];  kamx::pack_acts(a, n_tokens, nb, tile, x);   // 16 tokens
//   kamx::panel_tiles<B>(panel, n_rows, x, nb, k0, k1, n_tokens, out, out_stride);
//   // panel: the kpanel_blocks of kquant_panels.hpp's pack_kpanel, as they are
//
// ---- the arithmetic ----
//
// kquant_panels.hpp's, per (row, token) and super-block: S = sum_g sc_g
// isum_g exact in int32, C = sum_k coef_k bsum_k, then the same float steps
// (acc = fma(d d8, float(S), acc); with mins accm = fma(-dmin d8, float(C),
// accm), without S - (C << offset_shift) first; acc + accm at the end). Only
// the isum_g come another way: a packed panel's codes for 32 values,
// codes[8u] .. codes[8u + 7] (lane r = row r's 4 codes 32u + 4g ..), are a
// B tile as they lie (8 rows of 64 bytes: value k of row r at row k / 4,
// byte 4r + k % 4), so one TDPBSUD of 16 tokens' 32 activation bytes
// (signed) by it (unsigned codes) leaves the 16 x 16 exact isum of a
// 32-value sub-block (q4_K, q5_K); the 16-value sub-blocks (q2_K, q3_K,
// q6_K) take two of 16 bytes and 4 rows. The sums go to memory and each
// token's row of them meets the sub-block's scales in a vpmulld, added into
// S: the same integers as the VNNI panels' chains, so the same bits.
//
// ---- why it pays ----
//
// Per super-block, 16 tokens and 16 rows the VNNI panels issue 16 x 64
// vpdpbusd and 16 x 8 scale multiplies; here 8 (or 16) tile products and 16
// x 8 (or 16 x 16) scale multiplies, the per-token bsum and float terms
// unchanged; those terms, not the tiles, bound it. Measured (one thread,
// 256 rows x 2048 or 5632 columns, 512 tokens): q4_K 1.1-1.25x the VNNI
// panels, q6_K 0.8x, so cpu/quantized.hpp takes the tiles for the 32-value
// types only (bench/README.md, "Intel with AMX").
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>

#include "kestrel/quant/amx.hpp"
#include "kestrel/quant/kquant_panels.hpp"

#if defined(KESTREL_AMX) && defined(KESTREL_KQUANT_PANEL)
#define KESTREL_KQUANT_AMX 1
#endif

namespace kestrel::quant {

#if defined(KESTREL_KQUANT_AMX)
namespace detail::kamx {

using amx::token_tile;

/// One super-block of a tile of 16 tokens: q[i] token i's 256 activation
/// bytes (an A tile of sub-block g is q[0] + 32 g, stride 256), bsums[i]
/// its 16 sums, d[i] its scale; tokens past the call's are zero.
struct alignas(64) kact_block {
  std::int8_t q[16][256];
  std::int16_t bsums[16][16];
  float d[16];
};

/// Tokens [16 tile, 16 tile + 16) of a call of n_tokens (activation blocks
/// a, nb per token) as nb kact_blocks.
inline void pack_acts(const block_q8_K* a, std::size_t n_tokens, std::size_t nb, std::size_t tile,
                      kact_block* dst) noexcept {
  const std::size_t t0 = tile * token_tile, n = std::min(token_tile, n_tokens - t0);
  for (std::size_t b = 0; b < nb; ++b) {
    kact_block& o = dst[b];
    for (std::size_t i = 0; i < token_tile; ++i) {
      if (i < n) {
        const block_q8_K& x = a[(t0 + i) * nb + b];
        std::memcpy(o.q[i], x.qs, sizeof x.qs);
        std::memcpy(o.bsums[i], x.bsums, sizeof x.bsums);
        o.d[i] = x.d;
      } else {
        std::memset(o.q[i], 0, sizeof o.q[i]);
        std::memset(o.bsums[i], 0, sizeof o.bsums[i]);
        o.d[i] = 0;
      }
    }
  }
}

/// The tiles for type B: A tiles of 32 activation bytes and B tiles of 8
/// rows (32-value sub-blocks), or 16 and 4 (16-value ones).
template <class B>
inline amx::tiles_on tiles() noexcept {
  if constexpr (kp::sub16<B>) return amx::tiles_on(16, 4);
  else return amx::tiles_on(32, 8);
}

/// A panel's nb packed super-blocks against a tile of 16 tokens: acc[i]
/// lane r = kp::panel_group's result for row r and token i, bit for bit.
template <class B>
inline void tile_16x16(const kp::kpanel_block* p, const kact_block* x, std::size_t nb, __m512* acc) noexcept {
  constexpr bool sub16 = kp::sub16<B>;
  constexpr int bytes = sub16 ? 16 : 32;  // activation bytes per tile product
  constexpr int steps = 256 / bytes;      // tile products per super-block (8 or 16)
  alignas(64) std::int32_t c[2][2][16][16];  // [buffer][product of the pair]
  // GCC's tileloadd names no memory operand: everything stored before
  // (the packed panel and tokens) must be in memory before the loads.
  asm volatile("" ::: "memory");
  __m512 accm[token_tile];
  for (std::size_t i = 0; i < token_tile; ++i) acc[i] = accm[i] = _mm512_setzero_ps();
  for (std::size_t b = 0; b < nb; ++b) {
    const kp::kpanel_block& pb = p[b];
    const kact_block& xb = x[b];
    __m512i tot[token_tile];
#pragma GCC unroll 16
    for (std::size_t i = 0; i < token_tile; ++i) tot[i] = _mm512_setzero_si512();
    // Product j: activation bytes [bytes j, bytes (j + 1)), codes rows
    // codes[bytes j / 4 ..] of the panel, scale j (sub16: scale[j]; else
    // scale[2j]). Two at a time, C in tiles 0 and 1, stored to one buffer
    // while the scale step reads the pair before from the other.
    auto products = [&](int j, std::int32_t (*ci)[16][16]) {
      _tile_zero(0);
      _tile_zero(1);
      _tile_loadd(2, xb.q[0] + bytes * j, 256);
      _tile_loadd(4, pb.codes + bytes * j / 4, 64);
      _tile_loadd(3, xb.q[0] + bytes * (j + 1), 256);
      _tile_loadd(5, pb.codes + bytes * (j + 1) / 4, 64);
      _tile_dpbsud(0, 2, 4);
      _tile_dpbsud(1, 3, 5);
      _tile_stored(0, ci[0], 64);
      _tile_stored(1, ci[1], 64);
    };
    auto scale = [&](int j, const std::int32_t (*ci)[16]) {
      const __m512i sc = pb.scale[sub16 ? j : 2 * j];
#pragma GCC unroll 16
      for (std::size_t i = 0; i < token_tile; ++i)
        tot[i] = _mm512_add_epi32(tot[i], _mm512_mullo_epi32(_mm512_load_si512(ci[i]), sc));
    };
    products(0, c[0]);
    for (int k = 1; k < steps / 2; ++k) {
      products(2 * k, c[k % 2]);
      scale(2 * k - 2, c[(k - 1) % 2][0]);
      scale(2 * k - 1, c[(k - 1) % 2][1]);
    }
    scale(steps - 2, c[(steps / 2 - 1) % 2][0]);
    scale(steps - 1, c[(steps / 2 - 1) % 2][1]);
    for (std::size_t i = 0; i < token_tile; ++i) {
      __m512i corr = _mm512_setzero_si512();
      for (int j = 0; j < 8; ++j) corr = _mm512_dpwssd_epi32(corr, pb.coef[j], kp::bcast_u32(xb.bsums[i] + 2 * j));
      if constexpr (kq::has_min<B>) {
        accm[i] = _mm512_fmadd_ps(_mm512_mul_ps(pb.dmin, _mm512_set1_ps(-xb.d[i])), _mm512_cvtepi32_ps(corr), accm[i]);
      } else {
        tot[i] = _mm512_sub_epi32(tot[i], _mm512_slli_epi32(corr, kq::offset_shift<B>));
      }
      acc[i] = _mm512_fmadd_ps(_mm512_mul_ps(pb.d, _mm512_set1_ps(xb.d[i])), _mm512_cvtepi32_ps(tot[i]), acc[i]);
    }
  }
  if constexpr (kq::has_min<B>)
    for (std::size_t i = 0; i < token_tile; ++i) acc[i] = _mm512_add_ps(acc[i], accm[i]);
}

/// A packed panel (n_rows of its 16 real) against the packed tokens' tiles
/// [k0, k1) of a call of n_tokens: out[t * out_stride + r].
template <class B>
inline void panel_tiles(const kp::kpanel_block* p, std::size_t n_rows, const kact_block* x, std::size_t nb,
                        std::size_t k0, std::size_t k1, std::size_t n_tokens, float* out,
                        std::size_t out_stride) noexcept {
  amx::store_token_tiles(n_rows, k0, k1, n_tokens, out, out_stride,
                         [&](std::size_t k, __m512* acc) { tile_16x16<B>(p, x + k * nb, nb, acc); });
}

}  // namespace detail::kamx
#endif

}  // namespace kestrel::quant
