// tests/json.hpp: the fixtures' JSON (reference outputs, test vectors),
// read with the library's own strict reader (io/json.hpp).
#pragma once

#include <string_view>
#include <vector>

#include "kestrel/core/token.hpp"
#include "kestrel/io/json.hpp"

namespace kestrel::test {

using json = io::json_value;

inline json parse_json(std::string_view text) { return io::parse_json(text, "test fixture"); }

/// A JSON array of numbers as token ids.
inline std::vector<token_id> json_ids(const json& a) {
  std::vector<token_id> ids;
  for (const auto& x : a.as_array()) ids.push_back(static_cast<token_id>(x.as_int()));
  return ids;
}

}  // namespace kestrel::test
