// kestrel/quant/legacy_x16_avx2.hpp: q4_0 prefill on AVX2 without AVX-512
// VNNI through 16-row panels packed per call, read as the q4_K x16 kernel
// reads its blocks (quant/kquant_x16_avx2.hpp):
//
//   quant::detail::q40x16::pack(rows, row_bytes, n_rows, nb, panel);   // 16 rows -> nb panel blocks
//   quant::detail::q40x16::tokens(panel, n_rows, a, start, nb, n_tokens, out, out_stride);
//
// A panel block holds 16 rows x 32 values: qs[g][r] is row r's q4_0 bytes
// 4g .. 4g + 3 (low nibbles values 4g + j, high nibbles 16 + 4g + j), so
// packing moves 4-byte words only, and d per row. Per block and token, 8
// rows per register: 8 vpmaddubsw (4 loads x low / high nibbles against the
// token's 4-byte broadcasts) summed in int16 (at most 8 * 2 * 15 * 128 =
// 30720 < 32767), one vpmaddwd by ones into int32, plus the code offset's
// -8 sum(a) of the block (block_start, exact), one convert and one FMA by d_w d_a
// (an exact product of two f16s) into the row's accumulator: per 256
// products 9 integer multiplies, against the register tiles' 16 (and their
// float step per row instead of per 8 rows). Measured on Zen 2 (TinyLlama
// q4_0, 2 threads, alternated, t/s before / with these panels): 16 tokens
// 72 / 74, 32 76 / 84, 64 77 / 89 (the register tiles before), 512 90.5 /
// 90 (the float GEMM over dequantized panels before, which this replaces
// too, as one path for every prefill length); 110M 512 tokens 874 / 874.
// Per block this kernel spends 7 float and integer steps per 8 rows and
// token on the scales, where q4_K's spends them per 256 values: q4_K x16
// prefill runs about 15% faster.
//
// Bits: S = sum (v - 8) a over the block is exact, each block adds one
// rounding: |result - exact| <= gamma_nb T, inside the tiles' bound; each
// token runs the same instructions whatever the group, so a token's result
// does not depend on the tokens beside it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>

#include "kestrel/quant/kquant_x16.hpp"
#include "kestrel/quant/legacy_format.hpp"
#include "kestrel/quant/legacy_tokens.hpp"
#include "kestrel/quant/token_groups.hpp"

#if defined(KESTREL_KQUANT_X16_AVX2)  // the same ISA as the q4_K x16 kernel (AVX2, FMA, F16C, no VNNI)
#include <immintrin.h>
#define KESTREL_Q4_0_X16_AVX2 1

namespace kestrel::quant::detail::q40x16 {

struct alignas(32) block {
  std::uint8_t qs[4][16][4];  // [g][r]: row r's q4_0 bytes 4g .. 4g + 3
  f16 d[16];
};
static_assert(sizeof(block) == 288);

/// Rows [0, n_rows) (n_rows <= 16, row_bytes apart, nb q4_0 blocks each)
/// as nb panel blocks; rows past n_rows are zero (d = 0).
inline void pack(const std::byte* rows, std::size_t row_bytes, std::size_t n_rows, std::size_t nb, block* out) noexcept {
  for (std::size_t b = 0; b < nb; ++b) {
    block& o = out[b];
    for (std::size_t r = 0; r < 16; ++r) {
      if (r < n_rows) {
        const block_q4_0& x = reinterpret_cast<const block_q4_0*>(rows + r * row_bytes)[b];
        for (int g = 0; g < 4; ++g) std::memcpy(o.qs[g][r], x.qs + 4 * g, 4);
        o.d[r] = x.d;
      } else {
        for (int g = 0; g < 4; ++g) std::memset(o.qs[g][r], 0, 4);
        o.d[r] = f16{};
      }
    }
  }
}

/// Token groups per pass over a panel (as the q4_K x16 kernel).
inline constexpr std::size_t token_group = 4;

/// acc[2t + h] (lane r = row 8h + r) = the dot of that row with token t <
/// NT; a: the tokens' nb blocks each, stride apart; start[t * stride + b] =
/// block_start<block_q4_0> of that block (-8 times its codes' sum).
template <std::size_t NT>
inline void group(const block* p, const block_q8_0* a, const std::int32_t* start, std::size_t nb, std::size_t stride,
                  __m256* acc) noexcept {
  for (std::size_t k = 0; k < 2 * NT; ++k) acc[k] = _mm256_setzero_ps();
  const __m256i m0f = _mm256_set1_epi8(0x0f), ones = _mm256_set1_epi16(1);
  for (std::size_t b = 0; b < nb; ++b) {
    const block& pb = p[b];
    __m256i s[NT][2];
    for (std::size_t t = 0; t < NT; ++t) s[t][0] = s[t][1] = _mm256_setzero_si256();
#pragma GCC unroll 4
    for (int g = 0; g < 4; ++g) {
      __m256i alo[NT], ahi[NT];
      for (std::size_t t = 0; t < NT; ++t) {
        const std::int8_t* q = a[t * stride + b].qs + 4 * g;
        alo[t] = x16::bcast4(q), ahi[t] = x16::bcast4(q + 16);
      }
#pragma GCC unroll 2
      for (int h = 0; h < 2; ++h) {
        const __m256i codes = x16::load8(pb.qs[g][8 * h]);
        const __m256i lo = _mm256_and_si256(codes, m0f), hi = _mm256_and_si256(_mm256_srli_epi16(codes, 4), m0f);
        for (std::size_t t = 0; t < NT; ++t)
          s[t][h] = _mm256_add_epi16(s[t][h], _mm256_add_epi16(_mm256_maddubs_epi16(lo, alo[t]), _mm256_maddubs_epi16(hi, ahi[t])));
      }
    }
#pragma GCC unroll 2
    for (int h = 0; h < 2; ++h) {
      const __m256 d = x16::halfs(pb.d + 8 * h);
      for (std::size_t t = 0; t < NT; ++t) {
        const __m256i S = _mm256_add_epi32(_mm256_madd_epi16(s[t][h], ones), _mm256_set1_epi32(start[t * stride + b]));
        const __m256 dd = _mm256_mul_ps(d, _mm256_set1_ps(to_f32(a[t * stride + b].d)));
        acc[2 * t + h] = _mm256_fmadd_ps(dd, _mm256_cvtepi32_ps(S), acc[2 * t + h]);
      }
    }
  }
}

/// A panel (nb blocks, n_rows valid rows) against tokens [0, n_tokens):
/// out[t * out_stride + r] for r < n_rows.
inline void tokens(const block* p, std::size_t n_rows, const block_q8_0* a, const std::int32_t* start, std::size_t nb,
                   std::size_t n_tokens, float* out, std::size_t out_stride) noexcept {
  for_token_groups<token_group>(n_tokens, [&]<std::size_t NT>(std::size_t t) {
    __m256 acc[2 * NT];
    group<NT>(p, a + t * nb, start + t * nb, nb, nb, acc);
    for (std::size_t i = 0; i < NT; ++i) x16::store_panel(acc + 2 * i, n_rows, out + (t + i) * out_stride);
  });
}

}  // namespace kestrel::quant::detail::q40x16
#endif
