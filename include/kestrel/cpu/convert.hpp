// kestrel/cpu/convert.hpp: loading f32 / f16 / bf16 weights as f32 batches,
// converting whole rows, and the one table that turns a weight_view's run-time
// dtype into a compile-time element type.
//
// xsimd (8.1 and 14) has no f16 or bf16 batches, so the conversions use
// intrinsics where the compile flags allow them (F16C / AVX-512F for f16,
// AVX2 / AVX-512F / SSE2 for bf16) and fall back to the exact scalar
// conversions of core/dtype.hpp otherwise. All paths are exact (every f16 and
// bf16 value is a float), so fast and reference kernels see the same weights.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <type_traits>
#include <utility>

#if defined(__x86_64__) || defined(_M_X64) || defined(__i386__)
#include <immintrin.h>
#endif

#include "kestrel/core/diagnostics.hpp"
#include "kestrel/core/dtype.hpp"
#include "kestrel/core/error.hpp"
#include "kestrel/core/tensor.hpp"
#include "kestrel/cpu/quantized.hpp"
#include "kestrel/cpu/xsimd_compat.hpp"

KESTREL_INTRINSICS_BEGIN  // GCC 12 (core/diagnostics.hpp)

namespace kestrel::cpu {

/// Scalar conversion of one element of any weight type (identity for float).
inline float to_float(float v) noexcept { return v; }
inline float to_float(f16 v) noexcept { return to_f32(v); }
inline float to_float(bf16 v) noexcept { return to_f32(v); }

namespace detail {

/// Converts simd::width elements at p into one batch through a spill buffer:
/// the portable path where no conversion intrinsic is available.
template <class T>
inline simd::fbatch load_via_scalar(const T* p) noexcept {
  alignas(64) float tmp[simd::width];
  for (std::size_t i = 0; i < simd::width; ++i) tmp[i] = to_float(p[i]);
  return simd::fbatch::load_aligned(tmp);
}

}  // namespace detail

/// simd::width consecutive elements at p (no alignment needed) as floats.
inline simd::fbatch load_f32(const float* p) noexcept { return simd::fbatch::load_unaligned(p); }

// xsimd picks its default arch from the same macros tested here (AVX-512F:
// 16 floats, AVX: 8, SSE2: 4); the static_asserts catch any disagreement.

inline simd::fbatch load_f32(const f16* p) noexcept {
#if defined(__AVX512F__)
  static_assert(simd::width == 16);
  return simd::fbatch(_mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p))));
#elif defined(__AVX__) && defined(__F16C__)
  static_assert(simd::width == 8);
  return simd::fbatch(_mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))));
#else
  return detail::load_via_scalar(p);
#endif
}

inline simd::fbatch load_f32(const bf16* p) noexcept {
  // bf16 is the upper half of a float: widen to 32 bits and shift left 16.
#if defined(__AVX512F__)
  static_assert(simd::width == 16);
  const __m512i w = _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
  return simd::fbatch(_mm512_castsi512_ps(_mm512_slli_epi32(w, 16)));
#elif defined(__AVX2__)
  static_assert(simd::width == 8);
  const __m256i w = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  return simd::fbatch(_mm256_castsi256_ps(_mm256_slli_epi32(w, 16)));
#elif defined(__SSE2__) && !defined(__AVX__)
  static_assert(simd::width == 4);
  // Interleaving zeros below each bf16 places it in the upper half of a lane.
  const __m128i h = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(p));
  return simd::fbatch(_mm_castsi128_ps(_mm_unpacklo_epi16(_mm_setzero_si128(), h)));
#else
  return detail::load_via_scalar(p);
#endif
}

/// The n < simd::width elements at p as floats, zero-padded to a batch.
/// Kernels finish rows with this rather than a scalar loop: the compiler may
/// contract a scalar `s += a * b` into an FMA in one inlined copy of a kernel
/// and not in another, which would make results depend on the call site
/// (and so on the thread count); explicit vector FMAs do not.
template <class T>
inline simd::fbatch load_f32_partial(const T* p, std::size_t n) noexcept {
#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__)
  // Masked loads: no spill buffer and no scalar f16 decode. Rows shorter
  // than a register (head_dim 8, a tiny model's n_embd) run through here for
  // every row; the spill path made such matvecs ~20x slower (measured on
  // llama-2-tiny-random's 32000 x 8 output matrix).
  static_assert(simd::width == 16);
  const __mmask16 m = static_cast<__mmask16>((1u << n) - 1u);
  if constexpr (std::is_same_v<T, float>) {
    return simd::fbatch(_mm512_maskz_loadu_ps(m, p));
  } else if constexpr (std::is_same_v<T, f16>) {
    return simd::fbatch(_mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, p)));
  } else {
    const __m512i w = _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(m, p));
    return simd::fbatch(_mm512_castsi512_ps(_mm512_slli_epi32(w, 16)));
  }
#else
  alignas(64) float tmp[simd::width] = {};
  for (std::size_t i = 0; i < n; ++i) tmp[i] = to_float(p[i]);
  return simd::fbatch::load_aligned(tmp);
#endif
}

/// out[0..n) = p[0..n) as floats (exact).
template <class T>
inline void convert_to_f32(const T* p, float* out, std::size_t n) noexcept {
  if constexpr (std::is_same_v<T, float>) {
    if (n) std::memcpy(out, p, n * sizeof(float));
  } else {
    const std::size_t n_vec = n - n % simd::width;
    for (std::size_t i = 0; i < n_vec; i += simd::width) load_f32(p + i).store_unaligned(out + i);
    for (std::size_t i = n_vec; i < n; ++i) out[i] = to_float(p[i]);
  }
}

/// The one table from a weight's run-time dtype to a compile-time element
/// type: calls f(static_cast<const T*>(w.data)) with T = float, f16 or bf16.
template <class F>
inline decltype(auto) visit_weight(const weight_view& w, F&& f) {
  switch (w.type) {
    case dtype::f32: return std::forward<F>(f)(static_cast<const float*>(w.data));
    case dtype::f16: return std::forward<F>(f)(static_cast<const f16*>(w.data));
    case dtype::bf16: return std::forward<F>(f)(static_cast<const bf16*>(w.data));
    default: break;  // block types: cpu/quantized.hpp's table
  }
  throw invalid_argument("kestrel::cpu: weight type " + std::string(name_of(w.type)) + " has no element kernel");
}

/// Embedding lookup: row `row` of w as floats. out: (w.cols)
inline void row_to_f32(const weight_view& w, std::size_t row, float* out) {
  if (is_quantized(w.type)) return detail::quantized_row_to_f32(w, row, out);
  visit_weight(w, [&](const auto* p) { convert_to_f32(p + row * w.cols, out, w.cols); });
}

}  // namespace kestrel::cpu
KESTREL_INTRINSICS_END
