// kestrel/quant/legacy_x16_avx2.hpp: q4_0 (and q4_1, q5_0, q5_1, q8_0) on AVX2
// without AVX-512 VNNI through 16-row panels (quant/legacy_x16.hpp's
// block_q4_0_x16, ...), read as the q4_K x16 kernel reads its blocks
// (quant/kquant_x16_avx2.hpp). Every call on an x16 matrix (what
// cpu_backend makes of a file's matrices of those types at load) and
// prefill on a row-major q4_0 one (panels packed per call) take it:
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
// q4_1, q5_0 and q5_1 take it too, interleaved at load (q5: the fifth bits
// merged as q5_K's, x16::q5_sums, two int16 sums per block; _1: one more
// FMA by m_w s_a). kestrel-bench -p 64 -n 32, TinyLlama, 2 threads, 2
// alternated rounds, t/s row-major / x16: q5_0 tg 31.4-31.5 / 39.6-40.5
// (bound ratio 0.74-0.80 / 0.91-0.93), pp64 63 / 82-83; q4_1 tg 33.7-34.0
// / 44.7-45.5 (0.94-0.98), pp64 53.5-54.4 / 74.8-77.5; q5_1 tg 24.4-24.8 /
// 35.4-35.8 (0.63-0.66 / 0.92-0.95), pp64 46.4-46.8 / 65.7-67.5. From 96
// tokens on they go to the dequantizing float GEMM instead (cpu/matmul.hpp,
// takes_dequant_gemm), which beat this kernel at pp512.
// q8_0 takes it too (q8_sums: signed codes as the row-major kernel's
// dot_s8s8, int32 per load, no code offset): 5 integer steps per 8 rows x 4
// values and the scales' float steps per 8 rows, against the row-major
// kernel's per-row scale steps. On Zen 3 the row-major q8_0 decode kernel
// read 37-44 GB/s in L3 on 2 threads, little above DRAM (kestrel-bench-
// kquant); kestrel-bench, 2 threads, 3 alternated rounds, t/s row-major /
// x16: TinyLlama tg64 28.0-31.6 / 30.3-33.3, 110M tg128 272-282 /
// 304-317, TinyLlama pp64 83.0-83.4 / 92.7-94.6.
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
#define KESTREL_LEGACY_X16_AVX2 1

namespace kestrel::quant::detail::q40x16 {

/// Token groups per pass over a panel (as the q4_K x16 kernel).
inline constexpr std::size_t token_group = 4;

/// Decode's software prefetch: per block, the lines prefetch_bytes (two
/// q4_0 blocks) ahead of it, non-temporal. Measured on Zen 2 (/tmp harness,
/// 302 MB of q4_0_x16 in huge pages, 2 threads each walking two panels side
/// by side, GB/s, medians of 7): none 27.4-29.2; NTA 288 bytes ahead
/// 27.9-28.6, 432 31.0-33.0, 576 32.2-33.0, 720 31.6-31.9, 864 28.2-29.7;
/// T0 576 29.1-30.8, T1 576 30.2-30.4, T1 1152 27.1-27.6. A plain read of
/// as many bytes reaches 33. The other types keep the 576 bytes.
inline constexpr std::size_t prefetch_bytes = 576;

/// The activation block of X's rows (q8_0, or q8_1 for the _1 types).
template <class X> using act_t = activation_of_t<typename x16_source<X>::type>;

/// The code offset o the kernel takes off through the starts (-o sum(a) per
/// block, cpu::detail::legacy_block_starts): the row-major type's, but 0
/// for q8_0, whose codes the kernel takes signed (q8_sums) rather than as
/// code_offset's value + 128 of the VNNI kernels.
template <class X>
inline constexpr int x16_offset = std::is_same_v<X, block_q8_0_x16> ? 0 : code_offset<typename x16_source<X>::type>;

/// q8_0's block: s[t][i][h] (lane r = row 8h + r of panel p[i]) = the exact
/// int32 sum of that row's 32 products with token t. Signed by signed as
/// the row-major kernel (legacy.hpp's dot_s8s8): |w| (128 for -128) against
/// a carrying w's sign, a vpmaddubsw pair at most 2 * 128 * 127 = 32512,
/// then vpmaddwd into int32 per load: two int16 sums could overflow.
template <std::size_t NT, std::size_t NP, class Codes, class Acts>
inline void q8_sums(Codes&& codes, Acts&& acts, __m256i (*s)[NP][2]) noexcept {
  const __m256i ones = _mm256_set1_epi16(1);
  for (std::size_t t = 0; t < NT; ++t)
    for (std::size_t i = 0; i < NP; ++i) s[t][i][0] = s[t][i][1] = _mm256_setzero_si256();
#pragma GCC unroll 8
  for (int g = 0; g < 8; ++g) {
    __m256i at[NT];
    for (std::size_t t = 0; t < NT; ++t) at[t] = x16::bcast4(acts(t) + 4 * g);
    for (std::size_t i = 0; i < NP; ++i)
#pragma GCC unroll 2
      for (int h = 0; h < 2; ++h) {
        const __m256i w = x16::load8(codes(i, g) + 8 * h), aw = _mm256_sign_epi8(w, w);
        for (std::size_t t = 0; t < NT; ++t)
          s[t][i][h] = _mm256_add_epi32(
              s[t][i][h], _mm256_madd_epi16(_mm256_maddubs_epi16(aw, _mm256_sign_epi8(at[t], w)), ones));
      }
  }
}

/// acc[2 (NP t + i) + h] (lane r = row 8h + r of panel p[i]) = the dot of
/// that row with token t < NT; a: the tokens' nb blocks each, stride apart;
/// start[t * stride + b] = -o times that block's activation sum, o =
/// x16_offset<X> (unread where o = 0: the _1 types and q8_0). Per block, as
/// ref::dot_fused: y = fma(d_w d_a, float(S), y), then for the _1 types y =
/// fma(m_w, s_a, y), with S exact. Every (row, token) runs the same
/// instructions whatever NT and NP: the same bits alone, among other tokens
/// or beside another panel.
template <legacy_x16_block X, std::size_t NT, std::size_t NP, bool Prefetch = false>
inline void group(const X* const* p, const act_t<X>* a, const std::int32_t* start, std::size_t nb,
                  std::size_t stride, __m256* acc) noexcept {
  constexpr bool q5 = requires(const X& x) { x.qh; }, has_m = requires(const X& x) { x.m; };
  constexpr bool q8 = std::is_same_v<X, block_q8_0_x16>;
  for (std::size_t k = 0; k < 2 * NT * NP; ++k) acc[k] = _mm256_setzero_ps();
  const __m256i ones = _mm256_set1_epi16(1);
  for (std::size_t b = 0; b < nb; ++b) {
    if constexpr (Prefetch)
      for (std::size_t i = 0; i < NP; ++i)
        for (std::size_t l = 0; l < sizeof(X); l += 64)
          _mm_prefetch(reinterpret_cast<const char*>(p[i] + b) + prefetch_bytes + l, _MM_HINT_NTA);
    auto codes = [&](std::size_t i, int g) { return p[i][b].qs[g]; };
    auto acts = [&](std::size_t t) { return a[t * stride + b].qs; };
    // int16 sums of the block's products: s (q5: of loads 0 and 1 in s5,
    // of loads 2 and 3 in s; x16::q5_sums), each to int32 below; q8_0's
    // int32 sums in s (q8_sums)
    __m256i s[NT][NP][2];
    [[maybe_unused]] __m256i s5[q5 ? NT : 1][q5 ? NP : 1][2];
    if constexpr (q8) {
      q8_sums<NT, NP>(codes, acts, s);
    } else if constexpr (q5) {
      auto high = [&](std::size_t i) { return p[i][b].qh[0]; };
      x16::q5_sums<0, NT, NP>(codes, high, acts, s5);
      x16::q5_sums<2, NT, NP>(codes, high, acts, s);
    } else {
      x16::nibble_sums<NT, NP>(codes, acts, s);
    }
    for (std::size_t i = 0; i < NP; ++i)
#pragma GCC unroll 2
      for (int h = 0; h < 2; ++h) {
        const __m256 d = x16::halfs(p[i][b].d + 8 * h);
        for (std::size_t t = 0; t < NT; ++t) {
          const act_t<X>& ab = a[t * stride + b];
          __m256i St = q8 ? s[t][i][h] : _mm256_madd_epi16(s[t][i][h], ones);
          if constexpr (q5) St = _mm256_add_epi32(_mm256_madd_epi16(s5[t][i][h], ones), St);
          if constexpr (x16_offset<X> != 0) St = _mm256_add_epi32(St, _mm256_set1_epi32(start[t * stride + b]));
          const __m256 dd = _mm256_mul_ps(d, _mm256_set1_ps(to_f32(ab.d)));
          __m256& c = acc[2 * (NP * t + i) + h];
          c = _mm256_fmadd_ps(dd, _mm256_cvtepi32_ps(St), c);
          if constexpr (has_m) c = _mm256_fmadd_ps(x16::halfs(p[i][b].m + 8 * h), _mm256_set1_ps(to_f32(ab.s)), c);
        }
      }
  }
}

/// A panel (nb blocks, n_rows valid rows) against tokens [0, n_tokens):
/// out[t * out_stride + r] for r < n_rows.
template <legacy_x16_block X>
inline void tokens(const X* p, std::size_t n_rows, const act_t<X>* a, const std::int32_t* start, std::size_t nb,
                   std::size_t n_tokens, float* out, std::size_t out_stride) noexcept {
  for_token_groups<token_group>(n_tokens, [&]<std::size_t NT>(std::size_t t) {
    __m256 acc[2 * NT];
    const X* const pp[1] = {p};
    const std::int32_t* st = start ? start + t * nb : nullptr;  // none for the _1 types
    group<X, NT, 1>(pp, a + t * nb, st, nb, nb, acc);
    for (std::size_t i = 0; i < NT; ++i) x16::store_panel(acc + 2 * i, n_rows, out + (t + i) * out_stride);
  });
}

/// Decode: 2 half whole panels (nb blocks each, from p) against one token,
/// panels j and half + j side by side (two streams through memory, as the
/// q4_K x16 kernel's x16_pairs); out[16 j + r]. The same bits as tokens.
template <legacy_x16_block X>
inline void pairs(const X* p, std::size_t half, const act_t<X>* a, const std::int32_t* start, std::size_t nb,
                  float* out) noexcept {
  if (half) x16::prefetch_start(p, p + half * nb);
  for (std::size_t j = 0; j < half; ++j) {
    const X* const pp[2] = {p + j * nb, p + (half + j) * nb};
    __m256 acc[4];
    group<X, 1, 2, true>(pp, a, start, nb, nb, acc);
    x16::store_panel(acc, 16, out + 16 * j);
    x16::store_panel(acc + 2, 16, out + 16 * (half + j));
  }
}

}  // namespace kestrel::quant::detail::q40x16
#endif
