// tests/tokenizer/test_bpe.cpp: byte-level BPE (bpe.hpp) and its loaders
// (bpe_loaders.hpp) against llama.cpp's vectors, across file formats, and on
// edge cases.
#include <doctest/doctest.h>

#include <chrono>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "data/cl100k_vectors.hpp"
#include "helpers.hpp"
#include "kestrel/tokenizer/bpe.hpp"
#include "kestrel/tokenizer/bpe_loaders.hpp"
#include "kestrel/tokenizer/detokenizer.hpp"

using namespace kestrel;
using namespace kestrel::test;

namespace {


bpe_tokenizer make(bpe_vocab v) { return bpe_tokenizer(std::move(v)); }

const bpe_tokenizer* gpt2_gguf() {
  static const std::unique_ptr<bpe_tokenizer> tok = []() -> std::unique_ptr<bpe_tokenizer> {
    const auto p = fixture("llamacpp-vocab/ggml-vocab-gpt-2.gguf");
    if (!p) return nullptr;
    return std::make_unique<bpe_tokenizer>(make(load_bpe_gguf(*p)));
  }();
  return tok.get();
}

const bpe_tokenizer* cl100k() {
  static const std::unique_ptr<bpe_tokenizer> tok = []() -> std::unique_ptr<bpe_tokenizer> {
    const auto p = fixture("bpe/tiktoken/cl100k_base.tiktoken");
    if (!p) return nullptr;
    return std::make_unique<bpe_tokenizer>(make(load_bpe_tiktoken(*p)));
  }();
  return tok.get();
}

/// The 46 llama.cpp vectors of `name` through `tok`, with round trips.
void check_bpe_vectors(const bpe_tokenizer& tok, const std::string& name, const std::string& label) {
  check_vocab_vectors(tok, name, label);
}

/// Text in several scripts, spacing and symbols, for round trips.
std::vector<std::string> varied_texts() {
  return {"",
          "Hello, world!",
          "   leading and trailing   ",
          "tabs\tand\nnewlines\r\n\n\n  mixed \t \n",
          "numbers 1 12 123 1234 12345 3.14159 1e10 0x1F",
          "Führer Cửa Việt naïve café",
          "нещо на Български",
          "我想在apple工作1314151天～",
          "日本語のテキストです。",
          "한국어 텍스트",
          "كلمات عربية",
          "emoji 🦙🚀😶‍🌫️✅ and ZWJ",
          "code: for (int i = 0; i < n; ++i) { x[i] += y[i]; }",
          "I've been 'told he's there, 'RE you sure? 'M not sure I'll make it, 'D you like some tea? We'Ve a'lL",
          "<|endoftext|> <s> </s> [INST]",
          "------======= ''''''```````\"\"\"\"......!!!!!!??????"};
}

}  // namespace

TEST_CASE("bpe: GPT-2's byte alphabet maps all 256 bytes and back") {
  std::string all;
  for (int b = 0; b < 256; ++b) all += static_cast<char>(b);
  const std::string mapped = gpt2_encode_bytes(all);
  CHECK(gpt2_encode_bytes(" ") == "\xC4\xA0");   // Ġ
  CHECK(gpt2_encode_bytes("\n") == "\xC4\x8A");  // Ċ
  CHECK(gpt2_encode_bytes("A~!") == "A~!");
  const auto back = gpt2_decode_bytes(mapped);
  REQUIRE(back);
  CHECK(*back == all);
  CHECK_FALSE(gpt2_decode_bytes("\xE2\x96\x81"));  // "▁" is not in the alphabet
  CHECK_FALSE(gpt2_decode_bytes(" "));             // nor is a plain space
}

TEST_CASE("bpe: ggml-vocab-gpt-2.gguf vectors 46/46") {
  const auto* tok = gpt2_gguf();
  if (!tok) return;
  CHECK(tok->n_vocab() == 50257);
  CHECK(tok->n_merges() == 50000);
  CHECK(tok->n_dropped_merges() == 0);
  CHECK(tok->missing_bytes() == 0);
  CHECK(tok->bos() == 50256);
  CHECK(tok->eos() == 50256);
  CHECK_FALSE(tok->add_bos());
  CHECK(tok->is_control(50256));
  CHECK(tok->piece(50256) == "<|endoftext|>");
  CHECK(tok->encode("Hello", true) == std::vector<token_id>{50256, 15496});
  check_bpe_vectors(*tok, "ggml-vocab-gpt-2", "gpt-2.gguf");
}

TEST_CASE("bpe: gpt2 tokenizer.json and encoder.json + vocab.bpe agree with the GGUF") {
  const auto* ref = gpt2_gguf();
  const auto tj = fixture("bpe/gpt2/tokenizer.json");
  const auto ej = fixture("bpe/gpt2/encoder.json");
  const auto vb = fixture("bpe/gpt2/vocab.bpe");
  if (!ref || !tj || !ej || !vb) return;
  const bpe_vocab hv = load_bpe_hf_json(*tj);
  CHECK(hv.pre == "gpt-2");
  CHECK(hv.bos == 50256);
  CHECK(hv.eos == 50256);
  const bpe_vocab ov = load_bpe_openai(*ej, *vb);
  CHECK(hv.tokens == ref->vocab().tokens);
  CHECK(ov.tokens == ref->vocab().tokens);
  CHECK(hv.merges == ref->vocab().merges);
  CHECK(ov.merges == ref->vocab().merges);
  const bpe_tokenizer h = make(hv), o = make(ov);
  CHECK(h.eos() == 50256);
  CHECK(o.eos() == 50256);
  check_bpe_vectors(h, "ggml-vocab-gpt-2", "gpt2 tokenizer.json");
  check_bpe_vectors(o, "ggml-vocab-gpt-2", "gpt2 encoder.json");
  for (const auto& s : varied_texts()) {
    const auto ids = ref->encode(s, false);
    CHECK(h.encode(s, false) == ids);
    CHECK(o.encode(s, false) == ids);
  }
}

TEST_CASE("bpe: llama3 encoder.json + vocab.bpe with ignore_merges: llama-bpe vectors 46/46") {
  const auto ej = fixture("bpe/llama3/encoder.json");
  const auto vb = fixture("bpe/llama3/vocab.bpe");
  if (!ej || !vb) return;
  const bpe_tokenizer tok = make(load_bpe_openai(*ej, *vb, "llama-bpe", true));
  CHECK(tok.n_vocab() == 128000);
  CHECK(tok.n_merges() + tok.n_dropped_merges() == 280147);
  CHECK(tok.missing_bytes() == 0);
  check_bpe_vectors(tok, "ggml-vocab-llama-bpe", "llama3 encoder.json");
  for (const auto& s : varied_texts()) CHECK(decode(tok, tok.encode(s, false)) == s);

  // Without ignore_merges one case differs (SOURCES.md: 45/46).
  const bpe_tokenizer plain = make(load_bpe_openai(*ej, *vb, "llama-bpe", false));
  const auto inp = fixture("llamacpp-vocab/ggml-vocab-llama-bpe.gguf.inp");
  const auto out = fixture("llamacpp-vocab/ggml-vocab-llama-bpe.gguf.out");
  if (!inp || !out) return;
  const auto cases = split_vocab_inp(read_file(*inp));
  const auto expected = parse_vocab_out(read_file(*out));
  std::size_t passed = 0;
  for (std::size_t i = 0; i < cases.size(); ++i) passed += plain.encode(cases[i], false) == expected[i];
  CHECK(passed == 45);
}

TEST_CASE("bpe: cl100k_base.tiktoken loads, matches tiktoken, and round-trips") {
  const auto* tok = cl100k();
  if (!tok) return;
  CHECK(tok->n_vocab() == 100256);
  CHECK(tok->missing_bytes() == 0);
  CHECK(tok->ignore_merges());
  for (const auto& s : varied_texts()) CHECK(decode(*tok, tok->encode(s, false)) == s);
  // Known encodings, from tiktoken itself (tools/gen_cl100k_vectors.py).
  std::size_t passed = 0;
  for (const auto& [text, ids] : cl100k_vectors()) {
    const std::vector<token_id> want(ids.begin(), ids.end());
    const auto got = tok->encode(text, false);
    CHECK_MESSAGE(got == want, "cl100k: \"" << text << "\"");
    passed += got == want;
  }
  MESSAGE("cl100k vectors from tiktoken: " << passed << "/" << cl100k_vectors().size());
}

TEST_CASE("bpe: edge cases: empty, whitespace runs, every byte, invalid UTF-8") {
  const auto* tok = gpt2_gguf();
  if (!tok) return;
  CHECK(tok->encode("", false).empty());
  CHECK(tok->encode("", true) == std::vector<token_id>{50256});
  for (std::size_t n : {1u, 2u, 3u, 7u, 100u, 1000u}) {
    for (const char* ws : {" ", "\n", "\t", " \n"}) {
      std::string s;
      for (std::size_t k = 0; k < n; ++k) s += ws;
      const auto ids = tok->encode(s, false);
      CHECK(decode_bytes(*tok, ids) == s);
    }
  }
  // Every byte value, alone and all together, comes back exactly.
  std::string all;
  for (int b = 0; b < 256; ++b) {
    const std::string one(1, static_cast<char>(b));
    const auto ids = tok->encode(one, false);
    REQUIRE(ids.size() == 1);
    CHECK(decode_bytes(*tok, ids) == one);
    all += one;
  }
  CHECK(decode_bytes(*tok, tok->encode(all, false)) == all);
  // Invalid UTF-8: encoded byte for byte, raw bytes back; decode() shows U+FFFD.
  const std::string bad = "ok \xFF\xC3 bad \xE2\x82 \xED\xA0\x80 end\xF0";
  const auto ids = tok->encode(bad, false);
  CHECK(decode_bytes(*tok, ids) == bad);
  CHECK(valid_utf8(decode(*tok, ids)));
  // Random bytes never crash and always round-trip.
  std::mt19937 rng(42);
  for (int trial = 0; trial < 200; ++trial) {
    std::string s(rng() % 64, '\0');
    for (auto& c : s) c = static_cast<char>(rng());
    CHECK(decode_bytes(*tok, tok->encode(s, false)) == s);
  }
}

TEST_CASE("bpe: 1 MB input encodes in linear time") {
  const auto* tok = gpt2_gguf();
  if (!tok) return;
  // One long pre-token (a run of one letter) and ordinary varied text.
  const std::string run(1 << 20, 'a');
  std::string text;
  const auto texts = varied_texts();
  for (std::size_t k = 0; text.size() < (1u << 20); ++k) text += texts[k % texts.size()] + " ";
  auto time = [&](const std::string& s) {
    const auto t0 = std::chrono::steady_clock::now();
    const auto ids = tok->encode(s, false);
    const double sec = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    CHECK(decode_bytes(*tok, ids) == s);
    return sec;
  };
  const double t_run = time(run), t_text = time(text);
  const double t_run_small = time(run.substr(0, run.size() / 16));
  MESSAGE("1 MB: single pre-token " << t_run << " s, varied text " << t_text << " s; 64 KB run " << t_run_small << " s");
  CHECK(t_run < 5.0);
  CHECK(t_text < 5.0);
  // Linear-ish: 16x the input may not cost more than 64x the time (a quadratic
  // merge loop would cost 256x). The small run is timed last, warm.
  CHECK(t_run < 64 * t_run_small + 0.05);
}

TEST_CASE("bpe: the other byte-level vocab GGUFs load and round-trip") {
  for (const char* name : {"deepseek-coder", "deepseek-llm", "falcon", "mpt", "refact", "starcoder", "gpt-neox"}) {
    const auto p = fixture(std::string("llamacpp-vocab/ggml-vocab-") + name + ".gguf");
    if (!p) continue;
    const bpe_vocab v = load_bpe_gguf(*p);
    const bpe_tokenizer tok = make(v);
    INFO(std::string(name) << " pre=" << v.pre << " dropped merges " << tok.n_dropped_merges() << " unmapped "
                           << tok.n_unmapped_tokens());
    // These vocabularies lack the tokens of some bytes (0xC0, 0xC1, 0xF5..0xFF
    // never occur in UTF-8; falcon also lacks some ASCII controls): such a
    // byte becomes unk, or is dropped when there is none.
    std::string missing;
    for (int b = 0; b < 256; ++b)
      if (tok.byte_token(static_cast<std::uint8_t>(b)) == no_token) missing += std::to_string(b) + " ";
    MESSAGE(std::string(name) << ": " << tok.missing_bytes() << " bytes without a token: " << missing);
    CHECK(tok.missing_bytes() <= 32);
    for (const auto& s : varied_texts()) CHECK_MESSAGE(decode(tok, tok.encode(s, false)) == s, name << ": " << s);
  }
}

TEST_CASE("bpe: loaders reject malformed files with file_error") {
  const auto dir = "bpe-bad";
  auto json_err = [&](std::string_view text) {
    const auto p = write_scratch(dir, "tokenizer.json", text);
    return error_of<file_error>([&] { (void)load_bpe_hf_json(p); });
  };
  CHECK(json_err("").find("unexpected end") != std::string::npos);
  CHECK(json_err("[]").find("not an object") != std::string::npos);
  CHECK(json_err(R"({"model": {"type": "WordPiece"}})").find("BPE") != std::string::npos);
  CHECK(json_err(R"({"model": {"type": "BPE", "vocab": {"a": 0, "b": 2}, "merges": []}, "pre_tokenizer": {"type": "ByteLevel"}})")
            .find("no token has id 1") != std::string::npos);
  CHECK(json_err(R"({"model": {"type": "BPE", "vocab": {"a": 0}, "merges": [3]}, "pre_tokenizer": {"type": "ByteLevel"}})")
            .find("merge 0") != std::string::npos);
  CHECK(json_err(R"({"model": {"type": "BPE", "vocab": {"a": 0}, "merges": []}, "pre_tokenizer": {"type": "Split", "pattern": {"Regex": "x+"}}})")
            .find("unrecognised pre-tokenizer regex") != std::string::npos);
  CHECK(json_err(R"({"model": {"type": "BPE", "vocab": {"a": 0.5}, "merges": []}})").find("not an integer") != std::string::npos);

  auto tik_err = [&](std::string_view text) {
    const auto p = write_scratch(dir, "x.tiktoken", text);
    return error_of<file_error>([&] { (void)load_bpe_tiktoken(p); });
  };
  CHECK(tik_err("").find("empty") != std::string::npos);
  CHECK(tik_err("QQ== 0\nQg== 0\n").find("given twice") != std::string::npos);
  CHECK(tik_err("QQ== 0\nQg== 2\n").find("rank 1") != std::string::npos);
  CHECK(tik_err("QQ==0\n").find("no space") != std::string::npos);
  CHECK(tik_err("Q!== 0\n").find("base64") != std::string::npos);
  CHECK(tik_err("QQ== x\n").find("bad rank") != std::string::npos);
  CHECK(tik_err("QQ== 0\nQg== 1\nQUI= 2\n").empty());

  const auto enc = write_scratch(dir, "encoder.json", R"({"a": 0, "b": 1, "ab": 2})");
  auto openai_err = [&](std::string_view enc_text, std::string_view merges) {
    const auto e = write_scratch(dir, "enc2.json", enc_text);
    const auto m = write_scratch(dir, "vocab.bpe", merges);
    return error_of<file_error>([&] { (void)load_bpe_openai(e, m); });
  };
  CHECK(openai_err(R"({"a": 0, "b": 1, "ab": 2})", "#version: 0.2\na b\n").empty());
  CHECK(openai_err(R"({"a": 0, "b": 1, "ab": 2})", "a b\nab\n").find("line 2") != std::string::npos);
  CHECK(openai_err(R"({"a": 0, "b": 5})", "").find("id 5") != std::string::npos);
  CHECK(openai_err(R"({"a": 0, "b": 0})", "").find("given twice") != std::string::npos);
  CHECK(error_of<file_error>([&] { (void)load_bpe_openai(enc, "/nonexistent/vocab.bpe"); }).find("cannot open") !=
        std::string::npos);

  // A GGUF with an SPM vocabulary is refused by name.
  if (const auto p = fixture("llamacpp-vocab/ggml-vocab-llama-spm.gguf"))
    CHECK(error_of<file_error>([&] { (void)load_bpe_gguf(*p); }).find("'llama'") != std::string::npos);
}

TEST_CASE("bpe: a tiny hand-made vocabulary merges by rank, leftmost on ties") {
  bpe_vocab v;
  for (const char* t : {"a", "b", "c", "ab", "bc", "abc", "aa", "aaa"}) v.tokens.emplace_back(t);
  v.merges = {{"b", "c"}, {"a", "b"}, {"a", "bc"}, {"a", "a"}, {"aa", "a"}};
  auto whole = [](std::string_view s, std::vector<std::string_view>& out) { out.push_back(s); };
  const bpe_tokenizer tok(v, whole);
  CHECK(tok.encode("abc", false) == std::vector<token_id>{5});       // b c first (rank 0), then a bc
  CHECK(tok.encode("ab", false) == std::vector<token_id>{3});
  CHECK(tok.encode("aaaa", false) == std::vector<token_id>{6, 6});   // leftmost a a first, twice
  CHECK(tok.encode("aaa", false) == std::vector<token_id>{7});
  CHECK(tok.encode("abab", false) == std::vector<token_id>{3, 3});
  // ignore_merges: "abc" has no merge path without bc, but is a token.
  bpe_vocab w = v;
  w.merges = {{"a", "b"}};
  CHECK(bpe_tokenizer(w, whole).encode("abc", false) == std::vector<token_id>{3, 2});
  w.ignore_merges = true;
  CHECK(bpe_tokenizer(w, whole).encode("abc", false) == std::vector<token_id>{5});
  // tiktoken's rule: the lowest-rank concatenation merges first.
  bpe_vocab r;
  for (const char* t : {"a", "b", "c", "bc", "ab", "abc"}) r.tokens.emplace_back(t);
  r.merges_from_ranks = true;
  CHECK(bpe_tokenizer(r, whole).encode("abc", false) == std::vector<token_id>{5});
  CHECK(bpe_tokenizer(r, whole).encode("abcab", false) == std::vector<token_id>{5, 4});
  // Validation.
  bpe_vocab bad = v;
  bad.eos = 99;
  CHECK(invalid_argument_message([&] { bpe_tokenizer t(bad, whole); }).find("eos id 99") != std::string::npos);
  bad = v;
  bad.types = {1, 1};
  CHECK(invalid_argument_message([&] { bpe_tokenizer t(bad, whole); }).find("token types") != std::string::npos);
  CHECK(invalid_argument_message([&] { (void)tok.piece(100); }).find("outside") != std::string::npos);
}

TEST_CASE("bpe: with pretokenize.hpp's pre-tokenizers (one-argument constructor)") {
  if (const auto p = fixture("llamacpp-vocab/ggml-vocab-gpt-2.gguf"))
    check_bpe_vectors(bpe_tokenizer(load_bpe_gguf(*p)), "ggml-vocab-gpt-2", "gpt-2.gguf (pretokenize.hpp)");
  const auto ej = fixture("bpe/llama3/encoder.json");
  const auto vb = fixture("bpe/llama3/vocab.bpe");
  if (ej && vb)
    check_bpe_vectors(bpe_tokenizer(load_bpe_openai(*ej, *vb, "llama-bpe", true)), "ggml-vocab-llama-bpe",
                      "llama3 encoder.json (pretokenize.hpp)");
  if (const auto p = fixture("bpe/tiktoken/cl100k_base.tiktoken")) {
    const bpe_tokenizer tok(load_bpe_tiktoken(*p));
    for (const auto& [text, ids] : cl100k_vectors())
      CHECK_MESSAGE(tok.encode(text, false) == std::vector<token_id>(ids.begin(), ids.end()), "cl100k: " << text);
  }
  for (const char* name : {"deepseek-coder", "deepseek-llm", "falcon", "mpt", "refact", "starcoder", "gpt-neox"}) {
    const auto p = fixture(std::string("llamacpp-vocab/ggml-vocab-") + name + ".gguf");
    if (!p) continue;
    const bpe_tokenizer tok(load_bpe_gguf(*p));
    for (const auto& s : varied_texts()) CHECK_MESSAGE(decode(tok, tok.encode(s, false)) == s, name << ": " << s);
  }
}
