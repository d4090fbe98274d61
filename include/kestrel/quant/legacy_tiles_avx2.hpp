// kestrel/quant/legacy_tiles_avx2.hpp: the legacy-format dots (q4_0, q4_1,
// q5_0, q5_1, q8_0 weights against q8_0 / q8_1 activations) for prefill on
// AVX2 without AVX-512 VNNI (with VNNI, legacy_tokens.hpp's panels run):
// a tile of rows x tokens held in registers, so each weight block is
// unpacked once for tile_tokens tokens and each activation block loaded
// once for tile_rows rows.
//
//   dot_tile_avx2<W>(rows, row_bytes, n_rows, a, aux, nb, n_tokens, y, y_stride);
//   // y[t * y_stride + r] ~ ref::dot(row r, token t) for r < n_rows <= tile_rows, t < n_tokens <= tile_tokens
//
// Per block and (row, token): the codes as in the AVX2 decode kernel
// (legacy_decode.hpp: unsigned nibbles with the start -o sum(q_a) added in
// lane 0, q8_0 signed with its signs moved onto the activations),
// vpmaddubsw + vpmaddwd into 8 int32 lanes (exact), one convert, and one
// FMA by d_w d_a (exact product of two 11-bit significands) into the
// (row, token)'s accumulator; the _1 types add m_w s_a into a scalar FMA
// chain. At the end hsum(acc) + m chain. Each (row, token) runs exactly
// these operations in block order whatever tile it sits in, so its result
// does not depend on the tiling, the thread count or the other tokens of
// the call. Quant::dot (one token alone) computes the same way but is not
// the same code, and the decode kernel splits blocks over two chains: both
// within the bound below of exact, not the same bits.
//
// The _0 types take two blocks per step (pairs_avx2: both blocks' int32
// sums in one register, one convert, scale multiply and FMA for the two),
// then an odd last block alone.
//
// Rounding: each lane adds at most nb terms (about nb / 2 with pairs),
// exact products each rounded once in its FMA, then 3 levels of hsum and
// the m chain's addition: at most nb + 4 roundings per term, |result -
// exact| <= gamma_(nb + 4) T (T as in legacy_decode.hpp), inside the
// gamma_(nb + 8) T quant::dot is held to.
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <type_traits>
#include <utility>

#include "kestrel/quant/legacy_decode.hpp"
#include "kestrel/quant/legacy_tokens.hpp"

#if defined(KESTREL_LEGACY_DECODE_AVX2)
#define KESTREL_LEGACY_TILES_AVX2 1

namespace kestrel::quant {

/// Rows and tokens of one register tile: 8 accumulators, 2 rows' codes and
/// scales, one activation vector and its scale, and temporaries fit the 16
/// ymm registers. The shape matters little on Zen 2 (2 threads, the 110M
/// shape's layer matrices x 512 tokens, GOP/s q4_0 / q8_0): 2 x 3 97 / 91,
/// 2 x 4 96 / 97, 3 x 2 91 / 92, 4 x 2 89 / 93, 1 x 6 83 / 86, 1 x 8 85 / 87
/// (one product per (row, token, block) each; quant::dot per (row, token)
/// 56 / 67). The int8 products bound it: vpmaddubsw + vpmaddwd issue at
/// about one pair per 2 cycles there (kestrel-bench's int8 probe, 199
/// GOP/s), and without the float scaling the same loop reaches 129 / 141.
inline constexpr std::size_t tile_rows_avx2 = 2;
inline constexpr std::size_t tile_tokens_avx2 = 4;

namespace detail::ld2 {

template <class W, std::size_t R, std::size_t T>
inline void tile(const std::byte* rows, std::size_t row_bytes, const activation_of_t<W>* a, const token_aux* aux,
                 const act_pair* pairs, std::size_t nb, float* y, std::size_t y_stride) noexcept {
  constexpr bool has_m = has_offset_m<W>;
  const W* rp[R];
  for (std::size_t r = 0; r < R; ++r) rp[r] = reinterpret_cast<const W*>(rows + r * row_bytes);
  __m256 acc[R][T];
  float om[R][T];
  for (std::size_t r = 0; r < R; ++r)
    for (std::size_t t = 0; t < T; ++t) {
      acc[r][t] = _mm256_setzero_ps();
      om[r][t] = 0.0f;
    }
  std::size_t k0 = 0;
  if constexpr (pairs_avx2<W>) {
    const std::size_t np = nb / 2;
    for (std::size_t k = 0; k < np; ++k) {
      __m256i wl[R], wh[R];
      __m256 dw[R];
#pragma GCC unroll 4
      for (std::size_t r = 0; r < R; ++r) {
        pair_codes(rp[r][2 * k], rp[r][2 * k + 1], wl[r], wh[r]);
        dw[r] = pair_scales(rp[r][2 * k], rp[r][2 * k + 1]);
      }
#pragma GCC unroll 4
      for (std::size_t t = 0; t < T; ++t) {
        const act_pair& x = pairs[t * np + k];
        const __m256i al = _mm256_load_si256(reinterpret_cast<const __m256i*>(x.lo));
        const __m256i ah = _mm256_load_si256(reinterpret_cast<const __m256i*>(x.hi));
        const __m256 da = _mm256_load_ps(x.d);
#pragma GCC unroll 4
        for (std::size_t r = 0; r < R; ++r)
          acc[r][t] = _mm256_fmadd_ps(_mm256_mul_ps(dw[r], da), _mm256_cvtepi32_ps(pair_sum<W>(wl[r], wh[r], al, ah, x)),
                                      acc[r][t]);
      }
    }
    k0 = 2 * np;
  }
  for (std::size_t k = k0; k < nb; ++k) {
    __m256i wv[R];
    __m256 dw[R];
    float mw[R];
#pragma GCC unroll 4
    for (std::size_t r = 0; r < R; ++r) {
      wv[r] = codes(rp[r][k]);
      dw[r] = broadcast_f16(rp[r][k].d);
      if constexpr (has_m) mw[r] = detail::avx2::h2f(rp[r][k].m);
    }
    // Unrolled: the accumulators must stay in registers (g++ -O2 and -O3
    // otherwise keep them on the stack, 1.6x slower).
#pragma GCC unroll 4
    for (std::size_t t = 0; t < T; ++t) {
      const activation_of_t<W>& ab = a[t * nb + k];
      const token_aux& x = aux[t * nb + k];
      const __m256i qa = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(ab.qs));
      const __m256 da = _mm256_broadcast_ss(&x.d);
      const __m256i start = _mm256_zextsi128_si256(_mm_cvtsi32_si128(x.start));
#pragma GCC unroll 4
      for (std::size_t r = 0; r < R; ++r) {
        acc[r][t] = _mm256_fmadd_ps(_mm256_mul_ps(dw[r], da), _mm256_cvtepi32_ps(block_sum<W>(wv[r], qa, start)),
                                    acc[r][t]);
        if constexpr (has_m) om[r][t] = std::fma(mw[r], x.s, om[r][t]);
      }
    }
  }
  for (std::size_t r = 0; r < R; ++r)
    for (std::size_t t = 0; t < T; ++t) y[t * y_stride + r] = detail::avx2::hsum(acc[r][t]) + om[r][t];
}

}  // namespace detail::ld2

/// y[t * y_stride + r] for r < n_rows (<= tile_rows_avx2, row_bytes apart)
/// and t < n_tokens (<= tile_tokens_avx2; token t's blocks at a + t * nb,
/// its aux from make_token_aux<W> at aux + t * nb and, for pairs_avx2<W>,
/// its pairs from make_act_pairs<W> at pairs + t * (nb / 2); else pairs
/// may be null).
template <class W>
inline void dot_tile_avx2(const std::byte* rows, std::size_t row_bytes, std::size_t n_rows,
                          const activation_of_t<W>* a, const token_aux* aux, const act_pair* pairs, std::size_t nb,
                          std::size_t n_tokens, float* y, std::size_t y_stride) noexcept {
  namespace ld2 = detail::ld2;
  auto run = [&]<std::size_t R>() {
    [&]<std::size_t... I>(std::index_sequence<I...>) {
      ((n_tokens == I + 1 ? ld2::tile<W, R, I + 1>(rows, row_bytes, a, aux, pairs, nb, y, y_stride) : void()), ...);
    }(std::make_index_sequence<tile_tokens_avx2>{});
  };
  [&]<std::size_t... I>(std::index_sequence<I...>) {
    ((n_rows == I + 1 ? run.template operator()<I + 1>() : void()), ...);
  }(std::make_index_sequence<tile_rows_avx2>{});
}

}  // namespace kestrel::quant

#endif
