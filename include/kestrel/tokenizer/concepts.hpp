// kestrel/tokenizer/concepts.hpp: the Tokenizer concept.
#pragma once

#include <concepts>
#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

#include "kestrel/core/token.hpp"

namespace kestrel {

/// @brief A policy that turns text into token ids and token ids back into
/// bytes of text.
///
/// Models: a vocabulary of `n_vocab()` tokens with fixed ids, an encoder, and
/// enough per-token facts for a generic, streaming detokenizer
/// (tokenizer/detokenizer.hpp) to rebuild text without knowing the scheme.
///
/// Required expressions, for `const T& t`, `std::string_view text`,
/// `bool add_bos`, `token_id id` with `0 <= id < t.n_vocab()`,
/// `std::string& out`:
/// - `t.encode(text, add_bos)` -> `std::vector<token_id>`: the ids of `text`,
///   preceded by `t.bos()` when `add_bos`. Text is plain text: special-token
///   spellings such as "<s>" are encoded as ordinary characters. Any byte
///   string is accepted (invalid UTF-8 included) and never throws for its
///   content; `encode("", false)` is empty.
/// - `t.piece(id)` -> convertible to `std::string_view`: the raw vocabulary
///   entry (e.g. "▁Hello", "<0x0A>", "<s>"); for display and debugging, not
///   for decoding.
/// - `t.n_vocab()` -> `std::size_t`.
/// - `t.bos()`, `t.eos()` -> `token_id` (`no_token` when the vocabulary has none).
/// - `t.is_control(id)` -> `bool`: the token stands for no text (BOS, EOS,
///   other control tokens); decoders print nothing for it.
/// - `t.append_bytes(id, out)`: appends the bytes `id` stands for in decoded
///   text: the piece with its scheme's escapes undone (SentencePiece's "▁" ->
///   " ", "<0xXX>" -> that one byte; byte-level BPE's byte alphabet -> bytes).
///   Nothing for control tokens. The bytes of one token need not be valid
///   UTF-8 on their own; a multi-byte character may span tokens.
///
/// Optional expressions (detected with `requires`, default in brackets):
/// - `t.add_space_prefix()` -> `bool` [false]: the encoder put a dummy space
///   before the text (SentencePiece's add_dummy_prefix), so a decoder strips
///   one leading space from the first text token of a sequence, i.e. from the
///   token right after BOS (llama2.c's decode rule) or at the start of a stream.
/// - `t.is_byte(id)` -> `bool` [false]: the token is a raw byte token; such a
///   token is never stripped by the rule above (llama2.c strips only a space
///   that begins a piece, and a byte piece begins with '<').
///
/// Semantics: for every valid UTF-8 `s` that contains no text the scheme
/// normalises away, decoding `t.encode(s, b)` gives back `s` (the round trip;
/// SentencePiece-style tokenizers need the dummy-prefix rule for it).
/// Encoding is O(n log n) or better in the length of the text.
///
/// Modelled by: `spm_tokenizer` (tokenizer/spm.hpp).
template <class T>
concept Tokenizer = requires(const T& t, std::string_view text, bool add_bos, token_id id, std::string& out) {
  { t.encode(text, add_bos) } -> std::same_as<std::vector<token_id>>;
  { t.piece(id) } -> std::convertible_to<std::string_view>;
  { t.n_vocab() } -> std::same_as<std::size_t>;
  { t.bos() } -> std::same_as<token_id>;
  { t.eos() } -> std::same_as<token_id>;
  { t.is_control(id) } -> std::convertible_to<bool>;
  t.append_bytes(id, out);
};

namespace detail {
/// `t.add_space_prefix()` when T provides it, else false.
template <Tokenizer T>
constexpr bool strips_dummy_prefix(const T& t) {
  if constexpr (requires { { t.add_space_prefix() } -> std::convertible_to<bool>; })
    return t.add_space_prefix();
  else
    return false;
}
/// `t.is_byte(id)` when T provides it, else false.
template <Tokenizer T>
constexpr bool is_byte_token(const T& t, token_id id) {
  if constexpr (requires { { t.is_byte(id) } -> std::convertible_to<bool>; })
    return t.is_byte(id);
  else
    return false;
}
}  // namespace detail

}  // namespace kestrel
