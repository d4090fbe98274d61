// tests/tokenizer/helpers.hpp: fixture readers shared by the tokenizer tests.
#pragma once

#include <cstdint>
#include <memory>
#include <sstream>
#include <string>
#include <string_view>
#include <vector>

#include "fixtures.hpp"
#include "json.hpp"  // kestrel::test::json, json_ids (kept here for includers of this header)
#include "kestrel/core/token.hpp"
#include "kestrel/tokenizer/detokenizer.hpp"
#include "kestrel/tokenizer/llama2c_vocab.hpp"
#include "kestrel/tokenizer/spm.hpp"

namespace kestrel::test {

/// llama.cpp's .inp format: every case, the last included, is followed by
/// "\n__ggml_vocab_test__\n" (SOURCES.md), so splitting on the separator and
/// keeping only what precedes each occurrence gives the cases exactly.
inline std::vector<std::string> split_vocab_inp(std::string_view all) {
  constexpr std::string_view sep = "\n__ggml_vocab_test__\n";
  std::vector<std::string> cases;
  for (std::size_t pos = 0;;) {
    const std::size_t at = all.find(sep, pos);
    if (at == std::string_view::npos) break;
    cases.emplace_back(all.substr(pos, at - pos));
    pos = at + sep.size();
  }
  return cases;
}

/// llama.cpp's .out format: one line per case, space-separated ids.
inline std::vector<std::vector<token_id>> parse_vocab_out(const std::string& all) {
  std::vector<std::vector<token_id>> lines;
  std::istringstream in(all);
  std::string line;
  while (std::getline(in, line)) {
    std::istringstream ls(line);
    std::vector<token_id> ids;
    long v;
    while (ls >> v) ids.push_back(static_cast<token_id>(v));
    lines.push_back(std::move(ids));
  }
  return lines;
}

/// An independent strict UTF-8 check (written separately from the library's
/// detail/utf8.hpp so that the tests do not trust the code they test).
inline bool valid_utf8(std::string_view s) {
  std::size_t i = 0;
  while (i < s.size()) {
    const auto c = static_cast<unsigned char>(s[i]);
    std::uint32_t cp;
    std::size_t n;
    if (c < 0x80) { cp = c; n = 1; }
    else if ((c & 0xE0) == 0xC0) { cp = c & 0x1F; n = 2; }
    else if ((c & 0xF0) == 0xE0) { cp = c & 0x0F; n = 3; }
    else if ((c & 0xF8) == 0xF0) { cp = c & 0x07; n = 4; }
    else return false;
    if (i + n > s.size()) return false;
    for (std::size_t k = 1; k < n; ++k) {
      const auto d = static_cast<unsigned char>(s[i + k]);
      if ((d & 0xC0) != 0x80) return false;
      cp = (cp << 6) | (d & 0x3F);
    }
    static constexpr std::uint32_t min_cp[] = {0, 0, 0x80, 0x800, 0x10000};
    if (cp < min_cp[n] || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return false;
    i += n;
  }
  return true;
}

/// The Llama 2 SentencePiece vocabulary from llama2.c's tokenizer.bin, loaded
/// once per test process; nullptr (skipped) when the fixture is missing.
inline const spm_tokenizer* llama2_tokenizer() {
  static const std::unique_ptr<spm_tokenizer> tok = []() -> std::unique_ptr<spm_tokenizer> {
    const auto p = fixture("llama2c/tokenizer.bin");
    if (!p) return nullptr;
    return std::make_unique<spm_tokenizer>(load_llama2c_tokenizer(*p, 32000));
  }();
  return tok.get();
}

/// Cases in each of llama.cpp's ggml-vocab-*.gguf.inp files used here.
inline constexpr std::size_t vocab_vector_cases = 46;

/// Runs llama.cpp's tokenizer vectors `name`.gguf.inp through `tok` and
/// compares with `name`.gguf.out (add_bos false, no special-token parsing,
/// dummy prefix on: SOURCES.md); each case must also decode back to itself
/// (every case is valid UTF-8 that SentencePiece keeps intact). `label`
/// names the run in messages. Skips (see fixture()) when a file is missing.
/// Any Tokenizer: SentencePiece, byte-level BPE, any_tokenizer.
template <class Tok>
void check_vocab_vectors(const Tok& tok, const std::string& name, const std::string& label) {
  const auto inp = fixture("llamacpp-vocab/" + name + ".gguf.inp");
  const auto out = fixture("llamacpp-vocab/" + name + ".gguf.out");
  if (!inp || !out) return;
  const auto cases = split_vocab_inp(read_file(*inp));
  const auto expected = parse_vocab_out(read_file(*out));
  REQUIRE(cases.size() == vocab_vector_cases);
  REQUIRE(expected.size() >= vocab_vector_cases);
  std::size_t passed = 0;
  for (std::size_t i = 0; i < cases.size(); ++i) {
    const auto got = tok.encode(cases[i], false);
    CHECK_MESSAGE(got == expected[i], label << " case " << i << ": \"" << cases[i] << "\"");
    passed += got == expected[i];
    CHECK_MESSAGE(decode(tok, got) == cases[i], label << " case " << i);
  }
  MESSAGE(label << " vectors: " << passed << "/" << vocab_vector_cases);
  CHECK(passed == vocab_vector_cases);
}

}  // namespace kestrel::test
