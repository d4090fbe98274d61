// kestrel/core/diagnostics.hpp: compiler warnings the library's headers turn
// off around their own code, and why.
#pragma once

// GCC 12's AVX-512 intrinsics that take a "don't care" source
// (_mm512_cvtph_ps, _mm512_castsi512_si256, _mm512_cvtepi32_ps, ... written
// over _mm512_undefined_ps and friends, which initialize a variable from
// itself) warn "'__Y' is used uninitialized" or "may be used
// uninitialized" once GCC inlines them into the kernels: 3334 warnings in
// a build of this repository with -march=native, none about the library's
// own variables. GCC 13 no longer warns. The kernels' headers (and the
// includes of xsimd and Eigen) put their code between
// KESTREL_INTRINSICS_BEGIN and KESTREL_INTRINSICS_END, which silence those
// two warnings for that code only, on GCC 12 and older only, so that an
// includer's -Wall stays quiet and the rest of its code keeps them.
#if defined(__GNUC__) && !defined(__clang__) && __GNUC__ < 13
#define KESTREL_INTRINSICS_BEGIN                                  \
  _Pragma("GCC diagnostic push")                                  \
  _Pragma("GCC diagnostic ignored \"-Wuninitialized\"")           \
  _Pragma("GCC diagnostic ignored \"-Wmaybe-uninitialized\"")
#define KESTREL_INTRINSICS_END _Pragma("GCC diagnostic pop")
#else
#define KESTREL_INTRINSICS_BEGIN
#define KESTREL_INTRINSICS_END
#endif
