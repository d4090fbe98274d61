// kestrel/quant/token_groups.hpp: how the prefill kernels walk a call's
// tokens: groups of G (the kernel's register budget), then one group each of
// 4, 2 and 1 for the rest, so a kernel is instantiated for a few group sizes
// rather than one per remainder; and their shared inner step with AVX-512
// VNNI, a vpdpbusd against one token's 4 bytes broadcast (dpbusd_bcast).
#pragma once

#include <cstddef>
#include <cstdint>

#if defined(__AVX512F__) && defined(__AVX512VNNI__)
#include <immintrin.h>
#endif

namespace kestrel::quant {

#if defined(__AVX512F__) && defined(__AVX512VNNI__)
/// acc + vpdpbusd(codes, the int32 at p broadcast to every lane), with the
/// broadcast embedded in the instruction ({1to16}): GCC 12 emits
/// _mm512_dpbusd_epi32(acc, codes, _mm512_set1_epi32(v)) as a separate
/// vpbroadcastd plus the vpdpbusd, one more instruction per 64 multiply-adds
/// in the prefill panels' inner loops. Both assembler dialects spelled out.
inline __m512i dpbusd_bcast(__m512i acc, __m512i codes, const void* p) noexcept {
  asm("{vpdpbusd %[m]%{1to16%}, %[c], %[a]|vpdpbusd %[a], %[c], %[m]%{1to16%}}"
      : [a] "+v"(acc)
      : [c] "v"(codes), [m] "m"(*static_cast<const std::int32_t*>(p)));
  return acc;
}

/// The lanes of a 16-row panel that hold real rows when only n do (n >= 16:
/// all of them); the prefill panels store their results through it.
inline __mmask16 panel_row_mask(std::size_t n) noexcept {
  return n >= 16 ? __mmask16(0xffff) : __mmask16((1u << n) - 1);
}
#endif

/// group.template operator()<NT>(t) covering tokens [t, t + NT) for all of
/// [0, n): NT = G while G tokens remain, then 4, 2, 1 as they fit (each at
/// most once, since fewer than G remain).
template <std::size_t G, class F>
inline void for_token_groups(std::size_t n, F&& group) {
  static_assert(G == 1 || G == 2 || G == 4 || G == 8, "the tail takes groups of 4, 2 and 1");
  std::size_t t = 0;
  for (; t + G <= n; t += G) group.template operator()<G>(t);
  if constexpr (G > 4) {
    if (t + 4 <= n) { group.template operator()<4>(t); t += 4; }
  }
  if constexpr (G > 2) {
    if (t + 2 <= n) { group.template operator()<2>(t); t += 2; }
  }
  if constexpr (G > 1) {
    if (t < n) group.template operator()<1>(t);
  }
}

#if defined(__AVX512F__) && defined(__AVX512VNNI__)
/// Tokens [0, n_tokens) against one 16-row panel, in groups of G (then 4,
/// 2, 1): kernel.template operator()<NT>(t, acc) leaves in acc[i] (lane r =
/// row r) the outputs of token t + i, i < NT, which go to out + (t + i) *
/// out_stride, the lanes in `valid` only. The driver of every panel kernel
/// (legacy, k-quant, x16).
template <std::size_t G, class Kernel>
inline void panel_token_groups(std::size_t n_tokens, __mmask16 valid, float* out, std::size_t out_stride,
                               Kernel&& kernel) {
  __m512 acc[G];
  for_token_groups<G>(n_tokens, [&]<std::size_t NT>(std::size_t t) {
    kernel.template operator()<NT>(t, acc);
    for (std::size_t i = 0; i < NT; ++i) _mm512_mask_storeu_ps(out + (t + i) * out_stride, valid, acc[i]);
  });
}
#endif

}  // namespace kestrel::quant
