// kestrel/quant/quantize_acts.hpp: the activation quantizers of the fast
// path (f32 rows -> q8_0 / q8_1 / q8_K), vectorized, equal BIT FOR BIT to
// the scalar quantize_row of legacy_format.hpp and kquants_format.hpp (their
// twins; tests/quant/test_quantize_acts.cpp checks every byte, ties included).
//
// Every matrix product with block-quantized weights first quantizes its
// activations. The scalar loops called roundf / lrintf per value (a libm
// call each): profiled on the 110M shape they took ~10% of q4_0 decode and
// ~25% of q4_0 prefill (with AVX-512); on Zen 2 (AVX2) ~9% of a q4_0
// prefill after its tile kernel (perf, 110M pp512), and the AVX2 versions
// below made that file's pp512 542-546 -> 589-596 t/s and tg128 233-249 ->
// 290-292 (kestrel-bench, 3 alternated rounds).
//
// Bit-identity: the per-block scale d and its inverse are computed by the
// same scalar expressions as the twin; the products x * id are single
// float multiplications either way (vmulps rounds as the scalar multiply
// does); and the two roundings are reproduced exactly:
// - q8_0 / q8_1 round to nearest with ties AWAY from zero (roundf), which no
//   SSE/AVX rounding mode does: t = trunc(v), and |v - t| >= 0.5 moves t one
//   step away from zero. v - t is exact (t is v with its fraction bits
//   cleared, so the difference is representable), hence so is the test.
// - q8_K rounds with lrintf, to nearest-even in the default rounding mode,
//   which is what vcvtps2dq does under the default MXCSR.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>

#if defined(__AVX512F__) && defined(__AVX512BW__)
#include <immintrin.h>
#define KESTREL_QUANTIZE_ACTS_AVX512 1
#elif defined(__AVX2__)
#include <immintrin.h>
#define KESTREL_QUANTIZE_ACTS_AVX2 1
#endif

#include "kestrel/core/diagnostics.hpp"
#include "kestrel/quant/kquants_format.hpp"
#include "kestrel/quant/legacy_format.hpp"

KESTREL_INTRINSICS_BEGIN  // GCC 12 (core/diagnostics.hpp)

namespace kestrel::quant {

#if defined(KESTREL_QUANTIZE_ACTS_AVX512)
namespace detail::qa {

/// roundf of every lane (ties away from zero), exactly.
inline __m512 round_away(__m512 v) noexcept {
  const __m512 t = _mm512_roundscale_ps(v, _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC);
  const __m512 frac = _mm512_sub_ps(v, t);  // exact
  const __mmask16 up = _mm512_cmp_ps_mask(_mm512_abs_ps(frac), _mm512_set1_ps(0.5f), _CMP_GE_OQ);
  // one step away from zero: +1 for positive v, -1 for negative (copysign)
  const __m512 step = _mm512_or_ps(_mm512_set1_ps(1.0f), _mm512_and_ps(v, _mm512_set1_ps(-0.0f)));
  return _mm512_mask_add_ps(t, up, t, step);
}

/// A block's 32 codes roundf(x * id) into qs, and their sum (q8_1's s;
/// dead code for q8_0).
inline int q8_codes(__m512 x0, __m512 x1, float id, std::int8_t* qs) noexcept {
  const __m512 vid = _mm512_set1_ps(id);
  const __m512i q0 = _mm512_cvttps_epi32(round_away(_mm512_mul_ps(x0, vid)));  // integral already: exact
  const __m512i q1 = _mm512_cvttps_epi32(round_away(_mm512_mul_ps(x1, vid)));
  _mm_storeu_si128(reinterpret_cast<__m128i*>(qs), _mm512_cvtepi32_epi8(q0));  // |q| <= 127: no truncation
  _mm_storeu_si128(reinterpret_cast<__m128i*>(qs + 16), _mm512_cvtepi32_epi8(q1));
  return _mm512_reduce_add_epi32(_mm512_add_epi32(q0, q1));
}

/// One q8_0 / q8_1 block (32 values): the twin's quantize_q8_block.
template <class Block>
inline int q8_block(const float* x, Block& y, float& d) noexcept {
  const __m512 x0 = _mm512_loadu_ps(x), x1 = _mm512_loadu_ps(x + 16);
  // max|x|: exact (max is order-independent); the twin's std::max chain
  // gives the same value for any finite x.
  const float amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(x0), _mm512_abs_ps(x1)));
  d = detail::fdiv(amax, 127.0f);
  const float id = d != 0 ? detail::fdiv(1.0f, d) : 0.0f;
  y.d = to_f16(d);
  return q8_codes(x0, x1, id, y.qs);
}

/// Lane b = op over the 16 lanes of v[b], b < 16 (op associative and
/// commutative, on floats as bits: max, or integer add through casts): a
/// tree of shuffles and ops over the 16 registers together (4 levels, 45
/// operations), instead of a horizontal reduction per register.
template <class Op>
inline __m512 reduce16(const __m512* v, Op&& op) noexcept {
  // 16 -> 8: lanes 0-7 register 2i, 8-15 register 2i + 1
  __m512 l1[8];
  for (int i = 0; i < 8; ++i)
    l1[i] = op(_mm512_shuffle_f32x4(v[2 * i], v[2 * i + 1], 0x44), _mm512_shuffle_f32x4(v[2 * i], v[2 * i + 1], 0xee));
  // 8 -> 4: quarter q of l2[j] register 4j + q
  __m512 l2[4];
  for (int j = 0; j < 4; ++j)
    l2[j] = op(_mm512_shuffle_f32x4(l1[2 * j], l1[2 * j + 1], 0x88), _mm512_shuffle_f32x4(l1[2 * j], l1[2 * j + 1], 0xdd));
  // 4 -> 2: quarter q of l3[h]: lanes 0-1 register 8h + q, lanes 2-3 register 8h + 4 + q
  __m512 l3[2];
  for (int h = 0; h < 2; ++h)
    l3[h] = op(_mm512_shuffle_ps(l2[2 * h], l2[2 * h + 1], _MM_SHUFFLE(2, 0, 2, 0)),
               _mm512_shuffle_ps(l2[2 * h], l2[2 * h + 1], _MM_SHUFFLE(3, 1, 3, 1)));
  // 2 -> 1: lane 4q + i register 4i + q
  const __m512 r = op(_mm512_shuffle_ps(l3[0], l3[1], _MM_SHUFFLE(2, 0, 2, 0)),
                      _mm512_shuffle_ps(l3[0], l3[1], _MM_SHUFFLE(3, 1, 3, 1)));
  // lane b <- lane 4 (b % 4) + b / 4
  return _mm512_permutexvar_ps(_mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15), r);
}

/// Lane b = the largest |x| of block b (32 values at x + 32 b), b < 16:
/// each block's two registers maxed, then reduce16. Exact (max is
/// order-independent).
inline __m512 block_maxima16(const float* x) noexcept {
  __m512 m[16];
  for (int b = 0; b < 16; ++b)
    m[b] = _mm512_max_ps(_mm512_abs_ps(_mm512_loadu_ps(x + 32 * b)), _mm512_abs_ps(_mm512_loadu_ps(x + 32 * b + 16)));
  return reduce16(m, [](__m512 a, __m512 b) { return _mm512_max_ps(a, b); });
}

/// 16 q8_0 blocks (512 values): q8_block's bytes, each block's d and its
/// inverse computed 16 at a time (vdivps rounds as the twin's fdiv, a
/// correctly rounded quotient; vcvtps2ph to nearest-even as to_f16).
/// Measured (bench/ab_decode.sh, AMX Xeon, against q8_block per block):
/// 110M q4_0 / q8_0 prefill 0.98 of the time, 110M q4_0 decode 0.98.
inline void q8_0_blocks16(const float* x, block_q8_0* y) noexcept {
  const __m512 d = _mm512_div_ps(block_maxima16(x), _mm512_set1_ps(127.0f));
  // the twin's d != 0 ? 1 / d : 0 (unordered counts as != 0, as in C++)
  const __m512 id = _mm512_maskz_div_ps(_mm512_cmp_ps_mask(d, _mm512_setzero_ps(), _CMP_NEQ_UQ), _mm512_set1_ps(1.0f), d);
  alignas(64) float ids[16];
  alignas(32) std::uint16_t dh[16];
  _mm512_store_ps(ids, id);
  _mm256_store_si256(reinterpret_cast<__m256i*>(dh), _mm512_cvtps_ph(d, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
  for (int b = 0; b < 16; ++b) {
    q8_codes(_mm512_loadu_ps(x + 32 * b), _mm512_loadu_ps(x + 32 * b + 16), ids[b], y[b].qs);
    y[b].d.bits = dh[b];
  }
}

}  // namespace detail::qa
#endif

#if defined(KESTREL_QUANTIZE_ACTS_AVX2)
namespace detail::qa2 {

// The AVX2 versions of detail::qa's: the same expressions on 8 lanes.

inline __m256 abs8(__m256 v) noexcept { return _mm256_andnot_ps(_mm256_set1_ps(-0.0f), v); }

/// The largest lane (exact, order-independent).
inline float max8(__m256 v) noexcept {
  __m128 m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  m = _mm_max_ps(m, _mm_movehl_ps(m, m));
  m = _mm_max_ss(m, _mm_movehdup_ps(m));
  return _mm_cvtss_f32(m);
}

inline int sum8(__m256i v) noexcept {
  __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
  s = _mm_add_epi32(s, _mm_unpackhi_epi64(s, s));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 1));
  return _mm_cvtsi128_si32(s);
}

/// roundf of every lane (ties away from zero), exactly (see detail::qa).
inline __m256 round_away(__m256 v) noexcept {
  const __m256 t = _mm256_round_ps(v, _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC);
  const __m256 up = _mm256_cmp_ps(abs8(_mm256_sub_ps(v, t)), _mm256_set1_ps(0.5f), _CMP_GE_OQ);
  const __m256 step = _mm256_or_ps(_mm256_set1_ps(1.0f), _mm256_and_ps(v, _mm256_set1_ps(-0.0f)));
  return _mm256_add_ps(t, _mm256_and_ps(up, step));
}

/// 32 int32 lanes (|q| <= 127) as 32 bytes in lane order at out.
inline void store_bytes(const __m256i q[4], std::int8_t* out) noexcept {
  // packs work per 128-bit lane: the bytes come out as 4-byte groups
  // q0[0..3] q1[0..3] q2[0..3] q3[0..3] q0[4..7] ...; one permute restores
  // the order. |q| <= 127, so the saturating packs do not change a value.
  const __m256i b = _mm256_packs_epi16(_mm256_packs_epi32(q[0], q[1]), _mm256_packs_epi32(q[2], q[3]));
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(out),
                      _mm256_permutevar8x32_epi32(b, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7)));
}

/// One q8_0 / q8_1 block (32 values): the twin's quantize_q8_block.
template <class Block>
inline int q8_block(const float* x, Block& y, float& d) noexcept {
  __m256 v[4], m = _mm256_setzero_ps();
  for (int i = 0; i < 4; ++i) {
    v[i] = _mm256_loadu_ps(x + 8 * i);
    m = _mm256_max_ps(m, abs8(v[i]));
  }
  d = detail::fdiv(max8(m), 127.0f);
  const float id = d != 0 ? detail::fdiv(1.0f, d) : 0.0f;
  const __m256 vid = _mm256_set1_ps(id);
  __m256i q[4];
  for (int i = 0; i < 4; ++i) q[i] = _mm256_cvttps_epi32(round_away(_mm256_mul_ps(v[i], vid)));  // integral: exact
  store_bytes(q, y.qs);
  y.d = to_f16(d);
  return sum8(_mm256_add_epi32(_mm256_add_epi32(q[0], q[1]), _mm256_add_epi32(q[2], q[3])));
}

}  // namespace detail::qa2
#endif

/// quantize_row(x, y, n) for the activation formats, vectorized where the
/// build allows, otherwise the scalar quantize_row itself.
inline void quantize_acts(const float* x, block_q8_0* y, std::size_t n) {
#if defined(KESTREL_QUANTIZE_ACTS_AVX512)
  const std::size_t nb = detail::legacy_blocks(n, "quantize q8_0");
  std::size_t i = 0;
  for (; i + 16 <= nb; i += 16) detail::qa::q8_0_blocks16(x + i * legacy_block_size, y + i);
  float d;
  for (; i < nb; ++i) detail::qa::q8_block(x + i * legacy_block_size, y[i], d);
#elif defined(KESTREL_QUANTIZE_ACTS_AVX2)
  const std::size_t nb = detail::legacy_blocks(n, "quantize q8_0");
  float d;
  for (std::size_t i = 0; i < nb; ++i) detail::qa2::q8_block(x + i * legacy_block_size, y[i], d);
#else
  quantize_row(x, y, n);
#endif
}

inline void quantize_acts(const float* x, block_q8_1* y, std::size_t n) {
#if defined(KESTREL_QUANTIZE_ACTS_AVX512)
  const std::size_t nb = detail::legacy_blocks(n, "quantize q8_1");
  float d;
  for (std::size_t i = 0; i < nb; ++i) {
    const int sum = detail::qa::q8_block(x + i * legacy_block_size, y[i], d);
    y[i].s = to_f16(detail::fmul(static_cast<float>(sum), d));
  }
#elif defined(KESTREL_QUANTIZE_ACTS_AVX2)
  const std::size_t nb = detail::legacy_blocks(n, "quantize q8_1");
  float d;
  for (std::size_t i = 0; i < nb; ++i) {
    const int sum = detail::qa2::q8_block(x + i * legacy_block_size, y[i], d);
    y[i].s = to_f16(detail::fmul(static_cast<float>(sum), d));
  }
#else
  quantize_row(x, y, n);
#endif
}

inline void quantize_acts(const float* x, block_q8_K* y, std::size_t n) {
#if defined(KESTREL_QUANTIZE_ACTS_AVX512)
  detail::check_n(n, "quantize_row");
  for (std::size_t bi = 0; bi < n / qk_k; ++bi) {
    const float* xb = x + bi * qk_k;
    __m512 m = _mm512_setzero_ps();
    for (std::size_t i = 0; i < qk_k; i += 16) m = _mm512_max_ps(m, _mm512_abs_ps(_mm512_loadu_ps(xb + i)));
    const float amax = _mm512_reduce_max_ps(m);
    block_q8_K& b = y[bi];
    if (!(amax > 0.0f)) {  // the twin's amax stays 0 unless some |x| > 0
      std::memset(&b, 0, sizeof b);
      continue;
    }
    // vmax: the FIRST value of largest magnitude, with its sign (the twin
    // updates only on a strictly larger |x|).
    float vmax = 0.0f;
    for (std::size_t i = 0; i < qk_k; i += 16) {
      const __mmask16 hit =
          _mm512_cmp_ps_mask(_mm512_abs_ps(_mm512_loadu_ps(xb + i)), _mm512_set1_ps(amax), _CMP_EQ_OQ);
      if (hit) {
        vmax = xb[i + static_cast<std::size_t>(__builtin_ctz(hit))];
        break;
      }
    }
    const float iscale = -127.0f / vmax;
    const __m512 vs = _mm512_set1_ps(iscale);
    const __m512i lo = _mm512_set1_epi32(-127), hi = _mm512_set1_epi32(127);
    __m512 qs[qk_k / 16];  // int32 lanes, as float bits for reduce16
    for (std::size_t g = 0; g < qk_k / 16; ++g) {
      __m512i q = _mm512_cvtps_epi32(_mm512_mul_ps(vs, _mm512_loadu_ps(xb + 16 * g)));  // lrintf: nearest-even
      q = _mm512_min_epi32(_mm512_max_epi32(q, lo), hi);
      _mm_storeu_si128(reinterpret_cast<__m128i*>(b.qs + 16 * g), _mm512_cvtepi32_epi8(q));
      qs[g] = _mm512_castsi512_ps(q);
    }
    // bsums[g] = the sum of group g's 16 codes (exact, |.| <= 2032): the 16
    // sums together (detail::qa::reduce16), one narrowing store
    static_assert(qk_k / 16 == 16);
    const __m512 sums = detail::qa::reduce16(qs, [](__m512 u, __m512 v) {
      return _mm512_castsi512_ps(_mm512_add_epi32(_mm512_castps_si512(u), _mm512_castps_si512(v)));
    });
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(b.bsums), _mm512_cvtepi32_epi16(_mm512_castps_si512(sums)));
    b.d = 1.0f / iscale;
  }
#elif defined(KESTREL_QUANTIZE_ACTS_AVX2)
  namespace qa2 = detail::qa2;
  detail::check_n(n, "quantize_row");
  for (std::size_t bi = 0; bi < n / qk_k; ++bi) {
    const float* xb = x + bi * qk_k;
    __m256 m = _mm256_setzero_ps();
    for (std::size_t i = 0; i < qk_k; i += 8) m = _mm256_max_ps(m, qa2::abs8(_mm256_loadu_ps(xb + i)));
    const float amax = qa2::max8(m);
    block_q8_K& b = y[bi];
    if (!(amax > 0.0f)) {  // the twin's amax stays 0 unless some |x| > 0
      std::memset(&b, 0, sizeof b);
      continue;
    }
    // vmax: the FIRST value of largest magnitude, with its sign.
    float vmax = 0.0f;
    for (std::size_t i = 0; i < qk_k; i += 8) {
      const int hit = _mm256_movemask_ps(
          _mm256_cmp_ps(qa2::abs8(_mm256_loadu_ps(xb + i)), _mm256_set1_ps(amax), _CMP_EQ_OQ));
      if (hit) {
        vmax = xb[i + static_cast<std::size_t>(__builtin_ctz(static_cast<unsigned>(hit)))];
        break;
      }
    }
    const float iscale = -127.0f / vmax;
    const __m256 vs = _mm256_set1_ps(iscale);
    const __m256i lo = _mm256_set1_epi32(-127), hi = _mm256_set1_epi32(127);
    for (std::size_t g = 0; g < qk_k / 32; ++g) {
      __m256i q[4];
      for (int i = 0; i < 4; ++i) {
        q[i] = _mm256_cvtps_epi32(_mm256_mul_ps(vs, _mm256_loadu_ps(xb + 32 * g + 8 * i)));  // lrintf: nearest-even
        q[i] = _mm256_min_epi32(_mm256_max_epi32(q[i], lo), hi);
      }
      qa2::store_bytes(q, b.qs + 32 * g);
      b.bsums[2 * g] = static_cast<std::int16_t>(qa2::sum8(_mm256_add_epi32(q[0], q[1])));
      b.bsums[2 * g + 1] = static_cast<std::int16_t>(qa2::sum8(_mm256_add_epi32(q[2], q[3])));
    }
    b.d = 1.0f / iscale;
  }
#else
  quantize_row(x, y, n);
#endif
}

}  // namespace kestrel::quant
KESTREL_INTRINSICS_END
