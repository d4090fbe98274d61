// tests/json.hpp: a minimal JSON reader for the fixtures' small files
// (reference outputs, encode vectors), and token id arrays read from them.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <stdexcept>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "kestrel/core/token.hpp"

namespace kestrel::test {

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
