// kestrel/tokenizer/bpe_loaders.hpp: byte-level BPE vocabularies from the four
// file formats that carry them:
//   - GGUF (tokenizer.ggml.model = "gpt2"), as llama.cpp's converters write it;
//   - HF tokenizers' tokenizer.json (model.type "BPE");
//   - OpenAI's encoder.json + vocab.bpe (= HF vocab.json + merges.txt);
//   - tiktoken rank files (*.tiktoken: "base64(token bytes) rank" per line).
// Every malformed input is a kestrel::file_error naming the file and, where
// one exists, the byte offset (or array element) of the bad entry.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "kestrel/core/error.hpp"
#include "kestrel/core/token.hpp"
#include "kestrel/io/gguf.hpp"
#include "kestrel/io/json.hpp"
#include "kestrel/tokenizer/bpe_vocab.hpp"

namespace kestrel {

namespace detail {

/// Splits a merge "a b" at its first space after the first character (a
/// token may itself begin with a space in vocabularies that are not
/// byte-mapped, as llama.cpp allows); false when there is none.
/// Calls f(line, byte offset, 1-based line number) for each non-empty line
/// of `text` ("\n" or "\r\n" endings).
template <class F>
void for_each_line(std::string_view text, F&& f) {
  std::size_t pos = 0, line_no = 0;
  while (pos < text.size()) {
    std::size_t end = text.find('\n', pos);
    if (end == std::string_view::npos) end = text.size();
    std::string_view line = text.substr(pos, end - pos);
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    const std::size_t at = pos;
    pos = end + 1;
    ++line_no;
    if (!line.empty()) f(line, at, line_no);
  }
}

inline bool split_merge(std::string_view m, std::pair<std::string, std::string>& out) {
  if (m.size() < 3) return false;
  const std::size_t sp = m.find(' ', 1);
  if (sp == std::string_view::npos || sp + 1 >= m.size()) return false;
  out.first.assign(m.substr(0, sp));
  out.second.assign(m.substr(sp + 1));
  return true;
}

/// Pre-tokenizer names whose models also use Llama 3's ignore_merges rule
/// (llama.cpp sets it, and add_bos, for these tokenizer.ggml.pre values).
inline bool is_llama3_pre(std::string_view pre) {
  return pre == "llama-bpe" || pre == "llama3" || pre == "llama-v3" || pre == "falcon3";
}

/// Well-known special-token spellings -> bos/eos/eot/pad, for formats that
/// do not name them (tokenizer.json, encoder.json). Only sets ids still unset.
inline void guess_special_ids(bpe_vocab& v, std::string_view tok, token_id id) {
  auto set = [&](token_id& slot) { if (slot == no_token) slot = id; };
  if (tok == "<|endoftext|>") { set(v.bos); set(v.eos); }
  else if (tok == "<|begin_of_text|>" || tok == "<s>" || tok == "<｜begin▁of▁sentence｜>") set(v.bos);
  else if (tok == "<|end_of_text|>" || tok == "</s>" || tok == "<｜end▁of▁sentence｜>") set(v.eos);
  else if (tok == "<|eot_id|>" || tok == "<|im_end|>") set(v.eot);
  else if (tok == "<pad>" || tok == "<|padding|>") set(v.pad);
}

}  // namespace detail

// ---------------------------------------------------------------- GGUF

/// Reads tokenizer.ggml.{model, pre, tokens, merges, token_type,
/// bos/eos/eot/padding/unknown_token_id, add_bos_token, add_eos_token}.
/// The model must be "gpt2". A missing pre is "default". ignore_merges and
/// add_bos follow llama.cpp: on for the Llama 3 pre-tokenizers, add_bos off
/// otherwise, both unless the file's add_bos_token says otherwise.
inline bpe_vocab bpe_vocab_from_gguf(const io::gguf_file& f) {
  const std::string path = f.path();
  const auto model = f.get_optional<std::string_view>("tokenizer.ggml.model");
  if (!model) throw file_error(path, "no tokenizer.ggml.model: the file carries no vocabulary");
  if (*model != "gpt2")
    throw file_error(path, "tokenizer.ggml.model is '" + std::string(*model) +
                               "'; bpe_tokenizer reads only byte-level BPE vocabularies ('gpt2')");
  if (!f.has("tokenizer.ggml.tokens")) throw file_error(path, "tokenizer.ggml.tokens is missing");
  if (!f.has("tokenizer.ggml.merges"))
    throw file_error(path, "tokenizer.ggml.merges is missing: a byte-level BPE vocabulary needs its merges");

  bpe_vocab v;
  {
    const auto toks = f.get_array<std::string_view>("tokenizer.ggml.tokens");
    v.tokens.reserve(toks.size());
    for (auto t : toks) v.tokens.emplace_back(t);
  }
  {
    const auto merges = f.get_array<std::string_view>("tokenizer.ggml.merges");
    v.merges.resize(merges.size());
    for (std::size_t i = 0; i < merges.size(); ++i)
      if (!detail::split_merge(merges[i], v.merges[i]))
        throw file_error(path, "tokenizer.ggml.merges element " + std::to_string(i) + " is '" +
                                   std::string(merges[i]) + "', expected two tokens separated by a space");
  }
  if (f.has("tokenizer.ggml.token_type")) v.types = f.get_array<std::int32_t>("tokenizer.ggml.token_type");

  auto id = [&](const char* key) -> token_id {
    const auto x = f.get_optional<std::int64_t>(key);
    if (!x || *x == -1 || *x == 0xFFFFFFFFll) return no_token;
    if (*x < 0 || *x >= static_cast<std::int64_t>(v.tokens.size()))
      throw file_error(path, std::string(key) + " = " + std::to_string(*x) + " is outside the vocabulary of " +
                                 std::to_string(v.tokens.size()));
    return static_cast<token_id>(*x);
  };
  v.bos = id("tokenizer.ggml.bos_token_id");
  v.eos = id("tokenizer.ggml.eos_token_id");
  v.eot = id("tokenizer.ggml.eot_token_id");
  v.pad = id("tokenizer.ggml.padding_token_id");
  v.unk = id("tokenizer.ggml.unknown_token_id");
  v.pre = std::string(f.get_optional<std::string_view>("tokenizer.ggml.pre").value_or("default"));
  v.ignore_merges = detail::is_llama3_pre(v.pre);
  v.add_bos = f.get_optional<bool>("tokenizer.ggml.add_bos_token").value_or(v.ignore_merges) && v.bos != no_token;
  v.add_eos = f.get_optional<bool>("tokenizer.ggml.add_eos_token").value_or(false) && v.eos != no_token;
  validate_from_file(v, path);
  return v;
}

inline bpe_vocab load_bpe_gguf(const std::filesystem::path& path) { return bpe_vocab_from_gguf(io::gguf_file(path)); }

// ---------------------------------------------------------------- tokenizer.json

/// The pre-tokenizer regexes of HF tokenizer.json files that we recognise,
/// by their GGUF names (the same table llama.cpp's convert_hf_to_gguf.py
/// keys by tokenizer hash; here by the pattern itself).
inline std::string_view pre_name_of_hf_regex(std::string_view re) {
  if (re == R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)")
    return "llama-bpe";
  if (re == R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)")
    return "qwen2";
  if (re == R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)") return "gpt-2";
  return {};
}

/// Reads an HF tokenizer.json whose model is BPE: model.vocab (token -> id),
/// model.merges (as "a b" strings or [a, b] pairs), model.ignore_merges,
/// added_tokens (special -> control, others -> user-defined; ids beyond the
/// vocab extend it), and the pre_tokenizer: ByteLevel with its regex -> "gpt-2",
/// a Split by a known regex (Llama 3, Qwen 2) -> that name; anything else is
/// a file_error naming it. bos/eos/eot/pad come from well-known spellings
/// (<|endoftext|>, <|begin_of_text|>, <|eot_id|>, ...): tokenizer.json does
/// not name them (tokenizer_config.json does). add_bos follows the
/// post_processor: on when it is a TemplateProcessing that starts with bos.
inline bpe_vocab bpe_vocab_from_hf_json(const io::json_value& j, const std::string& path) {
  auto bad = [&](const io::json_value& at, const std::string& what) -> file_error {
    return file_error(path, at.offset(), "tokenizer.json: " + what);
  };
  if (!j.is_object()) throw bad(j, "the top level is not an object");
  const io::json_value* model = j.find("model");
  if (!model || !model->is_object()) throw bad(j, "no \"model\" object");
  if (const auto* type = model->find("type"); type && (!type->is_string() || type->as_string() != "BPE"))
    throw bad(*type, "model.type is " + (type->is_string() ? "'" + type->as_string() + "'" : std::string("not a string")) +
                         "; bpe_tokenizer reads only BPE models");
  for (const char* k : {"continuing_subword_prefix", "end_of_word_suffix"})
    if (const auto* x = model->find(k); x && x->is_string() && !x->as_string().empty())
      throw bad(*x, std::string("model.") + k + " '" + x->as_string() + "' is not supported (not a byte-level BPE)");
  const io::json_value* vocab = model->find("vocab");
  const io::json_value* merges = model->find("merges");
  if (!vocab || !vocab->is_object()) throw bad(*model, "model.vocab is missing or not an object");
  if (!merges || !merges->is_array()) throw bad(*model, "model.merges is missing or not an array");

  bpe_vocab v;
  std::vector<bool> have;
  std::vector<std::int32_t> types;
  auto put = [&](const io::json_value& at, std::string tok, std::int64_t id, std::int32_t type) {
    if (id < 0 || id >= (std::int64_t{1} << 31) - 1) throw bad(at, "token id " + std::to_string(id) + " out of range");
    const auto i = static_cast<std::size_t>(id);
    if (i >= v.tokens.size()) {
      v.tokens.resize(i + 1);
      have.resize(i + 1, false);
      types.resize(i + 1, token_type::normal);
    }
    if (have[i] && v.tokens[i] != tok)
      throw bad(at, "token id " + std::to_string(id) + " given to both '" + v.tokens[i] + "' and '" + tok + "'");
    v.tokens[i] = std::move(tok);
    have[i] = true;
    types[i] = type;
  };
  for (const auto& [tok, idv] : vocab->as_object()) {
    if (!idv.is_number()) throw bad(idv, "model.vocab['" + tok + "'] is not a number");
    std::int64_t id;
    try {
      id = idv.as_int();
    } catch (const invalid_argument&) {
      throw bad(idv, "model.vocab['" + tok + "'] is not an integer");
    }
    put(idv, tok, id, token_type::normal);
  }
  if (const auto* added = j.find("added_tokens"); added && !added->is_null()) {
    if (!added->is_array()) throw bad(*added, "added_tokens is not an array");
    for (const auto& a : added->as_array()) {
      const auto* id = a.find("id");
      const auto* content = a.find("content");
      if (!id || !id->is_number() || !content || !content->is_string())
        throw bad(a, "an added_tokens entry without a numeric id and a string content");
      const auto* special = a.find("special");
      const bool is_special = special && special->is_bool() && special->as_bool();
      std::int64_t n;
      try {
        n = id->as_int();
      } catch (const invalid_argument&) {
        throw bad(*id, "added token id is not an integer");
      }
      put(a, content->as_string(), n, is_special ? token_type::control : token_type::user_defined);
    }
  }
  for (std::size_t i = 0; i < have.size(); ++i)
    if (!have[i]) throw bad(*vocab, "no token has id " + std::to_string(i) + " (ids must be 0..n-1)");
  v.types = std::move(types);

  v.merges.resize(merges->size());
  for (std::size_t r = 0; r < merges->size(); ++r) {
    const io::json_value& m = merges->as_array()[r];
    if (m.is_string()) {
      if (!detail::split_merge(m.as_string(), v.merges[r]))
        throw bad(m, "merge " + std::to_string(r) + " '" + m.as_string() + "' is not two tokens separated by a space");
    } else if (m.is_array() && m.size() == 2 && m.as_array()[0].is_string() && m.as_array()[1].is_string()) {
      v.merges[r] = {m.as_array()[0].as_string(), m.as_array()[1].as_string()};
    } else {
      throw bad(m, "merge " + std::to_string(r) + " is neither \"a b\" nor [\"a\", \"b\"]");
    }
  }
  if (const auto* im = model->find("ignore_merges"); im && im->is_bool()) v.ignore_merges = im->as_bool();

  // Pre-tokenizer.
  const io::json_value* pt = j.find("pre_tokenizer");
  if (!pt || pt->is_null()) throw bad(j, "no pre_tokenizer: a byte-level BPE needs one (ByteLevel or a Split regex)");
  std::string pre;
  bool byte_level = false;
  auto visit = [&](const io::json_value& p) {
    const auto* type = p.find("type");
    if (!type || !type->is_string()) throw bad(p, "a pre_tokenizer without a type");
    const std::string& t = type->as_string();
    if (t == "ByteLevel") {
      byte_level = true;
      const auto* use_regex = p.find("use_regex");
      if (!use_regex || !use_regex->is_bool() || use_regex->as_bool()) {
        if (!pre.empty() && pre != "gpt-2") throw bad(p, "two regex pre-tokenizers in sequence");
        pre = "gpt-2";
      }
      if (const auto* aps = p.find("add_prefix_space"); aps && aps->is_bool() && aps->as_bool())
        throw bad(*aps, "ByteLevel add_prefix_space = true is not supported");
    } else if (t == "Split") {
      const auto* pattern = p.find("pattern");
      const auto* re = pattern ? pattern->find("Regex") : nullptr;
      if (!re || !re->is_string()) throw bad(p, "a Split pre_tokenizer without a Regex pattern");
      const std::string_view name = pre_name_of_hf_regex(re->as_string());
      if (name.empty()) throw bad(*re, "unrecognised pre-tokenizer regex " + re->as_string());
      if (!pre.empty()) throw bad(p, "two regex pre-tokenizers in sequence");
      pre = name;
    } else {
      throw bad(p, "unsupported pre_tokenizer type '" + t + "'");
    }
  };
  const auto* pt_type = pt->find("type");
  if (pt_type && pt_type->is_string() && pt_type->as_string() == "Sequence") {
    const auto* list = pt->find("pretokenizers");
    if (!list || !list->is_array()) throw bad(*pt, "a Sequence pre_tokenizer without a pretokenizers array");
    for (const auto& p : list->as_array()) visit(p);
  } else {
    visit(*pt);
  }
  if (!byte_level) throw bad(*pt, "the pre_tokenizer has no ByteLevel step: not a byte-level BPE");
  if (pre.empty()) throw bad(*pt, "the pre_tokenizer has no regex step");
  v.pre = std::move(pre);

  for (std::size_t i = 0; i < v.tokens.size(); ++i)
    if (v.types[i] != token_type::normal) detail::guess_special_ids(v, v.tokens[i], static_cast<token_id>(i));
  if (v.bos == no_token && v.eos == no_token)  // GPT-2's one special token is a normal vocab entry
    for (std::size_t i = 0; i < v.tokens.size(); ++i)
      if (v.tokens[i] == "<|endoftext|>") detail::guess_special_ids(v, v.tokens[i], static_cast<token_id>(i));
  if (v.bos != no_token) v.types[static_cast<std::size_t>(v.bos)] = token_type::control;
  if (v.eos != no_token) v.types[static_cast<std::size_t>(v.eos)] = token_type::control;

  // add_bos: a TemplateProcessing post-processor whose single template starts with bos.
  if (const auto* pp = j.find("post_processor"); pp && pp->is_object() && v.bos != no_token) {
    const io::json_value* single = pp->find("single");
    if (const auto* list = pp->find("processors"); list && list->is_array())
      for (const auto& p : list->as_array())
        if (const auto* s = p.find("single")) single = s;
    if (single && single->is_array() && single->size() > 0)
      if (const auto* st = single->as_array()[0].find("SpecialToken"))
        if (const auto* sid = st->find("id"); sid && sid->is_string() && sid->as_string() == v.tokens[static_cast<std::size_t>(v.bos)])
          v.add_bos = true;
  }
  validate_from_file(v, path);
  return v;
}

inline bpe_vocab load_bpe_hf_json(const std::filesystem::path& path) {
  return bpe_vocab_from_hf_json(io::read_json_file(path), path.string());
}

// ---------------------------------------------------------------- encoder.json + vocab.bpe

/// The merges of a vocab.bpe / merges.txt: an optional "#version" first line,
/// then one "a b" per line; blank lines are skipped.
inline std::vector<std::pair<std::string, std::string>> read_bpe_merges(const std::filesystem::path& path) {
  const std::string text = io::read_whole_file(path);
  std::vector<std::pair<std::string, std::string>> merges;
  merges.reserve(text.size() / 8);
  detail::for_each_line(text, [&](std::string_view line, std::size_t at, std::size_t line_no) {
    if (line_no == 1 && line.starts_with("#version")) return;
    std::pair<std::string, std::string> m;
    if (!detail::split_merge(line, m) || m.second.find(' ') != std::string::npos)
      throw file_error(path.string(), at, "line " + std::to_string(line_no) + " is '" + std::string(line.substr(0, 80)) +
                                              "', expected two tokens separated by one space");
    merges.push_back(std::move(m));
  });
  return merges;
}

/// OpenAI's encoder.json (token -> id) with vocab.bpe (merges). `pre` is the
/// pre-tokenizer by GGUF name (the files do not say: GPT-2's own is
/// "gpt-2"; Llama 3's, with ignore_merges, "llama-bpe"). "<|endoftext|>"
/// (and the other well-known spellings) become control tokens and bos/eos.
inline bpe_vocab load_bpe_openai(const std::filesystem::path& encoder_json, const std::filesystem::path& vocab_bpe,
                                 std::string pre = "gpt-2", bool ignore_merges = false) {
  const std::string path = encoder_json.string();
  const io::json_value j = io::read_json_file(encoder_json);
  if (!j.is_object()) throw file_error(path, j.offset(), "encoder.json: the top level is not an object (token -> id)");
  bpe_vocab v;
  std::vector<bool> have(j.size(), false);
  v.tokens.resize(j.size());
  for (const auto& [tok, idv] : j.as_object()) {
    std::int64_t id = -1;
    if (idv.is_number()) {
      try {
        id = idv.as_int();
      } catch (const invalid_argument&) {
      }
    }
    if (id < 0) throw file_error(path, idv.offset(), "encoder.json: the id of '" + tok + "' is not a non-negative integer");
    if (static_cast<std::size_t>(id) >= v.tokens.size())
      throw file_error(path, idv.offset(), "encoder.json: id " + std::to_string(id) + " of '" + tok + "' is not below the " +
                                               std::to_string(v.tokens.size()) + " entries (ids must be 0..n-1)");
    if (have[static_cast<std::size_t>(id)])
      throw file_error(path, idv.offset(), "encoder.json: id " + std::to_string(id) + " given twice");
    have[static_cast<std::size_t>(id)] = true;
    v.tokens[static_cast<std::size_t>(id)] = tok;
  }
  v.merges = read_bpe_merges(vocab_bpe);
  v.types.assign(v.tokens.size(), token_type::normal);
  for (std::size_t i = 0; i < v.tokens.size(); ++i) {
    const std::string& t = v.tokens[i];
    if (t.size() > 2 && t.front() == '<' && t.back() == '>' && (t[1] == '|' || t == "<s>" || t == "</s>")) {
      detail::guess_special_ids(v, t, static_cast<token_id>(i));
      if (static_cast<token_id>(i) == v.bos || static_cast<token_id>(i) == v.eos || static_cast<token_id>(i) == v.eot)
        v.types[i] = token_type::control;
    }
  }
  v.pre = std::move(pre);
  v.ignore_merges = ignore_merges;
  validate_from_file(v, path);
  return v;
}

// ---------------------------------------------------------------- tiktoken

/// The bytes of standard base64 `s` (with '=' padding); false if malformed.
inline bool base64_decode(std::string_view s, std::string& out) {
  out.clear();
  if (s.size() % 4 != 0) return false;
  auto val = [](char c) -> int {
    if (c >= 'A' && c <= 'Z') return c - 'A';
    if (c >= 'a' && c <= 'z') return c - 'a' + 26;
    if (c >= '0' && c <= '9') return c - '0' + 52;
    if (c == '+') return 62;
    if (c == '/') return 63;
    return -1;
  };
  for (std::size_t i = 0; i < s.size(); i += 4) {
    const bool last = i + 4 == s.size();
    const int pad = (s[i + 3] == '=') + (s[i + 2] == '=' && s[i + 3] == '=');
    if (pad > 0 && !last) return false;
    const int a = val(s[i]), b = val(s[i + 1]);
    const int c = pad >= 2 ? 0 : val(s[i + 2]);
    const int d = pad >= 1 ? 0 : val(s[i + 3]);
    if (a < 0 || b < 0 || c < 0 || d < 0) return false;
    const std::uint32_t x = (static_cast<std::uint32_t>(a) << 18) | (static_cast<std::uint32_t>(b) << 12) |
                            (static_cast<std::uint32_t>(c) << 6) | static_cast<std::uint32_t>(d);
    out += static_cast<char>(x >> 16);
    if (pad < 2) out += static_cast<char>((x >> 8) & 0xFF);
    if (pad < 1) out += static_cast<char>(x & 0xFF);
  }
  return true;
}

/// A tiktoken rank file: "base64(bytes) rank" per line; the rank is the
/// token id and the merge priority (merges_from_ranks), and a pre-token that
/// is a token is emitted whole (tiktoken's first step, = ignore_merges).
/// Ranks must be 0..n-1, each once. The file holds no special tokens
/// (cl100k's <|endoftext|> = 100257 etc. live in tiktoken's code). `pre` is
/// the pre-tokenizer's GGUF name: cl100k_base's regex is Llama 3's
/// ("llama-bpe"); r50k/p50k use GPT-2's ("gpt-2").
inline bpe_vocab load_bpe_tiktoken(const std::filesystem::path& path, std::string pre = "llama-bpe") {
  const std::string text = io::read_whole_file(path);
  const std::string p = path.string();
  bpe_vocab v;
  std::vector<bool> have;
  std::string bytes;
  detail::for_each_line(text, [&](std::string_view line, std::size_t at, std::size_t line_no) {
    auto bad = [&](const std::string& what) {
      return file_error(p, at, "line " + std::to_string(line_no) + ": " + what);
    };
    const std::size_t sp = line.find(' ');
    if (sp == std::string_view::npos) throw bad("expected 'base64 rank', found no space");
    if (!base64_decode(line.substr(0, sp), bytes) || bytes.empty())
      throw bad("'" + std::string(line.substr(0, std::min<std::size_t>(sp, 60))) + "' is not non-empty base64");
    const std::string_view num = line.substr(sp + 1);
    std::uint64_t rank = 0;
    if (num.empty() || num.size() > 10) throw bad("bad rank '" + std::string(num.substr(0, 20)) + "'");
    for (char c : num) {
      if (c < '0' || c > '9') throw bad("bad rank '" + std::string(num) + "'");
      rank = rank * 10 + static_cast<std::uint64_t>(c - '0');
    }
    if (rank >= (std::uint64_t{1} << 31) - 1) throw bad("rank " + std::to_string(rank) + " out of range");
    const auto r = static_cast<std::size_t>(rank);
    if (r >= v.tokens.size()) {
      v.tokens.resize(r + 1);
      have.resize(r + 1, false);
    }
    if (have[r]) throw bad("rank " + std::to_string(rank) + " given twice");
    have[r] = true;
    v.tokens[r] = gpt2_encode_bytes(bytes);
  });
  if (v.tokens.empty()) throw file_error(p, "no tokens: an empty tiktoken file");
  for (std::size_t i = 0; i < have.size(); ++i)
    if (!have[i]) throw file_error(p, "no token has rank " + std::to_string(i) + " (ranks must be 0..n-1)");
  v.merges_from_ranks = true;
  v.ignore_merges = true;
  v.pre = std::move(pre);
  validate_from_file(v, p);
  return v;
}

}  // namespace kestrel
