// spm_tokenizer on the Llama 2 vocabulary: round trips, byte fallback,
// invalid UTF-8, and the cost of long inputs.
#include <doctest/doctest.h>

#include <chrono>
#include <random>
#include <string>
#include <vector>

#include "helpers.hpp"
#include "kestrel/tokenizer/detokenizer.hpp"
#include "kestrel/tokenizer/spm.hpp"

using namespace kestrel;

TEST_CASE("empty text: [] or [bos]") {
  const spm_tokenizer* tok = test::llama2_tokenizer();
  if (!tok) return;
  CHECK(tok->encode("", false).empty());
  CHECK(tok->encode("", true) == std::vector<token_id>{1});
  CHECK(tok->encode("Hello world", false) == std::vector<token_id>{15043, 3186});
  CHECK(tok->encode(" ", false) == std::vector<token_id>{259});
}

TEST_CASE("round trip decode(encode(s)) == s on the Llama 2 vocabulary") {
  const spm_tokenizer* tok = test::llama2_tokenizer();
  if (!tok) return;
  const std::vector<std::string> texts = {
      "Hello world",
      " leading space",
      "trailing space ",
      "  two leading, three   inside,\ttab\nnewline\r\n",
      "    ",
      "\n",
      "a",
      "caf\xC3\xA9 na\xC3\xAFve r\xC3\xA9sum\xC3\xA9",                     // Latin-1 range
      "\xD0\x9F\xD1\x80\xD0\xB8\xD0\xB2\xD0\xB5\xD1\x82",                   // Привет
      "\xE4\xBD\xA0\xE5\xA5\xBD\xEF\xBC\x8C\xE4\xB8\x96\xE7\x95\x8C",       // 你好，世界
      "\xF0\x9F\x98\x80 \xF0\x9F\xA6\x99 \xF0\x9F\x91\xA8\xE2\x80\x8D\xF0\x9F\x91\xA9",  // emoji: byte fallback
      "\xF0\x9F\x8F\xB3\xEF\xB8\x8F\xE2\x80\x8D\xF0\x9F\x8C\x88",           // flag sequence with ZWJ
      "<s> </s> <unk> <0x41>",                                               // specials as plain text
      "\xE2\x96\x81 literal lower block",                                    // a typed "▁" comes back as a space
      "mixed: 123 + 4.5e-6 = x; {\"k\": [1, 2]}",
  };
  for (const auto& s : texts) {
    const auto ids = tok->encode(s, false);
    // SentencePiece cannot tell a typed U+2581 from an escaped space.
    std::string want;
    for (std::size_t i = 0; i < s.size();) {
      const bool lower_block = std::string_view(s).substr(i, spm_space.size()) == spm_space;
      want += lower_block ? ' ' : s[i];
      i += lower_block ? spm_space.size() : 1;
    }
    CHECK_MESSAGE(decode(*tok, ids) == want, "text: " << s);
    // With BOS in front the decode is the same: BOS prints nothing and the
    // dummy space after it is stripped.
    CHECK(decode(*tok, tok->encode(s, true)) == want);
  }
  // Special spellings are plain text: no control ids come out.
  for (token_id id : tok->encode("<s></s><unk>", false)) CHECK_FALSE(tok->is_control(id));
}

TEST_CASE("every byte 0..255 survives byte fallback") {
  const spm_tokenizer* tok = test::llama2_tokenizer();
  if (!tok) return;
  for (int b = 0; b < 256; ++b) {
    const std::string s(1, static_cast<char>(b));
    const auto ids = tok->encode(s, false);
    REQUIRE(!ids.empty());
    // Raw bytes: the dummy "▁" (a space) and then exactly the byte.
    CHECK(decode_bytes(*tok, ids) == (b == ' ' ? std::string("  ") : " " + s));
    if (b >= 0x80) {
      // Alone, a byte >= 0x80 is invalid UTF-8: its own byte token, decoded to U+FFFD.
      CHECK(ids.back() == 3 + b);
      CHECK(decode(*tok, ids) == "\xEF\xBF\xBD");
    }
  }
  // All 256 bytes in one string, and a run of all invalid bytes.
  std::string all;
  for (int b = 0; b < 256; ++b) all += static_cast<char>(b);
  CHECK(decode_bytes(*tok, tok->encode(all, false)) == " " + all);
}

TEST_CASE("invalid UTF-8 input encodes byte by byte and never crashes") {
  const spm_tokenizer* tok = test::llama2_tokenizer();
  if (!tok) return;
  const std::vector<std::string> bad = {
      "\xC3",                   // truncated 2-byte
      "ab\xE4\xBD",             // truncated 3-byte at the end
      "\xE4\xBD" "a",           // truncated 3-byte before ASCII
      "\xC0\xAF",               // overlong '/'
      "\xED\xA0\x80",           // surrogate
      "\xF4\x90\x80\x80",       // above U+10FFFF
      "\xFF\xFE\xFD",
      "\x80\x80\x80 text",
      std::string("nul\0in the middle", 17),
  };
  for (const auto& s : bad) {
    const auto ids = tok->encode(s, false);
    CHECK(decode_bytes(*tok, ids) == " " + s);
    const std::string text = decode(*tok, ids);
    CHECK(test::valid_utf8(text));
  }
  // Each invalid byte is one byte token, even where neighbours are mergeable.
  CHECK(tok->encode("\xE4\xBD" "a", false) ==
        std::vector<token_id>{tok->find(spm_space), 3 + 0xE4, 3 + 0xBD, tok->find("a")});
  // Random bytes: no crash, raw bytes preserved.
  std::mt19937 rng(42);
  for (int round = 0; round < 200; ++round) {
    std::string s(rng() % 64, '\0');
    for (auto& c : s) c = static_cast<char>(rng());
    const auto ids = tok->encode(s, true);
    CHECK(decode_bytes(*tok, ids) == (s.empty() ? "" : " " + s));
    CHECK(test::valid_utf8(decode(*tok, ids)));
  }
}

TEST_CASE("ids outside the vocabulary are rejected by the accessors") {
  const spm_tokenizer* tok = test::llama2_tokenizer();
  if (!tok) return;
  CHECK_THROWS_AS((void)tok->piece(-1), invalid_argument);
  CHECK_THROWS_AS((void)tok->piece(32000), invalid_argument);
  std::string out;
  CHECK_THROWS_AS(tok->append_bytes(32000, out), invalid_argument);
  CHECK_THROWS_AS((void)tok->byte_value(500), invalid_argument);
}

TEST_CASE("vocabulary validation") {
  spm_vocab v;
  CHECK_THROWS_AS(spm_tokenizer{v}, invalid_argument);  // empty
  v.pieces = {"<unk>", "<s>", "</s>", "a"};
  v.scores = {0, 0, 0};
  CHECK_THROWS_AS(spm_tokenizer{v}, invalid_argument);  // sizes differ
  v.scores = {0, 0, 0, -1};
  CHECK_NOTHROW(spm_tokenizer{v});  // no byte tokens, but an unk
  v.types = {2, 3, 3, 9};
  CHECK_THROWS_AS(spm_tokenizer{v}, invalid_argument);  // unknown type
  v.types = {2, 3, 3, 6};
  CHECK_THROWS_AS(spm_tokenizer{v}, invalid_argument);  // "a" is no <0xXX>
  v.types = {2, 3, 3, 1};
  v.eos = 4;
  CHECK_THROWS_AS(spm_tokenizer{v}, invalid_argument);  // eos out of range
  v.eos = 2;
  v.unk = no_token;
  CHECK_THROWS_AS(spm_tokenizer{v}, invalid_argument);  // neither unk nor bytes
  v.unk = 0;
  // Without byte tokens, an unknown character becomes one unk.
  const spm_tokenizer t(v);
  CHECK(t.encode("a\xE2\x82\xAC" "a", false) == std::vector<token_id>{0, 3, 0, 3});  // "▁" is unknown too
  CHECK(decode(t, t.encode("a", false)) == "\xE2\x81\x87 a");  // " ⁇ " then "a", first space stripped
}

TEST_CASE("1 MB of text encodes in near-linear time") {
  const spm_tokenizer* tok = test::llama2_tokenizer();
  if (!tok) return;
  // Mixed prose, with long runs that merge deep ("aaaa..." and spaces) which
  // a quadratic pair rescan would take minutes on.
  std::string chunk =
      "The quick brown fox jumps over the lazy dog. \xE4\xBD\xA0\xE5\xA5\xBD \xF0\x9F\x98\x80 1234567890\n";
  std::string text;
  while (text.size() < (1u << 20) / 2) text += chunk;
  text += std::string(1u << 18, 'a');
  text += std::string(1u << 18, ' ');
  const auto t0 = std::chrono::steady_clock::now();
  const auto ids = tok->encode(text, false);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  MESSAGE("encoded " << text.size() << " bytes into " << ids.size() << " tokens in " << seconds << " s");
  CHECK(seconds < 10.0);  // generous for slow CI machines; a quadratic encoder needs hours
  CHECK(decode(*tok, ids) == text);
}
