// bench/ab_decode.cpp: decode of two or more builds of kestrel (shared
// objects of ab_decode_model.cpp, made by ab_decode.sh) in one process, in
// alternation, so that a change worth a few percent shows through a noisy
// machine. Each round, every build decodes n_ctx tokens from an empty cache
// (random tokens, the same sequence for all builds in a round), the order
// of the builds rotating; its round figure is the median token time. The
// result per build: the median of its round medians, and the median and
// quartiles over rounds of the ratio of its round median to the first
// build's of the same round. One JSON line per build.
//
// With --prefill before the libraries, each round every build instead
// prefills N_CTX random tokens from an empty cache in one call, and its
// round figure is that call's time (median_prefill_us in the output).
//
//   ab_decode MODEL SECONDS N_CTX N_THREADS [--prefill] LIB.so [LIB.so ...]
#include <dlfcn.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

namespace {
struct build {
  std::string name;
  void* (*open)(const char*, std::size_t, std::size_t);
  const char* (*error)();
  std::size_t (*vocab)(void*);
  void (*reset)(void*);
  void (*decode)(void*, int);
  void (*prefill)(void*, const int*, std::size_t);
  void (*close)(void*);
  void* model = nullptr;
  std::vector<double> round_us{};  // the figure per round: median token time, or the prefill time
};

double quantile(std::vector<double> v, double q) {
  std::sort(v.begin(), v.end());
  return v[static_cast<std::size_t>(q * static_cast<double>(v.size() - 1) + 0.5)];
}

template <class F>
F symbol(void* lib, const char* name, const char* path) {
  void* p = dlsym(lib, name);
  if (!p) {
    std::fprintf(stderr, "ab_decode: %s has no %s\n", path, name);
    std::exit(1);
  }
  return reinterpret_cast<F>(p);
}
}  // namespace

int main(int argc, char** argv) {
  if (argc < 6) {
    std::fprintf(stderr, "usage: ab_decode MODEL SECONDS N_CTX N_THREADS [--prefill] LIB.so [LIB.so ...]\n");
    return 2;
  }
  const char* model = argv[1];
  const double seconds = std::atof(argv[2]);
  const long n_ctx = std::atol(argv[3]), n_threads = std::atol(argv[4]);
  if (seconds <= 0 || n_ctx < 1 || n_threads < 1) {
    std::fprintf(stderr, "ab_decode: SECONDS, N_CTX and N_THREADS must be positive\n");
    return 2;
  }
  const bool prefill = std::string(argv[5]) == "--prefill";
  if (prefill && argc < 7) {
    std::fprintf(stderr, "ab_decode: --prefill needs at least one library\n");
    return 2;
  }
  std::vector<build> builds;
  for (int i = prefill ? 6 : 5; i < argc; ++i) {
    void* lib = dlopen(argv[i], RTLD_NOW | RTLD_LOCAL);
    if (!lib) {
      std::fprintf(stderr, "ab_decode: %s\n", dlerror());
      return 1;
    }
    std::string name = argv[i];  // the file's name without its folder and ".so"
    name = name.substr(name.find_last_of('/') + 1);
    if (name.size() > 3 && name.ends_with(".so")) name.resize(name.size() - 3);
    build b{name,
            symbol<void* (*)(const char*, std::size_t, std::size_t)>(lib, "ab_open", argv[i]),
            symbol<const char* (*)()>(lib, "ab_error", argv[i]),
            symbol<std::size_t (*)(void*)>(lib, "ab_vocab", argv[i]),
            symbol<void (*)(void*)>(lib, "ab_reset", argv[i]),
            symbol<void (*)(void*, int)>(lib, "ab_decode", argv[i]),
            symbol<void (*)(void*, const int*, std::size_t)>(lib, "ab_prefill", argv[i]),
            symbol<void (*)(void*)>(lib, "ab_close", argv[i])};
    b.model = b.open(model, static_cast<std::size_t>(n_ctx), static_cast<std::size_t>(n_threads));
    if (!b.model) {
      std::fprintf(stderr, "ab_decode: %s: %s\n", argv[i], b.error());
      return 1;
    }
    builds.push_back(std::move(b));
  }
  const std::size_t vocab = builds[0].vocab(builds[0].model);
  std::mt19937 rng(1);
  const auto end = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
  std::size_t rounds = 0;
  std::vector<int> tokens(static_cast<std::size_t>(n_ctx));
  std::vector<double> us(tokens.size());
  while (rounds < 3 || std::chrono::steady_clock::now() < end) {
    for (int& t : tokens) t = static_cast<int>(rng() % vocab);
    for (std::size_t k = 0; k < builds.size(); ++k) {
      build& b = builds[(rounds + k) % builds.size()];
      b.reset(b.model);
      if (prefill) {
        const auto t0 = std::chrono::steady_clock::now();
        b.prefill(b.model, tokens.data(), tokens.size());
        b.round_us.push_back(std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count());
        continue;
      }
      for (std::size_t i = 0; i < tokens.size(); ++i) {
        const auto t0 = std::chrono::steady_clock::now();
        b.decode(b.model, tokens[i]);
        us[i] = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count();
      }
      b.round_us.push_back(quantile(us, 0.5));
    }
    ++rounds;
  }
  for (build& b : builds) {
    std::vector<double> ratio(rounds);
    for (std::size_t r = 0; r < rounds; ++r) ratio[r] = b.round_us[r] / builds[0].round_us[r];
    std::printf("{\"build\": \"%s\", \"model_filename\": \"%s\", \"n_ctx\": %ld, \"n_threads\": %ld, \"rounds\": %zu, "
                "\"%s\": %.1f, \"ratio_to_first\": %.4f, \"ratio_q1\": %.4f, \"ratio_q3\": %.4f}\n",
                b.name.c_str(), model, n_ctx, n_threads, rounds, prefill ? "median_prefill_us" : "median_token_us",
                quantile(b.round_us, 0.5), quantile(ratio, 0.5),
                quantile(ratio, 0.25), quantile(ratio, 0.75));
    b.close(b.model);
  }
}
