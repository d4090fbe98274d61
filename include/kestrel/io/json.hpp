// kestrel/io/json.hpp: a strict JSON (RFC 8259) reader for tokenizer files
// (HF tokenizer.json, OpenAI encoder.json) and other small metadata.
//
// Strict and bounds-checked: every error is a kestrel::file_error whose
// message reads "PATH: offset N: what", N being the byte offset of the
// offending character. Rejected: trailing commas, comments, single quotes,
// leading zeros, raw control characters in strings, invalid UTF-8, unpaired
// UTF-16 surrogates in \u escapes, bytes after the top-level value, and
// nesting deeper than `max_depth` (default 512): the parser recurses once per
// level, so the limit is what keeps a hostile file ("[[[[..." a million deep)
// from overflowing the stack, both while parsing and while destroying the tree.
//
// Objects keep their members in file order (a tokenizer's vocabulary is an
// object of 10^5 members, which are iterated, not looked up); find() is a
// linear scan and returns the first of duplicate keys. Numbers are kept as
// double and as their source text, so integers up to 2^53 are exact and
// as_int() can reject fractions. Every value remembers its byte offset, so a
// loader can report where in the file a semantically bad value sits.
#pragma once

#include <charconv>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "kestrel/core/error.hpp"

namespace kestrel::io {

class json_value {
 public:
  enum class kind : std::uint8_t { null, boolean, number, string, array, object };
  using member = std::pair<std::string, json_value>;

  json_value() = default;

  kind type() const noexcept { return kind_; }
  /// Byte offset of the value's first character in the parsed text.
  std::size_t offset() const noexcept { return offset_; }

  bool is_null() const noexcept { return kind_ == kind::null; }
  bool is_bool() const noexcept { return kind_ == kind::boolean; }
  bool is_number() const noexcept { return kind_ == kind::number; }
  bool is_string() const noexcept { return kind_ == kind::string; }
  bool is_array() const noexcept { return kind_ == kind::array; }
  bool is_object() const noexcept { return kind_ == kind::object; }

  /// Accessors throw kestrel::invalid_argument on the wrong kind; loaders
  /// that know the file use the checked helpers of json_document instead.
  bool as_bool() const { return want(kind::boolean), bool_; }
  double as_number() const { return want(kind::number), number_; }
  /// The number as an integer: must be integral and within +-2^53.
  std::int64_t as_int() const {
    want(kind::number);
    if (!(std::fabs(number_) <= 9007199254740992.0) || std::floor(number_) != number_)
      throw invalid_argument("json: number " + text_ + " at offset " + std::to_string(offset_) + " is not an integer");
    return static_cast<std::int64_t>(number_);
  }
  /// The decoded string (UTF-8), or a number's source text.
  const std::string& as_string() const {
    if (kind_ != kind::number) want(kind::string);
    return text_;
  }
  const std::vector<json_value>& as_array() const { return want(kind::array), items_; }
  const std::vector<member>& as_object() const { return want(kind::object), members_; }

  /// Elements of an array or members of an object; 0 otherwise.
  std::size_t size() const noexcept { return kind_ == kind::array ? items_.size() : kind_ == kind::object ? members_.size() : 0; }

  /// The member `key` of an object, or nullptr (also when this is no object).
  const json_value* find(std::string_view key) const noexcept {
    if (kind_ != kind::object) return nullptr;
    for (const auto& m : members_)
      if (m.first == key) return &m.second;
    return nullptr;
  }

  /// The member `key` of an object; a clear error naming the key (and where
  /// this object starts) when it is missing or this is no object.
  const json_value& at(std::string_view key) const {
    want(kind::object);
    if (const json_value* v = find(key)) return *v;
    throw error("json: no member \"" + std::string(key) + "\" in the object at offset " + std::to_string(offset_));
  }

  static const char* name_of(kind k) noexcept {
    switch (k) {
      case kind::null: return "null";
      case kind::boolean: return "a boolean";
      case kind::number: return "a number";
      case kind::string: return "a string";
      case kind::array: return "an array";
      case kind::object: return "an object";
    }
    return "?";
  }

 private:
  friend class json_parser;
  void want(kind k) const {
    if (kind_ != k)
      throw invalid_argument(std::string("json: value at offset ") + std::to_string(offset_) + " is " + name_of(kind_) +
                             ", expected " + name_of(k));
  }

  kind kind_ = kind::null;
  bool bool_ = false;
  double number_ = 0;
  std::size_t offset_ = 0;
  std::string text_;               // string value, or a number's source text
  std::vector<json_value> items_;  // array
  std::vector<member> members_;    // object, in file order
};

/// The parser behind parse_json(); one per text.
class json_parser {
 public:
  json_parser(std::string_view text, std::string path, std::size_t max_depth)
      : t_(text), path_(std::move(path)), max_depth_(max_depth) {}

  json_value parse() {
    json_value v;
    skip_ws();
    value(v, 0);
    skip_ws();
    if (i_ != t_.size()) fail(i_, "unexpected " + describe(i_) + " after the top-level value");
    return v;
  }

 private:
  [[noreturn]] void fail(std::size_t at, const std::string& what) const { throw file_error(path_, at, "json: " + what); }

  std::string describe(std::size_t at) const {
    if (at >= t_.size()) return "end of input";
    const auto c = static_cast<unsigned char>(t_[at]);
    if (c >= 0x20 && c < 0x7F) return std::string("'") + static_cast<char>(c) + "'";
    constexpr char hex[] = "0123456789ABCDEF";
    return std::string("byte 0x") + hex[c >> 4] + hex[c & 15];
  }

  void skip_ws() noexcept {
    while (i_ < t_.size() && (t_[i_] == ' ' || t_[i_] == '\n' || t_[i_] == '\r' || t_[i_] == '\t')) ++i_;
  }

  void expect(char c, const char* context) {
    skip_ws();
    if (i_ >= t_.size() || t_[i_] != c) fail(i_, std::string("expected '") + c + "' " + context + ", found " + describe(i_));
    ++i_;
  }

  void value(json_value& v, std::size_t depth) {
    if (i_ >= t_.size()) fail(i_, "unexpected end of input, expected a value");
    v.offset_ = i_;
    const char c = t_[i_];
    switch (c) {
      case '{': return object(v, depth + 1);
      case '[': return array(v, depth + 1);
      case '"': v.kind_ = json_value::kind::string; return string(v.text_);
      case 't': literal("true"); v.kind_ = json_value::kind::boolean; v.bool_ = true; return;
      case 'f': literal("false"); v.kind_ = json_value::kind::boolean; v.bool_ = false; return;
      case 'n': literal("null"); v.kind_ = json_value::kind::null; return;
      default:
        if (c == '-' || (c >= '0' && c <= '9')) return number(v);
        fail(i_, "unexpected " + describe(i_) + ", expected a value");
    }
  }

  void literal(std::string_view word) {
    if (t_.substr(i_, word.size()) != word) fail(i_, "invalid literal, expected '" + std::string(word) + "'");
    i_ += word.size();
  }

  void check_depth(std::size_t depth) const {
    if (depth > max_depth_) fail(i_, "nesting deeper than " + std::to_string(max_depth_) + " levels");
  }

  void array(json_value& v, std::size_t depth) {
    check_depth(depth);
    v.kind_ = json_value::kind::array;
    ++i_;  // '['
    skip_ws();
    if (i_ < t_.size() && t_[i_] == ']') return void(++i_);
    for (;;) {
      skip_ws();
      v.items_.emplace_back();
      value(v.items_.back(), depth);
      skip_ws();
      if (i_ < t_.size() && t_[i_] == ',') { ++i_; continue; }
      if (i_ < t_.size() && t_[i_] == ']') return void(++i_);
      fail(i_, "expected ',' or ']' in the array that starts at offset " + std::to_string(v.offset_) + ", found " + describe(i_));
    }
  }

  void object(json_value& v, std::size_t depth) {
    check_depth(depth);
    v.kind_ = json_value::kind::object;
    ++i_;  // '{'
    skip_ws();
    if (i_ < t_.size() && t_[i_] == '}') return void(++i_);
    for (;;) {
      skip_ws();
      if (i_ >= t_.size() || t_[i_] != '"') fail(i_, "expected a string key in the object that starts at offset " + std::to_string(v.offset_) + ", found " + describe(i_));
      v.members_.emplace_back();
      string(v.members_.back().first);
      expect(':', "after an object key");
      skip_ws();
      value(v.members_.back().second, depth);
      skip_ws();
      if (i_ < t_.size() && t_[i_] == ',') { ++i_; continue; }
      if (i_ < t_.size() && t_[i_] == '}') return void(++i_);
      fail(i_, "expected ',' or '}' in the object that starts at offset " + std::to_string(v.offset_) + ", found " + describe(i_));
    }
  }

  void number(json_value& v) {
    const std::size_t start = i_;
    auto digits = [&] {
      const std::size_t d = i_;
      while (i_ < t_.size() && t_[i_] >= '0' && t_[i_] <= '9') ++i_;
      return i_ - d;
    };
    if (t_[i_] == '-') ++i_;
    if (i_ < t_.size() && t_[i_] == '0') {
      ++i_;
      if (i_ < t_.size() && t_[i_] >= '0' && t_[i_] <= '9') fail(start, "number with a leading zero");
    } else if (digits() == 0) {
      fail(i_, "expected a digit, found " + describe(i_));
    }
    if (i_ < t_.size() && t_[i_] == '.') {
      ++i_;
      if (digits() == 0) fail(i_, "expected a digit after '.', found " + describe(i_));
    }
    if (i_ < t_.size() && (t_[i_] == 'e' || t_[i_] == 'E')) {
      ++i_;
      if (i_ < t_.size() && (t_[i_] == '+' || t_[i_] == '-')) ++i_;
      if (digits() == 0) fail(i_, "expected a digit in the exponent, found " + describe(i_));
    }
    v.kind_ = json_value::kind::number;
    v.text_.assign(t_.substr(start, i_ - start));
    const auto r = std::from_chars(t_.data() + start, t_.data() + i_, v.number_);
    if (r.ec == std::errc::result_out_of_range) fail(start, "number " + v.text_ + " is out of the range of double");
    if (r.ec != std::errc() || r.ptr != t_.data() + i_) fail(start, "malformed number " + v.text_);
  }

  static void put_utf8(std::string& out, std::uint32_t cp) {
    if (cp < 0x80) {
      out += static_cast<char>(cp);
    } else if (cp < 0x800) {
      out += static_cast<char>(0xC0 | (cp >> 6));
      out += static_cast<char>(0x80 | (cp & 0x3F));
    } else if (cp < 0x10000) {
      out += static_cast<char>(0xE0 | (cp >> 12));
      out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
      out += static_cast<char>(0x80 | (cp & 0x3F));
    } else {
      out += static_cast<char>(0xF0 | (cp >> 18));
      out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
      out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
      out += static_cast<char>(0x80 | (cp & 0x3F));
    }
  }

  std::uint32_t hex4() {
    if (t_.size() - i_ < 4) fail(i_, "truncated \\u escape");
    std::uint32_t v = 0;
    for (int k = 0; k < 4; ++k, ++i_) {
      const char c = t_[i_];
      int d;
      if (c >= '0' && c <= '9') d = c - '0';
      else if (c >= 'a' && c <= 'f') d = c - 'a' + 10;
      else if (c >= 'A' && c <= 'F') d = c - 'A' + 10;
      else fail(i_, "expected a hex digit in a \\u escape, found " + describe(i_));
      v = v * 16 + static_cast<std::uint32_t>(d);
    }
    return v;
  }

  /// Length of the valid UTF-8 character at i_ (strict: no overlongs, no
  /// surrogates, nothing above U+10FFFF), or 0.
  std::size_t utf8_length() const noexcept {
    const auto b0 = static_cast<unsigned char>(t_[i_]);
    std::size_t need;
    unsigned char lo = 0x80, hi = 0xBF;
    if (b0 >= 0xC2 && b0 <= 0xDF) need = 2;
    else if (b0 >= 0xE0 && b0 <= 0xEF) { need = 3; if (b0 == 0xE0) lo = 0xA0; if (b0 == 0xED) hi = 0x9F; }
    else if (b0 >= 0xF0 && b0 <= 0xF4) { need = 4; if (b0 == 0xF0) lo = 0x90; if (b0 == 0xF4) hi = 0x8F; }
    else return 0;
    if (t_.size() - i_ < need) return 0;
    for (std::size_t k = 1; k < need; ++k) {
      const auto b = static_cast<unsigned char>(t_[i_ + k]);
      if (k == 1 ? (b < lo || b > hi) : (b < 0x80 || b > 0xBF)) return 0;
    }
    return need;
  }

  void string(std::string& out) {
    const std::size_t start = i_;
    ++i_;  // opening quote
    for (;;) {
      // Copy the run of plain ASCII characters in one go (the common case).
      std::size_t run = i_;
      while (run < t_.size()) {
        const auto c = static_cast<unsigned char>(t_[run]);
        if (c == '"' || c == '\\' || c < 0x20 || c >= 0x80) break;
        ++run;
      }
      out.append(t_.substr(i_, run - i_));
      i_ = run;
      if (i_ >= t_.size()) fail(start, "unterminated string");
      const auto c = static_cast<unsigned char>(t_[i_]);
      if (c == '"') return void(++i_);
      if (c < 0x20) fail(i_, "raw control character " + describe(i_) + " in a string (must be escaped)");
      if (c >= 0x80) {
        const std::size_t n = utf8_length();
        if (n == 0) fail(i_, "invalid UTF-8 (" + describe(i_) + ") in a string");
        out.append(t_.substr(i_, n));
        i_ += n;
        continue;
      }
      // A backslash escape.
      const std::size_t esc = i_++;
      if (i_ >= t_.size()) fail(start, "unterminated string");
      switch (t_[i_++]) {
        case '"': out += '"'; break;
        case '\\': out += '\\'; break;
        case '/': out += '/'; break;
        case 'b': out += '\b'; break;
        case 'f': out += '\f'; break;
        case 'n': out += '\n'; break;
        case 'r': out += '\r'; break;
        case 't': out += '\t'; break;
        case 'u': {
          std::uint32_t cp = hex4();
          if (cp >= 0xDC00 && cp <= 0xDFFF) fail(esc, "unpaired low surrogate \\u" + std::string(t_.substr(esc + 2, 4)));
          if (cp >= 0xD800 && cp <= 0xDBFF) {
            if (t_.substr(i_, 2) != "\\u") fail(esc, "high surrogate \\u" + std::string(t_.substr(esc + 2, 4)) + " not followed by a low surrogate");
            i_ += 2;
            const std::uint32_t lo = hex4();
            if (lo < 0xDC00 || lo > 0xDFFF) fail(esc, "high surrogate \\u" + std::string(t_.substr(esc + 2, 4)) + " followed by \\u" + std::string(t_.substr(i_ - 4, 4)) + ", not a low surrogate");
            cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
          }
          put_utf8(out, cp);
          break;
        }
        default: fail(esc, "invalid escape '\\" + std::string(1, t_[i_ - 1]) + "'");
      }
    }
  }

  std::string_view t_;
  std::string path_;
  std::size_t max_depth_;
  std::size_t i_ = 0;
};

inline constexpr std::size_t json_default_max_depth = 512;

/// Parses `text`; errors are file_errors naming `path` (or "<memory>").
inline json_value parse_json(std::string_view text, std::string path = {},
                             std::size_t max_depth = json_default_max_depth) {
  return json_parser(text, std::move(path), max_depth).parse();
}

/// The bytes of the file at `path` (a text file: JSON, merges, a text to
/// tokenize). A missing, unreadable or directory path is a file_error
/// naming it (a directory opens as a stream and then fails to read with a
/// message that names no file).
inline std::string read_whole_file(const std::filesystem::path& path) {
  if (std::error_code ec; std::filesystem::is_directory(path, ec)) throw file_error(path.string(), "is a directory, not a file");
  std::ifstream f(path, std::ios::binary);
  if (!f) throw file_error(path.string(), "cannot open file");
  std::string text{std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>()};
  if (f.bad()) throw file_error(path.string(), "read error");
  return text;
}

/// Reads and parses the file at `path`. A missing or unreadable file is a
/// file_error too.
inline json_value read_json_file(const std::filesystem::path& path, std::size_t max_depth = json_default_max_depth) {
  return parse_json(read_whole_file(path), path.string(), max_depth);
}

}  // namespace kestrel::io
