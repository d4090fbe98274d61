// kestrel/tokenizer/detokenizer.hpp: token ids back to text, streaming.
//
// A generated token may end in the middle of a UTF-8 character (byte-fallback
// tokens carry one byte each: "é" is <0xC3> <0xA9>). A callback that receives
// text per token must never see half a character, so push() returns only
// complete characters and holds the tail back until the next token completes
// it. Output is always valid UTF-8: bytes that can never form a character are
// replaced by U+FFFD at once, one per maximal invalid subpart (Unicode's
// recommended practice), and flush() does the same for an incomplete tail.
//
// SentencePiece vocabularies add a dummy space before the text, so the first
// text piece of a sequence starts with a space the user never typed. As in
// llama2.c's decode ("a piece that follows BOS has its leading space
// stripped") and SentencePiece's own decoder, that one space is removed from
// the token right after BOS, and from the first token of a stream that starts
// right after BOS (the usual case: generation after a prompt that began with
// BOS is decoded with at_sequence_start = false, a fresh sequence with true).
#pragma once

#include <span>
#include <string>

#include "kestrel/core/token.hpp"
#include "kestrel/tokenizer/concepts.hpp"
#include "kestrel/tokenizer/detail/utf8.hpp"

namespace kestrel {

template <Tokenizer T>
class detokenizer {
 public:
  /// `tok` must outlive the detokenizer. `at_sequence_start`: the first
  /// token pushed follows BOS (or begins the text), so it loses the dummy
  /// prefix space when the tokenizer adds one.
  explicit detokenizer(const T& tok, bool at_sequence_start = true)
      : tok_(&tok), strip_next_(at_sequence_start) {}

  /// The text that `id` completes: whole UTF-8 characters only, possibly
  /// empty (a control token, or a byte that starts a multi-byte character).
  std::string push(token_id id) {
    if (tok_->is_control(id)) {
      strip_next_ = id == tok_->bos();
      return {};
    }
    const std::size_t start = pending_.size();
    tok_->append_bytes(id, pending_);
    if (strip_next_ && detail::strips_dummy_prefix(*tok_) && !detail::is_byte_token(*tok_, id) &&
        pending_.size() > start && pending_[start] == ' ')
      pending_.erase(start, 1);
    strip_next_ = false;
    return drain(false);
  }

  /// Ends the stream: whatever incomplete character is held back comes out as
  /// U+FFFD. Later pushes continue the same sequence; reset() begins a new one.
  std::string flush() { return drain(true); }

  /// Drops held-back bytes and starts a new sequence.
  void reset(bool at_sequence_start = true) {
    pending_.clear();
    strip_next_ = at_sequence_start;
  }

  /// Bytes held back, waiting for the rest of a character (0 to 3).
  std::size_t pending() const noexcept { return pending_.size(); }

 private:
  std::string drain(bool final) {
    std::string out;
    // Unless final, an incomplete character stays pending for the next token.
    pending_.erase(0, detail::utf8_append_sanitized(out, pending_, !final));
    return out;
  }

  const T* tok_;
  std::string pending_;  // bytes of at most one incomplete character between pushes
  bool strip_next_;
};

/// Decodes a whole sequence (one that starts at its beginning, after any BOS)
/// to valid UTF-8, with the same rules as the streaming detokenizer.
template <Tokenizer T>
std::string decode(const T& tok, std::span<const token_id> ids) {
  detokenizer<T> d(tok, true);
  std::string out;
  for (token_id id : ids) out += d.push(id);
  out += d.flush();
  return out;
}

/// The raw bytes of a sequence, without UTF-8 repair or dummy-prefix
/// stripping: exactly the bytes the tokens stand for (control tokens give
/// none). Use it to check that byte fallback preserves arbitrary bytes.
template <Tokenizer T>
std::string decode_bytes(const T& tok, std::span<const token_id> ids) {
  std::string out;
  for (token_id id : ids) tok.append_bytes(id, out);
  return out;
}

}  // namespace kestrel
