// Pre-tokenizers against Python's `regex` module running the models' regexes
// (data/pretokenize_reference.inc, made by tools/gen_pretokenize_reference.py),
// plus coverage on invalid UTF-8 and linear time on 1 MB inputs.
#include <doctest/doctest.h>

#include <chrono>
#include <cstddef>
#include <random>
#include <string>
#include <string_view>
#include <vector>

#include "fixtures.hpp"
#include "kestrel/tokenizer/pretokenize.hpp"
#include "kestrel/tokenizer/unicode.hpp"

using namespace kestrel;

namespace {

struct pretok_case {
  std::string_view pre;     // tokenizer.ggml.pre name
  std::size_t text;         // index into pretok_texts
  std::string_view lengths;  // byte lengths of the expected pieces, space-separated
};

#include "data/pretokenize_reference.inc"

constexpr pre_tokenizer all_pre_tokenizers[] = {
    pre_tokenizer::llamacpp_default, pre_tokenizer::gpt2,         pre_tokenizer::mpt,
    pre_tokenizer::starcoder,        pre_tokenizer::refact,       pre_tokenizer::falcon,
    pre_tokenizer::deepseek_llm,     pre_tokenizer::deepseek_coder, pre_tokenizer::llama3,
    pre_tokenizer::qwen2,            pre_tokenizer::deepseek_r1_qwen,
};

std::string lengths_of(const std::vector<std::string_view>& pieces) {
  std::string s;
  for (const auto& p : pieces) {
    if (!s.empty()) s += ' ';
    s += std::to_string(p.size());
  }
  return s;
}

std::string shown(std::string_view s) {
  std::string out;
  for (unsigned char c : s) {
    if (c == '\n') out += "\\n";
    else if (c == '\r') out += "\\r";
    else if (c == '\t') out += "\\t";
    else if (c < 0x20) {
      out += "\\x";
      out += std::to_string(c);
    }
    else out += static_cast<char>(c);
  }
  return out;
}

std::string shown_pieces(const std::vector<std::string_view>& pieces) {
  std::string s;
  for (const auto& p : pieces) {
    s += '[';
    s += shown(p);
    s += ']';
  }
  return s;
}

/// Pieces are non-empty and, concatenated in order, are `text` itself (same bytes, same addresses).
bool covers(std::string_view text, const std::vector<std::string_view>& pieces) {
  const char* at = text.data();
  for (const auto& p : pieces) {
    if (p.empty() || p.data() != at) return false;
    at += p.size();
  }
  return at == text.data() + text.size();
}

}  // namespace

TEST_CASE("pretokenize: every pre-tokenizer splits like the regex reference") {
  std::size_t failures = 0;
  std::vector<std::string_view> pieces;
  for (const pretok_case& c : pretok_expected) {
    const std::string_view text = pretok_texts[c.text];
    pieces.clear();
    pretokenize(pre_tokenizer_from_name(c.pre), text, pieces);
    const std::string got = lengths_of(pieces);
    if (got != c.lengths || !covers(text, pieces)) {
      if (++failures <= 20)
        MESSAGE(c.pre << " text " << c.text << " \"" << shown(text) << "\"\n  got      " << shown_pieces(pieces)
                      << " (" << got << ")\n  expected " << c.lengths);
    }
  }
  CHECK(failures == 0);
  CHECK(std::size(pretok_expected) == std::size(pretok_texts) * std::size(all_pre_tokenizers));
}

TEST_CASE("pretokenize: a few splits spelled out") {
  using v = std::vector<std::string_view>;
  CHECK(pretokenize(pre_tokenizer::llama3, "Hello world") == v{"Hello", " world"});
  CHECK(pretokenize(pre_tokenizer::gpt2, "Hello world") == v{"Hello", " world"});
  CHECK(pretokenize(pre_tokenizer::llama3, "12345") == v{"123", "45"});
  CHECK(pretokenize(pre_tokenizer::qwen2, "123") == v{"1", "2", "3"});
  CHECK(pretokenize(pre_tokenizer::gpt2, "12345") == v{"12345"});
  CHECK(pretokenize(pre_tokenizer::llama3, "I'M here") == v{"I", "'M", " here"});
  CHECK(pretokenize(pre_tokenizer::gpt2, "I'M here") == v{"I", "'", "M", " here"});
  CHECK(pretokenize(pre_tokenizer::llama3, "a  \n\n b") == v{"a", "  \n\n", " b"});
  CHECK(pretokenize(pre_tokenizer::gpt2, "a   b") == v{"a", "  ", " b"});
  CHECK(pretokenize(pre_tokenizer::gpt2, "").empty());
}

TEST_CASE("pretokenize: names round-trip; unknown names are a clear error") {
  for (pre_tokenizer p : all_pre_tokenizers) CHECK(pre_tokenizer_from_name(name_of(p)) == p);
  CHECK(name_of(pre_tokenizer::llama3) == "llama-bpe");
  CHECK(pre_tokenizer_from_name("llama3") == pre_tokenizer::llama3);
  CHECK(pre_tokenizer_from_name("gpt-2") == pre_tokenizer::gpt2);
  CHECK(pre_tokenizer_from_name("default") == pre_tokenizer::llamacpp_default);
  const std::string msg = test::invalid_argument_message([] { (void)pre_tokenizer_from_name("bogus-pre"); });
  CHECK(msg.find("bogus-pre") != std::string::npos);
  CHECK(msg.find("gpt-2") != std::string::npos);
  CHECK(msg.find("deepseek-r1-qwen") != std::string::npos);
  for (pre_tokenizer p : all_pre_tokenizers) CHECK(!regex_list(p).empty());
}

TEST_CASE("pretokenize: invalid UTF-8 never crashes and the pieces still cover the text") {
  std::string all_bytes;
  for (int b = 0; b < 256; ++b) all_bytes += static_cast<char>(b);
  std::vector<std::string> texts = {all_bytes, "\xFF", "\x80\x80", "a\xC3", "\xE2\x82", "caf\xC3\xA9\xFF!",
                                    "\xED\xA0\x80 surrogate", "\xF4\x90\x80\x80 too big", "\xC0\xAF overlong",
                                    "it'\xC5 s", " \xFF\xFE  \n"};
  std::mt19937 rng(1234);
  for (int i = 0; i < 200; ++i) {
    std::string s(rng() % 64, '\0');
    for (auto& c : s) c = static_cast<char>(rng() % 4 == 0 ? 0x80 + rng() % 128 : rng() % 256);
    texts.push_back(s);
  }
  std::vector<std::string_view> pieces;
  for (pre_tokenizer p : all_pre_tokenizers) {
    for (const auto& t : texts) {
      pieces.clear();
      pretokenize(p, t, pieces);
      CHECK_MESSAGE(covers(t, pieces), name_of(p) << " on \"" << shown(t) << "\"");
    }
  }
  // An invalid byte is one unit with U+FFFD's properties (a symbol): it is
  // never glued into a letter run, and never split inside a valid character.
  CHECK(pretokenize(pre_tokenizer::gpt2, "ab\xFF" "cd") == std::vector<std::string_view>{"ab", "\xFF", "cd"});
  CHECK(pretokenize(pre_tokenizer::llama3, "ab\xFF" "cd") == std::vector<std::string_view>{"ab", "\xFF" "cd"});
  CHECK(unicode::decode_utf8("\xE2\x82", 0).length == 1);
  CHECK(!unicode::decode_utf8("\xE2\x82", 0).valid);
  CHECK(unicode::decode_utf8("\xE2\x82\xAC", 0).cp == U'\u20AC');
}

TEST_CASE("pretokenize: unicode properties") {
  CHECK(unicode::is_letter(U'\u01C5'));   // Lt
  CHECK(unicode::is_letter(U'\u02B0'));   // Lm
  CHECK(!unicode::is_letter(U'\u0301'));  // Mn
  CHECK(unicode::is_mark(U'\u0301'));
  CHECK(unicode::is_number(U'\u2160'));  // Nl
  CHECK(unicode::is_decimal_digit(U'\u0663'));
  CHECK(unicode::is_punctuation(U'\u00BF'));
  CHECK(unicode::is_symbol(U'\u20AC'));
  CHECK(unicode::is_separator(U'\u2028'));
  CHECK(!unicode::is_whitespace(U'\x1C'));  // str.isspace() says yes; \s says no
  CHECK(unicode::is_whitespace(U'\u2029'));
  CHECK(unicode::category_of(U'\U0010FFFF') == unicode::general_category::Cn);
  CHECK(unicode::category_of(U'\U000F0000') == unicode::general_category::Co);
  CHECK(unicode::category_of(0x110000) == unicode::general_category::Cn);
}

TEST_CASE("pretokenize: 1 MB inputs in linear time") {
  // A multilingual mix built from the reference texts, and runs that a naive
  // backtracking matcher would make quadratic.
  std::string mixed;
  while (mixed.size() < (1u << 20))
    for (std::string_view t : pretok_texts) mixed += t;
  const std::string small = mixed.substr(0, 1u << 16);
  std::vector<std::string> worst = {std::string(1u << 20, ' '), std::string(1u << 20, ' ') + "a",
                                    std::string(1u << 20, '\n'), std::string(1u << 20, '7'),
                                    std::string(1u << 20, '\''), std::string(1u << 20, '!')};
  {
    std::string s;
    while (s.size() < (1u << 20)) s += " \t\u3000";
    worst.push_back(s + "x");
  }
  using clock = std::chrono::steady_clock;
  std::vector<std::string_view> pieces;
  for (pre_tokenizer p : all_pre_tokenizers) {
    auto time = [&](std::string_view t) {
      pieces.clear();
      const auto t0 = clock::now();
      pretokenize(p, t, pieces);
      const double s = std::chrono::duration<double>(clock::now() - t0).count();
      CHECK(covers(t, pieces));
      return s;
    };
    time(small);  // warm up
    const double t_small = time(small), t_big = time(mixed);
    // 16x the input: linear is ~16x; allow 4x more for noise on a busy 2-core machine.
    CHECK_MESSAGE(t_big < 64 * t_small + 0.05, name_of(p) << ": 64 KiB " << t_small << " s, 1 MiB " << t_big << " s");
    for (const auto& w : worst) {
      const double t = time(w);
      // Quadratic would be ~10^12 steps (hours); linear is milliseconds.
      CHECK_MESSAGE(t < 2.0, name_of(p) << " on a 1 MiB run of '" << shown(w.substr(0, 3)) << "': " << t << " s");
    }
  }
}
