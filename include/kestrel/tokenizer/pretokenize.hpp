// kestrel/tokenizer/pretokenize.hpp: the pre-tokenizers of byte-level BPE
// vocabularies, which cut text into pieces before BPE merges run inside each.
//
// Every vocabulary defines its pre-tokenizer as a list of regexes over Unicode
// categories (HF tokenizer.json `pre_tokenizer`, llama.cpp's per-`tokenizer.ggml.pre`
// regex lists in src/llama-vocab.cpp). They are applied in sequence: regex k
// runs over each piece left by regex k-1 (the piece is the whole subject, so
// `$` and `(?!\S)` see the piece's end) and splits it into its matches and
// the unmatched gaps between them, all kept, in order ("Isolated" in HF terms).
//
// Why no regex library: the library is header-only with Eigen and xsimd as its
// only dependencies, and PCRE2 (the well-kept choice, with JIT) would add a
// compiled dependency for eleven fixed regexes. Each regex here is instead a
// hand-written matcher with the same semantics (alternatives tried in order at
// each position, greedy quantifiers, backtracking worked out by hand where a
// regex needs it, e.g. `\s*[\r\n]+` and `\s+(?!\S)`), over the generated
// tables of unicode.hpp. Every matcher is linear in the piece length. The
// tests compare every pre-tokenizer with Python's `regex` module running the
// exact regex strings in regex_list() (tools/gen_pretokenize_reference.py).
//
// Where llama.cpp deviates from the model's own regex, we follow the model:
// Llama 3 and Qwen2 use `(?i:'s|'t|...)`, whose case folding also lets
// U+017F (long s) match `s`; llama.cpp's rewrite `'[sS]|...` does not.
//
// Invalid UTF-8: each invalid byte is one unit with U+FFFD's properties
// (a symbol, So), as in llama.cpp; pieces always cover the text exactly.
//
//   std::vector<std::string_view> pieces;
//   kestrel::pretokenize(kestrel::pre_tokenizer_from_name("llama-bpe"), "Hello world", pieces);
//   // pieces == {"Hello", " world"}
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "kestrel/core/error.hpp"
#include "kestrel/tokenizer/unicode.hpp"

namespace kestrel {

/// One value per `tokenizer.ggml.pre` name (several share a rule set; see
/// regex_list). `llamacpp_default` is llama.cpp's rule for a BPE vocabulary
/// whose GGUF names no (or an unknown) pre-tokenizer, e.g. gpt-neox.
enum class pre_tokenizer : std::uint8_t {
  llamacpp_default,  // "default"
  gpt2,              // "gpt-2"
  mpt,               // "mpt": gpt2's regex
  starcoder,         // "starcoder": digits one by one, then gpt2's regex
  refact,            // "refact": as starcoder
  falcon,            // "falcon"
  deepseek_llm,      // "deepseek-llm"
  deepseek_coder,    // "deepseek-coder"
  llama3,            // "llama-bpe" (also accepted: "llama3", "llama-v3")
  qwen2,             // "qwen2"
  deepseek_r1_qwen,  // "deepseek-r1-qwen": qwen2's regex
};

namespace detail {

struct pre_tokenizer_name {
  std::string_view name;
  pre_tokenizer value;
};

// Canonical names first (name_of reads the first entry of each value).
inline constexpr std::array<pre_tokenizer_name, 13> pre_tokenizer_names{{
    {"default", pre_tokenizer::llamacpp_default},
    {"gpt-2", pre_tokenizer::gpt2},
    {"mpt", pre_tokenizer::mpt},
    {"starcoder", pre_tokenizer::starcoder},
    {"refact", pre_tokenizer::refact},
    {"falcon", pre_tokenizer::falcon},
    {"deepseek-llm", pre_tokenizer::deepseek_llm},
    {"deepseek-coder", pre_tokenizer::deepseek_coder},
    {"llama-bpe", pre_tokenizer::llama3},
    {"qwen2", pre_tokenizer::qwen2},
    {"deepseek-r1-qwen", pre_tokenizer::deepseek_r1_qwen},
    {"llama3", pre_tokenizer::llama3},
    {"llama-v3", pre_tokenizer::llama3},
}};

// The regex sources, as the model defines them (documentation, and the input
// of the reference generator and the PCRE2 comparison).
inline constexpr std::string_view re_gpt2 =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S))";
inline constexpr std::string_view re_llama3 =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
inline constexpr std::string_view re_qwen2 =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
inline constexpr std::string_view re_deepseek_cjk = "[\u4E00-\u9FA5\u0800-\u4E00\uAC00-\uD7FF]+";

inline constexpr std::string_view regexes_gpt2[] = {re_gpt2};
inline constexpr std::string_view regexes_starcoder[] = {R"(\p{N})", re_gpt2};
inline constexpr std::string_view regexes_falcon[] = {R"([\p{P}\$\+<=>\^~\|`]+)", re_gpt2, "[0-9][0-9][0-9]"};
inline constexpr std::string_view regexes_default[] = {R"([\p{P}\$\+<=>\^~\|]+)", re_gpt2, R"(\p{N}+)",
                                                       "[0-9][0-9][0-9]"};
inline constexpr std::string_view regexes_deepseek_coder[] = {"[\r\n]", R"(\s?\p{L}+)", R"(\s?\p{P}+)",
                                                              re_deepseek_cjk, R"(\p{N})"};
// The second regex's class is tables::deepseek_llm_letters (too long to repeat).
inline constexpr std::string_view regexes_deepseek_llm[] = {
    "[\r\n]", R"(\s?[<tables::deepseek_llm_letters>]+)", "\\s?[!-/:-~\uFF01-\uFF0F\uFF1A-\uFF5E\u2018-\u201F\u3000-\u3002]+",
    R"(\s+$)", re_deepseek_cjk, R"(\p{N}+)"};
inline constexpr std::string_view regexes_llama3[] = {re_llama3};
inline constexpr std::string_view regexes_qwen2[] = {re_qwen2};

// ---- the text as units -----------------------------------------------------

enum : std::uint8_t {
  cls_letter = 1,  // \p{L}
  cls_number = 2,  // \p{N}
  cls_punct = 4,   // \p{P}
  cls_space = 8,   // \s
};

/// The text decoded once: unit i is text[off[i], off[i + 1]).
struct pretok_units {
  std::vector<char32_t> cp;        // (n_units) code point, U+FFFD for an invalid byte
  std::vector<std::uint8_t> cls;   // (n_units) cls_* bits
  std::vector<std::size_t> off;    // (n_units + 1) byte offsets

  void decode(std::string_view text) {
    cp.resize(text.size());  // upper bounds; trimmed below
    cls.resize(text.size());
    off.resize(text.size() + 1);
    std::size_t n = 0;
    for (std::size_t pos = 0; pos < text.size(); ++n) {
      const unicode::decoded d = unicode::decode_utf8(text, pos);
      const unicode::general_category c = unicode::category_of(d.cp);
      std::uint8_t bits = 0;
      if (unicode::is_letter(c)) bits |= cls_letter;
      else if (unicode::is_number(c)) bits |= cls_number;
      else if (unicode::is_punctuation(c)) bits |= cls_punct;
      if (unicode::is_whitespace(d.cp)) bits |= cls_space;
      cp[n] = d.cp;
      cls[n] = bits;
      off[n] = pos;
      pos += d.length;
    }
    off[n] = text.size();
    cp.resize(n);
    cls.resize(n);
    off.resize(n + 1);
  }
  std::size_t size() const noexcept { return cp.size(); }
};

using unit_range = std::pair<std::size_t, std::size_t>;  // [first, last) unit indices

// A matcher returns the length in units of the match at unit i of the piece
// ending at e (i < e), or 0 when the regex does not match at i.

/// Length of the run of units from i (< e) satisfying pred.
template <class Pred>
inline std::size_t run_length(const pretok_units& u, std::size_t i, std::size_t e, Pred pred) {
  std::size_t k = i;
  while (k < e && pred(u, k)) ++k;
  return k - i;
}

inline bool unit_is(const pretok_units& u, std::size_t k, std::uint8_t bits) { return (u.cls[k] & bits) != 0; }
inline constexpr auto is_l = [](const pretok_units& u, std::size_t k) -> bool {
  return unit_is(u, k, cls_letter); };
inline constexpr auto is_n = [](const pretok_units& u, std::size_t k) -> bool {
  return unit_is(u, k, cls_number); };
inline constexpr auto is_p = [](const pretok_units& u, std::size_t k) -> bool {
  return unit_is(u, k, cls_punct); };
inline constexpr auto is_s = [](const pretok_units& u, std::size_t k) -> bool {
  return unit_is(u, k, cls_space); };
/// [^\s\p{L}\p{N}]
inline constexpr auto is_other = [](const pretok_units& u, std::size_t k) -> bool {
  return (u.cls[k] & (cls_space | cls_letter | cls_number)) == 0;
};
inline constexpr auto is_crlf = [](const pretok_units& u, std::size_t k) -> bool {
  return u.cp[k] == U'\r' || u.cp[k] == U'\n'; };

/// `'s|'t|'re|'ve|'m|'ll|'d`, case-sensitive or under (?i:...) (simple case
/// folding: ASCII letters, and U+017F for s).
inline std::size_t match_contraction(const pretok_units& u, std::size_t i, std::size_t e, bool ignore_case) {
  if (u.cp[i] != U'\'' || i + 1 >= e) return 0;
  auto fold = [&](std::size_t k) -> char32_t {
    char32_t c = u.cp[k];
    if (!ignore_case) return c;
    if (c >= U'A' && c <= U'Z') return c + 32;
    if (c == U'\u017F') return U's';
    return c;
  };
  const char32_t a = fold(i + 1);
  if (a == U's' || a == U't' || a == U'm' || a == U'd') return 2;
  if (i + 2 >= e) return 0;
  const char32_t b = fold(i + 2);
  if ((a == U'r' && b == U'e') || (a == U'v' && b == U'e') || (a == U'l' && b == U'l')) return 3;
  return 0;
}

/// GPT-2: 's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)
/// (and a lone \s before \S, which matches nothing, stays a gap of one unit:
/// the same as llama.cpp's trailing `|\s+`).
inline std::size_t match_gpt2(const pretok_units& u, std::size_t i, std::size_t e) {
  if (std::size_t n = match_contraction(u, i, e, false)) return n;
  // ` ?X+` for X = L, N, other: the optional space binds when X follows it.
  std::size_t j = (u.cp[i] == U' ' && i + 1 < e && !is_s(u, i + 1)) ? i + 1 : i;
  if (is_l(u, j)) return j - i + run_length(u, j, e, is_l);
  if (is_n(u, j)) return j - i + run_length(u, j, e, is_n);
  if (is_other(u, j)) return j - i + run_length(u, j, e, is_other);
  // \s+(?!\S): the whitespace run, less its last unit unless the piece ends there.
  const std::size_t k = run_length(u, i, e, is_s);
  if (i + k == e) return k;
  return k > 1 ? k - 1 : 1;
}

/// Llama 3 (max_digits 3) and Qwen2 (max_digits 1):
/// (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+
inline std::size_t match_llama3(const pretok_units& u, std::size_t i, std::size_t e, std::size_t max_digits) {
  if (std::size_t n = match_contraction(u, i, e, true)) return n;
  if (is_l(u, i)) return run_length(u, i, e, is_l);
  if (!is_crlf(u, i) && !is_n(u, i) && i + 1 < e && is_l(u, i + 1)) return 1 + run_length(u, i + 1, e, is_l);
  if (is_n(u, i)) {  // \p{N}{1,max_digits}: look no further than max_digits (linear on long runs)
    std::size_t k = 1;
    while (k < max_digits && i + k < e && is_n(u, i + k)) ++k;
    return k;
  }
  std::size_t j = (u.cp[i] == U' ' && i + 1 < e && is_other(u, i + 1)) ? i + 1 : i;
  if (is_other(u, j)) {
    j += run_length(u, j, e, is_other);
    return j - i + run_length(u, j, e, is_crlf);
  }
  // Whitespace. \s*[\r\n]+ : greedy \s* gives back down to the last \r or \n of the run.
  const std::size_t k = run_length(u, i, e, is_s);
  for (std::size_t p = i + k; p > i; --p)
    if (is_crlf(u, p - 1)) return p - i;
  // \s+(?!\S), else \s+.
  if (i + k == e) return k;
  return k > 1 ? k - 1 : 1;
}

/// \s?X+ for a class X (deepseek).
template <class Pred>
inline std::size_t match_opt_space_run(const pretok_units& u, std::size_t i, std::size_t e, Pred x) {
  if (x(u, i)) return run_length(u, i, e, x);
  if (is_s(u, i) && i + 1 < e && x(u, i + 1)) return 1 + run_length(u, i + 1, e, x);
  return 0;
}

inline constexpr auto is_falcon_punct = [](const pretok_units& u, std::size_t k) -> bool {
  const char32_t c = u.cp[k];
  return is_p(u, k) || c == U'$' || c == U'+' || c == U'<' || c == U'=' || c == U'>' || c == U'^' || c == U'~' ||
         c == U'|' || c == U'`';
};
inline constexpr auto is_default_punct = [](const pretok_units& u, std::size_t k) -> bool {
  return u.cp[k] != U'`' && is_falcon_punct(u, k); };
inline constexpr auto is_ascii_digit = [](const pretok_units& u, std::size_t k) -> bool {
  return u.cp[k] >= U'0' && u.cp[k] <= U'9'; };
inline constexpr auto is_deepseek_cjk = [](const pretok_units& u, std::size_t k) -> bool {
  return u.cp[k] >= 0x800 && unicode::detail::in_ranges(unicode::tables::deepseek_cjk, u.cp[k]);
};
inline constexpr auto is_deepseek_letter = [](const pretok_units& u, std::size_t k) -> bool {
  const char32_t c = u.cp[k];
  if (c < 128) return (c | 32) >= U'a' && (c | 32) <= U'z';
  return unicode::detail::in_ranges(unicode::tables::deepseek_llm_letters, c);
};
inline constexpr auto is_deepseek_punct = [](const pretok_units& u, std::size_t k) -> bool {
  return unicode::detail::in_ranges(unicode::tables::deepseek_llm_punct, u.cp[k]);
};

/// Splits every piece of `in` into matches and gaps (both kept) and appends them to `out`.
template <class Match>
inline void split_each(const pretok_units& u, const std::vector<unit_range>& in, std::vector<unit_range>& out,
                       Match match) {
  for (const auto& [b, e] : in) {
    std::size_t gap = b;
    for (std::size_t i = b; i < e;) {
      const std::size_t n = match(u, i, e);
      if (n == 0) {
        ++i;
        continue;
      }
      if (gap < i) out.emplace_back(gap, i);
      out.emplace_back(i, i + n);
      i += n;
      gap = i;
    }
    if (gap < e) out.emplace_back(gap, e);
  }
}

/// \s+$ : at most one match per piece, its trailing whitespace run (done
/// directly: trying every position would be quadratic on long runs).
inline void split_trailing_space(const pretok_units& u, const std::vector<unit_range>& in,
                                 std::vector<unit_range>& out) {
  for (const auto& [b, e] : in) {
    std::size_t t = e;
    while (t > b && is_s(u, t - 1)) --t;
    if (b < t) out.emplace_back(b, t);
    if (t < e) out.emplace_back(t, e);
  }
}

template <class Match>
inline auto step(Match m) {
  return [m](const pretok_units& u, std::vector<unit_range>& in, std::vector<unit_range>& out) {
    out.clear();
    split_each(u, in, out, m);
    in.swap(out);
  };
}

inline constexpr auto m_gpt2 =
    [](const pretok_units& u, std::size_t i, [[maybe_unused]] std::size_t e) -> std::size_t { return match_gpt2(u, i, e); };
inline constexpr auto m_llama3 =
    [](const pretok_units& u, std::size_t i, [[maybe_unused]] std::size_t e) -> std::size_t { return match_llama3(u, i, e, 3); };
inline constexpr auto m_qwen2 =
    [](const pretok_units& u, std::size_t i, [[maybe_unused]] std::size_t e) -> std::size_t { return match_llama3(u, i, e, 1); };
inline constexpr auto m_one_number =
    [](const pretok_units& u, std::size_t i, [[maybe_unused]] std::size_t e) -> std::size_t { return is_n(u, i) ? 1 : 0; };
inline constexpr auto m_numbers =
    [](const pretok_units& u, std::size_t i, [[maybe_unused]] std::size_t e) -> std::size_t { return run_length(u, i, e, is_n); };
inline constexpr auto m_three_digits =
    [](const pretok_units& u, std::size_t i, [[maybe_unused]] std::size_t e) -> std::size_t {
  return i + 3 <= e && is_ascii_digit(u, i) && is_ascii_digit(u, i + 1) && is_ascii_digit(u, i + 2) ? 3 : 0;
};
inline constexpr auto m_falcon_punct =
    [](const pretok_units& u, std::size_t i, [[maybe_unused]] std::size_t e) -> std::size_t {
  return run_length(u, i, e, is_falcon_punct);
};
inline constexpr auto m_default_punct =
    [](const pretok_units& u, std::size_t i, [[maybe_unused]] std::size_t e) -> std::size_t {
  return run_length(u, i, e, is_default_punct);
};
inline constexpr auto m_crlf =
    [](const pretok_units& u, std::size_t i, [[maybe_unused]] std::size_t e) -> std::size_t { return is_crlf(u, i) ? 1 : 0; };
inline constexpr auto m_space_letters =
    [](const pretok_units& u, std::size_t i, [[maybe_unused]] std::size_t e) -> std::size_t {
  return match_opt_space_run(u, i, e, is_l);
};
inline constexpr auto m_space_puncts =
    [](const pretok_units& u, std::size_t i, [[maybe_unused]] std::size_t e) -> std::size_t {
  return match_opt_space_run(u, i, e, is_p);
};
inline constexpr auto m_cjk =
    [](const pretok_units& u, std::size_t i, [[maybe_unused]] std::size_t e) -> std::size_t {
  return run_length(u, i, e, is_deepseek_cjk);
};
inline constexpr auto m_deepseek_letters =
    [](const pretok_units& u, std::size_t i, [[maybe_unused]] std::size_t e) -> std::size_t {
  return match_opt_space_run(u, i, e, is_deepseek_letter);
};
inline constexpr auto m_deepseek_puncts =
    [](const pretok_units& u, std::size_t i, [[maybe_unused]] std::size_t e) -> std::size_t {
  return match_opt_space_run(u, i, e, is_deepseek_punct);
};

}  // namespace detail

/// The canonical `tokenizer.ggml.pre` name of `p`.
constexpr std::string_view name_of(pre_tokenizer p) noexcept {
  for (const auto& n : detail::pre_tokenizer_names)
    if (n.value == p) return n.name;
  return "unknown";
}

/// Parses a `tokenizer.ggml.pre` value; throws invalid_argument naming it and
/// listing the known names.
inline pre_tokenizer pre_tokenizer_from_name(std::string_view name) {
  for (const auto& n : detail::pre_tokenizer_names)
    if (n.name == name) return n.value;
  std::string msg = "unknown pre-tokenizer '" + std::string(name) + "' (known:";
  for (std::size_t i = 0; i < detail::pre_tokenizer_names.size(); ++i) {
    msg += i ? ", " : " ";
    msg += detail::pre_tokenizer_names[i].name;
  }
  throw invalid_argument(msg + ")");
}

/// The regexes `p` applies in sequence, as the model defines them.
constexpr std::span<const std::string_view> regex_list(pre_tokenizer p) noexcept {
  switch (p) {
    case pre_tokenizer::gpt2:
    case pre_tokenizer::mpt: return detail::regexes_gpt2;
    case pre_tokenizer::starcoder:
    case pre_tokenizer::refact: return detail::regexes_starcoder;
    case pre_tokenizer::falcon: return detail::regexes_falcon;
    case pre_tokenizer::deepseek_llm: return detail::regexes_deepseek_llm;
    case pre_tokenizer::deepseek_coder: return detail::regexes_deepseek_coder;
    case pre_tokenizer::llama3: return detail::regexes_llama3;
    case pre_tokenizer::qwen2:
    case pre_tokenizer::deepseek_r1_qwen: return detail::regexes_qwen2;
    case pre_tokenizer::llamacpp_default: break;
  }
  return detail::regexes_default;
}

/// Appends the pieces of `text` under `p` to `out`: non-empty, contiguous
/// substrings of `text` that cover it in order. Linear time; never throws for
/// any bytes (invalid UTF-8 included) other than std::bad_alloc.
inline void pretokenize(pre_tokenizer p, std::string_view text, std::vector<std::string_view>& out) {
  if (text.empty()) return;
  using namespace detail;
  pretok_units u;
  u.decode(text);
  std::vector<unit_range> pieces{{0, u.size()}}, scratch;
  auto run = [&](auto... matchers) { (step(matchers)(u, pieces, scratch), ...); };
  switch (p) {
    case pre_tokenizer::gpt2:
    case pre_tokenizer::mpt: run(m_gpt2); break;
    case pre_tokenizer::starcoder:
    case pre_tokenizer::refact: run(m_one_number, m_gpt2); break;
    case pre_tokenizer::falcon: run(m_falcon_punct, m_gpt2, m_three_digits); break;
    case pre_tokenizer::llamacpp_default: run(m_default_punct, m_gpt2, m_numbers, m_three_digits); break;
    case pre_tokenizer::deepseek_coder: run(m_crlf, m_space_letters, m_space_puncts, m_cjk, m_one_number); break;
    case pre_tokenizer::deepseek_llm:
      run(m_crlf, m_deepseek_letters, m_deepseek_puncts);
      scratch.clear();
      split_trailing_space(u, pieces, scratch);
      pieces.swap(scratch);
      run(m_cjk, m_numbers);
      break;
    case pre_tokenizer::llama3: run(m_llama3); break;
    case pre_tokenizer::qwen2:
    case pre_tokenizer::deepseek_r1_qwen: run(m_qwen2); break;
  }
  out.reserve(out.size() + pieces.size());
  for (const auto& [b, e] : pieces) out.emplace_back(text.data() + u.off[b], u.off[e] - u.off[b]);
}

/// The pieces of `text` as a new vector.
inline std::vector<std::string_view> pretokenize(pre_tokenizer p, std::string_view text) {
  std::vector<std::string_view> out;
  pretokenize(p, text, out);
  return out;
}

}  // namespace kestrel
