// kestrel/tokenizer/detail/utf8.hpp: strict UTF-8 sequence scanning shared by
// the encoder (splitting text into characters) and the streaming detokenizer
// (holding back incomplete characters, replacing invalid bytes).
//
// "Strict" is the Unicode definition (Table 3-7 of the standard): no overlong
// forms, no surrogates, nothing above U+10FFFF. Being strict matters for the
// detokenizer, whose output must always be valid UTF-8, and it keeps the
// encoder's "one invalid byte = one symbol" rule well defined.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace kestrel::detail {

/// What sits at the start of a byte range.
enum class utf8_scan : std::uint8_t {
  complete,    // a whole valid character of `length` bytes
  incomplete,  // a valid prefix of `length` bytes that the range ends inside
  invalid,     // `length` bytes (the maximal subpart, >= 1) form no character
};

struct utf8_result {
  utf8_scan kind;
  std::size_t length;
};

/// Classifies the bytes at the start of non-empty `s`. For `invalid`, `length`
/// is the "maximal subpart" of Unicode's U+FFFD substitution practice, so one
/// replacement character per result reproduces what browsers and Python print.
constexpr utf8_result utf8_classify(std::string_view s) noexcept {
  const auto b0 = static_cast<unsigned char>(s[0]);
  if (b0 < 0x80) return {utf8_scan::complete, 1};
  std::size_t need = 0;
  unsigned char lo = 0x80, hi = 0xBF;  // allowed range of the second byte
  if (b0 >= 0xC2 && b0 <= 0xDF) {
    need = 2;
  } else if (b0 >= 0xE0 && b0 <= 0xEF) {
    need = 3;
    if (b0 == 0xE0) lo = 0xA0;  // overlong below U+0800
    if (b0 == 0xED) hi = 0x9F;  // UTF-16 surrogates
  } else if (b0 >= 0xF0 && b0 <= 0xF4) {
    need = 4;
    if (b0 == 0xF0) lo = 0x90;  // overlong below U+10000
    if (b0 == 0xF4) hi = 0x8F;  // above U+10FFFF
  } else {
    return {utf8_scan::invalid, 1};  // 0x80..0xC1 (continuation or overlong lead), 0xF5..0xFF
  }
  for (std::size_t i = 1; i < need; ++i) {
    if (i >= s.size()) return {utf8_scan::incomplete, i};
    const auto b = static_cast<unsigned char>(s[i]);
    const bool ok = i == 1 ? (b >= lo && b <= hi) : (b >= 0x80 && b <= 0xBF);
    if (!ok) return {utf8_scan::invalid, i};
  }
  return {utf8_scan::complete, need};
}

inline constexpr std::string_view utf8_replacement = "\xEF\xBF\xBD";  // U+FFFD

/// Appends the valid UTF-8 rendering of `bytes` to `out`: valid characters
/// as they are, each invalid subpart as one U+FFFD. An incomplete character
/// at the end becomes one U+FFFD too, unless `hold_incomplete_tail`: then it
/// is left unconsumed (a stream waiting for the rest of it). Returns the
/// number of bytes consumed: bytes.size(), or less by the held-back tail.
inline std::size_t utf8_append_sanitized(std::string& out, std::string_view bytes,
                                         bool hold_incomplete_tail = false) {
  std::string_view rest = bytes;
  while (!rest.empty()) {
    const auto r = utf8_classify(rest);
    if (r.kind == utf8_scan::incomplete && hold_incomplete_tail) break;
    if (r.kind == utf8_scan::complete)
      out.append(rest.substr(0, r.length));
    else
      out.append(utf8_replacement);
    rest.remove_prefix(r.length);
  }
  return bytes.size() - rest.size();
}

}  // namespace kestrel::detail
