// tests/model/model_fixtures.hpp: loading the fixture models once per process.
#pragma once

#include <memory>
#include <optional>
#include <string>

#include "fixtures.hpp"
#include "kestrel/model/load.hpp"
#include "json.hpp"

namespace kestrel::test {

/// stories260K as a llama2.c checkpoint with tok512.bin, or as GGUF.
inline std::optional<model_file> stories260k(bool gguf) {
  if (gguf) {
    const auto p = fixture("gguf/stories260K.gguf");
    if (!p) return std::nullopt;
    return load_model_file(*p);
  }
  const auto p = fixture("llama2c/stories260K.bin");
  const auto t = fixture("llama2c/tok512.bin");
  if (!p || !t) return std::nullopt;
  return load_model_file(*p, *t);
}

/// The cases of llama2c/stories260K_reference_outputs.json.
inline std::optional<json> stories260k_reference() {
  const auto p = fixture("llama2c/stories260K_reference_outputs.json");
  if (!p) return std::nullopt;
  return parse_json(read_file(*p));
}

inline const json* reference_case(const json& ref, std::string_view name) {
  for (const auto& c : ref.at("cases").as_array())
    if (c.at("name").as_string() == name) return &c;
  return nullptr;
}

}  // namespace kestrel::test
