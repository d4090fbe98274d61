// kestrel/quant/legacy.hpp: GGUF's legacy block formats (q4_0, q4_1, q5_0,
// q5_1, q8_0, q8_1: layouts, quantize_row, dequantize_row in
// legacy_format.hpp) and their dot products against activations quantized
// once per step:
//
//   float dot(const block_q4_0* w, const block_q8_0* a, size_t n);  // also q5_0, q8_0 weights
//   float dot(const block_q4_1* w, const block_q8_1* a, size_t n);  // also q5_1 weights
//
// n is the row length in values, a multiple of 32 (invalid_argument
// otherwise). With AVX2 the 32 products of a block are summed exactly in
// int32 lanes (AVX-512 VNNI's vpdpbusd where available, else
// vpmaddubsw + vpmaddwd) and scaled into 8 float accumulators; without it
// the scalar twins in kestrel/quant/ref/legacy.hpp run. The integer sums
// equal the twins'; only the order of the float accumulation differs.
//
// Activations must come from quantize_row (|q| <= 127): the AVX2 q8_0 path
// moves weight signs onto the activations, and -128 has no positive twin.
#pragma once

#include <cstddef>
#include <cstdint>

#if defined(__AVX2__)
#include <immintrin.h>
#endif

#include "kestrel/quant/simd.hpp"
#include "kestrel/quant/legacy_format.hpp"
#include "kestrel/quant/ref/legacy.hpp"

namespace kestrel::quant {

#if defined(__AVX2__)
namespace detail::avx2 {

// The 32 nibbles of qs as bytes in value order: values 0..15 from the low
// nibbles, 16..31 from the high ones. The 16 bytes go to both 128-bit lanes
// in one broadcast load and the high lane is shifted right by 4 (one
// instruction fewer than a load, a shift and an insert).
inline __m256i nibbles(const std::uint8_t* qs) noexcept {
  const __m256i b = _mm256_broadcastsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(qs)));
  return _mm256_and_si256(_mm256_srlv_epi32(b, _mm256_setr_epi32(0, 0, 0, 0, 4, 4, 4, 4)), _mm256_set1_epi8(0x0f));
}

// 0x10 in byte j where bit j of the 32-bit qh is set.
inline __m256i fifth_bits(const std::uint8_t* qh) noexcept {
  const std::uint32_t bits = load_qh(qh);
#if defined(__AVX512BW__) && defined(__AVX512VL__)
  return _mm256_maskz_set1_epi8(bits, 0x10);
#else
  // Byte k of bits to bytes 8k..8k+7, then test bit (j mod 8) of each.
  const __m256i rep = _mm256_shuffle_epi8(
      _mm256_set1_epi32(static_cast<int>(bits)),
      _mm256_set_epi64x(0x0303030303030303, 0x0202020202020202, 0x0101010101010101, 0));
  const __m256i sel = _mm256_set1_epi64x(static_cast<long long>(0x8040201008040201ull));
  return _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(rep, sel), sel), _mm256_set1_epi8(0x10));
#endif
}

// sum(u * s) over groups of 4 bytes into 8 int32 lanes, u unsigned, s signed.
// Exact: without VNNI the int16 pair sums stay below 2 * 128 * 128.
inline __m256i dot_u8s8(__m256i u, __m256i s) noexcept {
#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
  return _mm256_dpbusd_epi32(_mm256_setzero_si256(), u, s);
#else
  return _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1));
#endif
}
// Signed x signed: |w| as unsigned, w's sign moved onto a.
inline __m256i dot_s8s8(__m256i w, __m256i a) noexcept {
  return dot_u8s8(_mm256_sign_epi8(w, w), _mm256_sign_epi8(a, w));
}

using simd256::h2f;
using simd256::hsum;
using simd256::fmadd;

// The weight block's values as signed bytes (q - offset) for the _0 types,
// as unsigned quants for the _1 types.
inline __m256i weights(const block_q4_0& b) noexcept { return _mm256_sub_epi8(nibbles(b.qs), _mm256_set1_epi8(8)); }
inline __m256i weights(const block_q5_0& b) noexcept {
  return _mm256_sub_epi8(_mm256_or_si256(nibbles(b.qs), fifth_bits(b.qh)), _mm256_set1_epi8(16));
}
inline __m256i weights(const block_q8_0& b) noexcept { return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b.qs)); }
inline __m256i weights(const block_q4_1& b) noexcept { return nibbles(b.qs); }
inline __m256i weights(const block_q5_1& b) noexcept { return _mm256_or_si256(nibbles(b.qs), fifth_bits(b.qh)); }

template <class W>
inline float dot_q8_0(const W* w, const block_q8_0* a, std::size_t nb) noexcept {
  __m256 acc = _mm256_setzero_ps();
  for (std::size_t i = 0; i < nb; ++i) {
    const __m256i qa = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(a[i].qs));
    const __m256i isum = dot_s8s8(weights(w[i]), qa);
    acc = fmadd(_mm256_set1_ps(h2f(w[i].d) * h2f(a[i].d)), _mm256_cvtepi32_ps(isum), acc);
  }
  return hsum(acc);
}

template <class W>
inline float dot_q8_1(const W* w, const block_q8_1* a, std::size_t nb) noexcept {
  __m256 acc = _mm256_setzero_ps();
  float offsets = 0;  // sum of m_w s_a
  for (std::size_t i = 0; i < nb; ++i) {
    const __m256i qa = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(a[i].qs));
    const __m256i isum = dot_u8s8(weights(w[i]), qa);
    acc = fmadd(_mm256_set1_ps(h2f(w[i].d) * h2f(a[i].d)), _mm256_cvtepi32_ps(isum), acc);
    offsets += h2f(w[i].m) * h2f(a[i].s);
  }
  return hsum(acc) + offsets;
}

}  // namespace detail::avx2

inline float dot(const block_q4_0* w, const block_q8_0* a, std::size_t n) {
  return detail::avx2::dot_q8_0(w, a, detail::legacy_blocks(n, "dot q4_0 x q8_0"));
}
inline float dot(const block_q5_0* w, const block_q8_0* a, std::size_t n) {
  return detail::avx2::dot_q8_0(w, a, detail::legacy_blocks(n, "dot q5_0 x q8_0"));
}
inline float dot(const block_q8_0* w, const block_q8_0* a, std::size_t n) {
  return detail::avx2::dot_q8_0(w, a, detail::legacy_blocks(n, "dot q8_0 x q8_0"));
}
inline float dot(const block_q4_1* w, const block_q8_1* a, std::size_t n) {
  return detail::avx2::dot_q8_1(w, a, detail::legacy_blocks(n, "dot q4_1 x q8_1"));
}
inline float dot(const block_q5_1* w, const block_q8_1* a, std::size_t n) {
  return detail::avx2::dot_q8_1(w, a, detail::legacy_blocks(n, "dot q5_1 x q8_1"));
}
#else
inline float dot(const block_q4_0* w, const block_q8_0* a, std::size_t n) { return ref::dot(w, a, n); }
inline float dot(const block_q5_0* w, const block_q8_0* a, std::size_t n) { return ref::dot(w, a, n); }
inline float dot(const block_q8_0* w, const block_q8_0* a, std::size_t n) { return ref::dot(w, a, n); }
inline float dot(const block_q4_1* w, const block_q8_1* a, std::size_t n) { return ref::dot(w, a, n); }
inline float dot(const block_q5_1* w, const block_q8_1* a, std::size_t n) { return ref::dot(w, a, n); }
#endif

}  // namespace kestrel::quant
