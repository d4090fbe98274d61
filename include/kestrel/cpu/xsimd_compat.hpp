// kestrel/cpu/xsimd_compat.hpp: the few places where xsimd 8.1 (Debian 12's
// package) and xsimd 13/14 (Meson's wrap) differ, behind one small API.
//
// Every kernel uses `simd::fbatch`, xsimd's batch<float> of the default arch,
// which the includer's compile flags choose (sse2 with no flags, avx2 with
// -mavx2, avx512bw with -march=native on Zen 4). The library never dispatches
// at run time: the ISA is a compile-time fact of the including binary.
#pragma once

#include <algorithm>
#include <cstddef>

#include "kestrel/core/diagnostics.hpp"

// xsimd's own functions (exp, which the activations and softmax use) are
// compiled where xsimd's text is: the same GCC 12 warnings there.
KESTREL_INTRINSICS_BEGIN
#include <xsimd/xsimd.hpp>
KESTREL_INTRINSICS_END

namespace kestrel::cpu::simd {

using fbatch = xsimd::batch<float>;
inline constexpr std::size_t width = fbatch::size;  // floats per register

/// Sum of the lanes. xsimd 8.1 calls it hadd; 9+ renamed it reduce_add.
inline float reduce_add(const fbatch& b) noexcept {
#if XSIMD_VERSION_MAJOR < 9
  return xsimd::hadd(b);
#else
  return xsimd::reduce_add(b);
#endif
}

/// Makes the compiler hold b in a register at this point of the program:
/// the instruction that computed it (a load) is issued here, in program
/// order with the other in_order values, and is not folded into the
/// instruction that uses it. Changes no value. Decode's f32 walk (cpu/matvec.hpp,
/// interleave_lines) orders its loads so; a no-op where GCC-style inline
/// assembly or x86 vector registers are missing.
inline void in_order(fbatch& b) noexcept {
#if (defined(__GNUC__) || defined(__clang__)) && (defined(__x86_64__) || defined(__i386__)) && defined(__AVX__)
  auto r = static_cast<typename fbatch::register_type>(b);
  asm volatile("" : "+v"(r));
  b = fbatch(r);
#else
  (void)b;
#endif
}

/// Largest lane. xsimd 8.1 has no reduce_max: spill and scan (used once per
/// softmax call, so the spill does not matter).
inline float reduce_max(const fbatch& b) noexcept {
#if XSIMD_VERSION_MAJOR < 9
  alignas(64) float lanes[width];
  b.store_aligned(lanes);
  float m = lanes[0];
  for (std::size_t i = 1; i < width; ++i) m = std::max(m, lanes[i]);
  return m;
#else
  return xsimd::reduce_max(b);
#endif
}

}  // namespace kestrel::cpu::simd
