// kestrel/quant/dequantize_fast.hpp: dequantize_row with AVX2 kernels for
// the types prefill dequantizes most (q4_0, q8_0, q4_K, q6_K), bit for bit
// the scalar dequantize_row (quant/legacy_format.hpp, kquants_format.hpp),
// its twin; other types, and builds without AVX2, call the twin.
//
// Why: on AVX2 without VNNI, prefill dequantizes each weight panel into the
// float GEMM (cpu/matmul.hpp, dequant_gemm). On Zen 2, dequantizing and
// packing cost about 1.9 cycles per weight with the scalar twin and 1.3
// with these kernels (from TinyLlama q4_0 prefill rates at 32 and 512
// tokens): 48 -> 57 t/s at 32 tokens, 88 -> 90 at 512.
//
// Bits: every value is scale * q (minus min for q4_K), where the product is
// exact (an f16's 11 significant bits times a scale of at most 7 bits times
// q of at most 6 bits: 24 bits at most), so the kernels' one multiply (and
// one subtract) rounds exactly as the twin's, whether or not a compiler
// contracts the two into an FMA.
#pragma once

#include <cstddef>
#include <type_traits>

#include "kestrel/quant/kquants_format.hpp"
#include "kestrel/quant/legacy_format.hpp"

#if defined(__AVX2__) && defined(__F16C__)
#include <immintrin.h>
#define KESTREL_DEQUANTIZE_AVX2 1
#endif

namespace kestrel::quant {

#if defined(KESTREL_DEQUANTIZE_AVX2)
namespace detail::dq2 {

/// y[0..8) = scale * q - min for the 8 signed bytes in q's low half.
inline void put8(__m128i q, __m256 scale, __m256 min, float* y) noexcept {
  const __m256 v = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(q));
  _mm256_storeu_ps(y, _mm256_sub_ps(_mm256_mul_ps(scale, v), min));
}

/// Values 0..15 of a block of 16 bytes (low half then high half of q).
inline void put16(__m128i q, __m256 scale, __m256 min, float* y) noexcept {
  put8(q, scale, min, y);
  put8(_mm_srli_si128(q, 8), scale, min, y + 8);
}

inline void block(const block_q4_0& b, float* y) noexcept {
  const __m256 d = _mm256_set1_ps(to_f32(b.d)), zero = _mm256_setzero_ps();
  const __m128i raw = _mm_loadu_si128(reinterpret_cast<const __m128i*>(b.qs));
  const __m128i low4 = _mm_set1_epi8(0x0F), eight = _mm_set1_epi8(8);
  put16(_mm_sub_epi8(_mm_and_si128(raw, low4), eight), d, zero, y);  // values j: low nibbles
  put16(_mm_sub_epi8(_mm_and_si128(_mm_srli_epi16(raw, 4), low4), eight), d, zero, y + 16);
}

inline void block(const block_q8_0& b, float* y) noexcept {
  const __m256 d = _mm256_set1_ps(to_f32(b.d)), zero = _mm256_setzero_ps();
  put16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(b.qs)), d, zero, y);
  put16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(b.qs + 16)), d, zero, y + 16);
}

/// The 32 values r .. r + 31 of a k-quant block, q as 32 signed bytes, with
/// the twin's per-16 scales and mins.
inline void run32(__m256i q, const float* scale, const float* min, int r, float* y) noexcept {
  const int g = r / 16;
  put16(_mm256_castsi256_si128(q), _mm256_set1_ps(scale[g]), _mm256_set1_ps(min[g]), y + r);
  put16(_mm256_extracti128_si256(q, 1), _mm256_set1_ps(scale[g + 1]), _mm256_set1_ps(min[g + 1]), y + r + 16);
}

inline void block(const block_q4_K& b, float* y) noexcept {
  unpacked u;  // scales and mins only: unpack_k4_scales, as the twin
  unpack_k4_scales(b, u);
  const __m256i low4 = _mm256_set1_epi8(0x0F);
  for (int r = 0; r < 256; r += 32) {
    const __m256i raw = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b.qs + detail::byte4(r)));
    const __m256i q = _mm256_and_si256(_mm256_srl_epi16(raw, _mm_cvtsi32_si128(detail::shift4(r))), low4);
    run32(q, u.scale.data(), u.min.data(), r, y);
  }
}

inline void block(const block_q6_K& b, float* y) noexcept {
  unpacked u;  // scales (and zero mins) only: unpack_k6_scales, as the twin
  unpack_k6_scales(b, u);
  const __m256i low4 = _mm256_set1_epi8(0x0F), low2 = _mm256_set1_epi8(3), off = _mm256_set1_epi8(32);
  for (int r = 0; r < 256; r += 32) {
    const __m256i ql = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b.ql + detail::byte6l(r)));
    const __m256i qh = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b.qh + detail::byte2(r)));
    const __m256i lo = _mm256_and_si256(_mm256_srl_epi16(ql, _mm_cvtsi32_si128(detail::shift6l(r))), low4);
    const __m256i hi = _mm256_and_si256(_mm256_srl_epi16(qh, _mm_cvtsi32_si128(detail::shift2(r))), low2);
    // hi <= 3, so the 16-bit shift keeps it in its byte
    run32(_mm256_sub_epi8(_mm256_or_si256(lo, _mm256_slli_epi16(hi, 4)), off), u.scale.data(), u.min.data(), r, y);
  }
}

template <class B>
inline constexpr bool has_kernel = std::is_same_v<B, block_q4_0> || std::is_same_v<B, block_q8_0> ||
                                   std::is_same_v<B, block_q4_K> || std::is_same_v<B, block_q6_K>;

}  // namespace detail::dq2
#endif

/// y = the n values x encodes, bit for bit dequantize_row(x, y, n) (which
/// also checks n), with AVX2 for q4_0, q8_0, q4_K and q6_K.
template <class B>
inline void dequantize_row_fast(const B* x, float* y, std::size_t n) {
#if defined(KESTREL_DEQUANTIZE_AVX2)
  if constexpr (detail::dq2::has_kernel<B>) {
    constexpr std::size_t qk = std::is_same_v<B, block_q4_K> || std::is_same_v<B, block_q6_K> ? qk_k : 32;
    if (n % qk == 0) {
      for (std::size_t i = 0; i < n / qk; ++i) detail::dq2::block(x[i], y + i * qk);
      return;
    }
  }
#endif
  dequantize_row(x, y, n);  // the twin, which also names a bad n
}

}  // namespace kestrel::quant
