// tests/io/test_json.cpp: the strict JSON reader (io/json.hpp).
#include <doctest/doctest.h>

#include <string>

#include "fixtures.hpp"
#include "kestrel/io/json.hpp"

using namespace kestrel;
using namespace kestrel::io;
using kestrel::test::error_of;

namespace {
std::string err(std::string_view text) {
  return error_of<file_error>([&] { (void)parse_json(text, "t.json"); });
}
}  // namespace

TEST_CASE("json: values, offsets, order") {
  const auto v = parse_json(R"( {"a": [1, -2.5e3, true, false, null], "b": {"c": "d"}, "a": 7} )");
  REQUIRE(v.is_object());
  CHECK(v.offset() == 1);
  CHECK(v.size() == 3);
  const auto* a = v.find("a");  // the first of duplicate keys
  REQUIRE(a);
  REQUIRE(a->is_array());
  CHECK(a->as_array()[0].as_int() == 1);
  CHECK(a->as_array()[1].as_number() == -2500.0);
  CHECK(a->as_array()[2].as_bool());
  CHECK_FALSE(a->as_array()[3].as_bool());
  CHECK(a->as_array()[4].is_null());
  CHECK(a->as_array()[1].offset() == 11);
  CHECK(v.find("b")->find("c")->as_string() == "d");
  CHECK(v.as_object()[2].first == "a");
  CHECK(v.find("zz") == nullptr);
  CHECK(parse_json("[]").size() == 0);
  CHECK(parse_json("{}").size() == 0);
  CHECK(parse_json("0").as_int() == 0);
  CHECK(parse_json("9007199254740992").as_int() == 9007199254740992LL);
  CHECK(error_of<invalid_argument>([] { (void)parse_json("1.5").as_int(); }).find("not an integer") != std::string::npos);
  CHECK(error_of<invalid_argument>([] { (void)parse_json("\"x\"").as_int(); }).find("is a string, expected a number") !=
        std::string::npos);
}

TEST_CASE("json: strings, escapes, surrogate pairs, UTF-8") {
  CHECK(parse_json(R"("a\"b\\c\/d\b\f\n\r\t")").as_string() == "a\"b\\c/d\b\f\n\r\t");
  CHECK(parse_json(R"("\u0041\u00e9\u20AC")").as_string() == "A\xC3\xA9\xE2\x82\xAC");
  CHECK(parse_json(R"("\ud83e\udd99")").as_string() == "\xF0\x9F\xA6\x99");  // 🦙
  CHECK(parse_json(R"("\u0000")").as_string() == std::string(1, '\0'));
  CHECK(parse_json("\"\xC4\xA0the \xE4\xBD\xA0\"").as_string() == "\xC4\xA0the \xE4\xBD\xA0");
  CHECK(err(R"("\ud83e")").find("not followed by a low surrogate") != std::string::npos);
  CHECK(err(R"("\ud83e\u0041")").find("not a low surrogate") != std::string::npos);
  CHECK(err(R"("\udd99")").find("unpaired low surrogate") != std::string::npos);
  CHECK(err(R"("\u12G4")").find("hex digit") != std::string::npos);
  CHECK(err(R"("\u12)").find("truncated") != std::string::npos);
  CHECK(err(R"("\q")").find("invalid escape") != std::string::npos);
  CHECK(err("\"a\nb\"").find("raw control character") != std::string::npos);
  CHECK(err("\"\xFF\"").find("invalid UTF-8") != std::string::npos);
  CHECK(err("\"\xC0\xAF\"").find("invalid UTF-8") != std::string::npos);      // overlong
  CHECK(err("\"\xED\xA0\x80\"").find("invalid UTF-8") != std::string::npos);  // surrogate
  CHECK(err("\"\xE2\x82\"").find("invalid UTF-8") != std::string::npos);      // truncated
  CHECK(err("\"abc").find("unterminated string") != std::string::npos);
}

TEST_CASE("json: malformed input names the offset") {
  CHECK(err("") == "t.json: offset 0: json: unexpected end of input, expected a value");
  CHECK(err("[1,]").find("offset 3") != std::string::npos);
  CHECK(err("[1 2]").find("offset 3: json: expected ',' or ']'") != std::string::npos);
  CHECK(err(R"({"a" 1})").find("expected ':'") != std::string::npos);
  CHECK(err(R"({"a": 1,})").find("expected a string key") != std::string::npos);
  CHECK(err("{'a': 1}").find("expected a string key") != std::string::npos);
  CHECK(err("01").find("leading zero") != std::string::npos);
  CHECK(err("1.").find("after '.'") != std::string::npos);
  CHECK(err("1e").find("exponent") != std::string::npos);
  CHECK(err("-").find("expected a digit") != std::string::npos);
  CHECK(err("1e999").find("out of the range") != std::string::npos);
  CHECK(err("tru").find("expected 'true'") != std::string::npos);
  CHECK(err("nul").find("expected 'null'") != std::string::npos);
  CHECK(err("[1] x").find("offset 4: json: unexpected 'x' after the top-level value") != std::string::npos);
  CHECK(err("// c\n1").find("unexpected '/'") != std::string::npos);
  CHECK(err("\xEF\xBB\xBF{}").find("byte 0xEF") != std::string::npos);  // a BOM is not JSON
  CHECK(err("[").find("unexpected end") != std::string::npos);
  CHECK(err("{\"a\":").find("unexpected end") != std::string::npos);
  // Every truncation of a valid document is an error, never a crash.
  const std::string doc = R"({"model": {"vocab": {"\u0120the": 262, "a": 1}, "merges": ["a b", ["c", "d"]]}, "x": -1.5e-3})";
  CHECK_NOTHROW((void)parse_json(doc));
  for (std::size_t n = 0; n < doc.size(); ++n) CHECK_FALSE(err(doc.substr(0, n)).empty());
}

TEST_CASE("json: deep nesting is an error, not a stack overflow") {
  const std::string ok = std::string(512, '[') + std::string(512, ']');
  CHECK_NOTHROW((void)parse_json(ok));
  const std::string deep = std::string(513, '[') + std::string(513, ']');
  CHECK(err(deep).find("nesting deeper than 512") != std::string::npos);
  const std::string hostile(1 << 20, '[');
  CHECK(err(hostile).find("nesting deeper") != std::string::npos);
  std::string objs;
  for (int i = 0; i < 100000; ++i) objs += "{\"a\":";
  CHECK(err(objs).find("nesting deeper") != std::string::npos);
  CHECK(error_of<file_error>([&] { (void)parse_json("[[[1]]]", "", 2); }).find("deeper than 2") != std::string::npos);
}

TEST_CASE("json: files") {
  const auto p = kestrel::test::write_scratch("json", "a.json", R"({"k": [1, 2, 3]})");
  CHECK(read_json_file(p).find("k")->size() == 3);
  CHECK(error_of<file_error>([] { (void)read_json_file("/nonexistent/x.json"); }).find("cannot open") != std::string::npos);
  const auto bad = kestrel::test::write_scratch("json", "b.json", "{\"k\": [1, 2,]}");
  CHECK(error_of<file_error>([&] { (void)read_json_file(bad); }).find("b.json: offset 12") != std::string::npos);
  if (const auto f = kestrel::test::fixture("bpe/gpt2/tokenizer.json")) {
    const auto j = read_json_file(*f);
    CHECK(j.find("model")->find("vocab")->size() == 50257);
    CHECK(j.find("model")->find("merges")->size() == 50000);
  }
}
