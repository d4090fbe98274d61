// SentencePiece vocabularies read from GGUF: llama.cpp's tokenizer vectors
// for llama-spm and phi-3, agreement with the llama2.c files, bad models.
#include <doctest/doctest.h>

#include <string>
#include <vector>

#include "fixtures.hpp"
#include "helpers.hpp"
#include "kestrel/io/gguf.hpp"
#include "kestrel/tokenizer/detokenizer.hpp"
#include "kestrel/tokenizer/gguf_vocab.hpp"
#include "kestrel/tokenizer/llama2c_vocab.hpp"
#include "kestrel/tokenizer/spm.hpp"

using namespace kestrel;
using kestrel::test::fixture;

namespace {

// The GGUF's own vocabulary against its .inp/.out vectors.
void check_vocab_vectors(const std::string& name) {
  const auto gguf = fixture("llamacpp-vocab/" + name + ".gguf");
  if (!gguf) return;
  const spm_tokenizer tok(vocab_from_gguf(io::gguf_file(*gguf)));
  test::check_vocab_vectors(tok, name, name);
}

}  // namespace

TEST_CASE("ggml-vocab-llama-spm.gguf .inp/.out: 46/46") { check_vocab_vectors("ggml-vocab-llama-spm"); }

TEST_CASE("ggml-vocab-phi-3.gguf .inp/.out: 46/46") { check_vocab_vectors("ggml-vocab-phi-3"); }

TEST_CASE("GGUF vocabulary metadata") {
  const auto p = fixture("llamacpp-vocab/ggml-vocab-phi-3.gguf");
  if (!p) return;
  const spm_vocab v = vocab_from_gguf(io::gguf_file(*p));
  CHECK(v.pieces.size() == 32064);
  CHECK(v.bos == 1);
  CHECK(v.eos == 32000);
  CHECK(v.unk == 0);
  CHECK(v.add_bos);
  CHECK(v.add_space_prefix);
  const spm_tokenizer tok(v);
  CHECK(tok.is_control(tok.eos()));  // <|endoftext|>
  std::string s;
  tok.append_bytes(tok.eos(), s);
  CHECK(s.empty());
}

TEST_CASE("the llama-spm GGUF and llama2.c's tokenizer.bin hold the same vocabulary") {
  const auto g = fixture("llamacpp-vocab/ggml-vocab-llama-spm.gguf");
  const spm_tokenizer* bin = test::llama2_tokenizer();
  if (!g || !bin) return;
  const spm_vocab v = vocab_from_gguf(io::gguf_file(*g));
  REQUIRE(v.pieces.size() == bin->n_vocab());
  std::size_t piece_diff = 0, score_diff = 0, type_diff = 0;
  for (std::size_t i = 0; i < v.pieces.size(); ++i) {
    const auto id = static_cast<token_id>(i);
    if (i != 1 && i != 2) piece_diff += v.pieces[i] != bin->piece(id);  // bos/eos: "<s>" vs "\n<s>\n"
    score_diff += v.scores[i] != bin->score(id);
    type_diff += v.types[i] != bin->type(id);
  }
  CHECK(piece_diff == 0);
  CHECK(score_diff == 0);
  CHECK(type_diff == 0);
}

TEST_CASE("stories260K.gguf carries tok512's vocabulary") {
  const auto g = fixture("gguf/stories260K.gguf");
  const auto t = fixture("llama2c/tok512.bin");
  if (!g || !t) return;
  const spm_vocab a = vocab_from_gguf(io::gguf_file(*g));
  const spm_vocab b = load_llama2c_tokenizer(*t, 512);
  REQUIRE(a.pieces.size() == 512);
  for (std::size_t i = 3; i < 512; ++i) CHECK(a.pieces[i] == b.pieces[i]);
  CHECK(a.scores == b.scores);
  const spm_tokenizer ta(a), tb(b);
  const std::string text = "Once upon a time, there was a little girl named Lily. \xF0\x9F\x98\x80";
  CHECK(ta.encode(text, true) == tb.encode(text, true));
}

TEST_CASE("a GGUF with another tokenizer model is a clear error") {
  const auto p = fixture("llamacpp-vocab/ggml-vocab-gpt-2.gguf");
  if (!p) return;
  try {
    (void)vocab_from_gguf(io::gguf_file(*p));
    FAIL("gpt2 vocabulary accepted");
  } catch (const file_error& e) {
    const std::string what = e.what();
    CHECK(what.find("'gpt2'") != std::string::npos);
    CHECK(what.find("ggml-vocab-gpt-2.gguf") != std::string::npos);
  }
}
