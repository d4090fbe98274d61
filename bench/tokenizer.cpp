// kestrel-bench-tokenize: tokenizer throughput. Encode and decode MB/s on a
// multilingual text at sizes 1 KB .. 1 MB (doubling), to show linear growth,
// printed as JSON lines (medians of -r repeats).
//
//   kestrel-bench-tokenize -m VOCAB.gguf [-f TEXT] [-r 5]     (SentencePiece or byte-level BPE)
//   kestrel-bench-tokenize -m tokenizer.bin --n-vocab 32000 [-f TEXT]
//
// Without -f the text is built from the llama.cpp tokenizer test inputs
// (English, code, CJK, emoji, whitespace runs) of ../shared/fixtures,
// repeated to 1 MB: a mix, not a corpus; pass -f for a real text.
#include <charconv>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <string_view>
#include <vector>

#include "common.hpp"
#include "kestrel/core/mmap.hpp"
#include "kestrel/io/gguf.hpp"
#include "kestrel/tokenizer/any.hpp"
#include "kestrel/tokenizer/detokenizer.hpp"
#include "kestrel/tokenizer/llama2c_vocab.hpp"

namespace {

[[noreturn]] void die(const std::string& m) {
  std::fprintf(stderr, "error: %s\n", m.c_str());
  std::exit(1);
}

std::string read_all(const std::filesystem::path& p) {
  std::ifstream f(p, std::ios::binary);
  if (!f) die("cannot read " + p.string());
  return {std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>()};
}

std::string default_text() {
  const char* env = std::getenv("KESTREL_FIXTURES");
  const std::filesystem::path dir = env && *env ? env : "../shared/fixtures";
  std::string base = read_all(dir / "llamacpp-vocab" / "ggml-vocab-llama-spm.gguf.inp");
  // Drop the case separators so the text reads as one document.
  for (std::size_t at; (at = base.find("__ggml_vocab_test__")) != std::string::npos;) base.erase(at, 19);
  std::string text;
  while (text.size() < (1u << 20)) text += base;
  // Cut at a character boundary.
  std::size_t n = 1u << 20;
  while (n > 0 && (static_cast<unsigned char>(text[n]) & 0xC0) == 0x80) --n;
  text.resize(n);
  return text;
}

std::string_view prefix(std::string_view s, std::size_t n) {
  n = std::min(n, s.size());
  while (n > 0 && n < s.size() && (static_cast<unsigned char>(s[n]) & 0xC0) == 0x80) --n;
  return s.substr(0, n);
}

}  // namespace

int main(int argc, char** argv) {
  std::string model, text_path;
  long repeats = 5, n_vocab = 0;
  for (int i = 1; i < argc; ++i) {
    const std::string_view a = argv[i];
    auto value = [&]() -> std::string_view {
      if (i + 1 >= argc) die(std::string(a) + " needs a value");
      return argv[++i];
    };
    auto number = [&](std::string_view v) {
      long x = 0;
      auto [p, ec] = std::from_chars(v.data(), v.data() + v.size(), x);
      if (ec != std::errc() || p != v.data() + v.size() || x < 1) die(std::string(a) + ": bad number '" + std::string(v) + "'");
      return x;
    };
    if (a == "-m") model = value();
    else if (a == "-f") text_path = value();
    else if (a == "-r") repeats = number(value());
    else if (a == "--n-vocab") n_vocab = number(value());
    else die("unknown argument " + std::string(a) + "\nusage: kestrel-bench-tokenize -m VOCAB [-f TEXT] [-r N] [--n-vocab N]");
  }
  if (model.empty()) die("usage: kestrel-bench-tokenize -m VOCAB [-f TEXT] [-r N] [--n-vocab N]");
  try {
    const kestrel::any_tokenizer tok =
        n_vocab ? kestrel::any_tokenizer(kestrel::spm_tokenizer(kestrel::load_llama2c_tokenizer(model, static_cast<std::size_t>(n_vocab))))
                : kestrel::tokenizer_from_gguf(kestrel::io::gguf_file(model));
    const std::string text = text_path.empty() ? default_text() : read_all(text_path);
    for (std::size_t size = 1024; size <= text.size(); size *= 2) {
      const std::string_view s = prefix(text, size);
      std::vector<double> enc_ms, dec_ms;
      std::vector<kestrel::token_id> ids;
      for (long r = 0; r < repeats; ++r) {
        double t0 = kestrel::bench::now_ms();
        ids = tok.encode(s, false);
        enc_ms.push_back(kestrel::bench::now_ms() - t0);
        t0 = kestrel::bench::now_ms();
        const std::string back = kestrel::decode(tok, ids);
        dec_ms.push_back(kestrel::bench::now_ms() - t0);
        if (back.size() + 8 < s.size()) die("decode lost text");  // keeps the work from being optimised away
      }
      const double mb = static_cast<double>(s.size()) / (1 << 20);
      std::printf("{\"bench\":\"tokenize\",\"vocab\":%s,\"bytes\":%zu,\"tokens\":%zu,\"encode_ms\":%.3f,\"encode_mb_s\":%.2f,"
                  "\"decode_ms\":%.3f,\"decode_mb_s\":%.2f}\n",
                  kestrel::bench::json_string(std::filesystem::path(model).filename().string()).c_str(), s.size(),
                  ids.size(), kestrel::bench::median(enc_ms), mb / (kestrel::bench::median(enc_ms) / 1e3),
                  kestrel::bench::median(dec_ms), mb / (kestrel::bench::median(dec_ms) / 1e3));
    }
  } catch (const std::exception& e) {
    die(e.what());
  }
}
