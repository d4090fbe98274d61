// kestrel/cpu/prefetch.hpp: asking for cache lines ahead of their use.
#pragma once

#include <cstddef>

namespace kestrel::cpu::detail {

/// Asks for the cache lines of n elements at p ahead of their use, into
/// every cache level (a hint: no effect on results). For data read once
/// and soon, whose next address the hardware prefetcher would not guess:
/// decode attention's value rows (cpu/attend.hpp), the k-quants' decode
/// rows two streams apart (cpu/quantized.hpp).
template <class T>
inline void prefetch_elements(const T* p, std::size_t n) noexcept {
  const char* c = reinterpret_cast<const char*>(p);
  for (std::size_t b = 0; b < n * sizeof(T); b += 64) __builtin_prefetch(c + b, 0, 3);
}

}  // namespace kestrel::cpu::detail
