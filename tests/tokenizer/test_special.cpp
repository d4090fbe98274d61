// Special tokens: the generic splitter, spm_tokenizer's parse_special, and
// the special ids read from GGUF metadata.
#include <doctest/doctest.h>

#include <chrono>
#include <random>
#include <string>
#include <vector>

#include "helpers.hpp"
#include "kestrel/io/gguf.hpp"
#include "kestrel/tokenizer/gguf_vocab.hpp"
#include "kestrel/tokenizer/special.hpp"
#include "kestrel/tokenizer/spm.hpp"

using namespace kestrel;

namespace {
std::vector<std::pair<token_id, std::string>> segments(const special_splitter& s, std::string_view text) {
  std::vector<std::pair<token_id, std::string>> out;
  for (const auto& seg : s.split(text)) out.emplace_back(seg.id, std::string(seg.text));
  return out;
}
using segs = std::vector<std::pair<token_id, std::string>>;
}  // namespace

TEST_CASE("special_splitter: segments, leftmost-longest, no specials") {
  const std::vector<special_token> toks = {{"<|end|>", 1}, {"<|endoftext|>", 2}, {"<s>", 3}, {"<", 4}, {"", 5}};
  const special_splitter s(toks);
  CHECK(s.size() == 4);  // the empty spelling is ignored
  CHECK(s.max_length() == 13);
  CHECK(segments(s, "").empty());
  CHECK(segments(s, "plain") == segs{{no_token, "plain"}});
  CHECK(segments(s, "a<|endoftext|>b") == segs{{no_token, "a"}, {2, "<|endoftext|>"}, {no_token, "b"}});
  CHECK(segments(s, "<|end|><|end|>") == segs{{1, "<|end|>"}, {1, "<|end|>"}});
  CHECK(segments(s, "<|en") == segs{{4, "<"}, {no_token, "|en"}});  // a partial spelling falls back to the longest that matches
  CHECK(segments(s, "x<s>") == segs{{no_token, "x"}, {3, "<s>"}});
  CHECK(s.find("<s>") == 3);
  CHECK(s.find("<s") == no_token);
  CHECK(s.find("") == no_token);
  const special_splitter none;
  CHECK(segments(none, "<s>") == segs{{no_token, "<s>"}});
}

TEST_CASE("special_splitter: duplicates keep the first id; many specials stay fast") {
  std::vector<special_token> toks = {{"<a>", 7}, {"<a>", 8}};
  for (int i = 0; i < 5000; ++i) toks.push_back({"<|reserved_special_token_" + std::to_string(i) + "|>", 100 + i});
  const special_splitter s(toks);
  CHECK(s.find("<a>") == 7);
  CHECK(s.find("<|reserved_special_token_4999|>") == 5099);
  // 1 MB of text full of '<' (every position a candidate start): linear in the text.
  std::string text;
  std::mt19937 rng(1);
  while (text.size() < (1u << 20)) {
    text += "<|reserved_special_token_" + std::to_string(rng() % 6000) + "|> and <b> text ";
  }
  const auto t0 = std::chrono::steady_clock::now();
  std::size_t n_special = 0, bytes = 0;
  s.split(text, [&](special_segment seg) {
    n_special += seg.is_special();
    bytes += seg.text.size();
  });
  const double sec = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  CHECK(bytes == text.size());
  CHECK(n_special > 10000);
  CHECK(sec < 1.0);
}

TEST_CASE("special_tokens_of: control, user-defined and unknown pieces") {
  const std::vector<std::string> pieces = {"<unk>", "<s>", "</s>", "<0x00>", "a", "<|user|>", "<unused>"};
  const std::vector<std::int32_t> types = {2, 3, 3, 6, 1, 4, 5};
  const auto sp = special_tokens_of(pieces, types);
  REQUIRE(sp.size() == 4);
  CHECK(sp[0].text == "<unk>");
  CHECK(sp[3].id == 5);
}

TEST_CASE("spm_tokenizer parse_special on the Llama 2 vocabulary") {
  // The GGUF copy: llama2.c's tokenizer.bin spells BOS/EOS "\n<s>\n", "\n</s>\n".
  const auto path = test::fixture("llamacpp-vocab/ggml-vocab-llama-spm.gguf");
  if (!path) return;
  const spm_tokenizer spm(vocab_from_gguf(io::gguf_file(*path)));
  const spm_tokenizer* tok = &spm;
  const std::string text = "<s>[INST] Hello [/INST] Hi</s>";
  // Off (the default, and the two-argument encode): "<s>" is text.
  CHECK(tok->encode(text, false, false) == tok->encode(text, false));
  const auto off = tok->encode(text, false);
  CHECK(std::find(off.begin(), off.end(), 1) == off.end());
  CHECK(std::find(off.begin(), off.end(), 2) == off.end());
  // On: <s> and </s> are their ids; each text run is encoded on its own, with
  // its dummy-prefix space (llama.cpp's SPM behaviour).
  const auto on = tok->encode(text, false, true);
  std::vector<token_id> expect = {1};
  const auto mid = tok->encode("[INST] Hello [/INST] Hi", false);
  expect.insert(expect.end(), mid.begin(), mid.end());
  expect.push_back(2);
  CHECK(on == expect);
  CHECK(tok->encode("Hello", true, true) == tok->encode("Hello", true));
  CHECK(tok->encode("<unk>", false, true) == std::vector<token_id>{0});
  CHECK(tok->encode("", true, true) == std::vector<token_id>{1});
  CHECK(tok->specials().size() == 3);
}

TEST_CASE("read_special_ids: GGUF metadata and defaults") {
  const auto path = test::fixture("gguf/stories260K.gguf");
  if (!path) return;
  const io::gguf_file f(*path);
  const auto s = read_special_ids(f);
  CHECK(s.bos == 1);
  CHECK(s.eos == 2);
  CHECK(s.pad == no_token);  // 0xFFFFFFFF
  CHECK(s.eot == no_token);
  CHECK(s.end_of_generation == std::vector<token_id>{2});
  CHECK(s.is_end_of_generation(2));
  CHECK(!s.is_end_of_generation(1));
  CHECK(!s.add_eos);
  special_ids d;
  d.add_bos = true;
  CHECK(read_special_ids(f, d).add_bos);  // absent key: the default stays
}

TEST_CASE("read_special_ids: eot from its spelling; phi-3 vocabulary") {
  const auto path = test::fixture("llamacpp-vocab/ggml-vocab-phi-3.gguf");
  if (!path) return;
  const io::gguf_file f(*path);
  const auto s = read_special_ids(f);
  const auto pieces = f.get_array<std::string>("tokenizer.ggml.tokens");
  REQUIRE(s.eot != no_token);
  CHECK(pieces[static_cast<std::size_t>(s.eot)] == "<|end|>");
  CHECK(s.is_end_of_generation(s.eot));
  CHECK(s.is_end_of_generation(s.eos));
  const spm_tokenizer tok(vocab_from_gguf(f));
  const auto ids = tok.encode("<|user|>\nHi<|end|>\n<|assistant|>\n", false, true);
  CHECK(std::find(ids.begin(), ids.end(), s.eot) != ids.end());
  CHECK(std::find(ids.begin(), ids.end(), tok.specials().find("<|user|>")) != ids.end());
  const auto off = tok.encode("<|end|>", false, false);
  CHECK(std::find(off.begin(), off.end(), s.eot) == off.end());
}
