// llama2.c tokenizer.bin / tok512.bin: loading, the upstream encode vectors,
// and rejection of corrupt files.
#include <doctest/doctest.h>

#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "fixtures.hpp"
#include "helpers.hpp"
#include "kestrel/tokenizer/llama2c_vocab.hpp"
#include "kestrel/tokenizer/spm.hpp"

using namespace kestrel;
using kestrel::test::fixture;

TEST_CASE("tokenizer.bin loads as a SentencePiece vocabulary") {
  const spm_tokenizer* tok = test::llama2_tokenizer();
  if (!tok) return;
  CHECK(tok->n_vocab() == 32000);
  CHECK(tok->bos() == 1);
  CHECK(tok->eos() == 2);
  CHECK(tok->unk() == 0);
  CHECK(tok->piece(1) == "\n<s>\n");
  CHECK(tok->is_control(1));
  CHECK(tok->is_control(2));
  CHECK(tok->type(0) == token_type::unknown);
  for (int b = 0; b < 256; ++b) {
    REQUIRE(tok->is_byte(3 + b));
    CHECK(tok->byte_value(3 + b) == b);
    CHECK(tok->byte_token(static_cast<std::uint8_t>(b)) == 3 + b);
  }
  CHECK_FALSE(tok->is_byte(259));
  // The export's plain spaces are back to "▁".
  CHECK(tok->piece(259) == "\xE2\x96\x81\xE2\x96\x81");
  CHECK(tok->find("\xE2\x96\x81t") == 260);
  CHECK(tok->find(" t") == no_token);
}

TEST_CASE("tok512.bin loads with n_vocab 512") {
  const auto p = fixture("llama2c/tok512.bin");
  if (!p) return;
  const spm_tokenizer tok(load_llama2c_tokenizer(*p, 512));
  CHECK(tok.n_vocab() == 512);
  CHECK(tok.piece(259) == "\xE2\x96\x81t");
  CHECK(tok.is_byte(258));
  CHECK(tok.byte_value(258) == 0xFF);
  CHECK(tok.encode("", true) == std::vector<token_id>{1});
}

TEST_CASE("llama2.c test.c encode vectors, with BOS: 5/5") {
  const spm_tokenizer* tok = test::llama2_tokenizer();
  const auto p = fixture("llama2c/tokenizer_bin_encode_vectors.json");
  if (!tok || !p) return;
  const auto j = test::parse_json(test::read_file(*p));
  const auto& cases = j.at("cases").as_array();
  REQUIRE(cases.size() == 5);
  int passed = 0;
  for (const auto& c : cases) {
    const auto got = tok->encode(c.at("text").as_string(), true);
    const auto want = test::json_ids(c.at("expected_ids"));
    CHECK_MESSAGE(got == want, "text: " << c.at("text").as_string());
    passed += got == want;
  }
  MESSAGE("llama2.c encode vectors: " << passed << "/5");
  CHECK(passed == 5);
}

TEST_CASE("ggml-vocab-llama-spm .inp/.out through tokenizer.bin: 46/46") {
  const spm_tokenizer* tok = test::llama2_tokenizer();
  if (!tok) return;
  test::check_vocab_vectors(*tok, "ggml-vocab-llama-spm", "llama-spm via tokenizer.bin");
}

namespace {

// A well-formed tokenizer.bin image: unk, bos, eos, the 256 byte tokens, then `extra`.
std::string make_tokenizer_bin(const std::vector<std::pair<std::string, float>>& extra, std::int32_t max_len = 16) {
  std::string img;
  auto put_i32 = [&](std::int32_t v) { img.append(reinterpret_cast<const char*>(&v), 4); };
  auto put_f32 = [&](float v) { img.append(reinterpret_cast<const char*>(&v), 4); };
  auto put_piece = [&](const std::string& p, float s) {
    put_f32(s);
    put_i32(static_cast<std::int32_t>(p.size()));
    img += p;
  };
  put_i32(max_len);
  put_piece("<unk>", 0);
  put_piece("\n<s>\n", 0);
  put_piece("\n</s>\n", 0);
  static const char* hex = "0123456789ABCDEF";
  for (int b = 0; b < 256; ++b) put_piece(std::string("<0x") + hex[b >> 4] + hex[b & 15] + ">", 0);
  for (const auto& [p, s] : extra) put_piece(p, s);
  return img;
}

std::span<const std::byte> bytes_of(const std::string& s) {
  return {reinterpret_cast<const std::byte*>(s.data()), s.size()};
}

}  // namespace

TEST_CASE("a synthetic tokenizer.bin: merges by score, leftmost on ties") {
  // "▁" is absent from every piece, so plain spaces are normalised.
  const std::string img = make_tokenizer_bin({{" ", -1}, {"a", -2}, {"b", -3}, {"ab", -10}, {"ba", -10}, {" a", -20}});
  const std::size_t n = 3 + 256 + 6;
  const spm_tokenizer tok(parse_llama2c_tokenizer(bytes_of(img), "synthetic", n));
  const token_id sp = 259, a = 260, b = 261, ab = 262, ba = 263, sp_a = 264;
  // " aba": "▁a" (-20) loses to "ab"/"ba" (-10, tie: leftmost "ab" first), then "▁" "ab" "a".
  CHECK(tok.encode("aba", false) == std::vector<token_id>{sp, ab, a});
  CHECK(tok.encode("bab", false) == std::vector<token_id>{sp, ba, b});
  CHECK(tok.encode("a", false) == std::vector<token_id>{sp_a});
  // 'c' is no piece: byte fallback.
  CHECK(tok.encode("c", false) == std::vector<token_id>{sp, 3 + 'c'});
}

TEST_CASE("corrupt tokenizer.bin images give file_error, never a crash") {
  const std::string good = make_tokenizer_bin({{" hello", -1}, {"x", -2}});
  const std::size_t n = 3 + 256 + 2;
  CHECK_NOTHROW(parse_llama2c_tokenizer(bytes_of(good), "good", n));

  // Every truncation point.
  for (std::size_t cut = 0; cut < good.size(); ++cut) {
    const std::string bad = good.substr(0, cut);
    CHECK_THROWS_AS(parse_llama2c_tokenizer(bytes_of(bad), "cut", n), file_error);
  }
  // More tokens than the file holds, and absurdly many.
  CHECK_THROWS_AS(parse_llama2c_tokenizer(bytes_of(good), "many", n + 1), file_error);
  CHECK_THROWS_AS(parse_llama2c_tokenizer(bytes_of(good), "many", std::size_t{1} << 40), file_error);
  CHECK_THROWS_AS(parse_llama2c_tokenizer(bytes_of(good), "few", 2), file_error);

  auto patch_i32 = [](std::string s, std::size_t at, std::int32_t v) {
    std::memcpy(s.data() + at, &v, 4);
    return s;
  };
  // max_token_length negative / zero / absurd.
  CHECK_THROWS_AS(parse_llama2c_tokenizer(bytes_of(patch_i32(good, 0, -1)), "m", n), file_error);
  CHECK_THROWS_AS(parse_llama2c_tokenizer(bytes_of(patch_i32(good, 0, 0)), "m", n), file_error);
  CHECK_THROWS_AS(parse_llama2c_tokenizer(bytes_of(patch_i32(good, 0, 1 << 30)), "m", n), file_error);
  // First token's length (at offset 4 + 4): negative, beyond max_token_length, huge.
  for (std::int32_t len : {-1, -2147483647 - 1, 17, 1 << 30}) {
    try {
      parse_llama2c_tokenizer(bytes_of(patch_i32(good, 8, len)), "len", n);
      FAIL("accepted length " << len);
    } catch (const file_error& e) {
      CHECK(e.offset() == 8);
      CHECK(std::string(e.what()).find("token 0") != std::string::npos);
    }
  }
  // A NaN score is rejected too.
  {
    std::string bad = good;
    const float nan = std::numeric_limits<float>::quiet_NaN();
    std::memcpy(bad.data() + 4, &nan, 4);
    CHECK_THROWS_AS(parse_llama2c_tokenizer(bytes_of(bad), "nan", n), file_error);
  }
}

TEST_CASE("truncated tokenizer.bin files on disk give file_error") {
  const auto p = fixture("llama2c/tokenizer.bin");
  if (!p) return;
  const std::string all = test::read_file(*p);
  const auto dir = test::scratch_dir("tokenizer");
  for (std::size_t cut : {std::size_t{0}, std::size_t{3}, std::size_t{100}, all.size() / 2, all.size() - 1}) {
    const auto f = dir / ("cut" + std::to_string(cut) + ".bin");
    test::write_file(f, all.substr(0, cut));
    CHECK_THROWS_AS(load_llama2c_tokenizer(f, 32000), file_error);
  }
  CHECK_THROWS_AS(load_llama2c_tokenizer(dir / "missing.bin", 32000), file_error);
  CHECK_THROWS_AS(load_llama2c_tokenizer(*p, 32001), file_error);
}
