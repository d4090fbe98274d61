// The streaming detokenizer: the llama2.c reference text, UTF-8 integrity of
// every push, and the dummy-prefix rule.
#include <doctest/doctest.h>

#include <random>
#include <string>
#include <vector>

#include "fixtures.hpp"
#include "helpers.hpp"
#include "kestrel/tokenizer/detokenizer.hpp"
#include "kestrel/tokenizer/llama2c_vocab.hpp"
#include "kestrel/tokenizer/spm.hpp"

using namespace kestrel;
using kestrel::test::fixture;

TEST_CASE("stories260K greedy reference text, decoded one token at a time") {
  const auto tok_path = fixture("llama2c/tok512.bin");
  const auto ref_path = fixture("llama2c/stories260K_reference_outputs.json");
  if (!tok_path || !ref_path) return;
  const spm_tokenizer tok(load_llama2c_tokenizer(*tok_path, 512));
  const auto ref = test::parse_json(test::read_file(*ref_path));
  const test::json* c = nullptr;
  for (const auto& x : ref.at("cases").as_array())
    if (x.at("name").as_string() == "test_all_greedy_200") c = &x;
  REQUIRE(c != nullptr);
  const auto ids = test::json_ids((*c).at("generated_ids_derived"));
  REQUIRE(!ids.empty());

  // Generation starts after the prompt's BOS.
  detokenizer<spm_tokenizer> d(tok, /*at_sequence_start=*/true);
  std::string text;
  for (token_id id : ids) {
    const std::string part = d.push(id);
    CHECK(test::valid_utf8(part));
    text += part;
  }
  text += d.flush();
  CHECK(text == (*c).at("expected_text").as_string());

  // The same ids pushed after an explicit BOS decode the same.
  detokenizer<spm_tokenizer> d2(tok, false);
  std::string text2 = d2.push(tok.bos());
  for (token_id id : ids) text2 += d2.push(id);
  CHECK(text2 == text);
  CHECK(decode(tok, ids) == text);
}

TEST_CASE("push never returns part of a UTF-8 character") {
  const spm_tokenizer* tok = test::llama2_tokenizer();
  if (!tok) return;
  // Characters absent from the vocabulary arrive as one byte token per byte.
  const std::string s = "x \xF0\x9F\xA6\x99\xF0\x9F\x98\x80 \xE4\xB8\x96 caf\xC3\xA9 \xF0\x9F\x91\xA8\xE2\x80\x8D\xF0\x9F\x91\xA9!";
  const auto ids = tok->encode(s, true);
  detokenizer<spm_tokenizer> d(*tok, false);
  std::string text;
  std::size_t held = 0;
  for (token_id id : ids) {
    const std::string part = d.push(id);
    CHECK_MESSAGE(test::valid_utf8(part), "token " << id);
    held = std::max(held, d.pending());
    text += part;
  }
  CHECK(held > 0);  // the test did exercise holding back
  CHECK(d.pending() == 0);
  CHECK(d.flush().empty());
  CHECK(text == s);
}

TEST_CASE("byte tokens: held back, completed, or replaced by U+FFFD") {
  const spm_tokenizer* tok = test::llama2_tokenizer();
  if (!tok) return;
  auto byte = [&](unsigned b) { return tok->byte_token(static_cast<std::uint8_t>(b)); };
  detokenizer<spm_tokenizer> d(*tok);
  // "€" = E2 82 AC, one byte per push.
  CHECK(d.push(byte(0xE2)).empty());
  CHECK(d.push(byte(0x82)).empty());
  CHECK(d.pending() == 2);
  CHECK(d.push(byte(0xAC)) == "\xE2\x82\xAC");
  // An incomplete character cut by a normal piece: U+FFFD, then the piece.
  CHECK(d.push(byte(0xE2)).empty());
  CHECK(d.push(tok->find("\xE2\x96\x81the")) == "\xEF\xBF\xBD the");
  // A byte that can never start a character is replaced at once.
  CHECK(d.push(byte(0xFF)) == "\xEF\xBF\xBD");
  CHECK(d.push(byte(0x80)) == "\xEF\xBF\xBD");
  // flush() turns an incomplete tail into one U+FFFD.
  CHECK(d.push(byte(0xF0)).empty());
  CHECK(d.push(byte(0x9F)).empty());
  CHECK(d.flush() == "\xEF\xBF\xBD");
  CHECK(d.flush().empty());
  // Random byte-token streams: every push is valid UTF-8.
  std::mt19937 rng(7);
  for (int round = 0; round < 500; ++round) {
    detokenizer<spm_tokenizer> r(*tok);
    for (int i = 0; i < 16; ++i) {
      const token_id id = rng() % 4 == 0 ? static_cast<token_id>(259 + rng() % 31000) : byte(0x80 + rng() % 0x80);
      CHECK(test::valid_utf8(r.push(id)));
    }
    CHECK(test::valid_utf8(r.flush()));
  }
}

TEST_CASE("utf8_append_sanitized: replaces invalid subparts, holds back or replaces an incomplete tail") {
  const std::string fffd = "\xEF\xBF\xBD";
  std::string out = ">";
  // "a", the overlong C0 80 (two invalid bytes), "€", then an incomplete F0 9F.
  const std::string bytes = "a\xC0\x80\xE2\x82\xAC\xF0\x9F";
  CHECK(detail::utf8_append_sanitized(out, bytes) == bytes.size());
  CHECK(out == ">a" + fffd + fffd + "\xE2\x82\xAC" + fffd);
  out.clear();
  CHECK(detail::utf8_append_sanitized(out, bytes, true) == bytes.size() - 2);
  CHECK(out == "a" + fffd + fffd + "\xE2\x82\xAC");
  out.clear();
  CHECK(detail::utf8_append_sanitized(out, "", true) == 0);
  CHECK(out.empty());
}

TEST_CASE("control tokens print nothing; the piece after BOS loses its dummy space") {
  const spm_tokenizer* tok = test::llama2_tokenizer();
  if (!tok) return;
  const token_id hello = tok->find("\xE2\x96\x81Hello"), world = tok->find("\xE2\x96\x81world");
  REQUIRE(hello != no_token);
  REQUIRE(world != no_token);
  {
    detokenizer<spm_tokenizer> d(*tok, false);  // mid-sequence: spaces are kept
    CHECK(d.push(hello) == " Hello");
    CHECK(d.push(tok->eos()).empty());
    CHECK(d.push(tok->bos()).empty());
    CHECK(d.push(world) == "world");  // right after BOS: stripped
    CHECK(d.push(hello) == " Hello");
  }
  {
    detokenizer<spm_tokenizer> d(*tok, true);  // a fresh sequence
    CHECK(d.push(hello) == "Hello");
    CHECK(d.push(world) == " world");
    d.reset();
    CHECK(d.push(world) == "world");
  }
  {
    // A byte token 0x20 after BOS is a typed space, not the dummy prefix.
    detokenizer<spm_tokenizer> d(*tok, true);
    CHECK(d.push(tok->byte_token(' ')) == " ");
  }
  const std::vector<token_id> seq = {tok->bos(), hello, world, tok->eos()};
  CHECK(decode(*tok, seq) == "Hello world");
}
