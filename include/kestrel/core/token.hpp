// kestrel/core/token.hpp: the token id type shared by tokenizers, samplers and models.
#pragma once

#include <cstdint>

namespace kestrel {

/// A vocabulary index. Signed 32-bit like llama.cpp's llama_token, so -1 can mean "none".
using token_id = std::int32_t;
inline constexpr token_id no_token = -1;

}  // namespace kestrel
