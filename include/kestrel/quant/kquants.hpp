// kestrel/quant/kquants.hpp: the GGUF k-quant formats q2_K .. q6_K
// (layouts, quantize_row, dequantize_row in kquants_format.hpp) and their
// dot products against activations quantized once per step to q8_K:
//
//   float vec_dot(const block_qN_K* w, const block_q8_K* a, size_t n);  // N = 2..6
//   void vec_dot_tokens(w, a, n, n_tokens, out, out_stride);  // one row, several tokens
//
// n is the row length in values, a multiple of 256 (invalid_argument
// otherwise). With AVX2 the SIMD kernels below run; without it the scalar
// twin quant::ref::vec_dot (ref/kquants.hpp) does.
//
// How a SIMD kernel computes one super-block (256 values, sub-blocks of 16
// or 32 sharing an integer scale sc_g and, for q2/q4/q5_K, an integer min
// m_g): the weight codes are unpacked to unsigned bytes v in [0, 2^bits),
// and
//   sum_i x_i a_i = d8 * (d * sum_g sc_g sum_{i in g} (v_i - o) a_i
//                         - dmin * sum_g m_g bsum_g)
// with o the code offset (4 for q3_K, 32 for q6_K, 0 otherwise) and bsum_g
// = sum_{i in g} a_i from the q8_K block, so the offset becomes
// - o * sum_g sc_g bsum_g and the min term never touches the 256 values.
// Per 32 values: vpmaddubsw (u8 x s8, adjacent pairs summed into int16)
// then the per-sub-block scale applied by an int16 x int16 multiply-add
// into int32 lanes (vpdpwssd with AVX-512 VNNI, else vpmaddwd + vpaddd).
// The integer sum of a whole super-block is exact (two int32 accumulators,
// so consecutive multiply-adds do not wait on each other); it meets the
// float scales once per block: one convert and one FMA into 8 float lanes,
// and the same for the min term into a second set of lanes.
//
// A weight block is first unpacked into registers (unpack_codes: codes v,
// scale vectors, bsum coefficients), then meets one or more tokens'
// activation blocks (dot_tokens<Isa, NT>): unpacking is the larger part of
// the work, so short prompts share it across a group of tokens
// (vec_dot_tokens: about half the time per token and block, data in L1).
// Each token's arithmetic is the same for every NT, so a token's result is
// the same alone or in a group. With AVX-512 VNNI, longer prompts
// (quant::kpanel_min_tokens) take quant/kquant_panels.hpp instead.
//
// Why not vpdpbusd here: it sums 4 products into int32 directly, but the
// sub-block scale then needs a 32-bit multiply per lane; vpmaddubsw +
// vpdpwssd applies the scale in the same two instructions. That holds for
// one row against one token; kquant_panels.hpp lays 16 rows across the
// lanes, where one vpmulld serves 8 vpdpbusd (4 with 16-value sub-blocks)
// for 16 rows and vpdpbusd wins (about 2x per token in prefill).
//
// Integer bounds (a_i in [-128, 127]; q8_K's quantize_row gives |a_i| <=
// 127, ggml's may give -128):
// - vpmaddubsw saturates int16: |v0 a0 + v1 a1| <= 2 * 63 * 128 = 16128
//   < 32767 for the widest code (q6_K, v <= 63), so it never saturates.
// - int32 lanes over a block: |sum_g sc_g sum_i v_i a_i| <= 256 * max|sc|
//   * max v * 128: q6_K 256 * 128 * 63 * 128 = 2.6e8, q5_K 256 * 63 * 31 *
//   128 = 6.4e7, the others less; offset terms o * sum |sc_g bsum_g| <= 32 *
//   16 * 128 * 2048 = 1.3e8 (q6_K). All below 2^31 = 2.1e9.
//
// Float: the SIMD kernel and the twin both compute the exact integer sums,
// but round differently afterwards (the twin per sub-block, the kernel per
// block and per lane), so they agree to within a rounding bound, not bit
// for bit; tests/quant/test_kquants_simd.cpp derives it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <type_traits>

#if defined(__AVX2__)
#include <immintrin.h>
#endif

#include "kestrel/quant/simd.hpp"
#include "kestrel/quant/kquants_format.hpp"
#include "kestrel/quant/ref/kquants.hpp"
#include "kestrel/quant/token_groups.hpp"

namespace kestrel::quant {

#if defined(__AVX2__)
namespace detail::kq {

// Instruction-set tags for the kernels: every tag the build can run is
// instantiable, so the tests compare each against the scalar twin.
struct avx2 {};         // vpmaddubsw + vpmaddwd + vpaddd
#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
struct avx512_vnni {};  // vpmaddubsw + vpdpwssd
using best_isa = avx512_vnni;
#else
using best_isa = avx2;
#endif

/// acc + sum of adjacent int16 products p * s, in 8 int32 lanes.
template <class Isa>
inline __m256i madd_acc(__m256i acc, __m256i p, __m256i s) noexcept {
#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
  if constexpr (std::is_same_v<Isa, avx512_vnni>) return _mm256_dpwssd_epi32(acc, p, s);
#endif
  return _mm256_add_epi32(acc, _mm256_madd_epi16(p, s));
}

inline __m256i load256(const void* p) noexcept { return _mm256_loadu_si256(static_cast<const __m256i*>(p)); }
inline __m256i bytes(int c) noexcept { return _mm256_set1_epi8(static_cast<char>(c)); }

/// Bits [from, from + w) of every byte moved to [to, to + w), the other bits
/// zero. 16-bit shifts are safe: with from + w <= 8 and to + w <= 8 every
/// kept bit comes from its own byte.
inline __m256i move_bits(__m256i x, int from, int to, int w) noexcept {
  const __m256i y = from >= to ? _mm256_srli_epi16(x, from - to) : _mm256_slli_epi16(x, to - from);
  return _mm256_and_si256(y, bytes(((1 << w) - 1) << to));
}

/// 16-value sub-blocks: sc16 holds 16 int16 scales (sub-blocks 0..7 in the
/// low 128-bit lane, 8..15 in the high one). For the 32 values 32 j .. 32 j
/// + 31 of half h (sub-blocks 8h + 2j and 8h + 2j + 1), the vpmaddubsw
/// output's low lane needs scale 8h + 2j in all 8 int16s, the high lane
/// scale 8h + 2j + 1.
inline __m256i half_scales(__m256i sc16, int h) noexcept {
  return h == 0 ? _mm256_permute2x128_si256(sc16, sc16, 0x00) : _mm256_permute2x128_si256(sc16, sc16, 0x11);
}
inline __m256i pair_scales(__m256i half, int j) noexcept {
  const __m256i ctrl = _mm256_setr_epi8(0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1,  //
                                        2, 3, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3);
  return _mm256_shuffle_epi8(half, _mm256_add_epi8(ctrl, bytes(4 * j)));
}
/// 32-value sub-blocks: s8 holds 8 int16 scales in both 128-bit lanes;
/// sub-block g's scale in all 16 int16s.
inline __m256i group_scale(__m256i s8, int g) noexcept {
  const __m256i ctrl = _mm256_setr_epi8(0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1,  //
                                        0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1);
  return _mm256_shuffle_epi8(s8, _mm256_add_epi8(ctrl, bytes(2 * g)));
}

using simd256::fmadd;
using simd256::h2f;
using simd256::hsum;

inline std::uint32_t load_u32(const std::uint8_t* p) noexcept {
  std::uint32_t v;
  std::memcpy(&v, p, 4);
  return v;
}

/// q4_K / q5_K's 12 scale bytes (see get_scale_min_k4) as 8 scales and 8
/// mins, one per byte, with 32-bit word arithmetic: with A, B, C the words
/// at bytes 0, 4, 8, scales 0..3 = A & 63, mins 0..3 = B & 63, scales 4..7
/// = C's low nibbles | A's top two bits << 4, mins 4..7 = C's high nibbles
/// | B's top two bits << 4.
inline void scales_k4(const std::uint8_t* s, std::uint64_t& sc, std::uint64_t& mn) noexcept {
  const std::uint32_t a = load_u32(s), b = load_u32(s + 4), c = load_u32(s + 8);
  const std::uint32_t sc_lo = a & 0x3f3f3f3fu, mn_lo = b & 0x3f3f3f3fu;
  const std::uint32_t sc_hi = (c & 0x0f0f0f0fu) | (((a >> 6) & 0x03030303u) << 4);
  const std::uint32_t mn_hi = ((c >> 4) & 0x0f0f0f0fu) | (((b >> 6) & 0x03030303u) << 4);
  sc = sc_lo | (std::uint64_t(sc_hi) << 32);
  mn = mn_lo | (std::uint64_t(mn_hi) << 32);
}

/// q3_K's 12 scale bytes (see get_scale_k3) as 16 signed scales sc - 32:
/// low nibbles of bytes 0..7 then their high nibbles; the top two bits of
/// scale 4k + r are bits 2k, 2k + 1 of byte 8 + r.
inline __m128i scales_k3(const std::uint8_t* s) noexcept {
  std::uint64_t lo8;
  std::memcpy(&lo8, s, 8);
  const std::uint32_t hi4 = load_u32(s + 8);
  const std::uint64_t m2 = 0x03030303u;
  const std::uint64_t top_a = (hi4 & m2) | (((hi4 >> 2) & m2) << 32);         // scales 0..7
  const std::uint64_t top_b = ((hi4 >> 4) & m2) | (((hi4 >> 6) & m2) << 32);  // scales 8..15
  const std::uint64_t a = (lo8 & 0x0f0f0f0f0f0f0f0full) | (top_a << 4);
  const std::uint64_t b = ((lo8 >> 4) & 0x0f0f0f0f0f0f0f0full) | (top_b << 4);
  return _mm_sub_epi8(_mm_set_epi64x(static_cast<long long>(b), static_cast<long long>(a)), _mm_set1_epi8(32));
}

// ---- unpacking one weight super-block for the integer dot ----
//
// Value i = 128 h + 32 j + k (k < 32) of the 2-bit layouts (q2_K, q3_K, and
// q6_K's high bits) is bits 2j, 2j + 1 of byte k of the half's 32 bytes; of
// q4_K / q5_K's nibbles, value 64 c + 32 t + k is nibble t of byte k of the
// c-th 32 bytes; of q6_K's low nibbles, value 128 h + 32 j + k is nibble j / 2
// of byte 32 (j % 2) + k of the half's 64 bytes. The fifth bit of q5_K and
// the third of q3_K: value i is bit i / 32 of byte i % 32.

/// A weight super-block ready to meet any number of q8_K activation blocks:
/// v[k] holds the codes of values 32k .. 32k + 31 as unsigned bytes, s[k]
/// the int16 scale for each int16 vpmaddubsw makes of them, coef one int16
/// per 16 values to vpmaddwd with the activations' bsums: the mins
/// (q2/q4/q5_K, the term is then scaled by -dmin) or the scales (q3/q6_K,
/// the term is then scaled by the code offset 2^offset_shift).
struct block_codes {
  __m256i v[8], s[8], coef;
  float d, dmin;
};
template <class B> inline constexpr bool has_min = true;
template <> inline constexpr bool has_min<block_q3_K> = false;
template <> inline constexpr bool has_min<block_q6_K> = false;
template <class B> inline constexpr int offset_shift = 0;
template <> inline constexpr int offset_shift<block_q3_K> = 2;  // codes v - 4
template <> inline constexpr int offset_shift<block_q6_K> = 5;  // codes v - 32

inline void unpack_codes(const block_q2_K& b, block_codes& c) noexcept {
  const __m128i raw = _mm_loadu_si128(reinterpret_cast<const __m128i*>(b.scales));
  const __m128i lo4 = _mm_set1_epi8(0x0f);
  const __m256i sc16 = _mm256_cvtepu8_epi16(_mm_and_si128(raw, lo4));
  c.coef = _mm256_cvtepu8_epi16(_mm_and_si128(_mm_srli_epi16(raw, 4), lo4));  // mins; |coef bsum| <= 2 * 15 * 2048
  for (int h = 0; h < 2; ++h) {
    const __m256i qs = load256(b.qs + 32 * h);
    const __m256i sh = half_scales(sc16, h);
    for (int j = 0; j < 4; ++j) {
      c.v[4 * h + j] = move_bits(qs, 2 * j, 0, 2);
      c.s[4 * h + j] = pair_scales(sh, j);
    }
  }
  c.d = h2f(b.d);
  c.dmin = h2f(b.dmin);
}

inline void unpack_codes(const block_q3_K& b, block_codes& c) noexcept {
  c.coef = _mm256_cvtepi8_epi16(scales_k3(b.scales));
  const __m256i hm = load256(b.hmask);
  for (int h = 0; h < 2; ++h) {
    const __m256i qs = load256(b.qs + 32 * h);
    const __m256i sh = half_scales(c.coef, h);
    for (int j = 0; j < 4; ++j) {
      // v = low two bits | third bit << 2, in [0, 7]; the code is v - 4
      c.v[4 * h + j] = _mm256_or_si256(move_bits(qs, 2 * j, 0, 2), move_bits(hm, 4 * h + j, 2, 1));
      c.s[4 * h + j] = pair_scales(sh, j);
    }
  }
  c.d = h2f(b.d);
  c.dmin = 0;
}

/// q4_K and q5_K (HighBit): eight 32-value sub-blocks.
template <bool HighBit, class B>
inline void unpack_codes_k45(const B& b, block_codes& c) noexcept {
  std::uint64_t sc, mn;
  scales_k4(b.scales, sc, mn);
  const __m256i s8 = _mm256_broadcastsi128_si256(_mm_cvtepu8_epi16(_mm_cvtsi64_si128(static_cast<long long>(sc))));
  // min j in both int16 halves of int32 lane j: vpmaddwd with the bsums
  // gives m_j (bsum_2j + bsum_2j+1), sub-block j's min term.
  const __m256i m32 = _mm256_cvtepu8_epi32(_mm_cvtsi64_si128(static_cast<long long>(mn)));
  c.coef = _mm256_or_si256(m32, _mm256_slli_epi32(m32, 16));
  __m256i hb = _mm256_setzero_si256();
  if constexpr (HighBit) hb = load256(b.qh);
  for (int k = 0; k < 4; ++k) {
    const __m256i qs = load256(b.qs + 32 * k);
    __m256i v0 = _mm256_and_si256(qs, bytes(0x0f));
    __m256i v1 = move_bits(qs, 4, 0, 4);
    if constexpr (HighBit) {
      v0 = _mm256_or_si256(v0, move_bits(hb, 2 * k, 4, 1));
      v1 = _mm256_or_si256(v1, move_bits(hb, 2 * k + 1, 4, 1));
    }
    c.v[2 * k] = v0;
    c.v[2 * k + 1] = v1;
    c.s[2 * k] = group_scale(s8, 2 * k);
    c.s[2 * k + 1] = group_scale(s8, 2 * k + 1);
  }
  c.d = h2f(b.d);
  c.dmin = h2f(b.dmin);
}
inline void unpack_codes(const block_q4_K& b, block_codes& c) noexcept { unpack_codes_k45<false>(b, c); }
inline void unpack_codes(const block_q5_K& b, block_codes& c) noexcept { unpack_codes_k45<true>(b, c); }

inline void unpack_codes(const block_q6_K& b, block_codes& c) noexcept {
  c.coef = _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(b.scales)));
  for (int h = 0; h < 2; ++h) {
    const __m256i l0 = load256(b.ql + 64 * h), l1 = load256(b.ql + 64 * h + 32);
    const __m256i hi = load256(b.qh + 32 * h);
    const __m256i sh = half_scales(c.coef, h);
    for (int j = 0; j < 4; ++j) {
      // v = low nibble | two high bits << 4, in [0, 63]; the code is v - 32
      const __m256i lo = move_bits(j % 2 ? l1 : l0, 4 * (j / 2), 0, 4);
      c.v[4 * h + j] = _mm256_or_si256(lo, move_bits(hi, 2 * j, 4, 2));
      c.s[4 * h + j] = pair_scales(sh, j);
    }
  }
  c.d = h2f(b.d);
  c.dmin = 0;
}

// ---- the kernel: one weight row against NT tokens' activations ----

/// out[t] = the dot of the row w (nb super-blocks) with token t's
/// activations a + t * stride, t < NT. Each weight block is unpacked once
/// for all NT tokens; each token's arithmetic is the same instruction
/// sequence whatever NT is, so its result is bit-identical for every NT.
template <class Isa, std::size_t NT, class B>
inline void dot_tokens(const B* w, const block_q8_K* a, std::size_t nb, std::size_t stride, float* out) noexcept {
  __m256 acc[NT], acc_min[NT];
  for (std::size_t t = 0; t < NT; ++t) acc[t] = acc_min[t] = _mm256_setzero_ps();
  block_codes c;
  for (std::size_t bi = 0; bi < nb; ++bi) {
    unpack_codes(w[bi], c);
    for (std::size_t t = 0; t < NT; ++t) {
      const block_q8_K& q8 = a[t * stride + bi];
      __m256i isum[2] = {_mm256_setzero_si256(), _mm256_setzero_si256()};
      for (int k = 0; k < 8; ++k) {
        const __m256i p = _mm256_maddubs_epi16(c.v[k], load256(q8.qs + 32 * k));
        isum[k % 2] = madd_acc<Isa>(isum[k % 2], p, c.s[k]);
      }
      const __m256i corr = _mm256_madd_epi16(c.coef, load256(q8.bsums));
      __m256i total = _mm256_add_epi32(isum[0], isum[1]);
      if constexpr (has_min<B>) {
        acc_min[t] = fmadd(_mm256_set1_ps(-c.dmin * q8.d), _mm256_cvtepi32_ps(corr), acc_min[t]);
      } else {
        total = _mm256_sub_epi32(total, _mm256_slli_epi32(corr, offset_shift<B>));
      }
      acc[t] = fmadd(_mm256_set1_ps(c.d * q8.d), _mm256_cvtepi32_ps(total), acc[t]);
    }
  }
  for (std::size_t t = 0; t < NT; ++t) out[t] = hsum(has_min<B> ? _mm256_add_ps(acc[t], acc_min[t]) : acc[t]);
}

template <class Isa, class B>
inline float dot(const B* w, const block_q8_K* a, std::size_t nb) noexcept {
  float r;
  dot_tokens<Isa, 1>(w, a, nb, 0, &r);
  return r;
}

}  // namespace detail::kq

/// sum_i w[i] * a[i] over n values with the best kernel the build has.
template <weight_block B>
inline float vec_dot(const B* w, const block_q8_K* a, std::size_t n) {
  detail::check_n(n, "vec_dot");
  return detail::kq::dot<detail::kq::best_isa>(w, a, n / qk_k);
}

/// One weight row against several tokens: out[t * out_stride] =
/// vec_dot(w, a + t * n / 256, n) for t < n_tokens, bit for bit, with each
/// weight block unpacked once per group of up to vec_dot_group tokens
/// (the inner loop of prompts shorter than kpanel_min_tokens, or of every
/// prompt without AVX-512 VNNI). Measured on Zen 4 (one thread, data in L1), time
/// per token and block relative to one token at a time: groups of 4 0.48-0.58,
/// of 8 0.40-0.53; 8 needs AVX-512's 32 vector registers (the 16 of AVX2
/// spill more), so AVX2 builds take 4.
#if defined(__AVX512VL__)
inline constexpr std::size_t vec_dot_group = 8;
#else
inline constexpr std::size_t vec_dot_group = 4;
#endif
template <weight_block B>
inline void vec_dot_tokens(const B* w, const block_q8_K* a, std::size_t n, std::size_t n_tokens, float* out,
                           std::size_t out_stride) {
  detail::check_n(n, "vec_dot_tokens");
  const std::size_t nb = n / qk_k;
  using isa = detail::kq::best_isa;
  float r[vec_dot_group];
  auto group = [&]<std::size_t NT>(std::size_t t) {
    detail::kq::dot_tokens<isa, NT>(w, a + t * nb, nb, nb, r);
    for (std::size_t i = 0; i < NT; ++i) out[(t + i) * out_stride] = r[i];
  };
  for_token_groups<vec_dot_group>(n_tokens, group);
}
#else
template <weight_block B>
inline float vec_dot(const B* w, const block_q8_K* a, std::size_t n) {
  return ref::vec_dot(w, a, n);
}
inline constexpr std::size_t vec_dot_group = 1;
template <weight_block B>
inline void vec_dot_tokens(const B* w, const block_q8_K* a, std::size_t n, std::size_t n_tokens, float* out,
                           std::size_t out_stride) {
  detail::check_n(n, "vec_dot_tokens");
  for (std::size_t t = 0; t < n_tokens; ++t) out[t * out_stride] = ref::vec_dot(w, a + t * (n / qk_k), n);
}
#endif

}  // namespace kestrel::quant
