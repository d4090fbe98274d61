// kestrel/tokenizer/bpe.hpp: byte-level BPE (the GPT-2 family: GPT-2, Llama 3,
// Qwen 2, DeepSeek, Falcon, StarCoder, GPT-NeoX, cl100k via tiktoken).
//
// Encoding, as GPT-2's encoder.py, HF tokenizers and tiktoken do it:
//   1. pre-tokenize: split the text into pre-tokens by the model's regex
//      (tokenizer/pretokenize.hpp); merges never cross a pre-token boundary;
//   2. Llama 3's ignore_merges (and tiktoken's first step): a pre-token that
//      is itself a token is emitted as that token;
//   3. otherwise every byte of the pre-token is one symbol, the token of that
//      byte (a byte-level vocabulary has one for each of the 256 bytes, spelled
//      in GPT-2's byte alphabet, see bpe_vocab.hpp);
//   4. repeatedly merge the adjacent pair of lowest merge rank, the leftmost
//      on ties, until no adjacent pair has a merge.
// Working on bytes and token ids rather than on mapped strings is the same
// computation (every token's bytes are distinct) without building the mapped
// string: a merge (a, b) -> ab is a table entry (id a, id b) -> (rank, id ab).
// Step 4 keeps candidate pairs in a binary heap over a doubly linked list of
// symbols and drops stale entries lazily: O(n log n) for a pre-token of n
// bytes instead of the O(n^2) of rescanning for the best pair after each merge
// (a 1 MB run of one letter is a single pre-token).
//
// Within one encode() call, the ids of each short pre-token are remembered,
// so repeated words cost one hash lookup (the cache is per call: encode() is
// const and safe to call from several threads at once).
//
// Invalid UTF-8 is not an error: the pre-tokenizer passes such bytes through,
// and every byte has a token, so append_bytes() gives the exact bytes back;
// decode() (the detokenizer) then shows U+FFFD for them, its output being
// always valid UTF-8. A vocabulary without the token of some byte (none of
// the known ones) encodes that byte as unk, or drops it when there is no unk;
// missing_bytes() tells.
//
// Decoding: append_bytes() writes a token's bytes (GPT-2 alphabet undone);
// there is no dummy-prefix space, so the streaming detokenizer needs nothing
// else from this family.
#pragma once

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "kestrel/core/error.hpp"
#include "kestrel/core/token.hpp"
#include "kestrel/tokenizer/bpe_vocab.hpp"
#include "kestrel/tokenizer/concepts.hpp"
#include "kestrel/tokenizer/pretokenize.hpp"
#include "kestrel/tokenizer/special.hpp"

namespace kestrel {

/// Splits text into pre-tokens (views into the text), appending to the vector.
using bpe_splitter = std::function<void(std::string_view, std::vector<std::string_view>&)>;

class bpe_tokenizer {
 public:
  /// Validates and indexes `v`; pre-tokenizes by v.pre. Throws
  /// invalid_argument on a bad vocabulary or an unknown pre-tokenizer name.
  explicit bpe_tokenizer(bpe_vocab v) : bpe_tokenizer(std::move(v), bpe_splitter{}) {}

  /// As above, with a caller-supplied pre-tokenizer (e.g. for a regex that
  /// pretokenize.hpp does not know). An empty `split` means v.pre's.
  bpe_tokenizer(bpe_vocab v, bpe_splitter split) : vocab_(std::move(v)), split_(std::move(split)) {
    validate(vocab_);
    if (!split_) {
      // No tokenizer.ggml.pre (gpt-neox) means llama.cpp's "default" rules.
      const pre_tokenizer p = pre_tokenizer_from_name(vocab_.pre.empty() ? std::string_view("default") : std::string_view(vocab_.pre));
      split_ = [p](std::string_view text, std::vector<std::string_view>& out) { pretokenize(p, text, out); };
    }
    if (vocab_.types.empty()) vocab_.types.assign(vocab_.tokens.size(), token_type::normal);
    index();
    specials_ = special_splitter(special_tokens_of(vocab_.tokens, vocab_.types));
    user_defined_ = special_splitter(user_defined_tokens_of(vocab_.tokens, vocab_.types));
  }

  // ---- the Tokenizer concept ----

  /// The ids of `text` (see the file comment), with bos() first when
  /// `add_bos` (and a bos exists). add_eos() is the caller's business.
  std::vector<token_id> encode(std::string_view text, bool add_bos) const { return encode(text, add_bos, false); }

  /// encode() with llama.cpp's parse_special: when on, the spellings of
  /// control, user-defined and unknown tokens in `text` become their ids and
  /// the text between them is encoded on its own. When off, only user-defined
  /// spellings are cut out (llama.cpp's rule: gpt-neox's whitespace-run
  /// tokens, DeepSeek's added pieces), and control spellings stay text.
  std::vector<token_id> encode(std::string_view text, bool add_bos, bool parse_special) const {
    std::vector<token_id> out;
    out.reserve(text.size() / 3 + 2);
    if (add_bos && vocab_.bos != no_token) out.push_back(vocab_.bos);
    const special_splitter& cut = parse_special ? specials_ : user_defined_;
    if (cut.size() == 0) {
      encode_append(text, out);
      return out;
    }
    cut.split(text, [&](special_segment seg) {
      if (seg.is_special())
        out.push_back(seg.id);
      else
        encode_append(seg.text, out);
    });
    return out;
  }

  /// The special tokens that encode(..., parse_special = true) cuts out.
  const special_splitter& specials() const noexcept { return specials_; }

  /// The vocabulary entry as the file spells it ("Ġhello", "<|endoftext|>").
  std::string_view piece(token_id id) const { return vocab_.tokens[checked(id)]; }
  std::size_t n_vocab() const noexcept { return vocab_.tokens.size(); }
  token_id bos() const noexcept { return vocab_.bos; }
  token_id eos() const noexcept { return vocab_.eos; }

  /// Control and unused tokens, and the bos/eos/eot ids whatever their type,
  /// stand for no text.
  bool is_control(token_id id) const {
    const std::int32_t t = vocab_.types[checked(id)];
    return t == token_type::control || t == token_type::unused || id == vocab_.bos || id == vocab_.eos ||
           id == vocab_.eot;
  }

  /// The bytes of the token: GPT-2's alphabet undone for byte-level tokens;
  /// added (user-defined) tokens as their literal text; nothing for control.
  void append_bytes(token_id id, std::string& out) const {
    if (is_control(id)) return;
    out += bytes_[static_cast<std::size_t>(id)];
  }

  // ---- byte-level BPE specifics ----

  token_id eot() const noexcept { return vocab_.eot; }
  token_id pad() const noexcept { return vocab_.pad; }
  token_id unk() const noexcept { return vocab_.unk; }
  bool add_bos() const noexcept { return vocab_.add_bos; }
  bool add_eos() const noexcept { return vocab_.add_eos; }
  bool ignore_merges() const noexcept { return vocab_.ignore_merges; }
  std::int32_t type(token_id id) const { return vocab_.types[checked(id)]; }
  const bpe_vocab& vocab() const noexcept { return vocab_; }
  /// The raw bytes of a token (GPT-2 alphabet undone), control tokens included.
  std::string_view token_bytes(token_id id) const { return bytes_[checked(id)]; }
  /// The token whose bytes are `bytes` (normal and user-defined tokens), or no_token.
  token_id find_bytes(std::string_view bytes) const {
    const auto it = bytes_id_.find(bytes);
    return it == bytes_id_.end() ? no_token : it->second;
  }
  /// The token of one byte, or no_token.
  token_id byte_token(std::uint8_t b) const noexcept { return byte_id_[b]; }
  /// Byte values that have no token of their own.
  std::size_t missing_bytes() const noexcept {
    return static_cast<std::size_t>(std::count(byte_id_.begin(), byte_id_.end(), no_token));
  }
  /// Merges in the table (after dropping those naming unknown tokens).
  std::size_t n_merges() const noexcept { return merges_.size(); }
  /// Merges of the vocabulary that name a token it does not have (never fire).
  std::size_t n_dropped_merges() const noexcept { return dropped_merges_; }
  /// Normal tokens that are not spelled in GPT-2's byte alphabet (decoded as literal text).
  std::size_t n_unmapped_tokens() const noexcept { return unmapped_tokens_; }

  /// Splits `text` into pre-tokens with this vocabulary's pre-tokenizer.
  void pre_tokenize(std::string_view text, std::vector<std::string_view>& out) const { split_(text, out); }

  /// encode() without BOS, appending to `out`.
  void encode_append(std::string_view text, std::vector<token_id>& out) const {
    if (text.empty()) return;
    std::vector<std::string_view> words;
    split_(text, words);
    work w;
    for (std::string_view word : words) {
      if (word.empty()) continue;
      if (word.size() <= max_cached_length) {
        const auto it = w.cache.find(word);
        if (it != w.cache.end()) {
          // Copy from the first occurrence's output (the range may be
          // reallocated by the insert, so index, not iterators).
          const std::size_t from = it->second.first, n = it->second.second;
          for (std::size_t k = 0; k < n; ++k) out.push_back(out[from + k]);
          continue;
        }
        const std::size_t start = out.size();
        encode_word(word, out, w);
        if (w.cache.size() >= max_cache_entries) w.cache.clear();
        w.cache.emplace(word, std::pair<std::size_t, std::size_t>{start, out.size() - start});
      } else {
        encode_word(word, out, w);
      }
    }
  }

 private:
  static constexpr std::size_t max_cached_length = 64;
  static constexpr std::size_t max_cache_entries = 1 << 16;

  struct merge_rule {
    std::int32_t rank;
    token_id result;
  };
  struct symbol {
    std::int32_t prev, next;  // neighbours, -1 at the ends
    token_id id;              // no_token: a byte without a token (never merged); dead: merged away
    std::uint32_t off, len;   // bytes of the pre-token
  };
  struct candidate {
    std::int32_t rank;
    std::int32_t left, right;
    token_id left_id, right_id, result;
  };
  // std::push_heap keeps the "largest" on top: lowest rank, then leftmost.
  struct candidate_order {
    bool operator()(const candidate& a, const candidate& b) const noexcept {
      if (a.rank != b.rank) return a.rank > b.rank;
      return a.left > b.left;
    }
  };
  struct string_hash {
    using is_transparent = void;
    std::size_t operator()(std::string_view s) const noexcept { return std::hash<std::string_view>{}(s); }
  };
  struct work {  // scratch of one encode() call
    std::vector<symbol> sym;
    std::vector<candidate> heap;
    std::unordered_map<std::string_view, std::pair<std::size_t, std::size_t>> cache;  // word -> range of out
  };

  static constexpr token_id dead = -2;

  static std::uint64_t key(token_id l, token_id r) noexcept {
    return (static_cast<std::uint64_t>(static_cast<std::uint32_t>(l)) << 32) | static_cast<std::uint32_t>(r);
  }

  const merge_rule* find_merge(token_id l, token_id r) const {
    const auto it = merges_.find(key(l, r));
    return it == merges_.end() ? nullptr : &it->second;
  }

  void encode_word(std::string_view word, std::vector<token_id>& out, work& w) const {
    if (vocab_.ignore_merges || word.size() == 1) {
      if (const token_id id = find_bytes(word); id != no_token) {
        out.push_back(id);
        return;
      }
    }
    auto& sym = w.sym;
    auto& heap = w.heap;
    sym.clear();
    heap.clear();
    const auto n = static_cast<std::int32_t>(word.size());
    for (std::int32_t i = 0; i < n; ++i)
      sym.push_back({i - 1, i + 1 < n ? i + 1 : -1, byte_id_[static_cast<unsigned char>(word[static_cast<std::size_t>(i)])],
                     static_cast<std::uint32_t>(i), 1});
    auto consider = [&](std::int32_t l, std::int32_t r) {
      if (l < 0 || r < 0) return;
      const token_id a = sym[static_cast<std::size_t>(l)].id, b = sym[static_cast<std::size_t>(r)].id;
      if (a < 0 || b < 0) return;
      if (const merge_rule* m = find_merge(a, b)) {
        heap.push_back({m->rank, l, r, a, b, m->result});
        std::push_heap(heap.begin(), heap.end(), candidate_order{});
      }
    };
    for (std::int32_t i = 0; i + 1 < n; ++i) consider(i, i + 1);
    while (!heap.empty()) {
      std::pop_heap(heap.begin(), heap.end(), candidate_order{});
      const candidate c = heap.back();
      heap.pop_back();
      symbol& l = sym[static_cast<std::size_t>(c.left)];
      symbol& r = sym[static_cast<std::size_t>(c.right)];
      // Stale: a side was merged away or grew since the pair was queued (a
      // symbol's id fixes its length, and its start never moves).
      if (l.next != c.right || l.id != c.left_id || r.id != c.right_id) continue;
      l.id = c.result;
      l.len += r.len;
      l.next = r.next;
      if (r.next >= 0) sym[static_cast<std::size_t>(r.next)].prev = c.left;
      r.id = dead;
      consider(l.prev, c.left);
      consider(c.left, l.next);
    }
    for (std::int32_t i = 0; i >= 0; i = sym[static_cast<std::size_t>(i)].next) {
      const token_id id = sym[static_cast<std::size_t>(i)].id;
      if (id >= 0)
        out.push_back(id);
      else if (vocab_.unk != no_token)
        out.push_back(vocab_.unk);  // a byte the vocabulary has no token for
    }
  }

  void index() {
    const std::size_t n = vocab_.tokens.size();
    bytes_.resize(n);
    byte_id_.fill(no_token);
    bytes_id_.reserve(n);
    // The file's spelling -> id, to resolve merges; first of duplicates wins.
    std::unordered_map<std::string_view, token_id> mapped_id;
    mapped_id.reserve(n);
    for (std::size_t i = 0; i < n; ++i) {
      const auto id = static_cast<token_id>(i);
      const std::int32_t t = vocab_.types[i];
      const std::string& tok = vocab_.tokens[i];
      const bool text_token = t == token_type::normal || t == token_type::undefined || t == token_type::byte;
      if (text_token) {
        if (auto b = gpt2_decode_bytes(tok)) {
          bytes_[i] = std::move(*b);
        } else {
          bytes_[i] = tok;  // not in the byte alphabet: literal text
          ++unmapped_tokens_;
        }
      } else {
        bytes_[i] = tok;  // control, user-defined, unknown, unused: literal
      }
      if (text_token || t == token_type::user_defined) {
        if (!bytes_[i].empty()) bytes_id_.try_emplace(bytes_[i], id);
        mapped_id.try_emplace(tok, id);
      }
    }
    for (std::size_t b = 0; b < 256; ++b) {
      const auto it = bytes_id_.find(std::string_view(std::string(1, static_cast<char>(b))));
      if (it != bytes_id_.end()) byte_id_[b] = it->second;
    }
    if (vocab_.merges_from_ranks) {
      // tiktoken: the pair whose concatenation has the lowest rank merges
      // first. Every split (a, b) of every token t, both halves tokens, is a
      // merge a b -> t of rank t; symbols' bytes identify their tokens, so
      // the lowest-rank pair of the table is the lowest-rank concatenation.
      merges_.reserve(n * 2);
      for (std::size_t i = 0; i < n; ++i) {
        const std::string& b = bytes_[i];
        if (b.size() < 2 || bytes_id_.find(b)->second != static_cast<token_id>(i)) continue;
        for (std::size_t k = 1; k < b.size(); ++k) {
          const token_id l = find_bytes(std::string_view(b).substr(0, k));
          const token_id r = find_bytes(std::string_view(b).substr(k));
          if (l == no_token || r == no_token) continue;
          merges_.try_emplace(key(l, r), merge_rule{static_cast<std::int32_t>(i), static_cast<token_id>(i)});
        }
      }
    } else {
      merges_.reserve(vocab_.merges.size());
      std::string joined;
      for (std::size_t rank = 0; rank < vocab_.merges.size(); ++rank) {
        const auto& [a, b] = vocab_.merges[rank];
        joined.assign(a);
        joined += b;
        const auto ia = mapped_id.find(a), ib = mapped_id.find(b), ir = mapped_id.find(joined);
        if (ia == mapped_id.end() || ib == mapped_id.end() || ir == mapped_id.end()) {
          ++dropped_merges_;
          continue;
        }
        merges_.try_emplace(key(ia->second, ib->second), merge_rule{static_cast<std::int32_t>(rank), ir->second});
      }
    }
  }

  std::size_t checked(token_id id) const {
    if (id < 0 || static_cast<std::size_t>(id) >= vocab_.tokens.size())
      throw invalid_argument("bpe_tokenizer: token id " + std::to_string(id) + " outside the vocabulary of " +
                             std::to_string(vocab_.tokens.size()));
    return static_cast<std::size_t>(id);
  }

  bpe_vocab vocab_;
  bpe_splitter split_;
  special_splitter specials_;  // control, user-defined and unknown spellings
  special_splitter user_defined_;  // user-defined spellings only: cut out even without parse_special
  std::vector<std::string> bytes_;  // (n_vocab) the bytes each token stands for
  std::unordered_map<std::string, token_id, string_hash, std::equal_to<>> bytes_id_;  // text tokens by bytes
  std::array<token_id, 256> byte_id_{};                     // byte -> its token, or no_token
  std::unordered_map<std::uint64_t, merge_rule> merges_;    // (left id, right id) -> rank, result
  std::size_t dropped_merges_ = 0;
  std::size_t unmapped_tokens_ = 0;
};

static_assert(Tokenizer<bpe_tokenizer>);

}  // namespace kestrel
