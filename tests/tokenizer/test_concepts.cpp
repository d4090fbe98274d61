// Compile-time checks of the Tokenizer concept, positive and negative.
#include <doctest/doctest.h>

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "kestrel/tokenizer/concepts.hpp"
#include "kestrel/tokenizer/detokenizer.hpp"
#include "kestrel/tokenizer/spm.hpp"

namespace {

using kestrel::token_id;

// The smallest model of the concept: one token per byte, no specials.
struct byte_tokenizer {
  std::vector<token_id> encode(std::string_view text, bool) const {
    std::vector<token_id> out;
    for (unsigned char c : text) out.push_back(c);
    return out;
  }
  std::string_view piece(token_id) const { return "?"; }
  std::size_t n_vocab() const { return 256; }
  token_id bos() const { return kestrel::no_token; }
  token_id eos() const { return kestrel::no_token; }
  bool is_control(token_id) const { return false; }
  void append_bytes(token_id id, std::string& out) const { out += static_cast<char>(id); }
};

// Misses append_bytes: a detokenizer could not decode it.
struct no_decode {
  std::vector<token_id> encode(std::string_view, bool) const { return {}; }
  std::string_view piece(token_id) const { return {}; }
  std::size_t n_vocab() const { return 0; }
  token_id bos() const { return 0; }
  token_id eos() const { return 0; }
  bool is_control(token_id) const { return false; }
};

// encode returns the wrong type.
struct wrong_encode {
  std::vector<std::int64_t> encode(std::string_view, bool) const { return {}; }
  std::string_view piece(token_id) const { return {}; }
  std::size_t n_vocab() const { return 0; }
  token_id bos() const { return 0; }
  token_id eos() const { return 0; }
  bool is_control(token_id) const { return false; }
  void append_bytes(token_id, std::string&) const {}
};

// encode is not const: a shared tokenizer must be usable from const code.
struct mutable_encode {
  std::vector<token_id> encode(std::string_view, bool) { return {}; }
  std::string_view piece(token_id) const { return {}; }
  std::size_t n_vocab() const { return 0; }
  token_id bos() const { return 0; }
  token_id eos() const { return 0; }
  bool is_control(token_id) const { return false; }
  void append_bytes(token_id, std::string&) const {}
};

}  // namespace

static_assert(kestrel::Tokenizer<kestrel::spm_tokenizer>);
static_assert(kestrel::Tokenizer<byte_tokenizer>);
static_assert(!kestrel::Tokenizer<int>);
static_assert(!kestrel::Tokenizer<std::string>);
static_assert(!kestrel::Tokenizer<no_decode>);
static_assert(!kestrel::Tokenizer<wrong_encode>);
static_assert(!kestrel::Tokenizer<mutable_encode>);

TEST_CASE("a minimal Tokenizer model works with the generic detokenizer") {
  byte_tokenizer t;
  const std::string text = "h\xC3\xA9llo \xF0\x9F\x98\x80";
  const auto ids = t.encode(text, false);
  CHECK(kestrel::decode(t, ids) == text);
  // No add_space_prefix(): nothing is stripped at the start.
  CHECK(kestrel::decode(t, t.encode(" x", false)) == " x");
}
