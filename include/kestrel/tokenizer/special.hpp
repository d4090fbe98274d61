// kestrel/tokenizer/special.hpp: special tokens in text, and the special ids
// a vocabulary's metadata names (BOS, EOS, EOT, padding, add_bos/add_eos).
//
// With parse_special on, a prompt such as "<|im_start|>user\nHi<|im_end|>"
// must become the control token <|im_start|>, the text "user\nHi", then the
// control token <|im_end|>: the spellings of control and user-defined tokens
// are cut out of the text before the tokenizer's own algorithm sees the rest.
// special_splitter does that cut for any tokenizer (spm_tokenizer,
// bpe_tokenizer): given the set of (spelling, id) pairs it splits text into
// segments that are either one special token or plain text.
//
// Matching is leftmost-longest: at each position the longest special
// spelling that starts there wins ("<|end|>" inside "<|endoftext|>" does not
// cut it). A byte trie holds the spellings; a 256-entry first-byte table
// skips positions where no spelling can start, so plain text costs one table
// lookup per byte and a position that starts a candidate costs at most the
// length of the longest spelling: O(text x max_len), independent of how many
// special tokens there are (Llama 3 has 256, Qwen2 over 200).
//
// llama.cpp's lstrip/rstrip token attributes (a special token swallowing the
// spaces next to it) are not applied: none of our vocabularies carries them.
#pragma once

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "kestrel/core/error.hpp"
#include "kestrel/core/token.hpp"
#include "kestrel/io/gguf.hpp"
#include "kestrel/tokenizer/vocab.hpp"

namespace kestrel {

/// One spelling of a special token and its id.
struct special_token {
  std::string text;
  token_id id = no_token;
};

/// A piece of split text: a special token (id != no_token, text its
/// spelling in the input) or plain text (id == no_token).
struct special_segment {
  token_id id = no_token;
  std::string_view text;
  bool is_special() const noexcept { return id != no_token; }
};

class special_splitter {
 public:
  special_splitter() { first_.fill(false); nodes_.emplace_back(); }

  /// Empty spellings are ignored; for a spelling listed twice the first id wins.
  explicit special_splitter(std::span<const special_token> tokens) : special_splitter() {
    for (const auto& t : tokens) add(t.text, t.id);
  }

  /// Adds one spelling (ignored when empty or already present).
  void add(std::string_view text, token_id id) {
    if (text.empty()) return;
    std::uint32_t n = 0;
    for (char ch : text) {
      const auto c = static_cast<unsigned char>(ch);
      std::uint32_t next = child(n, c);
      if (next == 0) {
        next = static_cast<std::uint32_t>(nodes_.size());
        auto& edges = nodes_[n].edges;
        edges.insert(std::lower_bound(edges.begin(), edges.end(), edge{c, 0}), edge{c, next});
        nodes_.emplace_back();
      }
      n = next;
    }
    if (nodes_[n].id == no_token) {
      nodes_[n].id = id;
      ++size_;
      max_len_ = std::max(max_len_, text.size());
    }
    first_[static_cast<unsigned char>(text[0])] = true;
  }

  std::size_t size() const noexcept { return size_; }
  bool empty() const noexcept { return size_ == 0; }
  std::size_t max_length() const noexcept { return max_len_; }

  /// The id of exactly `text`, or no_token.
  token_id find(std::string_view text) const {
    std::uint32_t n = 0;
    for (char ch : text) {
      n = child(n, static_cast<unsigned char>(ch));
      if (n == 0) return no_token;
    }
    return text.empty() ? no_token : nodes_[n].id;
  }

  /// The longest special spelling that starts `text`: (id, length), or
  /// (no_token, 0).
  std::pair<token_id, std::size_t> match_prefix(std::string_view text) const {
    std::pair<token_id, std::size_t> best{no_token, 0};
    std::uint32_t n = 0;
    for (std::size_t i = 0; i < text.size(); ++i) {
      n = child(n, static_cast<unsigned char>(text[i]));
      if (n == 0) break;
      if (nodes_[n].id != no_token) best = {nodes_[n].id, i + 1};
    }
    return best;
  }

  /// Calls `on_segment(special_segment)` for each segment of `text` in order:
  /// maximal runs of plain text (never empty) and special tokens.
  template <class F>
  void split(std::string_view text, F&& on_segment) const {
    std::size_t plain = 0;  // start of the current plain-text run
    for (std::size_t i = 0; i < text.size();) {
      if (!first_[static_cast<unsigned char>(text[i])]) {
        ++i;
        continue;
      }
      const auto [id, len] = match_prefix(text.substr(i));
      if (len == 0) {
        ++i;
        continue;
      }
      if (i > plain) on_segment(special_segment{no_token, text.substr(plain, i - plain)});
      on_segment(special_segment{id, text.substr(i, len)});
      i += len;
      plain = i;
    }
    if (plain < text.size()) on_segment(special_segment{no_token, text.substr(plain)});
  }

  /// split() collected into a vector (views into `text`).
  std::vector<special_segment> split(std::string_view text) const {
    std::vector<special_segment> out;
    split(text, [&](special_segment s) { out.push_back(s); });
    return out;
  }

 private:
  struct edge {
    unsigned char byte;
    std::uint32_t to;
    bool operator<(const edge& o) const noexcept { return byte < o.byte; }
  };
  struct node {
    std::vector<edge> edges;  // sorted by byte
    token_id id = no_token;   // a spelling ends here
  };

  std::uint32_t child(std::uint32_t n, unsigned char c) const {
    const auto& e = nodes_[n].edges;
    const auto it = std::lower_bound(e.begin(), e.end(), edge{c, 0});
    return it != e.end() && it->byte == c ? it->to : 0;  // node 0 is the root: never a child
  }

  std::vector<node> nodes_;        // nodes_[0] is the root
  std::array<bool, 256> first_{};  // some spelling starts with this byte
  std::size_t size_ = 0, max_len_ = 0;
};

/// The tokens that parse_special cuts out of text, as llama.cpp does:
/// control, user-defined and unknown tokens (by GGUF token type), with
/// their pieces as spellings. `types` may be empty (then nothing).
inline std::vector<special_token> special_tokens_of(std::span<const std::string> pieces,
                                                    std::span<const std::int32_t> types) {
  std::vector<special_token> out;
  for (std::size_t i = 0; i < types.size() && i < pieces.size(); ++i) {
    const std::int32_t t = types[i];
    if ((t == token_type::control || t == token_type::user_defined || t == token_type::unknown) && !pieces[i].empty())
      out.push_back({pieces[i], static_cast<token_id>(i)});
  }
  return out;
}

/// The user-defined tokens alone: llama.cpp cuts these out of the text even
/// when parse_special is off (only control and unknown spellings stay text),
/// e.g. gpt-neox's whitespace-run tokens or DeepSeek's added pieces.
inline std::vector<special_token> user_defined_tokens_of(std::span<const std::string> pieces,
                                                         std::span<const std::int32_t> types) {
  std::vector<special_token> out;
  for (std::size_t i = 0; i < types.size() && i < pieces.size(); ++i)
    if (types[i] == token_type::user_defined && !pieces[i].empty()) out.push_back({pieces[i], static_cast<token_id>(i)});
  return out;
}

/// The special ids and flags of a vocabulary, from GGUF metadata
/// (tokenizer.ggml.*), for any tokenizer model. An absent id is no_token.
struct special_ids {
  token_id bos = no_token, eos = no_token, eot = no_token, pad = no_token, unk = no_token;
  bool add_bos = false, add_eos = false;
  /// Tokens that end a generated reply: eos, eot, and end-of-turn tokens
  /// found by their spelling (see read_special_ids).
  std::vector<token_id> end_of_generation;

  bool is_end_of_generation(token_id id) const {
    return id != no_token && std::find(end_of_generation.begin(), end_of_generation.end(), id) != end_of_generation.end();
  }
};

/// End-of-turn spellings of the common chat formats, as llama.cpp's vocab
/// loader guesses EOT when tokenizer.ggml.eot_token_id is absent.
inline constexpr std::array<std::string_view, 8> end_of_turn_spellings = {
    "<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>", "<|endoftext|>", "<|END_OF_TURN_TOKEN|>", "<|EOT|>",
    "<|end_of_turn|>"};

/// Reads tokenizer.ggml.{bos,eos,eot,padding,unknown}_token_id and
/// add_{bos,eos}_token. `defaults` supplies what is absent (spm_vocab's
/// Llama defaults for a SentencePiece file). When eot_token_id is absent, the
/// first control/user-defined token spelled like an end of turn
/// (end_of_turn_spellings) becomes eot. Ids outside the vocabulary, or
/// 0xFFFFFFFF, count as absent.
inline special_ids read_special_ids(const io::gguf_file& f, special_ids defaults = {}) {
  special_ids s = defaults;
  std::vector<std::string> pieces;
  if (f.has("tokenizer.ggml.tokens")) pieces = f.get_array<std::string>("tokenizer.ggml.tokens");
  std::vector<std::int32_t> types;
  if (f.has("tokenizer.ggml.token_type")) types = f.get_array<std::int32_t>("tokenizer.ggml.token_type");
  auto id = [&](const char* key, token_id fallback) -> token_id {
    const auto x = f.get_optional<std::int64_t>(key);
    if (!x) return fallback;
    if (*x < 0 || *x >= static_cast<std::int64_t>(pieces.size())) return no_token;
    return static_cast<token_id>(*x);
  };
  s.bos = id("tokenizer.ggml.bos_token_id", s.bos);
  s.eos = id("tokenizer.ggml.eos_token_id", s.eos);
  s.eot = id("tokenizer.ggml.eot_token_id", s.eot);
  s.pad = id("tokenizer.ggml.padding_token_id", s.pad);
  s.unk = id("tokenizer.ggml.unknown_token_id", s.unk);
  s.add_bos = f.get_optional<bool>("tokenizer.ggml.add_bos_token").value_or(s.add_bos);
  s.add_eos = f.get_optional<bool>("tokenizer.ggml.add_eos_token").value_or(s.add_eos);

  // turn_ends[k]: the token spelled end_of_turn_spellings[k], or no_token.
  std::array<token_id, end_of_turn_spellings.size()> turn_ends;
  turn_ends.fill(no_token);
  for (std::size_t i = 0; i < pieces.size(); ++i) {
    const std::int32_t t = i < types.size() ? types[i] : token_type::normal;
    if (t != token_type::control && t != token_type::user_defined) continue;
    const auto it = std::find(end_of_turn_spellings.begin(), end_of_turn_spellings.end(), pieces[i]);
    if (it != end_of_turn_spellings.end() && turn_ends[it - end_of_turn_spellings.begin()] == no_token)
      turn_ends[it - end_of_turn_spellings.begin()] = static_cast<token_id>(i);
  }
  // The first spelling in priority order that is not EOS itself (Phi-3's
  // EOS is <|endoftext|>, its end of turn <|end|>).
  if (s.eot == no_token)
    for (token_id x : turn_ends)
      if (x != no_token && x != s.eos) {
        s.eot = x;
        break;
      }
  s.end_of_generation.clear();
  for (token_id x : {s.eos, s.eot})
    if (x != no_token) s.end_of_generation.push_back(x);
  for (token_id x : turn_ends)
    if (x != no_token && !s.is_end_of_generation(x)) s.end_of_generation.push_back(x);
  return s;
}

}  // namespace kestrel
