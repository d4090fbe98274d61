// kestrel/tokenizer/spm.hpp: SentencePiece-style BPE over a scored
// vocabulary (Llama 1/2, Mistral, Phi-3, TinyLlama, llama2.c models).
//
// Encoding, as SentencePiece's BPE model does it:
//   1. normalise: a dummy-prefix space before non-empty text (add_space_prefix),
//      then every ' ' becomes "▁";
//   2. split into UTF-8 characters, one symbol each;
//   3. repeatedly merge the adjacent pair whose concatenation is a vocabulary
//      piece with the highest score, the leftmost pair on ties;
//   4. a symbol that is no piece (a character unseen in training) falls back
//      to one "<0xXX>" byte token per UTF-8 byte, or to unk when the
//      vocabulary has no byte tokens.
// Step 3 keeps the candidate pairs in a priority queue over a doubly linked
// list of symbols and drops stale entries lazily, so a text of n characters
// costs O(n log n) instead of the O(n^2) of rescanning for the best pair
// after every merge (llama2.c's loop): 1 MB of text stays well under a second.
//
// Invalid UTF-8 in the input is not an error: each byte that does not belong
// to a valid character is a symbol of its own, never merged, and falls back
// to its byte token. Decoding then yields U+FFFD for it (the detokenizer's
// output is always valid UTF-8), while append_bytes() gives the byte back.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <queue>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "kestrel/core/error.hpp"
#include "kestrel/core/token.hpp"
#include "kestrel/tokenizer/concepts.hpp"
#include "kestrel/tokenizer/detail/utf8.hpp"
#include "kestrel/tokenizer/special.hpp"
#include "kestrel/tokenizer/vocab.hpp"

namespace kestrel {

class spm_tokenizer {
 public:
  /// Validates `v` (see validate() in vocab.hpp), derives token types when
  /// absent, and indexes the pieces. Throws invalid_argument on a bad vocab,
  /// or when some byte could be encoded neither as a byte token nor as unk.
  explicit spm_tokenizer(spm_vocab v) : vocab_(std::move(v)) {
    validate(vocab_);
    if (vocab_.types.empty()) derive_types(vocab_);
    byte_id_.fill(no_token);
    piece_id_.reserve(vocab_.pieces.size());
    for (std::size_t i = 0; i < vocab_.pieces.size(); ++i) {
      const auto id = static_cast<token_id>(i);
      const std::int32_t t = vocab_.types[i];
      if (t == token_type::byte) {
        const std::uint8_t b = *parse_byte_piece(vocab_.pieces[i]);
        if (byte_id_[b] == no_token) byte_id_[b] = id;
        ++n_byte_tokens_;
      } else if (t == token_type::normal || t == token_type::undefined || t == token_type::user_defined) {
        // Only text-bearing pieces take part in merges, as in SentencePiece:
        // text "<s>" must not become the control token <s>, nor text "<0x41>"
        // a byte token. The first of duplicate pieces wins.
        if (!vocab_.pieces[i].empty()) piece_id_.try_emplace(vocab_.pieces[i], id);
      }
    }
    {
      const auto specials = special_tokens_of(vocab_.pieces, vocab_.types);
      specials_ = special_splitter(specials);
      user_defined_ = special_splitter(user_defined_tokens_of(vocab_.pieces, vocab_.types));
    }
    // Words can be merged one at a time when no mergeable piece has a "▁"
    // right after something other than "▁": then no merge can join a
    // character to the space run that begins the next word, so splitting the
    // text before each such run changes nothing but the cost (true for
    // Llama 2, Phi-3, baichuan and tok512; checked, not assumed).
    word_split_exact_ = true;
    for (const auto& [piece, id] : piece_id_)
      for (std::size_t at = piece.find(spm_space, 1); at != std::string::npos; at = piece.find(spm_space, at + 1))
        if (at < spm_space.size() || piece.compare(at - spm_space.size(), spm_space.size(), spm_space) != 0) {
          word_split_exact_ = false;
          break;
        }
    if (vocab_.unk == no_token)
      for (std::size_t b = 0; b < 256; ++b)
        if (byte_id_[b] == no_token)
          throw invalid_argument("spm_tokenizer: the vocabulary has neither an unk token nor a byte token for <0x" +
                                 hex_byte(static_cast<std::uint8_t>(b)) + ">, so some text cannot be encoded");
  }

  // ---- the Tokenizer concept ----

  /// The ids of `text` (see the file comment), with bos() first when `add_bos`.
  std::vector<token_id> encode(std::string_view text, bool add_bos) const { return encode(text, add_bos, false); }

  /// encode() with llama.cpp's parse_special: when on, the spellings of
  /// control, user-defined and unknown tokens in `text` (special_splitter,
  /// leftmost-longest) become their ids, and each run of text between them is
  /// encoded on its own, with its own dummy-prefix space as llama.cpp's SPM
  /// path does. When off, only user-defined spellings are cut out (as
  /// llama.cpp does; control tokens such as "<s>" stay text).
  std::vector<token_id> encode(std::string_view text, bool add_bos, bool parse_special) const {
    std::vector<token_id> out;
    if (add_bos && vocab_.bos != no_token) out.push_back(vocab_.bos);
    const special_splitter& cut = parse_special ? specials_ : user_defined_;
    if (cut.size() == 0) {
      encode_append(text, out);
      return out;
    }
    cut.split(text, [&](special_segment s) {
      if (s.is_special())
        out.push_back(s.id);
      else
        encode_append(s.text, out);
    });
    return out;
  }

  std::string_view piece(token_id id) const { return vocab_.pieces[checked(id)]; }
  std::size_t n_vocab() const noexcept { return vocab_.pieces.size(); }
  token_id bos() const noexcept { return vocab_.bos; }
  token_id eos() const noexcept { return vocab_.eos; }

  /// Control and unused tokens, and the bos/eos ids whatever their type
  /// (Phi-3's EOS <|endoftext|> is typed user-defined), stand for no text.
  bool is_control(token_id id) const {
    const std::int32_t t = vocab_.types[checked(id)];
    return t == token_type::control || t == token_type::unused || id == vocab_.bos || id == vocab_.eos;
  }

  /// "▁" -> ' ', "<0xXX>" -> that byte, unk -> " ⁇ " (SentencePiece's
  /// default unk surface), control -> nothing.
  void append_bytes(token_id id, std::string& out) const {
    if (is_control(id)) return;
    const std::int32_t t = vocab_.types[static_cast<std::size_t>(id)];
    const std::string& p = vocab_.pieces[static_cast<std::size_t>(id)];
    if (t == token_type::byte) {
      out += static_cast<char>(*parse_byte_piece(p));
      return;
    }
    if (t == token_type::unknown) {
      out += " \xE2\x81\x87 ";
      return;
    }
    for (std::size_t i = 0; i < p.size();) {
      if (p.compare(i, spm_space.size(), spm_space) == 0) {
        out += ' ';
        i += spm_space.size();
      } else {
        out += p[i++];
      }
    }
  }

  // ---- optional Tokenizer expressions ----

  bool add_space_prefix() const noexcept { return vocab_.add_space_prefix; }
  bool is_byte(token_id id) const { return vocab_.types[checked(id)] == token_type::byte; }

  // ---- SentencePiece specifics ----

  /// The byte a byte token stands for. Precondition: is_byte(id).
  std::uint8_t byte_value(token_id id) const {
    if (!is_byte(id)) throw invalid_argument("spm_tokenizer: token " + std::to_string(id) + " is not a byte token");
    return *parse_byte_piece(vocab_.pieces[static_cast<std::size_t>(id)]);
  }
  /// The byte token of `b`, or no_token.
  token_id byte_token(std::uint8_t b) const noexcept { return byte_id_[b]; }
  /// The id of a mergeable (normal or user-defined) piece, or no_token.
  token_id find(std::string_view piece) const {
    const auto it = piece_id_.find(piece);
    return it == piece_id_.end() ? no_token : it->second;
  }
  token_id unk() const noexcept { return vocab_.unk; }
  bool add_bos() const noexcept { return vocab_.add_bos; }
  float score(token_id id) const { return vocab_.scores[checked(id)]; }
  std::int32_t type(token_id id) const { return vocab_.types[checked(id)]; }
  const spm_vocab& vocab() const noexcept { return vocab_; }
  /// The special tokens that encode(..., parse_special = true) cuts out.
  const special_splitter& specials() const noexcept { return specials_; }

  /// encode() without BOS, appending to `out` (lets callers reuse a buffer).
  void encode_append(std::string_view text, std::vector<token_id>& out) const {
    if (text.empty()) return;  // no dummy prefix for empty text: "" -> []
    const std::string norm = normalize(text);
    if (!word_split_exact_) return encode_segment(norm, out);
    // One word at a time (see word_split_exact_): a word starts where a run
    // of "▁" follows anything else. Keeps the queue small and the text in
    // cache: 1 MB encodes ~6x faster than as one sequence (bench/tokenizer.cpp).
    const std::string_view all(norm);
    std::size_t begin = 0;
    for (std::size_t at = all.find(spm_space, 1); at != std::string_view::npos; at = all.find(spm_space, at + 1)) {
      if (at >= spm_space.size() && all.compare(at - spm_space.size(), spm_space.size(), spm_space) == 0) continue;
      encode_segment(all.substr(begin, at - begin), out);
      begin = at;
    }
    encode_segment(all.substr(begin), out);
  }

 private:
  /// Steps 2-4 on one normalised segment.
  void encode_segment(std::string_view norm, std::vector<token_id>& out) const {
    if (norm.empty()) return;
    // Step 2: one symbol per UTF-8 character, or per invalid byte.
    std::vector<symbol> sym;
    sym.reserve(norm.size());
    for (std::size_t off = 0; off < norm.size();) {
      const auto r = detail::utf8_classify(std::string_view(norm).substr(off));
      const bool ok = r.kind == detail::utf8_scan::complete;
      const std::size_t len = ok ? r.length : 1;
      const auto i = static_cast<std::ptrdiff_t>(sym.size());
      sym.push_back({i - 1, i + 1, off, len, ok ? find(std::string_view(norm).substr(off, len)) : no_token, !ok});
      off += len;
    }
    sym.back().next = -1;

    // Step 3: merges, best score first, leftmost on ties.
    std::priority_queue<candidate, std::vector<candidate>, candidate_order> queue;
    auto consider = [&](std::ptrdiff_t l, std::ptrdiff_t r) {
      if (l < 0 || r < 0 || sym[l].invalid || sym[r].invalid) return;
      const std::size_t len = sym[l].len + sym[r].len;
      const token_id id = find(std::string_view(norm).substr(sym[l].off, len));
      if (id != no_token) queue.push({vocab_.scores[static_cast<std::size_t>(id)], l, r, len, id});
    };
    for (std::size_t i = 1; i < sym.size(); ++i) consider(static_cast<std::ptrdiff_t>(i - 1), static_cast<std::ptrdiff_t>(i));
    while (!queue.empty()) {
      const candidate c = queue.top();
      queue.pop();
      symbol& l = sym[c.left];
      symbol& r = sym[c.right];
      // Stale: one side was merged away or grew since this pair was queued.
      if (l.len == 0 || r.len == 0 || l.next != c.right || l.len + r.len != c.len) continue;
      l.len = c.len;
      l.id = c.id;
      l.next = r.next;
      if (r.next >= 0) sym[r.next].prev = c.left;
      r.len = 0;
      consider(l.prev, c.left);
      consider(c.left, l.next);
    }

    // Step 4: emit, with byte fallback for symbols that are no piece.
    for (std::ptrdiff_t i = 0; i >= 0; i = sym[i].next) {
      const symbol& s = sym[i];
      if (s.id != no_token) {
        out.push_back(s.id);
        continue;
      }
      for (std::size_t k = 0; k < s.len; ++k) {
        const token_id b = byte_id_[static_cast<unsigned char>(norm[s.off + k])];
        if (b != no_token) {
          out.push_back(b);
        } else if (n_byte_tokens_ == 0) {
          out.push_back(vocab_.unk);  // no byte tokens at all: one unk per character
          break;
        } else {
          out.push_back(vocab_.unk);  // a byte token missing from a partial set: unk for that byte
        }
      }
    }
  }

  struct symbol {
    std::ptrdiff_t prev, next;  // neighbours in the linked list, -1 at the ends
    std::size_t off, len;       // bytes of the normalised text; len 0 once merged away
    token_id id;                // the piece these bytes form, or no_token
    bool invalid;               // an invalid UTF-8 byte: never merged
  };
  struct candidate {
    float score;
    std::ptrdiff_t left, right;
    std::size_t len;  // bytes of left + right when queued, to detect staleness
    token_id id;
  };
  struct candidate_order {  // std::priority_queue pops the "largest"
    bool operator()(const candidate& a, const candidate& b) const noexcept {
      if (a.score != b.score) return a.score < b.score;
      return a.left > b.left;  // equal scores: the leftmost pair is the largest
    }
  };
  struct string_hash {
    using is_transparent = void;
    std::size_t operator()(std::string_view s) const noexcept { return std::hash<std::string_view>{}(s); }
  };

  std::string normalize(std::string_view text) const {
    std::string norm;
    norm.reserve(text.size() + text.size() / 4 + spm_space.size());
    if (vocab_.add_space_prefix) norm += spm_space;
    append_spm_escaped(norm, text);
    return norm;
  }

  std::size_t checked(token_id id) const {
    if (id < 0 || static_cast<std::size_t>(id) >= vocab_.pieces.size())
      throw invalid_argument("spm_tokenizer: token id " + std::to_string(id) + " outside the vocabulary of " +
                             std::to_string(vocab_.pieces.size()));
    return static_cast<std::size_t>(id);
  }

  static std::string hex_byte(std::uint8_t b) {
    constexpr char digits[] = "0123456789ABCDEF";
    return {digits[b >> 4], digits[b & 15]};
  }

  spm_vocab vocab_;
  std::unordered_map<std::string, token_id, string_hash, std::equal_to<>> piece_id_;  // mergeable pieces
  std::array<token_id, 256> byte_id_{};  // byte -> its "<0xXX>" token, or no_token
  std::size_t n_byte_tokens_ = 0;
  special_splitter specials_;  // control, user-defined and unknown spellings
  special_splitter user_defined_;  // user-defined spellings only: cut out even without parse_special
  bool word_split_exact_ = false;  // merges never cross the start of a "▁" run (see the constructor)
};

static_assert(Tokenizer<spm_tokenizer>);

}  // namespace kestrel
