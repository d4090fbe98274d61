// kestrel/cpu/amx_bf16.hpp: what the kernels on AMX bf16 tiles share (a
// prompt's attention, cpu/attend_amx.hpp; the float GEMM, cpu/gemm_amx.hpp):
// whether they run here, and the split of f32 values into pairs of bf16.
//
// A tile product (tdpbf16ps) multiplies bf16 values, 8 significant bits,
// too few to stand for an f32 (or an f16's 11), so each operand is split
// into two: x = hi + lo + e with hi = bf16(x), lo = bf16(x - hi) (x - hi is
// exact: hi is x rounded), |e| <= 2^-16 |x|, and a product takes three tile
// products, hi*hi + hi*lo + lo*hi (the dropped lo*lo is within 2^-16 of the
// product). An f16 or bf16 value is exactly hi + lo (11 bits fit in two
// 8-bit halves). The products of bf16 are exact in f32 and the tiles
// accumulate in f32, so what the splits cost is bf16_split_rel per product.
//
// Built where quant/amx.hpp's kernels are (KESTREL_AMX) and the compiler
// also targets AMX-BF16 and AVX512-BF16; run where the CPU reports AMX-BF16
// too (amx_bf16_enabled).
#pragma once

#include <cstddef>
#include <cstdint>

#include "kestrel/core/diagnostics.hpp"
#include "kestrel/cpu/convert.hpp"
#include "kestrel/quant/amx.hpp"

#if defined(KESTREL_AMX) && defined(__AMX_BF16__) && defined(__AVX512BF16__)
#define KESTREL_AMX_BF16 1
#endif

KESTREL_INTRINSICS_BEGIN  // GCC 12 (core/diagnostics.hpp)

namespace kestrel::cpu {

/// The bf16 splits' error per product x y, relative to |x y|: each operand
/// within 2^-16 of its two halves, and the dropped lo*lo within 2^-16 (1 +
/// 2^-8)^2; 3.1 * 2^-16 covers the three. The tests derive their
/// tolerances from it (tests/cpu/test_kernels.cpp, attend_tol;
/// tests/cpu/test_linear.cpp, amx_tol; tests/model/test_llama.cpp,
/// nmse_bound).
inline constexpr double bf16_split_rel = 3.1 / 65536.0;

#if defined(KESTREL_AMX_BF16)

/// Whether the bf16 tile kernels run in this process: quant::amx_enabled()
/// (AMX-TILE, AMX-INT8, the kernel's grant, KESTREL_AMX not 0) and the CPU
/// reports AMX-BF16 (cpuid leaf 7, EDX bit 22).
inline bool amx_bf16_enabled() noexcept {
  static const bool ok = [] {
    unsigned a = 0, b = 0, c = 0, d = 0;
    return quant::amx_enabled() && __get_cpuid_count(7, 0, &a, &b, &c, &d) && ((d >> 22) & 1u);
  }();
  return ok;
}

namespace detail::amx_bf16 {

inline constexpr std::size_t tile_floats = 256;  // one tile: 16 rows x 64 bytes

/// x rounded to the nearest bf16 (ties to even), as f32 bits whose low 16
/// are 0. For finite x (|x| below the largest bf16).
inline __m512i round_bf16(__m512 x) noexcept {
  const __m512i b = _mm512_castps_si512(x);
  const __m512i odd = _mm512_and_si512(_mm512_srli_epi32(b, 16), _mm512_set1_epi32(1));
  const __m512i r = _mm512_add_epi32(_mm512_add_epi32(b, _mm512_set1_epi32(0x7FFF)), odd);
  return _mm512_and_si512(r, _mm512_set1_epi32(static_cast<int>(0xFFFF0000u)));
}

/// x = hi + lo + e, |e| <= 2^-16 |x|: hi and lo as f32 bits of bf16 values.
inline void split(__m512 x, __m512i& hi, __m512i& lo) noexcept {
  hi = round_bf16(x);
  lo = round_bf16(_mm512_sub_ps(x, _mm512_castsi512_ps(hi)));
}

/// 32 bf16 in order (a's 16, then b's) from f32 bits whose low halves are 0.
inline __m512i pack_order(__m512i a, __m512i b) noexcept {
  alignas(64) static constexpr std::uint16_t idx[32] = {1,  3,  5,  7,  9,  11, 13, 15, 17, 19, 21,
                                                        23, 25, 27, 29, 31, 33, 35, 37, 39, 41, 43,
                                                        45, 47, 49, 51, 53, 55, 57, 59, 61, 63};
  return _mm512_permutex2var_epi16(a, _mm512_load_si512(idx), b);
}

/// Lane i = (bf16 of a[i], bf16 of b[i]): a B tile row of two positions.
inline __m512i pack_pairs(__m512i a, __m512i b) noexcept { return _mm512_or_si512(_mm512_srli_epi32(a, 16), b); }

/// 16 floats of p, or zeros.
template <class T>
inline __m512 load16(const T* p, bool valid) noexcept {
  return valid ? static_cast<__m512>(load_f32(p)) : _mm512_setzero_ps();
}

/// The 32 values at p split: hi and lo as 32 bf16 each, in order (an A
/// tile's row, or before a transpose a B tile's column of pairs). The
/// same halves as split and pack_order wherever a half is a normal number,
/// by vcvtne2ps2bf16 (round to nearest even, as round_bf16); a half below
/// 2^-126 (a lo half of |x| below about 2^-118) flushes to zero, as the
/// tiles would read it anyway:
/// 0.6-0.7 of their time in gemm_amx's splits of W (rdtsc, one thread,
/// 2048 x 2048 and 5632 x 2048 / 2048 x 5632, f32).
template <class T>
inline void split32(const T* p, __m512i& hi, __m512i& lo) noexcept {
  const __m512 a = load_f32(p), b = load_f32(p + 16);
  const __m512i h = (__m512i)_mm512_cvtne2ps_pbh(b, a);  // a's 16, then b's
  const __m512 ha = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm512_castsi512_si256(h)), 16));
  const __m512 hb = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm512_extracti64x4_epi64(h, 1)), 16));
  lo = (__m512i)_mm512_cvtne2ps_pbh(_mm512_sub_ps(b, hb), _mm512_sub_ps(a, ha));
  hi = h;
}

}  // namespace detail::amx_bf16

#else

inline bool amx_bf16_enabled() noexcept { return false; }

#endif

}  // namespace kestrel::cpu
KESTREL_INTRINSICS_END
