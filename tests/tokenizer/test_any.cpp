// tokenizer/any.hpp: the run-time choice of tokenizer family from a GGUF file.
#include <doctest/doctest.h>

#include <string>

#include "fixtures.hpp"
#include "kestrel/tokenizer/any.hpp"
#include "kestrel/tokenizer/detokenizer.hpp"
#include "tokenizer/helpers.hpp"

using namespace kestrel;

namespace {

/// llama.cpp's vectors through any_tokenizer: the family comes from the file.
void check_vectors(const std::string& name) {
  const auto p = test::fixture("llamacpp-vocab/" + name + ".gguf");
  if (!p) return;
  test::check_vocab_vectors(tokenizer_from_gguf(io::gguf_file(*p)), name, name + " through any_tokenizer");
}

}  // namespace

static_assert(Tokenizer<any_tokenizer>);

TEST_CASE("any_tokenizer: SentencePiece and byte-level BPE from GGUF, llama.cpp's vectors 46/46") {
  check_vectors("ggml-vocab-llama-spm");
  check_vectors("ggml-vocab-phi-3");
  check_vectors("ggml-vocab-gpt-2");
  if (const auto p = test::fixture("llamacpp-vocab/ggml-vocab-gpt-2.gguf")) {
    const auto tok = tokenizer_from_gguf(io::gguf_file(*p));
    CHECK(tok.bpe() != nullptr);
    CHECK_FALSE(tok.add_space_prefix());
  }
}

TEST_CASE("any_tokenizer: a vocabulary of an unsupported family is a clear error") {
  if (const auto p = test::fixture("llamacpp-vocab/ggml-vocab-bert-bge.gguf"))
    CHECK_THROWS_WITH_AS(tokenizer_from_gguf(io::gguf_file(*p)), doctest::Contains("'bert' is not supported"), file_error);
  if (const auto p = test::fixture("gguf/llama-2-tiny-random.gguf")) {
    const auto tok = tokenizer_from_gguf(io::gguf_file(*p));
    CHECK(tok.spm() != nullptr);
    CHECK(tok.n_vocab() == 32000);
  }
}

TEST_CASE("user-defined tokens are cut out even without parse_special, as llama.cpp does") {
  // Expected ids from llama.cpp's llama-tokenize (c392e50) with --no-bos
  // --no-parse-special: gpt-neox's whitespace runs are user-defined tokens
  // (50270, 50275, 50276) that its merges alone would never produce.
  if (const auto p = test::fixture("llamacpp-vocab/ggml-vocab-gpt-neox.gguf")) {
    const auto tok = tokenizer_from_gguf(io::gguf_file(*p));
    CHECK(tok.encode("def f():\n        return   1", false) == std::vector<token_id>{1545, 269, 14850, 187, 50270, 2309, 50275, 18});
    CHECK(tok.encode("Hello   world  !", false) == std::vector<token_id>{12092, 50275, 10186, 50276, 2});
  }
  if (const auto p = test::fixture("llamacpp-vocab/ggml-vocab-deepseek-coder.gguf")) {
    const auto tok = tokenizer_from_gguf(io::gguf_file(*p));
    CHECK(tok.encode("def f():\n        return   1", false) == std::vector<token_id>{1551, 267, 10942, 185, 436, 967, 315, 16});
    CHECK(tok.encode("Hello   world  !", false) == std::vector<token_id>{17535, 243, 1835, 207, 2069});
  }
}
