// kestrel/tokenizer/llama2c_vocab.hpp: reading llama2.c's tokenizer.bin.
//
// Layout (little-endian, no magic, no count: the model header's vocab_size
// says how many entries to read):
//   int32 max_token_length
//   n_vocab x { float32 score; int32 len; len bytes of piece }
// Ids 0, 1, 2 are unk, bos, eos (pieces "<unk>", "\n<s>\n", "\n</s>\n");
// ids 3..258 are the byte tokens "<0xXX>". The export replaced SentencePiece's
// "▁" with a plain space; normalize_spaces() puts it back.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <span>
#include <string>

#include "kestrel/core/error.hpp"
#include "kestrel/core/mmap.hpp"
#include "kestrel/tokenizer/vocab.hpp"

namespace kestrel {

/// Parses a tokenizer.bin image already in memory; `path` names it in errors.
/// Throws file_error on truncation, a negative or absurd length (a piece
/// longer than the declared max_token_length), or an inconsistent vocabulary.
inline spm_vocab parse_llama2c_tokenizer(std::span<const std::byte> bytes, const std::string& path,
                                         std::size_t n_vocab) {
  if (n_vocab < 3)
    throw file_error(path, "n_vocab " + std::to_string(n_vocab) + " is too small: ids 0, 1, 2 are unk, bos, eos");
  if (bytes.size() >= 4 && std::memcmp(bytes.data(), "GGUF", 4) == 0)
    throw file_error(path, 0, "a GGUF file, not a llama2.c tokenizer.bin");
  byte_reader in(bytes, path);
  const auto max_len = in.read<std::int32_t>("max_token_length");
  // Real files declare 7 (tok512) to 27 (Llama 2); a length beyond 64 KiB
  // is corruption, not a vocabulary.
  if (max_len <= 0 || max_len > 65536)
    throw file_error(path, 0, "max_token_length " + std::to_string(max_len) + " is not in 1..65536");
  // Every entry needs at least 8 bytes: refuse a vocab size the file cannot
  // hold before reserving memory for it.
  if (n_vocab > in.remaining() / 8)
    throw file_error(path, in.offset(),
                     "truncated, or a smaller vocabulary than the model's: the model's " + std::to_string(n_vocab) +
                         " tokens need at least " + std::to_string(n_vocab * 8) + " bytes, " +
                         std::to_string(in.remaining()) + " left");
  spm_vocab v;
  v.pieces.reserve(n_vocab);
  v.scores.reserve(n_vocab);
  for (std::size_t i = 0; i < n_vocab; ++i) {
    const std::string what = "token " + std::to_string(i);
    const float score = in.read<float>(what + " score");
    const std::size_t len_at = in.offset();
    const auto len = in.read<std::int32_t>(what + " length");
    if (len < 0 || len > max_len)
      throw file_error(path, len_at,
                       what + " has length " + std::to_string(len) + ", outside 0..max_token_length (" +
                           std::to_string(max_len) + ")");
    const auto piece = in.take(static_cast<std::size_t>(len), what + " piece");
    v.pieces.emplace_back(reinterpret_cast<const char*>(piece.data()), piece.size());
    v.scores.push_back(score);
  }
  // The file stores no count: bytes left over mean the model's vocab_size
  // and this tokenizer disagree (e.g. the 32000-token tokenizer.bin given
  // to a 512-token model), which would silently mis-decode.
  if (in.remaining() != 0)
    throw file_error(path, in.offset(),
                     std::to_string(in.remaining()) + " bytes follow the " + std::to_string(n_vocab) +
                         " tokens the model expects: this tokenizer has a larger vocabulary than the model");
  v.unk = 0;
  v.bos = 1;
  v.eos = 2;
  v.add_bos = true;
  v.add_space_prefix = true;
  validate_from_file(v, path);
  derive_types(v);
  normalize_spaces(v);
  return v;
}

/// Reads a llama2.c tokenizer.bin of exactly `n_vocab` entries (the model
/// header's vocab_size: 32000 for tokenizer.bin, 512 for tok512.bin).
inline spm_vocab load_llama2c_tokenizer(const std::filesystem::path& path, std::size_t n_vocab) {
  const mapped_file file(path);
  return parse_llama2c_tokenizer(file.bytes(), file.path(), n_vocab);
}

}  // namespace kestrel
