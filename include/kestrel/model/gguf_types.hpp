// kestrel/model/gguf_types.hpp: the one table between a GGUF tensor type
// (ggml_type) and the weight dtype the kernels take. Loading reads it one
// way (model/load.hpp), saving the other (model/save.hpp).
#pragma once

#include <optional>
#include <string>
#include <utility>

#include "kestrel/core/dtype.hpp"
#include "kestrel/core/error.hpp"
#include "kestrel/io/gguf.hpp"

namespace kestrel {

inline constexpr std::pair<io::ggml_type, dtype> gguf_weight_types[] = {
    {io::ggml_type::f32, dtype::f32},   {io::ggml_type::f16, dtype::f16},   {io::ggml_type::bf16, dtype::bf16},
    {io::ggml_type::q4_0, dtype::q4_0}, {io::ggml_type::q4_1, dtype::q4_1}, {io::ggml_type::q5_0, dtype::q5_0},
    {io::ggml_type::q5_1, dtype::q5_1}, {io::ggml_type::q8_0, dtype::q8_0}, {io::ggml_type::q2_k, dtype::q2_k},
    {io::ggml_type::q3_k, dtype::q3_k}, {io::ggml_type::q4_k, dtype::q4_k}, {io::ggml_type::q5_k, dtype::q5_k},
    {io::ggml_type::q6_k, dtype::q6_k},
};

/// The kernels' dtype for a GGUF tensor type, or nullopt when they have none.
constexpr std::optional<dtype> weight_dtype_of(io::ggml_type t) noexcept {
  for (const auto& [g, d] : gguf_weight_types)
    if (g == t) return d;
  return std::nullopt;
}

/// The GGUF tensor type that stores a weight dtype: every dtype but the
/// backends' interleaved layouts (the _x16 types), which throw
/// invalid_argument: a model whose weights a backend repacked is not saved.
inline io::ggml_type ggml_type_of(dtype t) {
  for (const auto& [g, d] : gguf_weight_types)
    if (d == t) return g;
  throw invalid_argument("no GGUF type for dtype " + std::string(name_of(t)));
}

}  // namespace kestrel
