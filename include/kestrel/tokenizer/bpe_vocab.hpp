// kestrel/tokenizer/bpe_vocab.hpp: the data of a byte-level BPE vocabulary
// (GPT-2 family: GPT-2, Llama 3, Qwen 2, DeepSeek, Falcon, StarCoder, ...),
// as read from a GGUF file, an HF tokenizer.json, OpenAI encoder.json +
// vocab.bpe or a tiktoken rank file, before a bpe_tokenizer indexes it.
//
// Tokens are kept as the files store them: in GPT-2's byte alphabet, where
// each of the 256 byte values is one printable character ("Ġ" is the space
// byte 0x20, "Ċ" is '\n'; printable ASCII and most of Latin-1 stand for
// themselves). The tokenizer decodes them to raw bytes once, when it indexes
// the vocabulary. Keeping the mapped form means that GGUF, tokenizer.json and
// encoder.json load without conversion, that piece() shows what the file says,
// and that merges ("Ġ t") refer to tokens by the same spelling. Control and
// user-defined (added) tokens such as "<|endoftext|>" are literal text, not
// mapped. Only tiktoken files store raw bytes; their loader maps them.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "kestrel/core/error.hpp"
#include "kestrel/core/token.hpp"
#include "kestrel/tokenizer/vocab.hpp"  // token_type

namespace kestrel {

struct bpe_vocab {
  std::vector<std::string> tokens;  // (n_vocab) GPT-2 byte alphabet; added/control tokens literal
  std::vector<std::pair<std::string, std::string>> merges;  // (n_merges) by rank: merges[0] is applied first
  std::vector<std::int32_t> types;  // (n_vocab) token_type::*; may be left empty: all normal
  token_id bos = no_token, eos = no_token, eot = no_token, pad = no_token, unk = no_token;
  bool add_bos = false;
  bool add_eos = false;
  /// The pre-tokenizer, by its GGUF tokenizer.ggml.pre name ("gpt-2",
  /// "llama-bpe", "qwen2", "deepseek-llm", ...; "default" and "" mean GPT-2's
  /// regex, as llama.cpp treats a file without the key). bpe_tokenizer
  /// resolves it with pre_tokenizer_from_name() (tokenizer/pretokenize.hpp).
  std::string pre = "gpt-2";
  /// Llama 3's rule (HF "ignore_merges"): a pre-token that is itself a
  /// normal token is emitted as that token without merging.
  bool ignore_merges = false;
  /// tiktoken's rule instead of `merges`: merge the adjacent pair whose
  /// concatenation is the token of lowest id (rank = id). bpe_tokenizer
  /// turns it into an explicit merge table (every split of every token).
  bool merges_from_ranks = false;
};

// ---- GPT-2's byte <-> unicode mapping ----
//
// GPT-2 (openai/gpt-2 encoder.py bytes_to_unicode) gives every byte a
// printable character so that BPE runs on strings without spaces or control
// characters: bytes '!'..'~', 0xA1..0xAC and 0xAE..0xFF are the code points
// of the same value; the other 68 bytes (0x00..0x20, 0x7F..0xA0, 0xAD) are
// U+0100 + n in byte order, n = 0..67 (so ' ' -> U+0120 'Ġ', '\n' -> U+010A 'Ċ').

namespace detail {
constexpr bool gpt2_byte_is_itself(unsigned b) noexcept {
  return (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE);
}
/// Code point of byte b in GPT-2's alphabet.
constexpr std::array<std::uint16_t, 256> gpt2_byte_to_cp = [] {
  std::array<std::uint16_t, 256> t{};
  unsigned n = 0;
  for (unsigned b = 0; b < 256; ++b) t[b] = static_cast<std::uint16_t>(gpt2_byte_is_itself(b) ? b : 256 + n++);
  return t;
}();
/// Byte of code point cp (< 324) in GPT-2's alphabet, or -1.
constexpr std::array<std::int16_t, 324> gpt2_cp_to_byte = [] {
  std::array<std::int16_t, 324> t{};
  for (auto& x : t) x = -1;
  for (unsigned b = 0; b < 256; ++b) t[gpt2_byte_to_cp[b]] = static_cast<std::int16_t>(b);
  return t;
}();
}  // namespace detail

/// Appends byte `b` in GPT-2's alphabet (1 or 2 UTF-8 bytes).
inline void append_gpt2_byte(std::string& out, std::uint8_t b) {
  const unsigned cp = detail::gpt2_byte_to_cp[b];
  if (cp < 0x80) {
    out += static_cast<char>(cp);
  } else {
    out += static_cast<char>(0xC0 | (cp >> 6));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  }
}

/// `bytes` spelled in GPT-2's alphabet.
inline std::string gpt2_encode_bytes(std::string_view bytes) {
  std::string out;
  out.reserve(bytes.size() * 2);
  for (char c : bytes) append_gpt2_byte(out, static_cast<std::uint8_t>(c));
  return out;
}

/// The bytes a GPT-2-alphabet string stands for; nullopt if it contains a
/// character outside the alphabet (then it is not a byte-level token).
inline std::optional<std::string> gpt2_decode_bytes(std::string_view mapped) {
  std::string out;
  out.reserve(mapped.size());
  for (std::size_t i = 0; i < mapped.size();) {
    const auto b0 = static_cast<unsigned char>(mapped[i]);
    unsigned cp;
    if (b0 < 0x80) {
      cp = b0;
      i += 1;
    } else if ((b0 & 0xE0) == 0xC0 && i + 1 < mapped.size() && (static_cast<unsigned char>(mapped[i + 1]) & 0xC0) == 0x80) {
      cp = ((b0 & 0x1Fu) << 6) | (static_cast<unsigned char>(mapped[i + 1]) & 0x3Fu);
      i += 2;
    } else {
      return std::nullopt;
    }
    if (cp >= detail::gpt2_cp_to_byte.size() || detail::gpt2_cp_to_byte[cp] < 0) return std::nullopt;
    out += static_cast<char>(detail::gpt2_cp_to_byte[cp]);
  }
  return out;
}

/// Throws invalid_argument naming the first inconsistency: an empty
/// vocabulary, sizes that disagree, special ids out of range, unknown token
/// types, empty merge halves, merges given together with merges_from_ranks.
/// (Merges that name tokens absent from the vocabulary are not errors: they
/// can never fire, and real files contain a few; bpe_tokenizer skips them.)
inline void validate(const bpe_vocab& v) {
  const std::size_t n = v.tokens.size();
  if (n == 0) throw invalid_argument("bpe_vocab: empty vocabulary");
  if (n > static_cast<std::size_t>(std::numeric_limits<token_id>::max()))
    throw invalid_argument("bpe_vocab: more tokens than token_id can index");
  if (!v.types.empty() && v.types.size() != n)
    throw invalid_argument("bpe_vocab: " + std::to_string(v.types.size()) + " token types for " + std::to_string(n) +
                           " tokens");
  auto check_id = [&](token_id id, const char* what) {
    if (id == no_token) return;
    if (id < 0 || static_cast<std::size_t>(id) >= n)
      throw invalid_argument(std::string("bpe_vocab: ") + what + " id " + std::to_string(id) +
                             " outside the vocabulary of " + std::to_string(n));
  };
  check_id(v.bos, "bos");
  check_id(v.eos, "eos");
  check_id(v.eot, "eot");
  check_id(v.pad, "pad");
  check_id(v.unk, "unk");
  if (v.add_bos && v.bos == no_token) throw invalid_argument("bpe_vocab: add_bos is set but there is no bos token");
  if (v.add_eos && v.eos == no_token) throw invalid_argument("bpe_vocab: add_eos is set but there is no eos token");
  for (std::size_t i = 0; i < v.types.size(); ++i)
    if (v.types[i] < token_type::undefined || v.types[i] > token_type::byte)
      throw invalid_argument("bpe_vocab: token " + std::to_string(i) + " has unknown type " + std::to_string(v.types[i]));
  if (v.merges_from_ranks && !v.merges.empty())
    throw invalid_argument("bpe_vocab: merges_from_ranks is set but " + std::to_string(v.merges.size()) +
                           " explicit merges are given");
  for (std::size_t r = 0; r < v.merges.size(); ++r)
    if (v.merges[r].first.empty() || v.merges[r].second.empty())
      throw invalid_argument("bpe_vocab: merge " + std::to_string(r) + " has an empty half");
}

/// validate() for a vocabulary read from a file: the file's fault, so a
/// file_error naming `path`.
inline void validate_from_file(const bpe_vocab& v, const std::string& path) {
  try {
    validate(v);
  } catch (const invalid_argument& e) {
    throw file_error(path, e.what());
  }
}

}  // namespace kestrel
