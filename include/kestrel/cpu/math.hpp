// kestrel/cpu/math.hpp: the vectorised exp used by softmax, silu and
// attention, with the error bound that the tests derive tolerances from.
#pragma once

#include <cstddef>

#include "kestrel/cpu/xsimd_compat.hpp"

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

}  // namespace kestrel::cpu
