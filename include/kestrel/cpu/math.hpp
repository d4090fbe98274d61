// kestrel/cpu/math.hpp: the vectorised exp used by softmax, silu and
// attention, with the error bound that the tests derive tolerances from.
#pragma once

#include <cstddef>

#if defined(__AVX512F__)
#include <immintrin.h>
#endif

#include "kestrel/core/diagnostics.hpp"
#include "kestrel/cpu/xsimd_compat.hpp"

KESTREL_INTRINSICS_BEGIN  // GCC 12 (core/diagnostics.hpp)

namespace kestrel::cpu {

/// Unit roundoff of float, 2^-24.
inline constexpr double f32_unit_roundoff = 1.0 / 16777216.0;

/// e^x lane-wise (xsimd's range reduction and polynomial; the same name in
/// xsimd 8.1 and 14).
/// Error contract, checked by tests/cpu on a dense sweep:
///   x in [exp_min_normal_x, exp_max_x]: relative error <= exp_rel_error;
///   x < exp_min_normal_x: result in [0, 2^-126] (subnormal results flush to 0);
///   x > exp_max_x: may be +inf although e^x is still finite (x <= 88.72).
inline simd::fbatch exp(const simd::fbatch& x) noexcept { return xsimd::exp(x); }
inline constexpr double exp_rel_error = 3.0 * f32_unit_roundoff;  // measured 2.16 u on avx512 and sse2
inline constexpr float exp_min_normal_x = -87.33f;                // e^x >= 2^-126 above this
inline constexpr float exp_max_x = 88.3f;

#if defined(__AVX512F__)
/// e^x for 16 floats under exp's contract (above), in about half of its
/// instructions: x = n ln 2 + r (n rounded from x log2 e, ln 2 in two parts),
/// e^r = 1 + r + r^2 P(r) with Cephes' degree-5 P for |r| <= ln 2 / 2, and
/// vscalefps for the 2^n (it underflows to subnormals and 0 and overflows to
/// inf on its own, so no range checks). x below -104 is taken as -104 (e^x
/// rounds to 0 either way; -inf would make r NaN); NaN stays NaN. Measured:
/// at most 2.0 u over every float in [-87.3, -80], [-10, -9] and [-1, 0.5];
/// the tests sweep the contract's whole range.
inline __m512 exp_scalef(__m512 x) noexcept {
  x = _mm512_max_ps(_mm512_set1_ps(-104.0f), x);  // NaN in x: the second operand, returned
  const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);  // ln 2's high part: n times it is exact
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
  __m512 p = _mm512_set1_ps(1.9875691500e-4f);
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3981999507e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894e-2f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459e-1f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201e-1f));
  const __m512 y = _mm512_fmadd_ps(p, _mm512_mul_ps(r, r), _mm512_add_ps(r, _mm512_set1_ps(1.0f)));
  return _mm512_scalef_ps(y, n);
}
#endif

}  // namespace kestrel::cpu
KESTREL_INTRINSICS_END
