// kestrel/tokenizer/any.hpp: a tokenizer whose family is a run-time fact of
// the file (GGUF's tokenizer.ggml.model), for programs that load any model.
//
// `any_tokenizer` holds one of the tokenizer types and models the Tokenizer
// concept itself, forwarding each call with std::visit; a library user who
// knows the family at compile time uses spm_tokenizer / bpe_tokenizer
// directly. `tokenizer_from_gguf` is the one place that maps the file's
// tokenizer model to a type.
#pragma once

#include <string>
#include <string_view>
#include <utility>
#include <variant>
#include <vector>

#include "kestrel/core/error.hpp"
#include "kestrel/io/gguf.hpp"
#include "kestrel/tokenizer/bpe.hpp"
#include "kestrel/tokenizer/bpe_loaders.hpp"
#include "kestrel/tokenizer/concepts.hpp"
#include "kestrel/tokenizer/gguf_vocab.hpp"
#include "kestrel/tokenizer/special.hpp"
#include "kestrel/tokenizer/spm.hpp"

namespace kestrel {

class any_tokenizer {
 public:
  using variant_type = std::variant<spm_tokenizer, bpe_tokenizer>;

  any_tokenizer(spm_tokenizer t) : t_(std::move(t)) {}
  any_tokenizer(bpe_tokenizer t) : t_(std::move(t)) {}

  std::vector<token_id> encode(std::string_view text, bool add_bos) const {
    return std::visit([&](const auto& t) { return t.encode(text, add_bos); }, t_);
  }
  std::vector<token_id> encode(std::string_view text, bool add_bos, bool parse_special) const {
    return std::visit([&](const auto& t) { return t.encode(text, add_bos, parse_special); }, t_);
  }
  std::string_view piece(token_id id) const {
    return std::visit([&](const auto& t) { return t.piece(id); }, t_);
  }
  std::size_t n_vocab() const {
    return std::visit([](const auto& t) { return t.n_vocab(); }, t_);
  }
  token_id bos() const { return std::visit([](const auto& t) { return t.bos(); }, t_); }
  token_id eos() const { return std::visit([](const auto& t) { return t.eos(); }, t_); }
  bool is_control(token_id id) const {
    return std::visit([&](const auto& t) { return t.is_control(id); }, t_);
  }
  void append_bytes(token_id id, std::string& out) const {
    std::visit([&](const auto& t) { t.append_bytes(id, out); }, t_);
  }
  bool add_bos() const { return std::visit([](const auto& t) { return t.add_bos(); }, t_); }
  /// SentencePiece's dummy-prefix space (never for byte-level BPE), for the detokenizer.
  bool add_space_prefix() const { return spm() && spm()->add_space_prefix(); }
  /// SentencePiece byte-fallback tokens (the detokenizer keeps their spaces).
  bool is_byte(token_id id) const { return spm() && spm()->is_byte(id); }
  const special_splitter& specials() const {
    return std::visit([](const auto& t) -> const special_splitter& { return t.specials(); }, t_);
  }

  const variant_type& get() const noexcept { return t_; }
  /// The SentencePiece tokenizer, or nullptr for another family.
  const spm_tokenizer* spm() const noexcept { return std::get_if<spm_tokenizer>(&t_); }
  const bpe_tokenizer* bpe() const noexcept { return std::get_if<bpe_tokenizer>(&t_); }

 private:
  variant_type t_;
};

static_assert(Tokenizer<any_tokenizer>);

/// The tokenizer a GGUF file describes: tokenizer.ggml.model "llama" is
/// SentencePiece BPE, "gpt2" byte-level BPE; anything else (or none) is a
/// clear error naming it.
inline any_tokenizer tokenizer_from_gguf(const io::gguf_file& f) {
  const auto model = f.get_optional<std::string>("tokenizer.ggml.model");
  if (!model) throw file_error(f.path(), "no tokenizer.ggml.model: the file carries no vocabulary");
  if (*model == "llama") return spm_tokenizer(vocab_from_gguf(f));
  if (*model == "gpt2") return bpe_tokenizer(bpe_vocab_from_gguf(f));
  throw file_error(f.path(), "tokenizer.ggml.model '" + *model + "' is not supported (supported: llama, gpt2)");
}

}  // namespace kestrel
