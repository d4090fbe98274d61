// kestrel/quant/kquant_amx.hpp: the prefill of the k-quants with mins
// (q2_K, q4_K, q5_K weights against q8_K activations) on Intel AMX tiles,
// where the CPU has AMX-INT8 and Linux lets the process use it
// (amx_enabled, quant/amx.hpp):
//
//   kp::pack_kpanel<B>(...) -> amx::pack_kamx<B>(kpanel_block, kamx_block)  // per block of a 16-row panel
//   amx::pack_kacts<B>(a, n_tokens, nb, k, acts + k * nb);                  // tokens 16k .. 16k + 15
//   amx::configure_tiles(k_tile_bytes, k_tile_rows);
//   amx::kpanel_tiles<B>(panel, n_rows, acts, nb, k0, k1, n_tokens, out, out_stride);
//   amx::release();
//   // out[t * out_stride + r] == the VNNI panels' (kquant_panels.hpp) bit for bit
//
// ---- the arithmetic ----
//
// A super-block of 256 values of row r against token t, as the VNNI panels
// compute it: the exact integers
//   S = sum_j sc_j sum_{i in j} q_i a_i      (sc_j: sub-block j's scale, <= 63)
//   M = sum_j m_j sum_{i in j} a_i           (m_j: its min, <= 63)
// then acc = fma(d d_a, float(S), acc), accm = fma(dmin (-d_a), float(M),
// accm), and acc + accm after the last block. The VNNI panels get S from
// 64 vpdpbusd per token plus a vpmulld by sc_j per sub-block, and M from 8
// vpdpwssd over the activations' bsums: about 118 instructions per (token,
// 16 rows, 256 values), which bound them (bench/README.md).
//
// Here the scale goes into the weight bytes instead: split sc_j = 8 h_j +
// l_j (h, l in 0..7), so q_i l_j and q_i h_j fit an unsigned byte (q <= 31:
// at most 217), and S = S_l + 8 S_h with
//   S_l = sum_i (q_i l_j(i)) a_i,  S_h = sum_i (q_i h_j(i)) a_i
// two sums of byte products over the whole super-block, each a TDPBSUD
// (signed activation bytes x unsigned weight bytes) per 64 values: 8 tile
// products give a 16-token x 16-row tile of S_l and S_h, exact in int32
// (|S| <= 256 * 63 * 31 * 128 < 2^26). M stays with AVX-512, as the VNNI
// panels make it: int16 pairs of mins against the token's sums by
// vpdpwssd, 8 per token with 16-value sub-blocks (q2_K: the mins per
// bsum), 4 with 32-value ones (q4_K, q5_K: pairs (m_2k, m_2k+1) against
// the sub-block sums bsum_2j + bsum_2j+1, <= 32 * 128 = 4096, the same
// integer as 8 against the bsums). What is left per token is the float
// step once per super-block, the VNNI panels' own (the same instructions
// in the same block order), so every output equals theirs bit for bit.
// M on the tiles instead (a third B tile of the mins, 12 products) was
// the first version: it loads 16 KiB of tiles per 16 tokens x 16 rows x
// 256 values, and those loads, from L2 for all but the smallest panels,
// bound it. With M by vpdpwssd the loads are 12 KiB, and the float step
// (64 more vpdpwssd) runs beside the next block's tile work: 0.86-0.88 of
// the prefill time of Q4_K_M files (bench/README.md).
// (An earlier try put only the products of each sub-block on tiles and left
// the scale multiplies and the bsum term to AVX-512, whose per-token work
// then bound it: 0.955-1.06 of the VNNI time, dropped; bench/README.md.)
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "kestrel/core/diagnostics.hpp"
#include "kestrel/quant/amx.hpp"
#include "kestrel/quant/kquant_panels.hpp"

#if defined(KESTREL_AMX) && defined(KESTREL_KQUANT_PANEL)
#define KESTREL_KQUANT_AMX 1
#endif

KESTREL_INTRINSICS_BEGIN  // GCC 12 (core/diagnostics.hpp)

namespace kestrel::quant {

/// The k-quant types whose prefill runs on tiles: a min per sub-block and
/// codes times a 3-bit scale part within a byte (q2_K's codes <= 3, q4_K's
/// <= 15, q5_K's <= 31; the scales and mins <= 63).
template <class B>
inline constexpr bool kquant_on_tiles =
    std::is_same_v<B, block_q2_K> || std::is_same_v<B, block_q4_K> || std::is_same_v<B, block_q5_K>;

#if defined(KESTREL_KQUANT_AMX)

namespace detail::amx {

/// Sums per token that meet the mins: the bsums (16-value sub-blocks) or
/// the 8 sub-block sums (32-value ones).
template <class B> inline constexpr int min_pairs = kp::sub16<B> ? 8 : 4;  // vpdpwssd per token and block

/// One super-block of a 16-row panel as B tiles, one per 64 values (step
/// s) and term: lo[s][k / 4][4 r + k % 4] = q l of value 64 s + k of row r,
/// hi the same with h; coef[k] lane r = row r's int16 pair of mins meeting
/// the token's sums 2k, 2k + 1 (k < min_pairs<B>); d and dmin the rows'
/// scales as floats (as the VNNI panels' kpanel_block has them).
struct alignas(64) kamx_block {
  std::uint8_t lo[4][16][64], hi[4][16][64];
  __m512i coef[8];
  float d[16], dmin[16];
};
static_assert(sizeof(kamx_block) == 8 * 1024 + 512 + 128);

/// The B tiles of one packed VNNI block (kp::kpanel_block, from a
/// row-major or an x16 matrix): kpanel_block::codes[16 s + i] already lies
/// as row i of step s's tile (four values of each row per 32-bit lane), and
/// lane r of scale[2 u + h] and word h of coef[u] are row r's scale and min
/// of unit u's half h (values 32 u + 16 h ..). The byte products by the
/// scale parts come from vpmullw: both words of a lane times the part, each
/// byte's product below 256, so nothing carries into the byte above.
/// With 32-value sub-blocks kpanel_block::coef[j] is sub-block j's pair
/// (m_j, m_j), and a blend of words makes the pairs (m_2k, m_2k+1); with
/// 16-value ones (q2_K) it is already the pair that meets bsums 2j, 2j + 1.
template <class B>
inline void pack_kamx(const kp::kpanel_block& k, kamx_block& o) noexcept {
  static_assert(kquant_on_tiles<B>);
  const __m512i seven = _mm512_set1_epi32(7);
  for (int s = 0; s < 4; ++s) {
    for (int i = 0; i < 16; ++i) {
      const int u = 2 * s + i / 8, h = (i % 8) / 4;
      const __m512i codes = k.codes[16 * s + i];
      const __m512i sc = k.scale[2 * u + h];
      const __m512i l = _mm512_and_si512(sc, seven), hh = _mm512_srli_epi32(sc, 3);
      const __m512i lw = _mm512_or_si512(l, _mm512_slli_epi32(l, 16)), hw = _mm512_or_si512(hh, _mm512_slli_epi32(hh, 16));
      _mm512_store_si512(o.lo[s][i], _mm512_mullo_epi16(codes, lw));
      _mm512_store_si512(o.hi[s][i], _mm512_mullo_epi16(codes, hw));
    }
  }
  for (int j = 0; j < 8; ++j)
    o.coef[j] = kp::sub16<B> ? k.coef[j]
                : j < 4      ? _mm512_mask_blend_epi16(0xAAAAAAAAu, k.coef[2 * j], k.coef[2 * j + 1])
                             : _mm512_setzero_si512();
  _mm512_store_ps(o.d, k.d);
  _mm512_store_ps(o.dmin, k.dmin);
}

/// One super-block of a tile of 16 tokens: q[s][i] token i's values 64 s
/// .. 64 s + 63, sums[i] its sums that meet the mins (the first 2
/// min_pairs<B>), d[i] its d_a; tokens past the call's are zero.
struct alignas(64) kact_block {
  std::int8_t q[4][16][64];
  std::int16_t sums[16][16];
  float d[16];
};
static_assert(sizeof(kact_block) == 4 * 1024 + 512 + 64);

/// Tokens [16 tile, 16 tile + 16) of a call (nb q8_K blocks per token) as
/// nb kact_blocks at dst, with B's sums.
template <class B>
inline void pack_kacts(const block_q8_K* a, std::size_t n_tokens, std::size_t nb, std::size_t tile,
                       kact_block* dst) noexcept {
  const std::size_t t0 = tile * token_tile, n = std::min(token_tile, n_tokens - t0);
  for (std::size_t b = 0; b < nb; ++b) {
    kact_block& o = dst[b];
    for (std::size_t i = 0; i < token_tile; ++i) {
      const block_q8_K* src = i < n ? &a[(t0 + i) * nb + b] : nullptr;
      for (int s = 0; s < 4; ++s)
        _mm512_store_si512(o.q[s][i], src ? _mm512_loadu_si512(src->qs + 64 * s) : _mm512_setzero_si512());
      for (int j = 0; j < 16; ++j)
        o.sums[i][j] = !src ? 0
                       : kp::sub16<B> ? src->bsums[j]
                       : j < 8        ? static_cast<std::int16_t>(src->bsums[2 * j] + src->bsums[2 * j + 1])
                                      : 0;
      o.d[i] = src ? src->d : 0.0f;
    }
  }
}

/// The tile shapes: configure_tiles(64, 16), every tile 16 rows x 64 bytes.
/// C: S_l, S_h in tiles 0, 1; A in 3; B: lo, hi in 4, 5.
inline constexpr std::uint16_t k_tile_bytes = 64;
inline constexpr std::uint8_t k_tile_rows = 16;

/// A panel's nb packed super-blocks against a tile of 16 tokens (nb
/// kact_blocks packed for B): acc[i] lane r = the VNNI panels' result for
/// row r, token i.
template <class B>
inline void ktile_16x16(const kamx_block* p, const kact_block* x, std::size_t nb, __m512* acc) noexcept {
  alignas(64) std::int32_t c[2][2][16][16];  // [buffer][S_l, S_h][token][row]
  asm volatile("" ::: "memory");  // tileloadd names no memory operand (see legacy_amx.hpp)
  __m512 y[token_tile], ym[token_tile];
#pragma GCC unroll 16
  for (std::size_t i = 0; i < token_tile; ++i) y[i] = ym[i] = _mm512_setzero_ps();
  auto products = [&](std::size_t b, std::int32_t (*ci)[16][16]) {
    _tile_zero(0);
    _tile_zero(1);
    for (int s = 0; s < 4; ++s) {
      _tile_loadd(4, p[b].lo[s], 64);
      _tile_loadd(3, x[b].q[s], 64);
      _tile_loadd(5, p[b].hi[s], 64);
      _tile_dpbsud(0, 3, 4);
      _tile_dpbsud(1, 3, 5);
    }
    _tile_stored(0, ci[0], 64);
    _tile_stored(1, ci[1], 64);
  };
  // The VNNI panels' bsum term and float step (kp::panel_group), token by token.
  auto step = [&](std::size_t b, const std::int32_t (*ci)[16][16]) {
    const __m512 dw = _mm512_load_ps(p[b].d), dm = _mm512_load_ps(p[b].dmin);
#pragma GCC unroll 16
    for (std::size_t i = 0; i < token_tile; ++i) {
      __m512i m = _mm512_setzero_si512();
#pragma GCC unroll 8
      for (int k = 0; k < min_pairs<B>; ++k) m = _mm512_dpwssd_epi32(m, p[b].coef[k], kp::bcast_u32(x[b].sums[i] + 2 * k));
      const __m512i s = _mm512_add_epi32(_mm512_load_si512(ci[0][i]), _mm512_slli_epi32(_mm512_load_si512(ci[1][i]), 3));
      ym[i] = _mm512_fmadd_ps(_mm512_mul_ps(dm, _mm512_set1_ps(-x[b].d[i])), _mm512_cvtepi32_ps(m), ym[i]);
      y[i] = _mm512_fmadd_ps(_mm512_mul_ps(dw, _mm512_set1_ps(x[b].d[i])), _mm512_cvtepi32_ps(s), y[i]);
    }
  };
  // Block b's products go to one buffer while the step reads block b - 1's
  // from the other (a vector load right after a tile store of its lines
  // waits for the store).
  products(0, c[0]);
  for (std::size_t b = 1; b < nb; ++b) {
    products(b, c[b % 2]);
    step(b - 1, c[(b - 1) % 2]);
  }
  step(nb - 1, c[(nb - 1) % 2]);
#pragma GCC unroll 16
  for (std::size_t i = 0; i < token_tile; ++i) acc[i] = _mm512_add_ps(y[i], ym[i]);
}

/// A packed panel (n_rows of its 16 real) against the packed tokens' tiles
/// [k0, k1) of a call of n_tokens: out[t * out_stride + r]. nb >= 1.
template <class B>
inline void kpanel_tiles(const kamx_block* p, std::size_t n_rows, const kact_block* x, std::size_t nb, std::size_t k0,
                         std::size_t k1, std::size_t n_tokens, float* out, std::size_t out_stride) noexcept {
  store_token_tiles(n_rows, k0, k1, n_tokens, out, out_stride,
                    [&](std::size_t k, __m512* acc) { ktile_16x16<B>(p, x + k * nb, nb, acc); });
}

/// Two packed panels of the same rows of two matrices (prefill's gate and
/// up) against the packed tokens' tiles [k0, k1): out[t * out_stride + r] =
/// combine(a_tr, b_tr), a and b each kpanel_tiles' result bit for bit
/// (legacy_amx.hpp's panel_tiles_pair for the k-quants).
template <class B, class Combine>
inline void kpanel_tiles_pair(const kamx_block* pa, const kamx_block* pb, std::size_t n_rows, const kact_block* x,
                              std::size_t nb, std::size_t k0, std::size_t k1, std::size_t n_tokens, float* out,
                              std::size_t out_stride, Combine&& combine) noexcept {
  store_token_tiles_pair(n_rows, k0, k1, n_tokens, out, out_stride,
                         [&](std::size_t k, __m512* acc) { ktile_16x16<B>(pa, x + k * nb, nb, acc); },
                         [&](std::size_t k, __m512* acc) { ktile_16x16<B>(pb, x + k * nb, nb, acc); }, combine);
}

}  // namespace detail::amx

#endif

}  // namespace kestrel::quant
KESTREL_INTRINSICS_END
