// kestrel-bench-gemm: the float prefill products side by side in one
// process: the packed-panel GEMM (cpu/gemm.hpp), the bf16 tiles
// (cpu/gemm_amx.hpp, where the CPU has AMX-BF16) and, for few tokens, the
// skinny kernel (cpu/matmul.hpp), on the 110M and TinyLlama matrix shapes,
// alternated repetition by repetition. One JSON line per (weights, shape,
// tokens): each kernel's median GFLOP/s and the tiles' over the GEMM's.
//
//   kestrel-bench-gemm [-t THREADS] [-n TOKENS,...] [-r REPS]
//
// Defaults: 2 threads, 512 tokens, 7 repetitions.
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "common.hpp"
#include "kestrel/cpu/gemm.hpp"
#include "kestrel/cpu/gemm_amx.hpp"
#include "kestrel/cpu/matmul.hpp"
#include "kestrel/cpu/thread_pool.hpp"

namespace {

namespace cpu = kestrel::cpu;

template <class F>
double seconds(F&& f) {
  const double t0 = kestrel::bench::now_ms();
  f();
  return (kestrel::bench::now_ms() - t0) / 1e3;
}

template <class T>
void run(const char* type, std::size_t rows, std::size_t cols, std::size_t n, int reps, cpu::thread_pool* pool) {
  std::mt19937 g(static_cast<std::uint32_t>(rows * 31 + cols + n));
  std::normal_distribution<float> d;
  std::vector<T> w(rows * cols);
  for (auto& v : w) {
    const float f = d(g) * 0.02f;
    if constexpr (std::is_same_v<T, float>) v = f;
    else v = kestrel::to_f16(f);
  }
  std::vector<float> x(n * cols), y(n * rows);
  for (auto& v : x) v = d(g);
  const bool tiles = cpu::gemm_amx_available(cols), skinny = n <= 24;
  std::vector<double> t_gemm, t_tiles, t_skinny;
  for (int r = 0; r < reps + 1; ++r) {  // the first repetition warms up, untimed
    const double a = seconds([&] {
      cpu::parallel_for(pool, (rows + 31) / 32, [&](std::size_t p0, std::size_t p1) {
        cpu::detail::gemm_rows(w.data(), rows, cols, x.data(), n, y.data(), p0 * 32, std::min(rows, p1 * 32));
      }, n * rows * cols);
    });
    const double b = tiles ? seconds([&] { cpu::gemm_amx(w.data(), rows, cols, x.data(), n, y.data(), pool); }) : 0;
    const double c = skinny ? seconds([&] {
      cpu::parallel_for(pool, (rows + 15) / 16, [&](std::size_t p0, std::size_t p1) {
        cpu::detail::matmul_skinny(w.data(), rows, cols, x.data(), n, y.data(), p0 * 16, std::min(rows, p1 * 16));
      }, n * rows * cols);
    }) : 0;
    if (r == 0) continue;
    t_gemm.push_back(a);
    if (tiles) t_tiles.push_back(b);
    if (skinny) t_skinny.push_back(c);
  }
  const double flop = 2.0 * static_cast<double>(n * rows * cols) / 1e9;
  using kestrel::bench::median;
  const double g_gemm = flop / median(t_gemm), g_tiles = tiles ? flop / median(t_tiles) : 0;
  std::printf("{\"weights\": \"%s\", \"rows\": %zu, \"cols\": %zu, \"n_tokens\": %zu, \"n_threads\": %zu, "
              "\"reps\": %d, \"gemm_gflops\": %.1f, \"tiles_gflops\": %.1f, \"skinny_gflops\": %.1f, "
              "\"tiles_over_gemm\": %.3f}\n",
              type, rows, cols, n, pool ? pool->size() : std::size_t{1}, reps, g_gemm, g_tiles,
              skinny ? flop / median(t_skinny) : 0.0, tiles ? g_tiles / g_gemm : 0.0);
  std::fflush(stdout);
}

}  // namespace

int main(int argc, char** argv) {
  std::size_t threads = 2;
  int reps = 7;
  std::vector<std::size_t> tokens = {512};
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (i + 1 >= argc) {
      std::fprintf(stderr, "error: %s needs a value\nusage: kestrel-bench-gemm [-t THREADS] [-n TOKENS,...] [-r REPS]\n",
                   a.c_str());
      return 2;
    }
    const std::string v = argv[++i];
    if (a == "-t") {
      threads = std::strtoul(v.c_str(), nullptr, 10);
    } else if (a == "-r") {
      reps = std::atoi(v.c_str());
    } else if (a == "-n") {
      tokens.clear();
      std::stringstream ss(v);
      for (std::string s; std::getline(ss, s, ',');) tokens.push_back(std::strtoul(s.c_str(), nullptr, 10));
    } else {
      std::fprintf(stderr, "error: unknown option %s\nusage: kestrel-bench-gemm [-t THREADS] [-n TOKENS,...] [-r REPS]\n",
                   a.c_str());
      return 2;
    }
  }
  if (threads < 1 || reps < 1 || tokens.empty() ||
      std::any_of(tokens.begin(), tokens.end(), [](std::size_t n) { return n < 1 || n > 8192; })) {
    std::fprintf(stderr, "error: threads and repetitions must be at least 1, tokens 1..8192\n");
    return 2;
  }
  if (!cpu::gemm_amx_available(32))
    std::fprintf(stderr, "note: no AMX-BF16 here (or KESTREL_AMX=0): the tiles are not run\n");
  cpu::thread_pool pool(threads);
  cpu::thread_pool* p = threads > 1 ? &pool : nullptr;
  // (rows, cols): the 110M shape's q/k/v/o, gate/up, down; TinyLlama's q/o, k/v, gate/up, down
  const std::size_t shapes[][2] = {{768, 768}, {2048, 768}, {768, 2048},  {2048, 2048},
                                   {256, 2048}, {5632, 2048}, {2048, 5632}};
  for (std::size_t n : tokens)
    for (auto [rows, cols] : shapes) {
      run<float>("f32", rows, cols, n, reps, p);
      run<kestrel::f16>("f16", rows, cols, n, reps, p);
    }
}
