// kestrel/quant/legacy_x16_avx2.hpp: q4_0 on AVX2 without AVX-512 VNNI
// through 16-row panels (quant/legacy_x16.hpp's block_q4_0_x16), read as
// the q4_K x16 kernel reads its blocks (quant/kquant_x16_avx2.hpp). Every
// call on a q4_0_x16 matrix (what cpu_backend makes of a file's q4_0 at
// load) and prefill on a row-major one (panels packed per call) take it:
//
//   quant::detail::q40x16::tokens(panel, n_rows, a, start, nb, n_tokens, out, out_stride);
//   quant::detail::q40x16::pairs(panels, half, a, start, nb, out);  // decode: two panels side by side
//
// Per block and token, 8 rows per register: 8 vpmaddubsw (4 loads x low /
// high nibbles against the token's 4-byte broadcasts) summed in int16 (at
// most 8 * 2 * 15 * 128 = 30720 < 32767), one vpmaddwd by ones into int32,
// plus the code offset's -8 sum(a) of the block (block_start, exact), one
// convert and one FMA by d_w d_a (an exact product of two f16s) into the
// row's accumulator: per 256 products 9 integer multiplies, against 12 for
// the row-major decode kernel (legacy_decode.hpp) and 16 for the register
// tiles, and the scales' float steps per 8 rows instead of per row.
// Measured on Zen 2:
// - Decode, one thread, 2048 columns, GB/s of weights (/tmp harness): in L2
//   the row-major decode kernel 16-17, these panels 30-31 (so the row-major
//   kernel read DRAM no faster than it computed: 15.3); from DRAM, 75 MB,
//   one panel at a time 13.3, two side by side (pairs) 19-20.5.
//   kestrel-bench tg64, 2 threads, alternated, t/s row-major / q4_0_x16:
//   TinyLlama 45.0 / 47.5, 110M 332 / 363.
// - Prefill, panels packed per call against the row-major kernels before
//   (TinyLlama q4_0, 2 threads, t/s): 16 tokens 72 / 74, 32 76 / 84, 64 77
//   / 89, 512 90.5 / 90 (the float GEMM over dequantized panels before);
//   110M 512 tokens 874 / 874. Interleaved at load instead of per call:
//   64 tokens 90 / 97, 512 90 / 91.5.
// Per block this kernel spends 7 float and integer steps per 8 rows and
// token on the scales, where q4_K's spends them per 256 values: q4_K x16
// prefill runs about 15% faster.
//
// Bits: S = sum (v - 8) a over the block is exact, each block adds one
// rounding: |result - exact| <= gamma_nb T, inside the tiles' bound; each
// (row, token) runs the same instructions whatever the token group or the
// panel beside it, so a token's result does not depend on the tokens beside
// it, and packing per call gives the bits of the interleaved matrix.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>

#include "kestrel/quant/kquant_x16.hpp"
#include "kestrel/quant/legacy_format.hpp"
#include "kestrel/quant/legacy_x16.hpp"
#include "kestrel/quant/legacy_tokens.hpp"
#include "kestrel/quant/token_groups.hpp"

#if defined(KESTREL_KQUANT_X16_AVX2)  // the same ISA as the q4_K x16 kernel (AVX2, FMA, F16C, no VNNI)
#include <immintrin.h>
#define KESTREL_Q4_0_X16_AVX2 1

namespace kestrel::quant::detail::q40x16 {

using block = block_q4_0_x16;

/// Token groups per pass over a panel (as the q4_K x16 kernel).
inline constexpr std::size_t token_group = 4;

/// Decode's software prefetch: per block, the lines prefetch_bytes (two
/// blocks) ahead of it, non-temporal. Measured on Zen 2 (/tmp harness, 302
/// MB of q4_0_x16 in huge pages, 2 threads each walking two panels side by
/// side, GB/s, medians of 7): none 27.4-29.2; NTA 288 bytes ahead 27.9-28.6,
/// 432 31.0-33.0, 576 32.2-33.0, 720 31.6-31.9, 864 28.2-29.7; T0 576
/// 29.1-30.8, T1 576 30.2-30.4, T1 1152 27.1-27.6. A plain read of as many
/// bytes reaches 33.
inline constexpr std::size_t prefetch_bytes = 2 * sizeof(block);
inline constexpr std::size_t prefetch_lines = (sizeof(block) + 63) / 64;

/// acc[2 (NP t + i) + h] (lane r = row 8h + r of panel p[i]) = the dot of
/// that row with token t < NT; a: the tokens' nb blocks each, stride apart;
/// start[t * stride + b] = block_start<block_q4_0> of that block (-8 times
/// its codes' sum). Every (row, token) runs the same instructions whatever
/// NT and NP: the same bits alone, among other tokens or beside another
/// panel.
template <std::size_t NT, std::size_t NP, bool Prefetch = false>
inline void group(const block* const* p, const block_q8_0* a, const std::int32_t* start, std::size_t nb,
                  std::size_t stride, __m256* acc) noexcept {
  for (std::size_t k = 0; k < 2 * NT * NP; ++k) acc[k] = _mm256_setzero_ps();
  const __m256i ones = _mm256_set1_epi16(1);
  for (std::size_t b = 0; b < nb; ++b) {
    if constexpr (Prefetch)
      for (std::size_t i = 0; i < NP; ++i)
        for (std::size_t l = 0; l < prefetch_lines; ++l)
          _mm_prefetch(reinterpret_cast<const char*>(p[i] + b) + prefetch_bytes + 64 * l, _MM_HINT_NTA);
    __m256i s[NT][NP][2];
    x16::nibble_sums<NT, NP>([&](std::size_t i, int g) { return p[i][b].qs[g]; },
                             [&](std::size_t t) { return a[t * stride + b].qs; }, s);
    for (std::size_t i = 0; i < NP; ++i)
#pragma GCC unroll 2
      for (int h = 0; h < 2; ++h) {
        const __m256 d = x16::halfs(p[i][b].d + 8 * h);
        for (std::size_t t = 0; t < NT; ++t) {
          const __m256i S =
              _mm256_add_epi32(_mm256_madd_epi16(s[t][i][h], ones), _mm256_set1_epi32(start[t * stride + b]));
          const __m256 dd = _mm256_mul_ps(d, _mm256_set1_ps(to_f32(a[t * stride + b].d)));
          __m256& c = acc[2 * (NP * t + i) + h];
          c = _mm256_fmadd_ps(dd, _mm256_cvtepi32_ps(S), c);
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
    const block* const pp[1] = {p};
    group<NT, 1>(pp, a + t * nb, start + t * nb, nb, nb, acc);
    for (std::size_t i = 0; i < NT; ++i) x16::store_panel(acc + 2 * i, n_rows, out + (t + i) * out_stride);
  });
}

/// Decode: 2 half whole panels (nb blocks each, from p) against one token,
/// panels j and half + j side by side (two streams through memory, as the
/// q4_K x16 kernel's x16_pairs); out[16 j + r]. The same bits as tokens.
inline void pairs(const block* p, std::size_t half, const block_q8_0* a, const std::int32_t* start, std::size_t nb,
                  float* out) noexcept {
  for (std::size_t j = 0; j < half; ++j) {
    const block* const pp[2] = {p + j * nb, p + (half + j) * nb};
    __m256 acc[4];
    group<1, 2, true>(pp, a, start, nb, nb, acc);
    x16::store_panel(acc, 16, out + 16 * j);
    x16::store_panel(acc + 2, 16, out + 16 * (half + j));
  }
}

}  // namespace kestrel::quant::detail::q40x16
#endif
