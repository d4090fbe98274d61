// kestrel-bench-cache: why a KV cache. For steps 1..N of a sequence, the
// latency of one decode step with the cache against recomputing the whole
// sequence (a prefill of every token so far, from an empty cache), printed
// as JSON lines. The cached curve stays flat (one token's work plus an
// attention that grows by one row); the recomputed one grows with the step.
//
//   kestrel-bench-cache -m stories260K.gguf [-n 256] [-r 5] [-t 1]
#include <cstdio>
#include <string_view>
#include <vector>

#include "../examples/common/cli.hpp"
#include "common.hpp"

static const char* usage =
    "usage: kestrel-bench-cache -m FILE [--tokenizer FILE] [-n STEPS (256)] [-r REPEATS (5)] [-t THREADS (1)]\n";

int main(int argc, char** argv) {
  long repeats = 5;
  auto opt = kestrel::cli::parse(argc, argv, usage,
                                 {{"-r", [&](std::string_view v) { repeats = kestrel::cli::parse_number<long>("-r", v); }}});
  if (repeats < 1) kestrel::cli::die("-r must be >= 1");
  bool threads_given = false;
  for (int i = 1; i < argc; ++i) threads_given |= std::string_view(argv[i]) == "-t" || std::string_view(argv[i]) == "--threads";
  if (!threads_given) opt.n_threads = 1;
  try {
    const auto file = kestrel::load_model_file(opt.model, kestrel::cli::tokenizer_path(opt));
    const std::size_t steps = static_cast<std::size_t>(opt.n_predict);
    kestrel::llama_model<> model(file.weights, steps + 1, kestrel::cpu_backend(static_cast<std::size_t>(opt.n_threads)));
    // A fixed token sequence (greedy from BOS would do as well; the timing does not depend on the ids).
    std::vector<kestrel::token_id> seq(steps);
    for (std::size_t i = 0; i < steps; ++i)
      seq[i] = static_cast<kestrel::token_id>((i * 7919 + 1) % model.n_vocab());
    std::vector<std::vector<double>> cached(steps), recomputed(steps);
    for (long r = 0; r < repeats; ++r) {
      model.reset();
      for (std::size_t s = 0; s < steps; ++s) {
        const double t0 = kestrel::bench::now_ms();
        model.decode(seq[s]);
        cached[s].push_back(kestrel::bench::now_ms() - t0);
      }
      for (std::size_t s = 0; s < steps; ++s) {
        model.reset();
        const double t0 = kestrel::bench::now_ms();
        model.prefill(std::span<const kestrel::token_id>(seq.data(), s + 1));
        recomputed[s].push_back(kestrel::bench::now_ms() - t0);
      }
    }
    for (std::size_t s = 0; s < steps; ++s) {
      const double c = kestrel::bench::median(cached[s]), u = kestrel::bench::median(recomputed[s]);
      std::printf("{\"bench\":\"kv_cache\",\"model\":%s,\"threads\":%ld,\"step\":%zu,\"cached_ms\":%.4f,"
                  "\"recomputed_ms\":%.4f,\"ratio\":%.2f}\n",
                  kestrel::bench::json_string(opt.model).c_str(), opt.n_threads, s + 1, c, u, c > 0 ? u / c : 0.0);
    }
  } catch (const std::exception& e) {
    kestrel::cli::die(e.what());
  }
}
