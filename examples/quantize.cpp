// kestrel-quantize: a GGUF model quantized to one of llama.cpp's mixes.
//
//   kestrel-quantize model-f32.gguf model-q4_k_m.gguf Q4_K_M
//
// Positional form and flag names follow llama.cpp's llama-quantize; the
// per-tensor type rules are in include/kestrel/quant/mix.hpp.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "kestrel/cpu/thread_pool.hpp"
#include "kestrel/io/gguf.hpp"
#include "kestrel/quant/quantize_gguf.hpp"

namespace {

const char* usage =
    "usage: kestrel-quantize [options] IN.gguf OUT.gguf TYPE [NTHREADS]\n"
    "  TYPE (case-insensitive): F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q2_K,\n"
    "       Q3_K_S, Q3_K_M, Q3_K_L, Q4_K_S, Q4_K_M, Q5_K_S, Q5_K_M, Q6_K\n"
    "  --allow-requantize          allow quantizing tensors that are already quantized\n"
    "  --pure                      every matrix gets TYPE's base type (no per-tensor promotions)\n"
    "  --output-tensor-type T      type of output.weight (F32, F16, BF16, Q8_0, ..., Q6_K)\n"
    "  --token-embedding-type T    type of token_embd.weight\n"
    "  NTHREADS                    threads (default: all)\n";

[[noreturn]] void die(const std::string& msg, bool show_usage = false) {
  std::fprintf(stderr, "error: %s\n", msg.c_str());
  if (show_usage) std::fprintf(stderr, "%s", usage);
  std::exit(1);
}

std::string shape(const std::vector<std::uint64_t>& dims) {
  std::string s = "[";
  for (std::size_t i = 0; i < 4; ++i) {
    char b[32];
    std::snprintf(b, sizeof b, "%s%6llu", i ? ", " : "", static_cast<unsigned long long>(i < dims.size() ? dims[i] : 1));
    s += b;
  }
  return s + "]";
}

double mib(std::uint64_t b) { return static_cast<double>(b) / (1024.0 * 1024.0); }

}  // namespace

int main(int argc, char** argv) {
  namespace q = kestrel::quant;
  q::quantize_options o;
  std::vector<std::string_view> pos;
  auto type_flag = [&](std::string_view flag, std::string_view v) {
    auto t = q::parse_ggml_type(v);
    if (!t) die(std::string(flag) + ": unknown type '" + std::string(v) + "'; use one of " + q::writable_type_names());
    return *t;
  };
  for (int i = 1; i < argc; ++i) {
    const std::string_view a = argv[i];
    auto value = [&]() -> std::string_view {
      if (i + 1 >= argc) die(std::string(a) + " needs a value", true);
      return argv[++i];
    };
    if (a == "-h" || a == "--help") {
      std::printf("%s", usage);
      return 0;
    } else if (a == "--allow-requantize") o.allow_requantize = true;
    else if (a == "--pure") o.pure = true;
    else if (a == "--output-tensor-type") o.output_type = type_flag(a, value());
    else if (a == "--token-embedding-type") o.token_embd_type = type_flag(a, value());
    else if (a.size() > 1 && a[0] == '-') die("unknown argument '" + std::string(a) + "'", true);
    else pos.push_back(a);
  }
  if (pos.size() < 3 || pos.size() > 4) die("expected IN.gguf OUT.gguf TYPE [NTHREADS]", true);
  const auto mix = q::parse_mix(pos[2]);
  if (!mix) die("unknown TYPE '" + std::string(pos[2]) + "'; use one of " + q::mix_names());
  o.type = *mix;
  std::size_t n_threads = std::max(1u, std::thread::hardware_concurrency());
  if (pos.size() == 4) {
    const std::string s(pos[3]);
    // Digits only, at most 4 of them (past that stoul could overflow and throw).
    if (s.empty() || s.size() > 4 || s.find_first_not_of("0123456789") != std::string::npos || std::stoul(s) == 0 ||
        std::stoul(s) > 1024)
      die("NTHREADS '" + s + "' is not a number from 1 to 1024");
    n_threads = std::stoul(s);
  }

  try {
    const auto t0 = std::chrono::steady_clock::now();
    const kestrel::io::gguf_file in{std::filesystem::path(pos[0])};
    kestrel::cpu::thread_pool pool(n_threads);
    std::fprintf(stderr, "kestrel-quantize: %s -> %s as %s (ftype %u), %zu threads\n", std::string(pos[0]).c_str(),
                 std::string(pos[1]).c_str(), std::string(q::name_of(o.type)).c_str(), q::llama_ftype(o.type), n_threads);
    const auto r = q::quantize_gguf(in, std::filesystem::path(pos[1]), o, &pool, [](const q::quantize_tensor_event& e) {
      const auto& t = *e.tensor;
      std::string what = e.to == t.type ? std::string("size = ") : "converting to " + std::string(kestrel::io::name_of(e.to)) + " .. size = ";
      char sizes[96];
      if (e.to == t.type) std::snprintf(sizes, sizeof sizes, "%8.3f MiB", mib(t.size_bytes));
      else std::snprintf(sizes, sizeof sizes, "%8.3f MiB -> %8.3f MiB", mib(t.size_bytes), mib(e.bytes_out));
      std::printf("[%4zu/%4zu] %36s - %s, type = %6s, %s%s%s\n", e.index + 1, e.count, t.name.c_str(),
                  shape(t.dims).c_str(), std::string(kestrel::io::name_of(t.type)).c_str(), what.c_str(), sizes,
                  e.fallback ? " (fallback: rows do not fit the mix's type)" : "");
    });
    const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    std::printf("model size  = %8.2f MiB\n", mib(r.bytes_in));
    std::printf("quant size  = %8.2f MiB\n", mib(r.bytes_out));
    if (r.n_fallback)
      std::printf("%zu of %zu tensors used a fallback type (row length not a multiple of the type's block)\n",
                  r.n_fallback, r.n_tensors);
    std::printf("quantize time = %8.2f ms\n", ms);
  } catch (const std::exception& e) {
    std::fflush(stdout);
    die(e.what());
  }
}
