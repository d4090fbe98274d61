// kestrel/quant/token_groups.hpp: how the prefill kernels walk a call's
// tokens: groups of G (the kernel's register budget), then one group each of
// 4, 2 and 1 for the rest, so a kernel is instantiated for a few group sizes
// rather than one per remainder.
#pragma once

#include <cstddef>

namespace kestrel::quant {

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

}  // namespace kestrel::quant
