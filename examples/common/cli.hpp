// examples/common/cli.hpp: the command-line options shared by kestrel's
// programs, with llama.cpp's flag names, and the model set-up they share.
#pragma once

#include <charconv>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <limits>
#include <map>
#include <optional>
#include <random>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "kestrel/kestrel.hpp"

namespace kestrel::cli {

struct options {
  std::string model;                   // -m
  std::optional<std::string> tokenizer;  // --tokenizer (llama2.c checkpoints)
  std::string prompt;                  // -p
  long n_predict = 256;                // -n (-1 or -2: until EOS or a full context)
  bool ignore_eos = false;             // --ignore-eos: EOS, BOS and stop tokens are never sampled
  float temperature = 0.8f;            // --temp
  std::int32_t top_k = 40;             // --top-k
  float top_p = 0.95f;                 // --top-p
  float min_p = 0.05f;                 // --min-p
  std::int32_t repeat_last_n = 64;     // --repeat-last-n (0: off, -1: the context size)
  float repeat_penalty = 1.0f;         // --repeat-penalty (1: off)
  float frequency_penalty = 0.0f;      // --frequency-penalty (0: off)
  float presence_penalty = 0.0f;       // --presence-penalty (0: off)
  long long seed = -1;                 // --seed (-1: random, printed to stderr)
  long n_threads = 0;                  // -t (0: all hardware threads)
  long n_ctx = 0;                      // -c (0: the model's training context)
  // --mmap: weights read in place; --no-mmap: copied into huge pages;
  // default: copied while the copy is fast (weight_placement::automatic)
  weight_placement placement = weight_placement::automatic;
};

[[noreturn]] inline void die(const std::string& msg) {
  std::fprintf(stderr, "error: %s\n", msg.c_str());
  std::exit(1);
}

template <class T>
T parse_number(std::string_view flag, std::string_view s) {
  T v{};
  const auto* end = s.data() + s.size();
  auto [p, ec] = std::from_chars(s.data(), end, v);
  if (ec != std::errc() || p != end) die(std::string(flag) + ": '" + std::string(s) + "' is not a valid number");
  return v;
}

/// Parses argv; `usage` is printed for -h and for mistakes. Flags beyond the
/// common ones can be added by the caller through `extra`.
inline options parse(int argc, char** argv, const char* usage,
                     const std::map<std::string, std::function<void(std::string_view)>>& extra = {}) {
  options o;
  auto help = [&](int code) {
    std::fprintf(code ? stderr : stdout, "%s", usage);
    std::exit(code);
  };
  for (int i = 1; i < argc; ++i) {
    const std::string_view a = argv[i];
    if (a == "-h" || a == "--help") help(0);
    if (a == "--ignore-eos") {
      o.ignore_eos = true;
      continue;
    }
    if (a == "--mmap" || a == "--no-mmap") {
      o.placement = a == "--mmap" ? weight_placement::file : weight_placement::huge_pages;
      continue;
    }
    auto value = [&]() -> std::string_view {
      if (i + 1 >= argc) die(std::string(a) + " needs a value");
      return argv[++i];
    };
    if (a == "-m" || a == "--model") o.model = value();
    else if (a == "--tokenizer") o.tokenizer = std::string(value());
    else if (a == "-p" || a == "--prompt") o.prompt = value();
    else if (a == "-n" || a == "--n-predict") o.n_predict = parse_number<long>(a, value());
    else if (a == "--temp") o.temperature = parse_number<float>(a, value());
    else if (a == "--top-k") o.top_k = parse_number<std::int32_t>(a, value());
    else if (a == "--top-p") o.top_p = parse_number<float>(a, value());
    else if (a == "--min-p") o.min_p = parse_number<float>(a, value());
    else if (a == "--repeat-last-n") o.repeat_last_n = parse_number<std::int32_t>(a, value());
    else if (a == "--repeat-penalty") o.repeat_penalty = parse_number<float>(a, value());
    else if (a == "--frequency-penalty") o.frequency_penalty = parse_number<float>(a, value());
    else if (a == "--presence-penalty") o.presence_penalty = parse_number<float>(a, value());
    else if (a == "-s" || a == "--seed") o.seed = parse_number<long long>(a, value());
    else if (a == "-t" || a == "--threads") o.n_threads = parse_number<long>(a, value());
    else if (a == "-c" || a == "--ctx-size") o.n_ctx = parse_number<long>(a, value());
    else if (auto it = extra.find(std::string(a)); it != extra.end()) it->second(value());
    else {
      std::fprintf(stderr, "error: unknown argument '%s'\n", argv[i]);
      help(1);
    }
  }
  if (o.model.empty()) {
    std::fprintf(stderr, "error: no model given (-m FILE)\n");
    help(1);
  }
  if (o.n_predict < -2)
    die("-n must be >= 0, or -1 / -2 for no limit but EOS and the context, got " + std::to_string(o.n_predict));
  if (o.n_threads < 0) die("-t must be >= 1, got " + std::to_string(o.n_threads));
  if (o.n_ctx < 0) die("-c must be >= 0, got " + std::to_string(o.n_ctx));
  if (o.repeat_last_n < -1)
    die("--repeat-last-n must be >= -1 (0: off, -1: the context size), got " + std::to_string(o.repeat_last_n));
  if (o.n_threads == 0) o.n_threads = std::max(1u, std::thread::hardware_concurrency());
  return o;
}

/// generate()'s options from the flags: at most -n tokens, or no limit for
/// llama.cpp's -1 ("infinity") and -2 ("until the context is filled"), where
/// generate() stops at EOS or a full context; --ignore-eos.
inline generation_options generation(const options& o) {
  generation_options g;
  g.n_predict = o.n_predict < 0 ? std::numeric_limits<std::size_t>::max() : static_cast<std::size_t>(o.n_predict);
  g.ignore_eos = o.ignore_eos;
  return g;
}

/// The sampler's parameters from the flags; `n_ctx` (0 until the model is
/// made: the flags are checked first) resolves --repeat-last-n -1 and
/// bounds the window by the context.
inline sampler_params sampling(options& o, std::size_t n_ctx = 0) {
  if (o.seed < 0) {
    o.seed = static_cast<long long>(std::random_device{}() & 0x7fffffff);
    std::fprintf(stderr, "seed: %lld\n", o.seed);
  }
  sampler_params p;
  p.temperature = o.temperature;
  p.top_k = o.top_k;
  p.top_p = o.top_p;
  p.min_p = o.min_p;
  const auto ctx = static_cast<std::int32_t>(std::min<std::size_t>(n_ctx, penalties_step::max_last_n));
  p.penalty_last_n = o.repeat_last_n < 0 ? ctx : n_ctx > 0 ? std::min(o.repeat_last_n, ctx) : o.repeat_last_n;
  p.penalty_repeat = o.repeat_penalty;
  p.penalty_freq = o.frequency_penalty;
  p.penalty_present = o.presence_penalty;
  p.seed = static_cast<std::uint64_t>(o.seed);
  validate(p);
  return p;
}

inline std::optional<std::filesystem::path> tokenizer_path(const options& o) {
  if (o.tokenizer) return std::filesystem::path(*o.tokenizer);
  return std::nullopt;
}

/// What kestrel-generate and kestrel-chat build from the common flags. The
/// sampler comes first so that bad sampling flags fail before a large model
/// is loaded.
struct session {
  explicit session(options& o)
      : sampler(sampling(o)),
        file(load_model_file(o.model, tokenizer_path(o))),
        tok(file.tokenizer),
        model(file.weights, static_cast<std::size_t>(o.n_ctx),
              cpu_backend(static_cast<std::size_t>(o.n_threads), o.placement)) {
    // The penalties' window: the whole context for -1, and never more.
    if (o.repeat_last_n < 0 || static_cast<std::size_t>(o.repeat_last_n) > model.n_ctx())
      sampler = sampler_chain(sampling(o, model.n_ctx()));
  }
  sampler_chain sampler;
  model_file file;
  const any_tokenizer& tok;  // file.tokenizer
  llama_model<> model;
};

/// The on_text callback of both programs: text straight to stdout, unbuffered.
inline void write_stdout(std::string_view s) {
  std::fwrite(s.data(), 1, s.size(), stdout);
  std::fflush(stdout);
}

inline void print_stats(const generation_stats& st) {
  const char* why = st.stop == stop_reason::end_of_text    ? "end of text"
                    : st.stop == stop_reason::context_full ? "context full"
                                                           : "-n reached";
  std::fprintf(stderr,
               "\n\nprompt: %zu tokens, generated: %zu tokens (%s)\n"
               "TTFT: %.2f ms | prefill: %.1f tokens/s | decode: %.1f tokens/s | TBT: %.2f ms\n",
               st.n_prompt, st.n_generated, why, st.ttft_ms, st.prefill_tokens_per_s(), st.decode_tokens_per_s(),
               st.tbt_ms());
}

}  // namespace kestrel::cli
