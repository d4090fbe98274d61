// kestrel/quant/simd.hpp: the small 256-bit helpers the block-quant dots
// share (legacy.hpp, kquants.hpp): f16 scale to float, FMA with a plain
// fallback, and a horizontal sum.
#pragma once

#if defined(__AVX2__)
#include <immintrin.h>

#include "kestrel/core/dtype.hpp"

namespace kestrel::quant::detail::simd256 {

/// f16 to float: F16C's vcvtph2ps where available (exact, as to_f32 is; the
/// portable to_f32 costs more than a block's integer dot).
inline float h2f(f16 h) noexcept {
#if defined(__F16C__)
  return _cvtsh_ss(h.bits);
#else
  return to_f32(h);
#endif
}

/// a * b + c, fused where the target has FMA.
inline __m256 fmadd(__m256 a, __m256 b, __m256 c) noexcept {
#if defined(__FMA__)
  return _mm256_fmadd_ps(a, b, c);
#else
  return _mm256_add_ps(_mm256_mul_ps(a, b), c);
#endif
}

/// The sum of the eight lanes (pairwise: 4 + 4, 2 + 2, 1 + 1).
inline float hsum(__m256 v) noexcept {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

}  // namespace kestrel::quant::detail::simd256
#endif
