// kestrel/tokenizer/gguf_vocab.hpp: the SentencePiece vocabulary embedded in
// a GGUF file (tokenizer.ggml.* keys, as llama.cpp's converters write them).
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "kestrel/core/error.hpp"
#include "kestrel/core/token.hpp"
#include "kestrel/io/gguf.hpp"
#include "kestrel/tokenizer/vocab.hpp"

namespace kestrel {

/// Reads tokenizer.ggml.{model, tokens, scores, token_type, bos_token_id,
/// eos_token_id, unknown_token_id, add_bos_token, add_space_prefix}.
/// The model must be "llama" (SentencePiece); any other ("gpt2", "bert", ...)
/// is a file_error naming it, as are missing tokens or scores (without
/// scores the merge order would be silently wrong) and an inconsistent
/// vocabulary. Missing token types are derived (vocab.hpp derive_types()),
/// missing ids and flags take the Llama defaults (bos 1, eos 2, unk 0, add
/// BOS, add the dummy-prefix space).
inline spm_vocab vocab_from_gguf(const io::gguf_file& f) {
  const std::string path = f.path();
  const auto model = f.get_optional<std::string>("tokenizer.ggml.model");
  if (!model) throw file_error(path, "no tokenizer.ggml.model: the file carries no vocabulary");
  if (*model != "llama")
    throw file_error(path, "tokenizer.ggml.model is '" + *model +
                               "'; spm_tokenizer reads only SentencePiece vocabularies ('llama')");
  if (!f.has("tokenizer.ggml.tokens")) throw file_error(path, "tokenizer.ggml.tokens is missing");
  if (!f.has("tokenizer.ggml.scores"))
    throw file_error(path, "tokenizer.ggml.scores is missing: a SentencePiece BPE vocabulary needs its merge scores");

  spm_vocab v;
  v.pieces = f.get_array<std::string>("tokenizer.ggml.tokens");
  v.scores = f.get_array<float>("tokenizer.ggml.scores");
  if (f.has("tokenizer.ggml.token_type")) v.types = f.get_array<std::int32_t>("tokenizer.ggml.token_type");

  // Ids are u32 in llama.cpp's files, with 0xFFFFFFFF for "none"
  // (stories260K.gguf's separator and padding ids).
  auto id = [&](const char* key, token_id fallback) -> token_id {
    const auto x = f.get_optional<std::int64_t>(key);
    if (!x) return fallback;
    if (*x == -1 || *x == 0xFFFFFFFFll) return no_token;
    if (*x < 0 || *x >= static_cast<std::int64_t>(v.pieces.size()))
      throw file_error(path, std::string(key) + " = " + std::to_string(*x) + " is outside the vocabulary of " +
                                 std::to_string(v.pieces.size()));
    return static_cast<token_id>(*x);
  };
  v.bos = id("tokenizer.ggml.bos_token_id", 1);
  v.eos = id("tokenizer.ggml.eos_token_id", 2);
  v.unk = id("tokenizer.ggml.unknown_token_id", 0);
  v.add_bos = f.get_optional<bool>("tokenizer.ggml.add_bos_token").value_or(true);
  v.add_space_prefix = f.get_optional<bool>("tokenizer.ggml.add_space_prefix").value_or(true);

  validate_from_file(v, path);
  if (v.types.empty()) derive_types(v);
  return v;
}

}  // namespace kestrel
