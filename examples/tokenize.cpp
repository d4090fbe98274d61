// kestrel-tokenize: text in, token ids out, with llama.cpp's llama-tokenize
// flags. Loads only the vocabulary, so vocab-only GGUF files work.
//
//   kestrel-tokenize -m ggml-vocab-llama-spm.gguf -p "Hello world"
//        1 -> '<s>'
//    15043 -> ' Hello'
//     3186 -> ' world'
//
// kestrel::tokenizer_from_gguf picks the family (SentencePiece or byte-level
// BPE) from the file; kestrel::any_tokenizer does the rest.
#include <cstdio>
#include <iostream>
#include <iterator>
#include <sstream>
#include <string>
#include <string_view>
#include <vector>

#include "common/cli.hpp"
#include "kestrel/io/gguf.hpp"
#include "kestrel/tokenizer/any.hpp"

namespace {

const char* usage =
    "usage: kestrel-tokenize -m FILE (-p TEXT | -f FILE | --stdin) [options]\n"
    "  -m FILE             GGUF file with a vocabulary (vocab-only files too)\n"
    "  -p TEXT             text to tokenize (escapes such as \\n are processed)\n"
    "  -f FILE             read the text from FILE\n"
    "  --stdin             read the text from standard input\n"
    "  --ids               print only the ids, as [1, 2, 3]\n"
    "  --no-bos            do not add BOS even if the vocabulary asks for it\n"
    "  --no-parse-special  encode special-token spellings (\"<s>\") as text\n"
    "  --no-escape         take -p TEXT literally\n"
    "  --show-count        print the number of tokens\n";

struct tokenize_options {
  std::string model;
  std::optional<std::string> prompt, file;
  bool from_stdin = false, ids = false, no_bos = false, parse_special = true, escape = true, show_count = false;
};

void run(const kestrel::any_tokenizer& tok, const tokenize_options& o, std::string_view text) {
  const auto ids = tok.encode(text, !o.no_bos && tok.add_bos(), o.parse_special);
  std::string out;
  if (o.ids) {
    out += '[';
    for (std::size_t i = 0; i < ids.size(); ++i) {
      if (i) out += ", ";
      out += std::to_string(ids[i]);
    }
    out += "]\n";
  } else {
    char buf[32];
    for (auto id : ids) {
      std::snprintf(buf, sizeof buf, "%6d -> '", id);
      out += buf;
      // As llama-tokenize prints a piece: special tokens as spelled, others
      // as the bytes they stand for.
      if (tok.is_control(id))
        out += tok.piece(id);
      else
        tok.append_bytes(id, out);
      out += "'\n";
    }
  }
  if (o.show_count) out += "Total number of tokens: " + std::to_string(ids.size()) + "\n";
  std::fwrite(out.data(), 1, out.size(), stdout);
}

/// llama.cpp's string_process_escapes: \n \r \t \' \" \\ and \xHH; an
/// unknown escape is kept as written.
std::string process_escapes(std::string_view in) {
  std::string out;
  for (std::size_t i = 0; i < in.size(); ++i) {
    if (in[i] != '\\' || i + 1 >= in.size()) {
      out += in[i];
      continue;
    }
    const char c = in[++i];
    switch (c) {
      case 'n': out += '\n'; break;
      case 'r': out += '\r'; break;
      case 't': out += '\t'; break;
      case '\'': out += '\''; break;
      case '"': out += '"'; break;
      case '\\': out += '\\'; break;
      case 'x': {
        auto hex = [](char h) -> int {
          if (h >= '0' && h <= '9') return h - '0';
          if (h >= 'a' && h <= 'f') return h - 'a' + 10;
          if (h >= 'A' && h <= 'F') return h - 'A' + 10;
          return -1;
        };
        if (i + 2 < in.size() && hex(in[i + 1]) >= 0 && hex(in[i + 2]) >= 0) {
          out += static_cast<char>(hex(in[i + 1]) * 16 + hex(in[i + 2]));
          i += 2;
        } else {
          out += "\\x";
        }
        break;
      }
      default: out += '\\'; out += c;
    }
  }
  return out;
}

tokenize_options parse(int argc, char** argv) {
  tokenize_options o;
  auto help = [&](int code) {
    std::fprintf(code ? stderr : stdout, "%s", usage);
    std::exit(code);
  };
  for (int i = 1; i < argc; ++i) {
    const std::string_view a = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) kestrel::cli::die(std::string(a) + " needs a value");
      return argv[++i];
    };
    if (a == "-h" || a == "--help") help(0);
    else if (a == "-m" || a == "--model") o.model = value();
    else if (a == "-p" || a == "--prompt") o.prompt = value();
    else if (a == "-f" || a == "--file") o.file = value();
    else if (a == "--stdin") o.from_stdin = true;
    else if (a == "--ids") o.ids = true;
    else if (a == "--no-bos") o.no_bos = true;
    else if (a == "--no-parse-special") o.parse_special = false;
    else if (a == "--no-escape") o.escape = false;
    else if (a == "--show-count") o.show_count = true;
    else {
      std::fprintf(stderr, "error: unknown argument '%s'\n", argv[i]);
      help(1);
    }
  }
  if (o.model.empty()) {
    std::fprintf(stderr, "error: no model given (-m FILE)\n");
    help(1);
  }
  const int n_sources = (o.prompt ? 1 : 0) + (o.file ? 1 : 0) + (o.from_stdin ? 1 : 0);
  if (n_sources != 1) kestrel::cli::die("give exactly one of -p TEXT, -f FILE, --stdin");
  return o;
}

}  // namespace

int main(int argc, char** argv) {
  const auto o = parse(argc, argv);
  try {
    std::string text;
    if (o.prompt) {
      text = o.escape ? process_escapes(*o.prompt) : *o.prompt;
    } else if (o.file) {
      text = kestrel::io::read_whole_file(*o.file);
    } else {
      text.assign(std::istreambuf_iterator<char>(std::cin), {});
      if (std::cin.bad()) kestrel::cli::die("standard input: read error");
    }
    const auto tok = kestrel::tokenizer_from_gguf(kestrel::io::gguf_file(o.model));
    run(tok, o, text);
  } catch (const std::exception& e) {
    std::fflush(stdout);
    kestrel::cli::die(e.what());
  }
}
