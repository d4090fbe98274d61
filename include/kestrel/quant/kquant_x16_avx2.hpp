// kestrel/quant/kquant_x16_avx2.hpp: the x16 layouts' kernels with AVX2 and
// without AVX-512 VNNI (included by kquant_x16.hpp, which defines the
// layouts; its header comment describes them and the arithmetic):
//
//   quant::detail::x16::x16_tokens(panel, n_rows, a, nb, n_tokens, out, out_stride);  // as the VNNI kernel
//   quant::detail::x16::x16_pairs(panels, n, a, nb, out);   // decode: 2n whole panels, two streams
//
// for q4_K, q6_K, q5_K, q3_K and q2_K (the last three only here: quant::x16_kernel).
//
// Why: the row-major q4_K kernel (quant/kquants.hpp) spends per 32 weights
// of one row a vpmaddubsw, a vpmaddwd that applies the sub-block's scale and
// a shuffle that broadcasts it; on Zen 2 all integer multiplies issue on one
// pipe, and the dot ran at 8.4 ns per 256 weights (17 GB/s a core), so
// TinyLlama Q4_K_M decode stayed at 0.81-0.88 of the bandwidth bound. With
// a row per 32-bit lane (8 rows per register, two registers per panel) the
// codes stay packed as the VNNI kernel reads them, one 4-byte broadcast of
// the activations meets 8 rows, and a sub-block's 8 vpmaddubsw (4 loads of
// 8 rows x 8 codes, low and high nibbles) are summed in int16 before ONE
// vpmaddwd applies the 8 rows' scales: 9 multiplies per 256 products instead
// of 16, and one scale shuffle per 8 rows instead of per row. Measured on
// Zen 2 (one thread, data in L1, /tmp harness): q4_K 4.6 ns per 256
// weights of a row against the row-major kernel's 8.4.
//
// Decode reads the matrix from DRAM, and there a faster kernel alone did
// not help: one thread's single stream of loads tops out near 13-14 GB/s
// (the row-major kernel already read at that rate), and the x16 kernel,
// whose loads come in a burst per block, read at 13 (q4_K) and 8 (q6_K,
// then laid out as two streams per block). What did: the blocks laid out
// in the order the kernel reads them (quant/kquant_x16.hpp), and each
// thread's panels walked two at a time from the two halves of its range
// (x16_pairs), two streams through memory. Software prefetch 1-16 blocks
// ahead cost 20-45% instead. Measured (/tmp harness, 32768 x 2048 in huge
// pages, 2 threads, GB/s row-major / x16): q4_K 26.5 / 30-33, q6_K 26.5 /
// 32; TinyLlama Q4_K_M tg 36.5 -> 42.4 t/s end to end (kestrel-bench,
// alternated). A short prefetch does pay: while a unit is read, the unit's
// bytes 576 further on, non-temporal (x16_group's Prefetch, decode only).
// kestrel-bench tg64, 2 threads, alternated, t/s: without / 576 bytes
// ahead, 3 rounds: TinyLlama Q4_K_M 42.1-42.8 / 48.5-49.8, 110M 290-318 /
// 362-376; 384 / 576 / 1152 bytes ahead, 2 rounds: TinyLlama 46.9-47.5 /
// 48.2-49.2 / 43.2-44.2, 110M 332-347 / 361 / 333-336. (The host read
// 35-40 GB/s then, its higher level, which decode had not followed.) Prefill keeps this kernel at every token count (token
// groups of 4): it beat dequantizing into the float GEMM (cpu/matmul.hpp)
// from 32 to 512 tokens, e.g. TinyLlama Q4_K_M pp512 92 -> 102 t/s.
//
// q5_K (dtype::q5_k_x16) has this kernel on AVX2 alone: its row-major AVX2
// decode kernel (quant/kquants.hpp, kquant_decode_rows) was compute-bound,
// TinyLlama Q5_K_S tg at 0.69-0.75 of the bandwidth bound. Its codes are
// q4_K's nibbles with the fifth bit merged in (q5_codes: two shifts, two
// ands and an or per 32 bytes of codes), and its mins as q4_K's. Measured
// (kestrel-bench -p 64 -n 32, 2 threads, 2 alternated rounds, t/s row-major
// / x16): TinyLlama Q5_K_S tg 29.2-29.8 / 41.6-42.0 (bound ratio 0.69-0.70
// / 0.95-0.97), pp64 68 / 100-101; Q5_K_M (half its attn_v and ffn_down
// q6_K) tg 24.5-30.4 / 34.7-36.1, pp64 69-70 / 77-78; 110M Q5_K_M tg
// 266-267 / 352-355, pp64 696-697 / 1013-1042.
//
// q3_K (dtype::q3_k_x16) likewise: its codes (value + 4, in [0, 7]) are
// its two low bits and its high bit merged (q3_codes), its scales unpacked
// from the 12 bytes per row in the block (q3_scales), the offset 4 taken
// off as q6_K's 32 is. TinyLlama Q3_K_M (mostly q3_K), same commands: tg
// 38.9-39.1 / 47.5-47.9 (bound ratio 0.66-0.69 / 0.83-0.86), pp64 84.7 /
// 100-102; Q2_K (whose q2_K matrices stayed row-major) tg 40.7 / 45.7-46.0.
// q2_K (dtype::q2_k_x16): its 2-bit codes as q3_K's low bits, its 4-bit
// scales and mins from one word load per 4 sub-blocks (scale_pairs,
// q2_mins), the mins as q4_K's but per 16 values. TinyLlama Q2_K, 3
// rounds, row-major q2_K / x16: tg 40.1-41.0 / 54.3-56.4, pp64 73-74 /
// 101-104.
//
// int16 bounds (a_i in [-128, 127]): q4_K, one vpmaddubsw lane <= 2 * 15 *
// 128 = 3840, a sub-block's 8 summed <= 30720 < 32767. q5_K (codes <= 31):
// one lane <= 2 * 31 * 128 = 7936, so four are summed (<= 31744) per
// vpmaddwd, two vpmaddwd per sub-block. q3_K (codes <= 7): one lane <=
// 1792, a 16-value sub-block's four summed <= 7168; q2_K (codes <= 3) less. q6_K (codes <= 63):
// one lane <= 2 * 63 * 128 = 16128, so two are summed (<= 32256) per
// vpmaddwd, four vpmaddwd per 32 values; the code offset 32 comes off as
// 32 sum_g sc_g bsum_g (as in kquants.hpp), one vpmaddwd per two sub-blocks.
//
// Bits: S and C are the same exact integers as the VNNI kernel's, and they
// meet the floats in the same operations (acc = fma(d d8, float(S), acc),
// accm = fma(dmin (-d8), float(C), accm), acc + accm), so both ISAs give the
// same bits.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "kestrel/quant/kquant_x16.hpp"

#if defined(KESTREL_KQUANT_X16_AVX2)
#include <immintrin.h>

namespace kestrel::quant::detail::x16 {

/// Tokens per pass over a panel's codes. Per token and 8-row half an int16
/// sum and an int32 total stay hot, so 4 tokens spill some of them out of
/// the 16 ymm registers, and still won: measured on Zen 2 (2 threads,
/// alternated, pp t/s with groups of 1 / 2 / 4 / 8): TinyLlama Q4_K_M
/// pp512 92 / 101-103 / 104-106 / 96, pp64 97 / 107 / 112 / -; 110M pp512
/// - / 967-1001 / 1024-1027 / 931-940.
inline constexpr std::size_t token_group = 4;

/// vpshufb controls, per 32-bit lane d of each 128-bit half: byte 4d + k
/// zero-extended into both of its int16 halves (dup), or bytes 4d + k and
/// 4d + k + 1 each zero-extended to int16 (pair).
inline __m256i ctrl_dup(int k) noexcept {
  auto c = [k](int d) { return static_cast<int>(0x80008000u | static_cast<unsigned>(4 * d + k) | static_cast<unsigned>(4 * d + k) << 16); };
  return _mm256_setr_epi32(c(0), c(1), c(2), c(3), c(0), c(1), c(2), c(3));
}
inline __m256i ctrl_pair(int k) noexcept {
  auto c = [k](int d) { return static_cast<int>(0x80008000u | static_cast<unsigned>(4 * d + k) | static_cast<unsigned>(4 * d + k + 1) << 16); };
  return _mm256_setr_epi32(c(0), c(1), c(2), c(3), c(0), c(1), c(2), c(3));
}

inline __m256i load8(const void* p) noexcept { return _mm256_load_si256(static_cast<const __m256i*>(p)); }
inline __m256i bcast4(const std::int8_t* p) noexcept {
  std::int32_t v;
  std::memcpy(&v, p, 4);
  return _mm256_set1_epi32(v);
}
inline __m256 halfs(const f16* p) noexcept {
  return _mm256_cvtph_ps(_mm_load_si128(reinterpret_cast<const __m128i*>(p)));
}

/// The 6-bit scales (sc) or mins (mn) of rows 8h .. 8h + 7 of a q4_K or
/// q5_K x16 block (the same fields), lane r = row 8h + r: v[0] byte k = sub-block k's, v[1] byte k =
/// sub-block 4 + k's (kquants.hpp's scales_k4, 8 rows at once).
struct k4_half {
  __m256i v[2];
};
template <class X>
inline k4_half unpack_scales(const X& b, int h) noexcept {
  const __m256i a = load8(b.scales[0] + 8 * h), c = load8(b.scales[2] + 8 * h);
  const __m256i m3f = _mm256_set1_epi8(0x3f), m0f = _mm256_set1_epi8(0x0f), m30 = _mm256_set1_epi8(0x30);
  // the top two bits of each byte of a to bits 4, 5 (a 32-bit shift: the
  // bits it moves across bytes land outside 0x30)
  return {{_mm256_and_si256(a, m3f),
           _mm256_or_si256(_mm256_and_si256(c, m0f), _mm256_and_si256(_mm256_srli_epi32(a, 2), m30))}};
}
template <class X>
inline k4_half unpack_mins(const X& b, int h) noexcept {
  const __m256i bw = load8(b.scales[1] + 8 * h), c = load8(b.scales[2] + 8 * h);
  const __m256i m3f = _mm256_set1_epi8(0x3f), m0f = _mm256_set1_epi8(0x0f), m30 = _mm256_set1_epi8(0x30);
  return {{_mm256_and_si256(bw, m3f),
           _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi32(c, 4), m0f),
                           _mm256_and_si256(_mm256_srli_epi32(bw, 2), m30))}};
}

/// q6_K's full 6-bit codes of one load of ql (8 rows): values 4g + j (lo)
/// and 16 + 4g + j (hi) of the unit, the high bits from bits 2g, 2g + 1 of
/// the unit's two qh loads (moved to bits 4, 5; the bits a 16-bit shift
/// brings in from the next byte fall outside 0x30).
inline void q6_codes(__m256i ql, __m256i qh0, __m256i qh1, int g, __m256i& lo, __m256i& hi) noexcept {
  const __m256i m0f = _mm256_set1_epi8(0x0f), m30 = _mm256_set1_epi8(0x30);
  auto to_bit4 = [g](__m256i v) {
    switch (g) {
      case 0: return _mm256_slli_epi16(v, 4);
      case 1: return _mm256_slli_epi16(v, 2);
      case 2: return v;
      default: return _mm256_srli_epi16(v, 2);
    }
  };
  lo = _mm256_or_si256(_mm256_and_si256(ql, m0f), _mm256_and_si256(to_bit4(qh0), m30));
  hi = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(ql, 4), m0f), _mm256_and_si256(to_bit4(qh1), m30));
}

/// q5_K's 5-bit codes of one load of qs (8 rows): values 4g + j (lo) and 16
/// + 4g + j (hi) of the unit, the fifth bits from bits g and 4 + g of the
/// unit's qh load (moved to bit 4; a 16-bit shift by at most 4 moves no bit
/// that lands on bit 4 of a byte across bytes).
inline void q5_codes(__m256i qs, __m256i qh, int g, __m256i& lo, __m256i& hi) noexcept {
  const __m256i m0f = _mm256_set1_epi8(0x0f), m10 = _mm256_set1_epi8(0x10);
  __m256i blo, bhi;  // bit g, bit 4 + g at bit 4
  switch (g) {
    case 0: blo = _mm256_slli_epi16(qh, 4), bhi = qh; break;
    case 1: blo = _mm256_slli_epi16(qh, 3), bhi = _mm256_srli_epi16(qh, 1); break;
    case 2: blo = _mm256_slli_epi16(qh, 2), bhi = _mm256_srli_epi16(qh, 2); break;
    default: blo = _mm256_slli_epi16(qh, 1), bhi = _mm256_srli_epi16(qh, 3); break;
  }
  lo = _mm256_or_si256(_mm256_and_si256(qs, m0f), _mm256_and_si256(blo, m10));
  hi = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(qs, 4), m0f), _mm256_and_si256(bhi, m10));
}

/// Lane r: the int16 pair (s, s) of the int8 scales p[0..8), sign-extended.
inline __m256i scale_dup(const std::int8_t* p) noexcept {
  const __m256i v = _mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p)));
  return _mm256_blend_epi16(v, _mm256_slli_epi32(v, 16), 0xAA);
}

/// Per block, the vpmaddwd operands that apply the sub-block scales to
/// rows 8h .. 8h + 7 (lane r: the int16 pair (sc, sc)), made once and
/// stored: the sub-block loop reads them from L1 rather than holding them in
/// registers (AVX2 has 16), and stays a loop (GCC fully unrolled it spills
/// the activations' broadcasts).
template <class X>
inline void scale_pairs(const X& b, __m256i (*out)[2]) noexcept {
#pragma GCC unroll 2
  for (int h = 0; h < 2; ++h) {
    const k4_half sc = unpack_scales(b, h);
#pragma GCC unroll 8
    for (int u = 0; u < 8; ++u) out[u][h] = _mm256_shuffle_epi8(sc.v[u / 4], ctrl_dup(u % 4));
  }
}
/// q6_K: out[2u + i][h] for sub-block 2u + i (values 32u + 16i .. + 15).
inline void scale_pairs(const block_q6_K_x16& b, __m256i (*out)[2]) noexcept {
#pragma GCC unroll 8
  for (int u = 0; u < 8; ++u)
#pragma GCC unroll 2
    for (int h = 0; h < 2; ++h) {
      out[2 * u][h] = scale_dup(b.scales[u][0] + 8 * h);
      out[2 * u + 1][h] = scale_dup(b.scales[u][1] + 8 * h);
    }
}

/// q3_K's 6-bit scales plus 32 (unsigned) of rows 8h .. 8h + 7, lane r =
/// row 8h + r: v[k] byte j = sub-block 4k + j's (kquants_format.hpp's
/// get_scale_k3, 8 rows at once; a 32-bit shift moves bits across bytes
/// only where the masks clear them).
inline void q3_scales(const block_q3_K_x16& b, int h, __m256i* v) noexcept {
  const __m256i w0 = load8(b.scales[0] + 8 * h), w1 = load8(b.scales[1] + 8 * h), w2 = load8(b.scales[2] + 8 * h);
  const __m256i m0f = _mm256_set1_epi8(0x0f), m30 = _mm256_set1_epi8(0x30);
  v[0] = _mm256_or_si256(_mm256_and_si256(w0, m0f), _mm256_and_si256(_mm256_slli_epi32(w2, 4), m30));
  v[1] = _mm256_or_si256(_mm256_and_si256(w1, m0f), _mm256_and_si256(_mm256_slli_epi32(w2, 2), m30));
  v[2] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi32(w0, 4), m0f), _mm256_and_si256(w2, m30));
  v[3] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi32(w1, 4), m0f), _mm256_and_si256(_mm256_srli_epi32(w2, 2), m30));
}
/// q3_K: out[k][h] for sub-block k (values 16k .. 16k + 15), the scale
/// less 32, in [-32, 31].
inline void scale_pairs(const block_q3_K_x16& b, __m256i (*out)[2]) noexcept {
  const __m256i m32 = _mm256_set1_epi16(32);
#pragma GCC unroll 2
  for (int h = 0; h < 2; ++h) {
    __m256i v[4];
    q3_scales(b, h, v);
#pragma GCC unroll 16
    for (int k = 0; k < 16; ++k) out[k][h] = _mm256_sub_epi16(_mm256_shuffle_epi8(v[k / 4], ctrl_dup(k % 4)), m32);
  }
}

/// q2_K: out[k][h] for sub-block k (values 16k .. 16k + 15), the low
/// nibble of its scale byte; q2_mins the high nibbles, as int16 pairs
/// (m_2u, m_2u+1), u < 8.
inline void scale_pairs(const block_q2_K_x16& b, __m256i (*out)[2]) noexcept {
  const __m256i m0f = _mm256_set1_epi8(0x0f);
#pragma GCC unroll 2
  for (int h = 0; h < 2; ++h)
#pragma GCC unroll 16
    for (int k = 0; k < 16; ++k)
      out[k][h] = _mm256_shuffle_epi8(_mm256_and_si256(load8(b.scales[k / 4] + 8 * h), m0f), ctrl_dup(k % 4));
}
inline void q2_mins(const block_q2_K_x16& b, int h, __m256i* out) noexcept {
  const __m256i m0f = _mm256_set1_epi8(0x0f);
#pragma GCC unroll 8
  for (int u = 0; u < 8; ++u)
    out[u] = _mm256_shuffle_epi8(_mm256_and_si256(_mm256_srli_epi32(load8(b.scales[u / 2] + 8 * h), 4), m0f),
                                 ctrl_pair(2 * (u % 2)));
}

/// The types whose codes carry an offset (q6_K: 32, q3_K: 4 = 2^offset_shift)
/// taken off per block as offset * sum_k sc_k bsum_k: out[u] lane r the int16
/// pair (sc_2u, sc_2u+1) of row 8h + r.
inline void offset_pairs(const block_q6_K_x16& b, int h, __m256i* out) noexcept {
#pragma GCC unroll 8
  for (int u = 0; u < 8; ++u) {
    const __m128i s0 = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(b.scales[u][0] + 8 * h));
    const __m128i s1 = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(b.scales[u][1] + 8 * h));
    out[u] = _mm256_cvtepi8_epi16(_mm_unpacklo_epi8(s0, s1));
  }
}
inline void offset_pairs(const block_q3_K_x16& b, int h, __m256i* out) noexcept {
  const __m256i m32 = _mm256_set1_epi16(32);
  __m256i v[4];
  q3_scales(b, h, v);
#pragma GCC unroll 8
  for (int u = 0; u < 8; ++u) out[u] = _mm256_sub_epi16(_mm256_shuffle_epi8(v[u / 2], ctrl_pair(2 * (u % 2))), m32);
}
template <class X> inline constexpr int offset_shift = std::is_same_v<X, block_q6_K_x16> ? 5 : 2;

/// q3_K's 3-bit codes (value + 4) of one unit's loads (8 rows): values 4g +
/// j (lo: low bits from ql0, high bit from bit g of hm) and 16 + 4g + j (hi:
/// ql1, bit 4 + g), each moved to bit 2 by a 16-bit shift that moves no bit
/// it keeps across bytes.
inline void q3_codes(__m256i ql0, __m256i ql1, __m256i hm, int g, __m256i& lo, __m256i& hi) noexcept {
  const __m256i m03 = _mm256_set1_epi8(0x03), m04 = _mm256_set1_epi8(0x04);
  __m256i blo, l0, l1;
  switch (g) {
    case 0: blo = _mm256_slli_epi16(hm, 2), l0 = ql0, l1 = ql1; break;
    case 1: blo = _mm256_slli_epi16(hm, 1), l0 = _mm256_srli_epi16(ql0, 2), l1 = _mm256_srli_epi16(ql1, 2); break;
    case 2: blo = hm, l0 = _mm256_srli_epi16(ql0, 4), l1 = _mm256_srli_epi16(ql1, 4); break;
    default: blo = _mm256_srli_epi16(hm, 1), l0 = _mm256_srli_epi16(ql0, 6), l1 = _mm256_srli_epi16(ql1, 6); break;
  }
  __m256i bhi;
  switch (g) {
    case 0: bhi = _mm256_srli_epi16(hm, 2); break;
    case 1: bhi = _mm256_srli_epi16(hm, 3); break;
    case 2: bhi = _mm256_srli_epi16(hm, 4); break;
    default: bhi = _mm256_srli_epi16(hm, 5); break;
  }
  lo = _mm256_or_si256(_mm256_and_si256(l0, m03), _mm256_and_si256(blo, m04));
  hi = _mm256_or_si256(_mm256_and_si256(l1, m03), _mm256_and_si256(bhi, m04));
}

/// s[t][i][h] (lane r: 2 int16 of row 8h + r of panel i) = the products of
/// the codes of loads g in [G0, G1) with token t's activations acts(t):
/// code(i, g, h, lo, hi) gives rows 8h .. 8h + 7's codes of values 4g + j
/// (lo) and 16 + 4g + j (hi), j < 4; a vpmaddubsw each, summed in int16.
template <int G0, int G1, std::size_t NT, std::size_t NP, class Code, class Acts>
inline void code_sums(Code&& code, Acts&& acts, __m256i (*s)[NP][2]) noexcept {
  for (std::size_t t = 0; t < NT; ++t)
    for (std::size_t i = 0; i < NP; ++i) s[t][i][0] = s[t][i][1] = _mm256_setzero_si256();
#pragma GCC unroll 4
  for (int g = G0; g < G1; ++g) {
    __m256i alo[NT], ahi[NT];
    for (std::size_t t = 0; t < NT; ++t) {
      const std::int8_t* q = acts(t) + 4 * g;
      alo[t] = bcast4(q), ahi[t] = bcast4(q + 16);
    }
    for (std::size_t i = 0; i < NP; ++i)
#pragma GCC unroll 2
      for (int h = 0; h < 2; ++h) {
        __m256i lo, hi;
        code(i, g, h, lo, hi);
        for (std::size_t t = 0; t < NT; ++t)
          s[t][i][h] = _mm256_add_epi16(s[t][i][h],
                                        _mm256_add_epi16(_mm256_maddubs_epi16(lo, alo[t]), _mm256_maddubs_epi16(hi, ahi[t])));
      }
  }
}

/// code_sums of 32 nibble codes: codes(i, g) the 16 rows x 4 bytes whose
/// low nibbles are values 4g + j and high nibbles 16 + 4g + j; 8 vpmaddubsw
/// per row and token, at most 8 * 2 * 15 * 128 = 30720. The q4_K sub-block
/// step here and q4_0's block step (quant/legacy_x16_avx2.hpp).
template <std::size_t NT, std::size_t NP, class Codes, class Acts>
inline void nibble_sums(Codes&& codes, Acts&& acts, __m256i (*s)[NP][2]) noexcept {
  const __m256i m0f = _mm256_set1_epi8(0x0f);
  code_sums<0, 4, NT, NP>(
      [&](std::size_t i, int g, int h, __m256i& lo, __m256i& hi) {
        const __m256i c = load8(codes(i, g) + 8 * h);
        lo = _mm256_and_si256(c, m0f), hi = _mm256_and_si256(_mm256_srli_epi16(c, 4), m0f);
      },
      acts, s);
}

/// code_sums of 5-bit codes over loads G0 and G0 + 1, their fifth bits from
/// high(i) (16 rows x 4 bytes, q5_codes): a vpmaddubsw lane <= 2 * 31 * 128
/// = 7936, four <= 31744. The q5_K sub-block's two halves and the q5_0 /
/// q5_1 block's (quant/legacy_x16_avx2.hpp).
template <int G0, std::size_t NT, std::size_t NP, class Codes, class High, class Acts>
inline void q5_sums(Codes&& codes, High&& high, Acts&& acts, __m256i (*s)[NP][2]) noexcept {
  code_sums<G0, G0 + 2, NT, NP>(
      [&](std::size_t i, int g, int h, __m256i& lo, __m256i& hi) {
        q5_codes(load8(codes(i, g) + 8 * h), load8(high(i) + 32 * h), g, lo, hi);
      },
      acts, s);
}

/// acc[(NP t + i) 2 + h] (lane r = row 8h + r of panel p[i]) = the dot of
/// that row with token t < NT over blocks [0, nb) (the arithmetic in the
/// header). NP > 1 walks NP panels side by side: NP streams through memory.
/// Decode's software prefetch (x16_pairs): while unit u of a block is read,
/// the unit's bytes prefetch_bytes further on, non-temporal, so the lines
/// ahead of each stream are asked for evenly through the block (the
/// distance measured in the header).
inline constexpr std::size_t prefetch_bytes = 576;

template <class X, std::size_t NT, std::size_t NP = 1, bool Prefetch = false>
inline void x16_group(const X* const* p, const block_q8_K* a, std::size_t nb, std::size_t stride, __m256* acc) noexcept {
  constexpr bool q6 = std::is_same_v<X, block_q6_K_x16>, q5 = std::is_same_v<X, block_q5_K_x16>,
                 q3 = std::is_same_v<X, block_q3_K_x16>, q2 = std::is_same_v<X, block_q2_K_x16>;
  constexpr std::size_t NA = 2 * NP * NT;  // accumulators
  __m256 accm[NA];
  for (std::size_t k = 0; k < NA; ++k) acc[k] = accm[k] = _mm256_setzero_ps();
  for (std::size_t b = 0; b < nb; ++b) {
    __m256i scp[NP][q6 || q3 || q2 ? 16 : 8][2];
    for (std::size_t i = 0; i < NP; ++i) {
      scale_pairs(p[i][b], scp[i]);
    }
    __m256i tot[NT][NP][2];
    for (std::size_t t = 0; t < NT; ++t)
      for (std::size_t i = 0; i < NP; ++i) tot[t][i][0] = tot[t][i][1] = _mm256_setzero_si256();
    for (int u = 0; u < 8; ++u) {
      if constexpr (Prefetch)
        for (std::size_t i = 0; i < NP; ++i) {
          const char* at = reinterpret_cast<const char*>(p[i] + b) + head_bytes<X> + u * unit_bytes<X> + prefetch_bytes;
          for (std::size_t l = 0; l < unit_bytes<X>; l += 64) _mm_prefetch(at + l, _MM_HINT_NTA);
        }
      if constexpr (q6) {
#pragma GCC unroll 2
        for (int g = 0; g < 4; g += 2) {
          __m256i a4[NT][4];  // values 4g, 4g + 4, 16 + 4g, 20 + 4g of the unit, 4 bytes each
          for (std::size_t t = 0; t < NT; ++t) {
            const std::int8_t* q = a[t * stride + b].qs + 32 * u + 4 * g;
            a4[t][0] = bcast4(q), a4[t][1] = bcast4(q + 4), a4[t][2] = bcast4(q + 16), a4[t][3] = bcast4(q + 20);
          }
          for (std::size_t i = 0; i < NP; ++i) {
            const X& pb = p[i][b];
#pragma GCC unroll 2
            for (int h = 0; h < 2; ++h) {
              const __m256i qh0 = load8(pb.unit[u].qh[0] + 8 * h), qh1 = load8(pb.unit[u].qh[1] + 8 * h);
              __m256i lo0, hi0, lo1, hi1;
              q6_codes(load8(pb.unit[u].ql[g] + 8 * h), qh0, qh1, g, lo0, hi0);
              q6_codes(load8(pb.unit[u].ql[g + 1] + 8 * h), qh0, qh1, g + 1, lo1, hi1);
              for (std::size_t t = 0; t < NT; ++t) {
                const __m256i s0 = _mm256_add_epi16(_mm256_maddubs_epi16(lo0, a4[t][0]), _mm256_maddubs_epi16(lo1, a4[t][1]));
                const __m256i s1 = _mm256_add_epi16(_mm256_maddubs_epi16(hi0, a4[t][2]), _mm256_maddubs_epi16(hi1, a4[t][3]));
                tot[t][i][h] = _mm256_add_epi32(tot[t][i][h], _mm256_add_epi32(_mm256_madd_epi16(s0, scp[i][2 * u][h]),
                                                                             _mm256_madd_epi16(s1, scp[i][2 * u + 1][h])));
              }
            }
          }
        }
      } else if constexpr (q3 || q2) {
        // Codes up to 7 (q2_K: 3): a vpmaddubsw lane <= 2 * 7 * 128 = 1792, a
        // sub-block's 4 summed <= 7168 in int16; one vpmaddwd per sub-block.
        // code_sums' loop, but with the lo and hi products kept apart: the
        // same loop made generic over how products are added (a lambda per
        // product) cost Q3_K_M pp64 3-5% (TinyLlama, 3 alternated rounds,
        // 102.5-104.0 / 97.1-100.8 t/s), so it stays written out.
        __m256i s[NT][NP][2][2];  // [.][.][h][sub-block 2u + k]
        for (std::size_t t = 0; t < NT; ++t)
          for (std::size_t i = 0; i < NP; ++i)
            for (int h = 0; h < 2; ++h) s[t][i][h][0] = s[t][i][h][1] = _mm256_setzero_si256();
#pragma GCC unroll 4
        for (int g = 0; g < 4; ++g) {
          __m256i alo[NT], ahi[NT];
          for (std::size_t t = 0; t < NT; ++t) {
            const std::int8_t* q = a[t * stride + b].qs + 32 * u + 4 * g;
            alo[t] = bcast4(q), ahi[t] = bcast4(q + 16);
          }
          for (std::size_t i = 0; i < NP; ++i)
#pragma GCC unroll 2
            for (int h = 0; h < 2; ++h) {
              const auto& un = p[i][b].unit[u];
              __m256i lo, hi;
              if constexpr (q3) {
                q3_codes(load8(un.ql[0] + 8 * h), load8(un.ql[1] + 8 * h), load8(un.hmask[8 * h]), g, lo, hi);
              } else {
                const __m256i m03 = _mm256_set1_epi8(0x03);
                lo = _mm256_and_si256(_mm256_srli_epi16(load8(un.ql[0] + 8 * h), 2 * g), m03);
                hi = _mm256_and_si256(_mm256_srli_epi16(load8(un.ql[1] + 8 * h), 2 * g), m03);
              }
              for (std::size_t t = 0; t < NT; ++t) {
                s[t][i][h][0] = _mm256_add_epi16(s[t][i][h][0], _mm256_maddubs_epi16(lo, alo[t]));
                s[t][i][h][1] = _mm256_add_epi16(s[t][i][h][1], _mm256_maddubs_epi16(hi, ahi[t]));
              }
            }
        }
        for (std::size_t t = 0; t < NT; ++t)
          for (std::size_t i = 0; i < NP; ++i)
            for (int h = 0; h < 2; ++h)
              tot[t][i][h] = _mm256_add_epi32(tot[t][i][h], _mm256_add_epi32(_mm256_madd_epi16(s[t][i][h][0], scp[i][2 * u][h]),
                                                                           _mm256_madd_epi16(s[t][i][h][1], scp[i][2 * u + 1][h])));
      } else if constexpr (q5) {
        // two int16 sums per sub-block (q5_sums), each scaled into tot
        auto half = [&]<int G0>() {
          __m256i s[NT][NP][2];
          q5_sums<G0, NT, NP>([&](std::size_t i, int g) { return p[i][b].unit[u].qs[g]; },
                              [&](std::size_t i) { return p[i][b].unit[u].qh[0]; },
                              [&](std::size_t t) { return a[t * stride + b].qs + 32 * u; }, s);
          for (std::size_t t = 0; t < NT; ++t)
            for (std::size_t i = 0; i < NP; ++i)
              for (int h = 0; h < 2; ++h) tot[t][i][h] = _mm256_add_epi32(tot[t][i][h], _mm256_madd_epi16(s[t][i][h], scp[i][u][h]));
        };
        half.template operator()<0>();
        half.template operator()<2>();
      } else {
        __m256i s[NT][NP][2];
        nibble_sums<NT, NP>([&](std::size_t i, int g) { return p[i][b].qs[u][g]; },
                            [&](std::size_t t) { return a[t * stride + b].qs + 32 * u; }, s);
        for (std::size_t t = 0; t < NT; ++t)
          for (std::size_t i = 0; i < NP; ++i)
            for (int h = 0; h < 2; ++h) tot[t][i][h] = _mm256_add_epi32(tot[t][i][h], _mm256_madd_epi16(s[t][i][h], scp[i][u][h]));
      }
    }
    for (std::size_t i = 0; i < NP; ++i) {
      const X& pb = p[i][b];
#pragma GCC unroll 2
      for (int h = 0; h < 2; ++h) {
        const __m256 d = halfs(pb.d + 8 * h);
        if constexpr (q6 || q3) {
          // the code offset: tot -= offset sum_k sc_k bsum_k, sub-blocks k in pairs
          __m256i scp2[8];
          offset_pairs(pb, h, scp2);
          for (std::size_t t = 0; t < NT; ++t) {
            const block_q8_K& ab = a[t * stride + b];
            __m256i corr = _mm256_setzero_si256();
#pragma GCC unroll 8
            for (int u = 0; u < 8; ++u) {
              std::int32_t pair;
              std::memcpy(&pair, ab.bsums + 2 * u, 4);
              corr = _mm256_add_epi32(corr, _mm256_madd_epi16(scp2[u], _mm256_set1_epi32(pair)));
            }
            const __m256i st = _mm256_sub_epi32(tot[t][i][h], _mm256_slli_epi32(corr, offset_shift<X>));
            __m256& o = acc[(NP * t + i) * 2 + h];
            o = _mm256_fmadd_ps(_mm256_mul_ps(d, _mm256_set1_ps(ab.d)), _mm256_cvtepi32_ps(st), o);
          }
        } else {
          const __m256 dmin = halfs(pb.dmin + 8 * h);
          // C = sum_k m_k bsum_k: q4_K / q5_K, 8 sub-blocks of 32 (mins
          // (m_2j, m_2j+1) against bsum_pairs); q2_K, 16 of 16 (q8_K's bsums)
          constexpr int NM = q2 ? 8 : 4;
          __m256i mins[NM];
          if constexpr (q2) {
            q2_mins(pb, h, mins);
          } else {
            const k4_half mn = unpack_mins(pb, h);
#pragma GCC unroll 4
            for (int j = 0; j < 4; ++j) mins[j] = _mm256_shuffle_epi8(mn.v[j / 2], ctrl_pair(2 * (j % 2)));  // (m_2j, m_2j+1)
          }
          for (std::size_t t = 0; t < NT; ++t) {
            const block_q8_K& ab = a[t * stride + b];
            alignas(16) std::int32_t pairs[NM];
            if constexpr (q2)
              std::memcpy(pairs, ab.bsums, sizeof pairs);
            else
              bsum_pairs(ab, pairs);
            __m256i corr = _mm256_setzero_si256();
#pragma GCC unroll 8
            for (int j = 0; j < NM; ++j) corr = _mm256_add_epi32(corr, _mm256_madd_epi16(mins[j], _mm256_set1_epi32(pairs[j])));
            const std::size_t k = (NP * t + i) * 2 + h;
            accm[k] = _mm256_fmadd_ps(_mm256_mul_ps(dmin, _mm256_set1_ps(-ab.d)), _mm256_cvtepi32_ps(corr), accm[k]);
            acc[k] = _mm256_fmadd_ps(_mm256_mul_ps(d, _mm256_set1_ps(ab.d)), _mm256_cvtepi32_ps(tot[t][i][h]), acc[k]);
          }
        }
      }
    }
  }
  if constexpr (!q6 && !q3)
    for (std::size_t k = 0; k < NA; ++k) acc[k] = _mm256_add_ps(acc[k], accm[k]);
}

/// acc[0 .. 3]: rows 0-7 and 8-15 of n_rows-row panels, stored to out[r] (r < n_rows).
inline void store_panel(const __m256* acc, std::size_t n_rows, float* o) noexcept {
  if (n_rows >= 16) {
    _mm256_storeu_ps(o, acc[0]);
    _mm256_storeu_ps(o + 8, acc[1]);
  } else {
    alignas(32) float tmp[16];
    _mm256_store_ps(tmp, acc[0]);
    _mm256_store_ps(tmp + 8, acc[1]);
    std::memcpy(o, tmp, n_rows * sizeof(float));
  }
}

/// The first start_bytes of decode's two streams, asked for at once when a
/// thread takes a chunk of panels (x16_pairs, q40x16::pairs): each chunk
/// starts two streams cold, one to five chunks per thread and matrix
/// (thread_pool's guided chunks, cpu::guided_rounds), and the stride prefetch above covers
/// only what lies 576 bytes ahead of the kernel. Measured (Zen 3 guest, 2
/// threads, q4_K x16 decode over 160 MB of copies, alternated in one
/// process, GB/s ratio with / without): 768 x 768 1.076, 2048 x 768 1.060.
inline constexpr std::size_t start_bytes = 1024;
inline void prefetch_start(const void* a, const void* b) noexcept {
  for (std::size_t l = 0; l < start_bytes; l += 64) {
    _mm_prefetch(static_cast<const char*>(a) + l, _MM_HINT_T0);
    _mm_prefetch(static_cast<const char*>(b) + l, _MM_HINT_T0);
  }
}

/// Decode (one token): full panels p0 .. p0 + 2n - 1 (nb blocks each, one
/// after another), panels p0 + i and p0 + n + i side by side, two streams
/// through memory; out[16 (panel - p0) + r].
template <class X>
inline void x16_pairs(const X* p0, std::size_t n, const block_q8_K* a, std::size_t nb, float* out) noexcept {
  if (n) prefetch_start(p0, p0 + n * nb);
  for (std::size_t i = 0; i < n; ++i) {
    const X* ps[2] = {p0 + i * nb, p0 + (n + i) * nb};
    __m256 acc[4];
    x16_group<X, 1, 2, true>(ps, a, nb, nb, acc);
    store_panel(acc, 16, out + 16 * i);
    store_panel(acc + 2, 16, out + 16 * (n + i));
  }
}

/// A panel (nb x16 blocks, n_rows valid rows) against tokens [0, n_tokens)
/// (nb q8_K blocks each, consecutive) in groups of token_group (then 1):
/// out[t * out_stride + r] for r < n_rows.
template <class X>
inline void x16_tokens(const X* p, std::size_t n_rows, const block_q8_K* a, std::size_t nb, std::size_t n_tokens,
                       float* out, std::size_t out_stride) noexcept {
  for_token_groups<token_group>(n_tokens, [&]<std::size_t NT>(std::size_t t) {
    __m256 acc[2 * NT];
    x16_group<X, NT>(&p, a + t * nb, nb, nb, acc);
    for (std::size_t i = 0; i < NT; ++i) store_panel(acc + 2 * i, n_rows, out + (t + i) * out_stride);
  });
}

}  // namespace detail::x16
#endif
