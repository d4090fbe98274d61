// kestrel/cpu/ref/weights.hpp: scalar reading of weights of any dtype, for
// the scalar twins.
#pragma once

#include <cstddef>

#include "kestrel/core/dtype.hpp"
#include "kestrel/core/error.hpp"
#include "kestrel/core/tensor.hpp"
#include "kestrel/cpu/quantized.hpp"

namespace kestrel::cpu::ref {

/// Element (r, c) of w as a float, converted with core/dtype.hpp's exact
/// scalar conversions.
inline float weight_at(const weight_view& w, std::size_t r, std::size_t c) {
  const std::size_t i = r * w.cols + c;
  switch (w.type) {
    case dtype::f32: return static_cast<const float*>(w.data)[i];
    case dtype::f16: return to_f32(static_cast<const f16*>(w.data)[i]);
    case dtype::bf16: return to_f32(static_cast<const bf16*>(w.data)[i]);
    default: break;
  }
  throw invalid_argument("kestrel::cpu::ref: unsupported weight dtype");
}

/// out[c] = w(row, c). out: (w.cols)
inline void row_to_f32(const weight_view& w, std::size_t row, float* out) {
  if (is_quantized(w.type)) return cpu::detail::quantized_row_to_f32(w, row, out);
  for (std::size_t c = 0; c < w.cols; ++c) out[c] = weight_at(w, row, c);
}

}  // namespace kestrel::cpu::ref
