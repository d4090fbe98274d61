// kestrel/tokenizer/vocab.hpp: the data of a SentencePiece-style vocabulary,
// as read from a GGUF file or a llama2.c tokenizer.bin, before an
// spm_tokenizer indexes it.
//
// Pieces are stored the SentencePiece way: a space is U+2581 "▁" and a raw
// byte is the piece "<0xXX>". Loaders of formats that store a plain space
// (llama2.c) call normalize_spaces() so that one encoder serves both.
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "kestrel/core/error.hpp"
#include "kestrel/core/token.hpp"

namespace kestrel {

/// GGUF's token types (tokenizer.ggml.token_type), same numbers as llama.cpp.
namespace token_type {
inline constexpr std::int32_t undefined = 0;     // treated as normal
inline constexpr std::int32_t normal = 1;
inline constexpr std::int32_t unknown = 2;       // <unk>
inline constexpr std::int32_t control = 3;       // <s>, </s>: never produced from text, decode to nothing
inline constexpr std::int32_t user_defined = 4;  // added pieces; encoded like normal ones here
inline constexpr std::int32_t unused = 5;
inline constexpr std::int32_t byte = 6;          // "<0xXX>"
}  // namespace token_type

/// U+2581 LOWER ONE EIGHTH BLOCK, SentencePiece's visible stand-in for a space.
inline constexpr std::string_view spm_space = "\xE2\x96\x81";

/// Appends `text` to `out` with every ' ' written as "▁", the one spelling of
/// a space that pieces and the encoder's normalised text share.
inline void append_spm_escaped(std::string& out, std::string_view text) {
  for (char c : text) {
    if (c == ' ')
      out += spm_space;
    else
      out += c;
  }
}

struct spm_vocab {
  std::vector<std::string> pieces;  // (n_vocab) raw pieces, spaces as "▁"
  std::vector<float> scores;        // (n_vocab) merge priority: higher merges first
  std::vector<std::int32_t> types;  // (n_vocab) token_type::*; may be left empty, then derived
  token_id bos = 1, eos = 2, unk = 0;
  bool add_bos = true;           // the model expects BOS before a prompt
  bool add_space_prefix = true;  // SentencePiece's add_dummy_prefix: " " before non-empty text
};

/// The byte of a byte piece "<0xXX>" (uppercase or lowercase hex), if it is one.
constexpr std::optional<std::uint8_t> parse_byte_piece(std::string_view p) noexcept {
  if (p.size() != 6 || p.substr(0, 3) != "<0x" || p[5] != '>') return std::nullopt;
  auto hex = [](char c) -> int {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    return -1;
  };
  const int hi = hex(p[3]), lo = hex(p[4]);
  if (hi < 0 || lo < 0) return std::nullopt;
  return static_cast<std::uint8_t>(hi * 16 + lo);
}

/// Fills `v.types` when a format carries none, by the convention of llama2.c
/// and SentencePiece: unk is unknown, bos/eos are control, "<0xXX>" is byte,
/// everything else normal.
inline void derive_types(spm_vocab& v) {
  v.types.assign(v.pieces.size(), token_type::normal);
  for (std::size_t i = 0; i < v.pieces.size(); ++i)
    if (parse_byte_piece(v.pieces[i])) v.types[i] = token_type::byte;
  auto mark = [&](token_id id, std::int32_t t) {
    if (id >= 0 && static_cast<std::size_t>(id) < v.types.size()) v.types[id] = t;
  };
  mark(v.unk, token_type::unknown);
  mark(v.bos, token_type::control);
  mark(v.eos, token_type::control);
}

/// Rewrites plain spaces to "▁" in normal pieces, unless some piece already
/// uses "▁" (then the vocabulary is SentencePiece-native and a plain space is
/// a genuine, if odd, character). llama2.c's export replaced "▁" by " ";
/// undoing it here lets the encoder work on one representation.
inline void normalize_spaces(spm_vocab& v) {
  for (const auto& p : v.pieces)
    if (p.find(spm_space) != std::string::npos) return;
  for (std::size_t i = 0; i < v.pieces.size(); ++i) {
    const std::int32_t t = v.types.empty() ? token_type::normal : v.types[i];
    if (t != token_type::normal && t != token_type::undefined && t != token_type::user_defined) continue;
    std::string& p = v.pieces[i];
    if (p.find(' ') == std::string::npos) continue;
    std::string out;
    out.reserve(p.size() + 8);
    append_spm_escaped(out, p);
    p = std::move(out);
  }
}

/// Throws invalid_argument naming the first inconsistency: sizes that
/// disagree, special ids out of range, unknown token types, NaN scores (they
/// would break the merge queue's ordering), byte-typed pieces that are not
/// "<0xXX>".
inline void validate(const spm_vocab& v) {
  const std::size_t n = v.pieces.size();
  if (n == 0) throw invalid_argument("spm_vocab: empty vocabulary");
  if (n > static_cast<std::size_t>(std::numeric_limits<token_id>::max())) throw invalid_argument("spm_vocab: more pieces than token_id can index");
  if (v.scores.size() != n)
    throw invalid_argument("spm_vocab: " + std::to_string(v.scores.size()) + " scores for " + std::to_string(n) +
                           " pieces");
  if (!v.types.empty() && v.types.size() != n)
    throw invalid_argument("spm_vocab: " + std::to_string(v.types.size()) + " token types for " +
                           std::to_string(n) + " pieces");
  auto check_id = [&](token_id id, const char* what, bool may_be_none) {
    if (may_be_none && id == no_token) return;
    if (id < 0 || static_cast<std::size_t>(id) >= n)
      throw invalid_argument(std::string("spm_vocab: ") + what + " id " + std::to_string(id) +
                             " outside the vocabulary of " + std::to_string(n));
  };
  check_id(v.bos, "bos", true);
  check_id(v.eos, "eos", true);
  check_id(v.unk, "unk", true);
  for (std::size_t i = 0; i < n; ++i) {
    if (std::isnan(v.scores[i])) throw invalid_argument("spm_vocab: score of token " + std::to_string(i) + " is NaN");
    if (v.types.empty()) continue;
    const std::int32_t t = v.types[i];
    if (t < token_type::undefined || t > token_type::byte)
      throw invalid_argument("spm_vocab: token " + std::to_string(i) + " has unknown type " + std::to_string(t));
    if (t == token_type::byte && !parse_byte_piece(v.pieces[i]))
      throw invalid_argument("spm_vocab: token " + std::to_string(i) + " is typed byte but its piece \"" +
                             v.pieces[i] + "\" is not <0xXX>");
  }
}

/// validate() for a vocabulary read from a file: an inconsistency is the
/// file's fault, so it becomes a file_error naming `path` (same message).
inline void validate_from_file(const spm_vocab& v, const std::string& path) {
  try {
    validate(v);
  } catch (const invalid_argument& e) {
    throw file_error(path, e.what());
  }
}

}  // namespace kestrel
