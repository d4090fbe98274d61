// kestrel-bench-speed: prefill and decode tokens/s on a model file, like
// llama-bench's pp/tg tests: a p-token prompt prefilled from an empty cache,
// then n tokens decoded one at a time; repeated r times; medians and the
// spread printed as JSON lines.
//
//   kestrel-bench-speed -m FILE [-p 128] [-n 128] [-r 5] [-t THREADS (default: all)]
#include <cmath>
#include <cstdio>
#include <string_view>
#include <vector>

#include "../examples/common/cli.hpp"
#include "common.hpp"

static const char* usage =
    "usage: kestrel-bench-speed -m FILE [--tokenizer FILE] [-p PROMPT_TOKENS (128)] [-n GEN_TOKENS (128)] [-r REPEATS (5)] [-t THREADS]\n";

int main(int argc, char** argv) {
  long repeats = 5, n_prompt = 128;
  auto opt = kestrel::cli::parse(argc, argv, usage,
                                 {{"-r", [&](std::string_view v) { repeats = kestrel::cli::parse_number<long>("-r", v); }},
                                  {"-pp", [&](std::string_view v) { n_prompt = kestrel::cli::parse_number<long>("-pp", v); }}});
  // -p is the prompt text elsewhere; here, as in llama-bench, it is a token count.
  if (!opt.prompt.empty()) n_prompt = kestrel::cli::parse_number<long>("-p", opt.prompt);
  if (repeats < 1 || n_prompt < 1) kestrel::cli::die("-r and -p must be >= 1");
  try {
    const auto file = kestrel::load_model_file(opt.model, kestrel::cli::tokenizer_path(opt));
    const std::size_t p = static_cast<std::size_t>(n_prompt), n = static_cast<std::size_t>(opt.n_predict);
    kestrel::llama_model<> model(file.weights, p + n + 1, kestrel::cpu_backend(static_cast<std::size_t>(opt.n_threads)));
    std::vector<kestrel::token_id> prompt(p);
    for (std::size_t i = 0; i < p; ++i) prompt[i] = static_cast<kestrel::token_id>((i * 7919 + 1) % model.n_vocab());
    std::vector<double> pp, tg;
    for (long r = 0; r <= repeats; ++r) {  // run 0 warms caches and page-faults the mapping in; not counted
      model.reset();
      double t0 = kestrel::bench::now_ms();
      auto logits = model.prefill(prompt);
      const double t_pp = kestrel::bench::now_ms() - t0;
      kestrel::token_id t = 0;
      t0 = kestrel::bench::now_ms();
      for (std::size_t i = 0; i < n; ++i) {
        logits = model.decode(t);
        t = static_cast<kestrel::token_id>((i * 31 + 7) % model.n_vocab());
      }
      const double t_tg = kestrel::bench::now_ms() - t0;
      if (r == 0) continue;
      pp.push_back(1e3 * static_cast<double>(p) / t_pp);
      if (n) tg.push_back(1e3 * static_cast<double>(n) / t_tg);
    }
    auto line = [&](const char* test, std::size_t n_prompt_, std::size_t n_gen, const std::vector<double>& v) {
      double mean = 0, var = 0;
      for (double x : v) mean += x;
      mean /= static_cast<double>(v.size());
      for (double x : v) var += (x - mean) * (x - mean);
      const double sd = v.size() > 1 ? std::sqrt(var / static_cast<double>(v.size() - 1)) : 0;
      std::printf("{\"bench\":\"speed\",\"test\":\"%s\",\"model\":%s,\"n_threads\":%ld,\"n_prompt\":%zu,\"n_gen\":%zu,"
                  "\"median_ts\":%.2f,\"avg_ts\":%.2f,\"stddev_ts\":%.2f,\"repeats\":%ld}\n",
                  test, kestrel::bench::json_string(opt.model).c_str(), opt.n_threads, n_prompt_, n_gen, kestrel::bench::median(v), mean, sd, repeats);
    };
    line("pp", p, 0, pp);
    if (n) line("tg", 0, n, tg);
  } catch (const std::exception& e) {
    kestrel::cli::die(e.what());
  }
}
