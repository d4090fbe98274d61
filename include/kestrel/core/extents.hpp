// kestrel/core/extents.hpp: a dimension that is either a compile-time
// constant or a run-time value, in one type family (std::mdspan's idea).
//
//   extent<64>      -- always 64, occupies no storage, checked when set
//   extent<dynamic> -- any value, stored
//
// Model configs are built from these, so a fully static config lets kernels
// see constants and a dynamic one serves any file.
#pragma once

#include <cstddef>
#include <span>
#include <string>
#include <string_view>

#include "kestrel/core/error.hpp"

namespace kestrel {

inline constexpr std::size_t dynamic = std::dynamic_extent;

template <std::size_t N>
struct extent {
  static constexpr bool is_static = true;
  static constexpr std::size_t static_value = N;
  constexpr extent() = default;
  /// Accepts only N; `what` names the dimension for the error message.
  constexpr explicit extent(std::size_t v, std::string_view what = "dimension") {
    if (v != N)
      throw invalid_argument(std::string(what) + ": expected " + std::to_string(N) + " (fixed at compile time), got " +
                             std::to_string(v));
  }
  constexpr std::size_t operator()() const noexcept { return N; }
  constexpr operator std::size_t() const noexcept { return N; }
};

template <>
struct extent<dynamic> {
  static constexpr bool is_static = false;
  static constexpr std::size_t static_value = dynamic;
  std::size_t value = 0;
  constexpr extent() = default;
  constexpr explicit extent(std::size_t v, std::string_view = {}) : value(v) {}
  constexpr std::size_t operator()() const noexcept { return value; }
  constexpr operator std::size_t() const noexcept { return value; }
};

template <class T> inline constexpr bool is_extent_v = false;
template <std::size_t N> inline constexpr bool is_extent_v<extent<N>> = true;

}  // namespace kestrel
