// kestrel/quant/kquant_panels.hpp: the k-quant dots (q2_K .. q6_K weights
// against q8_K activations) for a tile of rows x tokens with AVX-512 VNNI,
// the kernel of quantized prefill:
//
//   kpanel_block blocks[nb];  pack_kpanel<B>(rows, row_bytes, n_rows, nb, blocks);  // once per call
//   kpanel_tokens<B>(blocks, n_rows, a, nb, n_tokens, out, out_stride);
//   // out[t * out_stride + r] ~ vec_dot(row r, token t), within gamma_(nb + 3) T of exact
//
// quant/kquants.hpp's kernel applies each sub-block's scale with vpmaddubsw
// + vpdpwssd: 32 multiply-adds per two 256-bit instructions, half of what
// vpdpbusd does alone, which caps prefill near half the int8 peak. Here a
// panel of 16 rows meets a group of up to 4 tokens (token_group) the way
// the legacy types meet 8 (quant/legacy_tokens.hpp): the rows' codes are
// laid out once per call with one row per int32 lane, register 8u + g
// holding codes 32u + 4g .. 32u + 4g + 3 of each row, so a 32-value unit takes 8 vpdpbusd with the
// token's 4 activation bytes broadcast (512 multiply-adds for 16 rows), no
// horizontal sums. Each 16-value half of the unit is its own chain of 4
// vpdpbusd; with 16-value sub-blocks (q2_K, q3_K, q6_K) each chain's int32
// sum then meets its sub-block scale in one vpmulld and one vpaddd, with
// 32-value ones (q4_K, q5_K) the two chains are added first and share one
// vpmulld (two chains of 4 rather than one of 8: 1.17x, as the latency of
// a chain, not the throughput, was the limit). Per block and token, the bsum term
// (the mins, or the scales times the code offset) takes 8 vpdpwssd of int16
// pairs with the token's bsums (broadcast), and the float scales one
// convert and one FMA per accumulator.
//
// ---- the arithmetic, per (row, token) ----
//
// With codes v (unsigned: the kernel's unpack_codes in kquants.hpp gives
// them, code offsets o = 4 (q3_K), 32 (q6_K), 0 otherwise), per block:
//   S    = sum_g sc_g sum_{i in g} v_i a_i                      exact int32
//   C    = sum_k coef_k bsum_k  (coef: mins (q2/q4/q5_K) per 16 values, or scales (q3/q6_K))
//   with a min:    acc  = fma(d d8, float(S), acc);  accm = fma(-dmin d8, float(C), accm)
//   without one:   acc  = fma(d d8, float(S - o C), acc)
// and the result is acc + accm (or acc). The integers are kquants.hpp's (its
// header bounds them below 2^31; a chain's partial sums are smaller still),
// computed in a different order but exactly, so the only roundings are
// float(S) (1), d d8 (1), the FMA chain over nb blocks (nb) and the final
// addition (1): every term passes at most nb + 3 roundings, |result - exact|
// <= gamma_(nb + 3) T with T the sum of the terms' magnitudes, inside the
// gamma_(2 nb + 6) T that vec_dot is held to (both derived in
// tests/quant/test_kquants_simd.cpp). A token's arithmetic is the same
// instruction sequence for every group size, row count and tiling, so its
// outputs do not depend on the tokens beside it; they are not bit-identical
// to vec_dot's (8 float lanes per row), only within both bounds of it.
//
// Packing (once per call and weight block, amortized over the call's tokens):
// each of the 16 rows is unpacked by kquants.hpp's unpack_codes into row-major
// scratch, and the scratch is turned into lanes by 16 x 16 dword transposes.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>

#include "kestrel/core/diagnostics.hpp"
#include "kestrel/quant/kquants.hpp"
#include "kestrel/quant/token_groups.hpp"

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VNNI__) && defined(__AVX512VL__)
#include <immintrin.h>

#include "kestrel/cpu/transpose.hpp"
#define KESTREL_KQUANT_PANEL 1
#endif

KESTREL_INTRINSICS_BEGIN  // GCC 12 (core/diagnostics.hpp)

namespace kestrel::quant {

/// Below this many tokens a call keeps vec_dot_tokens, whose token groups
/// unpack each weight block per group instead of packing it once per call.
/// Measured crossover (kestrel-bench-kquant --prefill --tokens N, one thread,
/// 5632 x 2048): q4_K 12-16 tokens (16: panels 1.07x, 32: 1.49x); q6_K,
/// whose packing costs more, 24-32 (24: 1.01x, 32: 1.04x; 512 tokens: 3x).
template <class B> inline constexpr std::size_t kpanel_min_tokens = 32;
template <> inline constexpr std::size_t kpanel_min_tokens<block_q4_K> = 16;
template <> inline constexpr std::size_t kpanel_min_tokens<block_q5_K> = 16;

#if defined(KESTREL_KQUANT_PANEL)
namespace detail::kp {

inline constexpr std::size_t panel_rows = 16;  // one row per int32 / float lane of a zmm
/// Tokens per load of a unit's codes. 4, not the legacy panels' 8: per
/// token a group keeps tot, acc and (with mins) accm registers beside the 8
/// of codes, so 8 tokens took 32 zmm and GCC spilled tot every unit and
/// reloaded codes; 4 fit. Measured (kestrel-bench-kquant --prefill, one
/// thread, 512 tokens, alternated, two rounds, GOP/s) 8 -> 4 tokens: q4_K
/// 2048 x 768 171-190 -> 207-219, 768 x 2048 186-213 -> 217-270, 5632 x 2048
/// 205-222 -> 231-285; q6_K 139-146 -> 197-201, 153-158 -> 200-211, 165-180
/// -> 242-246; 2 tokens fell below 8. (The legacy panels' single chain of 8
/// vpdpbusd per token needs 8 tokens in flight: 4 measured no better there.)
inline constexpr std::size_t token_group = 4;

/// Sub-blocks of 16 values (two scales per 32-value unit) or of 32.
template <class B> inline constexpr bool sub16 = true;
template <> inline constexpr bool sub16<block_q4_K> = false;
template <> inline constexpr bool sub16<block_q5_K> = false;

/// One super-block of a 16-row panel: codes[8u + g] lane r = row r's codes
/// 32u + 4g .. 32u + 4g + 3 (bytes), scale[2u + h] lane r = the int32 scale
/// of values 32u + 16h .. 32u + 16h + 15, coef[j] lane r = the int16 pair
/// (coef_2j, coef_2j+1) that meets bsums 2j, 2j + 1, d and dmin lane r.
struct alignas(64) kpanel_block {
  __m512i codes[64];
  __m512i scale[16];
  __m512i coef[8];
  __m512 d, dmin;
};

/// Packs blocks [0, nb) of rows [0, n_rows) (1 <= n_rows <= 16, rows
/// row_bytes apart; rows past n_rows repeat the last) into dst[0, nb).
template <class B>
inline void pack_kpanel(const std::byte* rows, std::size_t row_bytes, std::size_t n_rows, std::size_t nb,
                        kpanel_block* dst) noexcept {
  struct alignas(64) row_scratch {
    std::uint32_t codes[64];
    std::int32_t scale[16], coef[16];
  };
  alignas(64) row_scratch rs[16];
  alignas(64) float d[16], dmin[16];
  alignas(32) std::int16_t s16[16];
  kq::block_codes c;
  auto transpose = [](const void* first, std::size_t stride_bytes, __m512i* out) {
    __m512 r[16];
    for (int i = 0; i < 16; ++i)
      r[i] = _mm512_load_ps(reinterpret_cast<const float*>(static_cast<const std::byte*>(first) + i * stride_bytes));
    cpu::detail::transpose16x16(r);
    for (int i = 0; i < 16; ++i) out[i] = _mm512_castps_si512(r[i]);
  };
  for (std::size_t b = 0; b < nb; ++b) {
    for (std::size_t r = 0; r < 16; ++r) {
      const B& blk = reinterpret_cast<const B*>(rows + std::min(r, n_rows - 1) * row_bytes)[b];
      kq::unpack_codes(blk, c);
      for (int k = 0; k < 8; ++k) {
        _mm256_store_si256(reinterpret_cast<__m256i*>(rs[r].codes + 8 * k), c.v[k]);
        _mm256_store_si256(reinterpret_cast<__m256i*>(s16), c.s[k]);  // int16 scale of each vpmaddubsw pair
        rs[r].scale[2 * k] = s16[0];       // values 32k .. 32k + 15
        rs[r].scale[2 * k + 1] = s16[8];   // values 32k + 16 .. 32k + 31
      }
      _mm256_store_si256(reinterpret_cast<__m256i*>(rs[r].coef), c.coef);
      _mm256_store_si256(reinterpret_cast<__m256i*>(rs[r].coef + 8), _mm256_setzero_si256());
      d[r] = c.d;
      dmin[r] = c.dmin;
    }
    kpanel_block& pb = dst[b];
    __m512i t[16];
    for (int q = 0; q < 4; ++q) transpose(rs[0].codes + 16 * q, sizeof(row_scratch), pb.codes + 16 * q);
    transpose(rs[0].scale, sizeof(row_scratch), pb.scale);
    transpose(rs[0].coef, sizeof(row_scratch), t);
    for (int j = 0; j < 8; ++j) pb.coef[j] = t[j];
    pb.d = _mm512_load_ps(d);
    pb.dmin = _mm512_load_ps(dmin);
  }
}

inline __m512i bcast_u32(const void* p) noexcept {
  std::int32_t v;
  std::memcpy(&v, p, 4);
  return _mm512_set1_epi32(v);
}

/// acc[t] (lane r) = the dot of row r with token t < NT over blocks [0, nb)
/// (the arithmetic in the header). Each token's instruction sequence is the
/// same whatever NT is.
template <class B, std::size_t NT>
inline void panel_group(const kpanel_block* p, const block_q8_K* a, std::size_t nb, std::size_t stride,
                        __m512* acc) noexcept {
  __m512 accm[NT];
  for (std::size_t t = 0; t < NT; ++t) acc[t] = accm[t] = _mm512_setzero_ps();
  for (std::size_t b = 0; b < nb; ++b) {
    const kpanel_block& pb = p[b];
    __m512i tot[NT];
    for (std::size_t t = 0; t < NT; ++t) tot[t] = _mm512_setzero_si512();
    for (int u = 0; u < 8; ++u) {
      __m512i c[8];
      for (int g = 0; g < 8; ++g) c[g] = _mm512_load_si512(pb.codes + 8 * u + g);
      for (std::size_t t = 0; t < NT; ++t) {
        const std::int8_t* q = a[t * stride + b].qs + 32 * u;
        if constexpr (sub16<B>) {
          __m512i s0 = _mm512_setzero_si512(), s1 = _mm512_setzero_si512();
          for (int g = 0; g < 4; ++g) {
            s0 = dpbusd_bcast(s0, c[g], q + 4 * g);
            s1 = dpbusd_bcast(s1, c[4 + g], q + 16 + 4 * g);
          }
          tot[t] = _mm512_add_epi32(tot[t], _mm512_mullo_epi32(s0, pb.scale[2 * u]));
          tot[t] = _mm512_add_epi32(tot[t], _mm512_mullo_epi32(s1, pb.scale[2 * u + 1]));
        } else {
          __m512i s0 = _mm512_setzero_si512(), s1 = _mm512_setzero_si512();
          for (int g = 0; g < 4; ++g) {
            s0 = dpbusd_bcast(s0, c[g], q + 4 * g);
            s1 = dpbusd_bcast(s1, c[4 + g], q + 16 + 4 * g);
          }
          tot[t] = _mm512_add_epi32(tot[t], _mm512_mullo_epi32(_mm512_add_epi32(s0, s1), pb.scale[2 * u]));
        }
      }
    }
    for (std::size_t t = 0; t < NT; ++t) {
      const block_q8_K& ab = a[t * stride + b];
      __m512i corr = _mm512_setzero_si512();
      for (int j = 0; j < 8; ++j) corr = _mm512_dpwssd_epi32(corr, pb.coef[j], bcast_u32(ab.bsums + 2 * j));
      if constexpr (kq::has_min<B>) {
        accm[t] = _mm512_fmadd_ps(_mm512_mul_ps(pb.dmin, _mm512_set1_ps(-ab.d)), _mm512_cvtepi32_ps(corr), accm[t]);
      } else {
        tot[t] = _mm512_sub_epi32(tot[t], _mm512_slli_epi32(corr, kq::offset_shift<B>));
      }
      acc[t] = _mm512_fmadd_ps(_mm512_mul_ps(pb.d, _mm512_set1_ps(ab.d)), _mm512_cvtepi32_ps(tot[t]), acc[t]);
    }
  }
  if constexpr (kq::has_min<B>)
    for (std::size_t t = 0; t < NT; ++t) acc[t] = _mm512_add_ps(acc[t], accm[t]);
}

/// A packed panel (n_rows valid rows) against tokens [0, n_tokens) in groups
/// of token_group (then 2, 1): out[t * out_stride + r] for r < n_rows.
template <class B>
inline void kpanel_tokens(const kpanel_block* p, std::size_t n_rows, const block_q8_K* a, std::size_t nb,
                          std::size_t n_tokens, float* out, std::size_t out_stride) noexcept {
  panel_token_groups<token_group>(n_tokens, panel_row_mask(n_rows), out, out_stride,
                                  [&]<std::size_t NT>(std::size_t t, __m512* acc) {
                                    panel_group<B, NT>(p, a + t * nb, nb, nb, acc);
                                  });
}

}  // namespace detail::kp
#endif

}  // namespace kestrel::quant
KESTREL_INTRINSICS_END
