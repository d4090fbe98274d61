// kestrel/cpu/transpose.hpp: in-register transposes for the kernels that
// repack blocks of rows into columns (cpu/gemm.hpp's panels).
#pragma once

#if defined(__AVX2__)
#include <immintrin.h>
#endif

#include "kestrel/core/diagnostics.hpp"

KESTREL_INTRINSICS_BEGIN  // GCC 12 (core/diagnostics.hpp)

namespace kestrel::cpu::detail {

#if defined(__AVX512F__)
/// r[i] = row i of a 16 x 16 block -> r[i] = column i: unpack pairs, then
/// 4 x 4 blocks within 128-bit lanes, then the 4 x 4 grid of lanes.
inline void transpose16x16(__m512 r[16]) noexcept {
  __m512 t[16], u[16];
  for (int i = 0; i < 8; ++i) {
    t[2 * i] = _mm512_unpacklo_ps(r[2 * i], r[2 * i + 1]);
    t[2 * i + 1] = _mm512_unpackhi_ps(r[2 * i], r[2 * i + 1]);
  }
  for (int i = 0; i < 4; ++i) {
    u[4 * i + 0] = _mm512_shuffle_ps(t[4 * i], t[4 * i + 2], 0x44);
    u[4 * i + 1] = _mm512_shuffle_ps(t[4 * i], t[4 * i + 2], 0xEE);
    u[4 * i + 2] = _mm512_shuffle_ps(t[4 * i + 1], t[4 * i + 3], 0x44);
    u[4 * i + 3] = _mm512_shuffle_ps(t[4 * i + 1], t[4 * i + 3], 0xEE);
  }
  // lane L of u[4i + c] = rows 4i..4i+3 of column 4L + c
  for (int c = 0; c < 4; ++c) {
    const __m512 a = _mm512_shuffle_f32x4(u[c], u[4 + c], 0x88), b = _mm512_shuffle_f32x4(u[c], u[4 + c], 0xDD);
    const __m512 e = _mm512_shuffle_f32x4(u[8 + c], u[12 + c], 0x88), f = _mm512_shuffle_f32x4(u[8 + c], u[12 + c], 0xDD);
    r[c] = _mm512_shuffle_f32x4(a, e, 0x88);
    r[8 + c] = _mm512_shuffle_f32x4(a, e, 0xDD);
    r[4 + c] = _mm512_shuffle_f32x4(b, f, 0x88);
    r[12 + c] = _mm512_shuffle_f32x4(b, f, 0xDD);
  }
}
#endif

#if defined(__AVX2__)
/// r[i] = row i of an 8 x 8 block -> r[i] = column i: unpack pairs, then
/// 4 x 4 blocks within 128-bit lanes, then swap the off-diagonal lanes.
inline void transpose8x8(__m256 r[8]) noexcept {
  __m256 t[8], u[8];
  for (int i = 0; i < 4; ++i) {
    t[2 * i] = _mm256_unpacklo_ps(r[2 * i], r[2 * i + 1]);
    t[2 * i + 1] = _mm256_unpackhi_ps(r[2 * i], r[2 * i + 1]);
  }
  for (int i = 0; i < 2; ++i) {
    u[4 * i + 0] = _mm256_shuffle_ps(t[4 * i], t[4 * i + 2], 0x44);
    u[4 * i + 1] = _mm256_shuffle_ps(t[4 * i], t[4 * i + 2], 0xEE);
    u[4 * i + 2] = _mm256_shuffle_ps(t[4 * i + 1], t[4 * i + 3], 0x44);
    u[4 * i + 3] = _mm256_shuffle_ps(t[4 * i + 1], t[4 * i + 3], 0xEE);
  }
  // lane L of u[4i + c] = rows 4i..4i+3 of column 4L + c
  for (int c = 0; c < 4; ++c) {
    r[c] = _mm256_permute2f128_ps(u[c], u[4 + c], 0x20);
    r[4 + c] = _mm256_permute2f128_ps(u[c], u[4 + c], 0x31);
  }
}
#endif

}  // namespace kestrel::cpu::detail
KESTREL_INTRINSICS_END
