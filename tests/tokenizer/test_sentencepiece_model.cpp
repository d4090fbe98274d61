// SentencePiece's tokenizer.model (protobuf) read without the sentencepiece
// library: the hf-tiny llama directory's file against the same vocabulary in
// llama.cpp's GGUF, llama.cpp's tokenizer vectors, and corrupt files.
#include <doctest/doctest.h>

#include <string>
#include <vector>

#include "fixtures.hpp"
#include "helpers.hpp"
#include "kestrel/io/gguf.hpp"
#include "kestrel/tokenizer/gguf_vocab.hpp"
#include "kestrel/tokenizer/sentencepiece_model.hpp"
#include "kestrel/tokenizer/spm.hpp"

using namespace kestrel;
using kestrel::test::fixture;

TEST_CASE("tokenizer.model: the Llama 2 vocabulary, identical to llama.cpp's GGUF of it") {
  const auto m = fixture("hf-tiny/tiny-random-llama/tokenizer.model");
  const auto g = fixture("llamacpp-vocab/ggml-vocab-llama-spm.gguf");
  if (!m || !g) return;
  const spm_vocab v = load_sentencepiece_model(*m);
  const spm_vocab w = vocab_from_gguf(io::gguf_file(*g));
  REQUIRE(v.pieces.size() == 32000);
  CHECK(v.pieces == w.pieces);
  CHECK(v.scores == w.scores);
  CHECK(v.types == w.types);
  CHECK(v.bos == 1);
  CHECK(v.eos == 2);
  CHECK(v.unk == 0);
  CHECK(v.add_space_prefix);
  // And it tokenizes llama.cpp's test texts as llama.cpp does.
  const spm_tokenizer tok(v);
  test::check_vocab_vectors(tok, "ggml-vocab-llama-spm", "tokenizer.model");
}

TEST_CASE("tokenizer.model: corrupt and unsupported files are clear errors") {
  const auto m = fixture("hf-tiny/tiny-random-llama/tokenizer.model");
  if (!m) return;
  const std::string bytes = test::read_file(*m);
  auto parse = [](const std::string& b) {
    return test::error_of([&] {
      (void)parse_sentencepiece_model(std::as_bytes(std::span(b.data(), b.size())), "t.model");
    });
  };
  // Truncation anywhere: an error naming the file and an offset, never a crash.
  for (std::size_t cut : {std::size_t{1}, std::size_t{2}, std::size_t{7}, bytes.size() / 3, bytes.size() - 1}) {
    const auto e = parse(bytes.substr(0, cut));
    INFO("cut at " << cut);
    CHECK(e.find("t.model") != std::string::npos);
  }
  CHECK(parse("").find("no pieces") != std::string::npos);
  CHECK(parse(std::string("\x0a\xff\xff\xff\xff\x0f", 6)).find("runs past the end") != std::string::npos);
  CHECK(parse(std::string("\x0b", 1)).find("wire type") != std::string::npos);
  // A unigram model (trainer_spec.model_type = 1): one piece, then field 2 { field 3 = 1 }.
  const std::string unigram = std::string("\x0a\x05\x0a\x03\x61\x62\x63", 7) + std::string("\x12\x02\x18\x01", 4);
  CHECK(parse(unigram).find("unigram") != std::string::npos);
}
