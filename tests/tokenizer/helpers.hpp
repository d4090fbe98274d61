// tests/tokenizer/helpers.hpp: fixture readers shared by the tokenizer tests.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <sstream>
#include <stdexcept>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "kestrel/core/token.hpp"

namespace kestrel::test {

/// llama.cpp's .inp format: every case, the last included, is followed by
/// "\n__ggml_vocab_test__\n" (SOURCES.md), so splitting on the separator and
/// keeping only what precedes each occurrence gives the cases exactly.
inline std::vector<std::string> split_vocab_inp(std::string_view all) {
  constexpr std::string_view sep = "\n__ggml_vocab_test__\n";
  std::vector<std::string> cases;
  for (std::size_t pos = 0;;) {
    const std::size_t at = all.find(sep, pos);
    if (at == std::string_view::npos) break;
    cases.emplace_back(all.substr(pos, at - pos));
    pos = at + sep.size();
  }
  return cases;
}

/// llama.cpp's .out format: one line per case, space-separated ids.
inline std::vector<std::vector<token_id>> parse_vocab_out(const std::string& all) {
  std::vector<std::vector<token_id>> lines;
  std::istringstream in(all);
  std::string line;
  while (std::getline(in, line)) {
    std::istringstream ls(line);
    std::vector<token_id> ids;
    long v;
    while (ls >> v) ids.push_back(static_cast<token_id>(v));
    lines.push_back(std::move(ids));
  }
  return lines;
}

/// An independent strict UTF-8 check (written separately from the library's
/// detail/utf8.hpp so that the tests do not trust the code they test).
inline bool valid_utf8(std::string_view s) {
  std::size_t i = 0;
  while (i < s.size()) {
    const auto c = static_cast<unsigned char>(s[i]);
    std::uint32_t cp;
    std::size_t n;
    if (c < 0x80) { cp = c; n = 1; }
    else if ((c & 0xE0) == 0xC0) { cp = c & 0x1F; n = 2; }
    else if ((c & 0xF0) == 0xE0) { cp = c & 0x0F; n = 3; }
    else if ((c & 0xF8) == 0xF0) { cp = c & 0x07; n = 4; }
    else return false;
    if (i + n > s.size()) return false;
    for (std::size_t k = 1; k < n; ++k) {
      const auto d = static_cast<unsigned char>(s[i + k]);
      if ((d & 0xC0) != 0x80) return false;
      cp = (cp << 6) | (d & 0x3F);
    }
    static constexpr std::uint32_t min_cp[] = {0, 0, 0x80, 0x800, 0x10000};
    if (cp < min_cp[n] || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return false;
    i += n;
  }
  return true;
}

/// A minimal JSON value and parser: enough for the fixtures' small files.
struct json {
  using array = std::vector<json>;
  using object = std::map<std::string, json, std::less<>>;
  std::variant<std::nullptr_t, bool, double, std::string, std::shared_ptr<array>, std::shared_ptr<object>> v;

  const json& operator[](std::string_view key) const {
    const auto& o = *std::get<std::shared_ptr<object>>(v);
    const auto it = o.find(key);
    if (it == o.end()) throw std::runtime_error("json: no key " + std::string(key));
    return it->second;
  }
  const array& arr() const { return *std::get<std::shared_ptr<array>>(v); }
  const std::string& str() const { return std::get<std::string>(v); }
  double num() const { return std::get<double>(v); }

  static json parse(std::string_view text) {
    std::size_t i = 0;
    json j = value(text, i);
    return j;
  }

 private:
  static void ws(std::string_view t, std::size_t& i) {
    while (i < t.size() && (t[i] == ' ' || t[i] == '\n' || t[i] == '\r' || t[i] == '\t')) ++i;
  }
  static void expect(std::string_view t, std::size_t& i, char c) {
    ws(t, i);
    if (i >= t.size() || t[i] != c) throw std::runtime_error(std::string("json: expected ") + c);
    ++i;
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
  static std::uint32_t hex4(std::string_view t, std::size_t& i) {
    if (i + 4 > t.size()) throw std::runtime_error("json: short \\u escape");
    const std::uint32_t v = static_cast<std::uint32_t>(std::stoul(std::string(t.substr(i, 4)), nullptr, 16));
    i += 4;
    return v;
  }
  static std::string string(std::string_view t, std::size_t& i) {
    expect(t, i, '"');
    std::string out;
    while (i < t.size() && t[i] != '"') {
      char c = t[i++];
      if (c != '\\') {
        out += c;
        continue;
      }
      c = t[i++];
      switch (c) {
        case 'n': out += '\n'; break;
        case 't': out += '\t'; break;
        case 'r': out += '\r'; break;
        case 'b': out += '\b'; break;
        case 'f': out += '\f'; break;
        case 'u': {
          std::uint32_t cp = hex4(t, i);
          if (cp >= 0xD800 && cp < 0xDC00 && t.substr(i, 2) == "\\u") {
            i += 2;
            cp = 0x10000 + ((cp - 0xD800) << 10) + (hex4(t, i) - 0xDC00);
          }
          put_utf8(out, cp);
          break;
        }
        default: out += c;  // \" \\ \/
      }
    }
    ++i;
    return out;
  }
  static json value(std::string_view t, std::size_t& i) {
    ws(t, i);
    if (i >= t.size()) throw std::runtime_error("json: unexpected end");
    json j;
    const char c = t[i];
    if (c == '{') {
      auto o = std::make_shared<object>();
      ++i;
      ws(t, i);
      if (t[i] == '}') { ++i; j.v = o; return j; }
      for (;;) {
        std::string k = string(t, i);
        expect(t, i, ':');
        (*o)[k] = value(t, i);
        ws(t, i);
        if (t[i++] == '}') break;
      }
      j.v = o;
    } else if (c == '[') {
      auto a = std::make_shared<array>();
      ++i;
      ws(t, i);
      if (t[i] == ']') { ++i; j.v = a; return j; }
      for (;;) {
        a->push_back(value(t, i));
        ws(t, i);
        if (t[i++] == ']') break;
      }
      j.v = a;
    } else if (c == '"') {
      j.v = string(t, i);
    } else if (t.substr(i, 4) == "true") {
      i += 4; j.v = true;
    } else if (t.substr(i, 5) == "false") {
      i += 5; j.v = false;
    } else if (t.substr(i, 4) == "null") {
      i += 4; j.v = nullptr;
    } else {
      std::size_t used = 0;
      j.v = std::stod(std::string(t.substr(i, 32)), &used);
      i += used;
    }
    return j;
  }
};

inline std::vector<token_id> json_ids(const json& a) {
  std::vector<token_id> ids;
  for (const auto& x : a.arr()) ids.push_back(static_cast<token_id>(x.num()));
  return ids;
}

}  // namespace kestrel::test

#include "fixtures.hpp"
#include "kestrel/tokenizer/llama2c_vocab.hpp"
#include "kestrel/tokenizer/spm.hpp"

namespace kestrel::test {

/// The Llama 2 SentencePiece vocabulary from llama2.c's tokenizer.bin, loaded
/// once per test process; nullptr (skipped) when the fixture is missing.
inline const spm_tokenizer* llama2_tokenizer() {
  static const std::unique_ptr<spm_tokenizer> tok = []() -> std::unique_ptr<spm_tokenizer> {
    const auto p = fixture("llama2c/tokenizer.bin");
    if (!p) return nullptr;
    return std::make_unique<spm_tokenizer>(load_llama2c_tokenizer(*p, 32000));
  }();
  return tok.get();
}

}  // namespace kestrel::test
