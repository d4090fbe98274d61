// kestrel-bench: prompt-processing and text-generation speed, with
// llama-bench's flags, tests and JSON field names, plus what llama-bench does
// not have: a read-bandwidth probe and int8 / f32 compute-peak probes run in
// the same process, each test's bound (tokens/s the hardware allows) and
// bound ratio, and the peak RSS against file size + KV cache.
//
//   kestrel-bench -m FILE [-m FILE...] [-t 2,4] [-p 512] [-n 128] [-pg 512,128] [-d 0,2048] [-b 2048]
//                 [-ub 512] [-r 5] [-o md|csv|json|jsonl] [--mmap 0|1] [-ctk f16|f32] [-ctv f16|f32]
//                 [--no-warmup]
//
// -ctk / -ctv (llama-bench's cache types) choose the KV cache's element
// type: f16 by default, as llama-bench (kestrel::f16_kv_cache), or f32
// (contiguous_kv_cache, the library's default); keys and values share one
// type here. JSON fields type_k and type_v.
//
// --mmap 1 reads the weights in place in the file mapping (llama-bench's
// default, weight_placement::file); 0 copies them into huge pages when the
// model is built (weight_placement::huge_pages, model/backend.hpp); without
// the flag, as in the library, the copy goes on only while it is fast
// (weight_placement::automatic). Each test builds its model; the build's
// time (the copy, if any) is `load_ns` in the JSON and "load ms" in the
// table; `use_mmap` is true for --mmap 1, `weight_placement` names the
// placement and `weights_copied_bytes` says how many of the matrices' bytes
// were copied.
//
// The tests are llama-bench's: pp<P> prefills P tokens (the first BOS when
// the vocabulary adds one, the rest random) into an empty cache; tg<N>
// decodes N tokens one at a time from an empty cache, the first BOS, the
// others random (no sampling, as llama-bench). With -d D (newer
// llama-bench's --n-depth) each repetition first fills the cache with D
// random tokens, untimed, so the test runs at depth D ("pp512 @ d2048";
// JSON field n_depth). -pg P,N (llama-bench's --n-pg, repeatable) adds a
// test of both: P prompt tokens, then N decoded ("pp512+tg128"; n_prompt
// and n_gen both set), at (P + N) / time tokens/s as llama-bench counts it,
// its bound the time of the pp bound's P tokens plus the tg bound's N. A
// warm-up run (the full prompt for pp, one token for tg, both for pp+tg)
// precedes the r timed repetitions.
//
// -b and -ub (llama-bench's batch and micro-batch sizes, lists): a prompt
// goes to the model in calls of min(b, ub) tokens (llama.cpp's ubatches;
// the depth's tokens too, untimed). The model itself prefills at most
// llama_model::max_prefill_chunk (512) tokens per pass, so -ub is at most
// that; the defaults, 2048 and 512, are llama-bench's, and what the model
// does alone. JSON fields n_batch and n_ubatch.
//
// Output: md (a table, the default), csv (llama-bench's: a header of the
// field names, then one row per test; the probes' figures are in the
// tests' bound fields), json (an array) or jsonl (one object per line).
// The JSON and CSV fields are llama-bench's where it has them
// (build_commit, model_filename, model_type, model_size, model_n_params,
// n_threads, n_prompt, n_gen, n_depth, test_time, avg_ns, stddev_ns,
// avg_ts, stddev_ts, samples_ns, samples_ts, type_k, type_v, use_mmap),
// then kestrel's.
//
// Bounds: decode reads every weight matrix once per token (the embedding
// row is negligible) and the KV cache up to its position, so tg's bound is
// read bandwidth / those bytes (the cache's at the test's mean position).
// The read bandwidth is that of the weights themselves: streaming reads of
// the decode matrices where the model placed them, each thread's share as
// two streams side by side (as decode reads its rows; eight on Intel with
// AVX-512, cpu/streaming.hpp, where decode reads eight; on AMD with AVX-512
// chunks of 512 KiB claimed in order, each as two streams, as decode splits
// its float products there, cpu/matvec.hpp), two before the first
// repetition and two after each (untimed; median; JSON weights_gbps and
// samples_weights_gbps, table column "weights GB/s"). The 1 GiB probe's
// fresh buffer reads at 28 to 54 GB/s on this shared host depending on where
// its pages and the cores land, which the weights need not share. Prefill
// does 2 ops per weight per token (the output matrix only for the last
// token; attention not counted), so pp's bound is peak / ops per token,
// with the int8 peak (vpdpbusd; without AVX-512 VNNI, vpmaddubsw +
// vpmaddwd, the pair an AVX2 kernel issues per 32 products) for quantized
// files and the f32 FMA peak (512- or 256-bit, what the CPU has) for float
// files (f32, f16, bf16); where a float file's prompt runs on AMX bf16
// tiles (cpu::takes_bf16_tiles: the CPU has AMX-BF16, the prompt has
// cpu::gemm_amx_min_tokens tokens or more and every layer matrix's width
// is whole 32-column chunks), the tiles' bf16 peak (TDPBF16PS back to
// back, amx_bf16_gflops) over 3, as each product takes three tile products
// (over 2 for bf16 weights, which take two). Each peak is timed like the weights' reads: one run of its
// loop before the first repetition and one after each (median; JSON
// peak_gops and samples_peak_gops), as the host's speed moves within
// seconds. The probes at the start (compute_peak) are the same loops.
// Where prefill runs on AMX tiles (quant/amx.hpp), the probe also
// reports the tiles' int8 peak (amx_int8_gops: TDPBSSD back to back, about
// 16 vpdpbusd's work each), which the bound does not use: the tile kernels
// are held to the float steps around each block's product, not to the tiles.
// g++ 12 reports its own AVX-512 intrinsics' `__Y` placeholders (undefined
// vectors) as uninitialized once inlined; a known false positive.
#pragma GCC diagnostic ignored "-Wuninitialized"
#include <immintrin.h>
#include <sys/stat.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <memory>
#include <numeric>
#include <random>
#include <span>
#include <string>
#include <string_view>
#include <thread>
#include <type_traits>
#include <vector>

#include "../examples/common/cli.hpp"
#include "common.hpp"
#include "build_info.h"
#include "kestrel/cpu/gemm_amx.hpp"
#include "kestrel/cpu/matmul.hpp"
#include "kestrel/cpu/matvec.hpp"
#include "kestrel/cpu/streaming.hpp"
#include "kestrel/quant/amx.hpp"
#include "kestrel/quant/mix.hpp"

namespace {

using kestrel::bench::json_string;

/// The most tokens the model prefills per pass (-ub's limit).
constexpr std::size_t model_chunk =
    kestrel::llama_model<kestrel::dynamic_llama_config, kestrel::cpu_backend, kestrel::f16_kv_cache>::max_prefill_chunk;

const char* usage =
    "usage: kestrel-bench [options]\n"
    "  -m, --model FILE        model file; repeatable or comma-separated\n"
    "  -t, --threads N,...     thread counts (default: all hardware threads)\n"
    "  -p, --n-prompt N,...    prompt tokens of the pp tests; 0 skips (default: 512)\n"
    "  -n, --n-gen N,...       generated tokens of the tg tests; 0 skips (default: 128)\n"
    "  -pg, --n-pg P,N         a test of P prompt tokens then N generated ones (pp P + tg N);\n"
    "                          repeatable (default: none)\n"
    "  -d, --n-depth N,...     tokens already in the KV cache when a test starts (default: 0)\n"
    "  -b, --batch-size N,...  logical batch: tokens per prefill call at most (default: 2048)\n"
    "  -ub, --ubatch-size N,... tokens per prefill pass, at most 512 (default: 512)\n"
    "  -r, --repetitions N     timed repetitions per test (default: 5)\n"
    "  -o, --output md|csv|json|jsonl  (default: md)\n"
    "  -mmp, --mmap 0|1        1: weights read in place from the file mapping; 0: copied into\n"
    "                          huge pages when the model is built (default: copied while the\n"
    "                          copy is fast, else read in place: weight_placement::automatic)\n"
    "  -ctk, --cache-type-k T  KV cache element type, f16 or f32 (default: f16)\n"
    "  -ctv, --cache-type-v T  the same for values: equal to -ctk here\n"
    "  --no-warmup             skip the warm-up run\n";

[[noreturn]] void die(const std::string& msg) {
  std::fprintf(stderr, "error: %s\n", msg.c_str());
  std::exit(1);
}

std::vector<std::string> split(std::string_view s) {
  std::vector<std::string> out;
  std::size_t at = 0;
  while (true) {
    const std::size_t c = s.find(',', at);
    out.emplace_back(s.substr(at, c == std::string_view::npos ? std::string_view::npos : c - at));
    if (c == std::string_view::npos) break;
    at = c + 1;
  }
  return out;
}

std::vector<long> numbers(std::string_view flag, std::string_view s, long min) {
  std::vector<long> out;
  for (const auto& x : split(s)) {
    const long v = kestrel::cli::parse_number<long>(flag, x);
    if (v < min) die(std::string(flag) + " values must be >= " + std::to_string(min) + ", got " + x);
    out.push_back(v);
  }
  return out;
}

double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}
std::uint64_t now_ns() {
  return static_cast<std::uint64_t>(
      std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch()).count());
}

template <class T>
double mean(const std::vector<T>& v) {
  double s = 0;
  for (T x : v) s += static_cast<double>(x);
  return v.empty() ? 0 : s / static_cast<double>(v.size());
}
template <class T>
double stddev(const std::vector<T>& v) {  // sample standard deviation, as llama-bench
  if (v.size() < 2) return 0;
  const double m = mean(v);
  double s = 0;
  for (T x : v) s += (static_cast<double>(x) - m) * (static_cast<double>(x) - m);
  return std::sqrt(s / static_cast<double>(v.size() - 1));
}

template <class T>
std::string json_list(const std::vector<T>& v, const char* fmt) {
  std::string s = "[";
  char buf[64];
  for (std::size_t i = 0; i < v.size(); ++i) {
    std::snprintf(buf, sizeof buf, fmt, v[i]);
    s += (i ? ", " : "") + std::string(buf);
  }
  return s + "]";
}

// ---- probes ----------------------------------------------------------------

/// Runs f(thread index) on n threads at once (started together) and returns
/// the wall time of the slowest.
template <class F>
double on_threads(std::size_t n, F f) {
  std::atomic<std::size_t> ready{0};
  std::atomic<bool> go{false};
  std::vector<std::thread> ts;
  for (std::size_t i = 0; i < n; ++i)
    ts.emplace_back([&, i] {
      ready.fetch_add(1);
      while (!go.load(std::memory_order_acquire)) {
      }
      f(i);
    });
  while (ready.load() != n) {
  }
  const double t0 = now_s();
  go.store(true, std::memory_order_release);
  for (auto& t : ts) t.join();
  return now_s() - t0;
}

/// Sums of the n bytes at p as streaming reads (the probes' loops; the
/// value only keeps the reads alive). Unaligned loads: a matrix starts
/// anywhere.
__attribute__((target("avx512f"))) float sum_bytes_avx512(const std::byte* p, std::size_t n) {
  __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
  std::size_t i = 0;
  for (; i + 256 <= n; i += 256) {
    a0 = _mm512_add_ps(a0, _mm512_loadu_ps(p + i));
    a1 = _mm512_add_ps(a1, _mm512_loadu_ps(p + i + 64));
    a2 = _mm512_add_ps(a2, _mm512_loadu_ps(p + i + 128));
    a3 = _mm512_add_ps(a3, _mm512_loadu_ps(p + i + 192));
  }
  float tail = 0;
  for (; i < n; ++i) tail += static_cast<float>(p[i]);
  return _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(a0, a1), _mm512_add_ps(a2, a3))) + tail;
}

__attribute__((target("avx2"))) float sum_bytes_avx2(const std::byte* p, std::size_t n) {
  __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
  std::size_t i = 0;
  for (; i + 128 <= n; i += 128) {
    a0 = _mm256_add_ps(a0, _mm256_loadu_ps(reinterpret_cast<const float*>(p + i)));
    a1 = _mm256_add_ps(a1, _mm256_loadu_ps(reinterpret_cast<const float*>(p + i + 32)));
    a2 = _mm256_add_ps(a2, _mm256_loadu_ps(reinterpret_cast<const float*>(p + i + 64)));
    a3 = _mm256_add_ps(a3, _mm256_loadu_ps(reinterpret_cast<const float*>(p + i + 96)));
  }
  float tail = 0;
  for (; i < n; ++i) tail += static_cast<float>(p[i]);
  const __m256 s = _mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3));
  alignas(32) float l[8];
  _mm256_store_ps(l, s);
  return l[0] + l[1] + l[2] + l[3] + l[4] + l[5] + l[6] + l[7] + tail;
}

float sum_bytes_scalar(const std::byte* p, std::size_t n) {
  std::uint64_t a[4] = {};  // 8-byte words: as few instructions per byte as the float loads
  std::size_t i = 0;
  for (; i + 32 <= n; i += 32)
    for (int j = 0; j < 4; ++j) {
      std::uint64_t v;
      std::memcpy(&v, p + i + 8 * j, 8);
      a[j] += v;
    }
  for (; i < n; ++i) a[0] += static_cast<std::uint64_t>(p[i]);
  return static_cast<float>(a[0] + a[1] + a[2] + a[3]);
}

KESTREL_INTRINSICS_BEGIN  // _mm512_reduce_add_ps on GCC 12 (kestrel/core/diagnostics.hpp)
/// Sums of the n bytes at a and the n bytes at b, read side by side: two
/// streams of loads per thread, 128 bytes of each in turn. On the Zen 2 host
/// (/tmp harness, 1 GiB in huge pages, 2 threads, medians of 7) one stream
/// per thread read 30.3-31.6 GB/s, two side by side 32.7-33.6, two in turns
/// of 4 KiB or more 30.0-30.7; kestrel's decode walks its matrices two
/// streams per thread (cpu::matvec, the x16 panels), and read its f32 weights
/// at up to 1.2x the one-stream probe, a bound ratio above 1.
__attribute__((target("avx512f"))) float sum_pair_avx512(const std::byte* a, const std::byte* b, std::size_t n) {
  __m512 a0 = _mm512_setzero_ps(), a1 = a0, b0 = a0, b1 = a0;
  std::size_t i = 0;
  for (; i + 128 <= n; i += 128) {
    a0 = _mm512_add_ps(a0, _mm512_loadu_ps(a + i));
    a1 = _mm512_add_ps(a1, _mm512_loadu_ps(a + i + 64));
    b0 = _mm512_add_ps(b0, _mm512_loadu_ps(b + i));
    b1 = _mm512_add_ps(b1, _mm512_loadu_ps(b + i + 64));
  }
  float tail = 0;
  for (; i < n; ++i) tail += static_cast<float>(a[i]) + static_cast<float>(b[i]);
  return _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(a0, a1), _mm512_add_ps(b0, b1))) + tail;
}

__attribute__((target("avx2"))) float sum_pair_avx2(const std::byte* a, const std::byte* b, std::size_t n) {
  __m256 a0 = _mm256_setzero_ps(), a1 = a0, b0 = a0, b1 = a0;
  std::size_t i = 0;
  for (; i + 128 <= n; i += 128)
    for (std::size_t j = 0; j < 128; j += 64) {
      a0 = _mm256_add_ps(a0, _mm256_loadu_ps(reinterpret_cast<const float*>(a + i + j)));
      a1 = _mm256_add_ps(a1, _mm256_loadu_ps(reinterpret_cast<const float*>(a + i + j + 32)));
      b0 = _mm256_add_ps(b0, _mm256_loadu_ps(reinterpret_cast<const float*>(b + i + j)));
      b1 = _mm256_add_ps(b1, _mm256_loadu_ps(reinterpret_cast<const float*>(b + i + j + 32)));
    }
  float tail = 0;
  for (; i < n; ++i) tail += static_cast<float>(a[i]) + static_cast<float>(b[i]);
  const __m256 s = _mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(b0, b1));
  alignas(32) float l[8];
  _mm256_store_ps(l, s);
  return l[0] + l[1] + l[2] + l[3] + l[4] + l[5] + l[6] + l[7] + tail;
}

bool has_avx512() { return __builtin_cpu_supports("avx512f"); }
bool has_vnni() { return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512vnni"); }
bool has_avx2() { return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"); }

/// The probes' streaming read with the widest loads the CPU has.
float sum_bytes(const std::byte* p, std::size_t n) {
  if (has_avx512()) return sum_bytes_avx512(p, n);
  if (has_avx2()) return sum_bytes_avx2(p, n);
  return sum_bytes_scalar(p, n);
}

float sum_pair(const std::byte* a, const std::byte* b, std::size_t n) {
  if (has_avx512()) return sum_pair_avx512(a, b, n);
  if (has_avx2()) return sum_pair_avx2(a, b, n);
  return sum_bytes_scalar(a, n) + sum_bytes_scalar(b, n);
}

using byte_runs = std::vector<std::span<const std::byte>>;

/// Bytes [lo, hi) of the runs laid end to end, as runs.
byte_runs slice_runs(const byte_runs& runs, std::size_t lo, std::size_t hi) {
  byte_runs out;
  std::size_t at = 0;
  for (const auto& m : runs) {
    const std::size_t a = std::max(lo, at), b = std::min(hi, at + m.size());
    if (a < b) out.push_back(m.subspan(a - at, b - a));
    at += m.size();
  }
  return out;
}

/// Sums of the n bytes at each of p[0 .. k), read side by side, 128 bytes
/// of each in turn (k streams of loads, as decode's row_streams::wide walks
/// 8 rows at once).
__attribute__((target("avx512f"))) float sum_streams_avx512(const std::byte* const* p, std::size_t k, std::size_t n) {
  __m512 a0 = _mm512_setzero_ps(), a1 = a0;
  std::size_t i = 0;
  for (; i + 128 <= n; i += 128)
    for (std::size_t s = 0; s < k; ++s) {
      a0 = _mm512_add_ps(a0, _mm512_loadu_ps(p[s] + i));
      a1 = _mm512_add_ps(a1, _mm512_loadu_ps(p[s] + i + 64));
    }
  float tail = 0;
  for (; i < n; ++i)
    for (std::size_t s = 0; s < k; ++s) tail += static_cast<float>(p[s][i]);
  return _mm512_reduce_add_ps(_mm512_add_ps(a0, a1)) + tail;
}
KESTREL_INTRINSICS_END

/// The streaming read of one thread's share: its k parts side by side
/// (sum_pair for two, sum_streams_avx512 for more) while all have bytes
/// left, then whatever is left of each part alone.
float read_parts(const std::vector<byte_runs>& parts) {
  const std::size_t k = parts.size();
  float acc = 0;
  std::vector<std::size_t> run(k, 0), off(k, 0);  // run index and offset in each part
  std::vector<const std::byte*> at(k);
  auto live = [&] {
    for (std::size_t s = 0; s < k; ++s)
      if (run[s] >= parts[s].size()) return false;
    return true;
  };
  while (k > 0 && live()) {
    std::size_t n = SIZE_MAX;
    for (std::size_t s = 0; s < k; ++s) {
      n = std::min(n, parts[s][run[s]].size() - off[s]);
      at[s] = parts[s][run[s]].data() + off[s];
    }
    if (k == 2) acc += sum_pair(at[0], at[1], n);
    else if (has_avx512()) acc += sum_streams_avx512(at.data(), k, n);
    else
      for (std::size_t s = 0; s < k; ++s) acc += sum_bytes(at[s], n);
    for (std::size_t s = 0; s < k; ++s)
      if ((off[s] += n) == parts[s][run[s]].size()) ++run[s], off[s] = 0;
  }
  for (std::size_t s = 0; s < k; ++s)
    for (; run[s] < parts[s].size(); ++run[s], off[s] = 0)
      acc += sum_bytes(parts[s][run[s]].data() + off[s], parts[s][run[s]].size() - off[s]);
  return acc;
}

/// Each thread's share of the runs laid end to end, split into the k parts
/// read_parts reads side by side.
std::vector<std::vector<byte_runs>> thread_parts(const byte_runs& runs, std::size_t n_threads, std::size_t k) {
  std::size_t total = 0;
  for (const auto& m : runs) total += m.size();
  const std::size_t share = (total + n_threads - 1) / n_threads;
  std::vector<std::vector<byte_runs>> out(n_threads);
  for (std::size_t t = 0; t < n_threads; ++t) {
    const std::size_t lo = std::min(total, t * share), hi = std::min(total, lo + share);
    for (std::size_t s = 0; s < k; ++s)
      out[t].push_back(slice_runs(runs, lo + (hi - lo) * s / k, lo + (hi - lo) * (s + 1) / k));
  }
  return out;
}

/// Streams per thread of the weights probe: as many as decode's float rows
/// take on this host (cpu/streaming.hpp: 2, or 8 with row_streams::wide
/// and AVX-512), which read faster than two there.
std::size_t probe_streams() {
  return kestrel::cpu::host_row_streams() == kestrel::cpu::row_streams::wide && has_avx512() ? 8 : 2;
}

struct bandwidth_probe {
  std::size_t n_threads = 0, bytes = 0;
  std::vector<double> samples_gbps;
  double gbps = 0;  // median
};

/// A streaming read of a 1 GiB buffer, split among the threads, each
/// reading the two halves of its slice side by side; GB/s (1e9 bytes),
/// median of 7 runs after one untimed pass.
bandwidth_probe probe_bandwidth(std::size_t n_threads) {
  bandwidth_probe r;
  r.n_threads = n_threads;
  r.bytes = std::size_t{1} << 30;
  const std::size_t n = r.bytes / sizeof(float);
  auto* buf = static_cast<float*>(std::aligned_alloc(64, r.bytes));
  if (!buf) die("cannot allocate the 1 GiB bandwidth probe buffer");
  // Each thread writes its own slice first (first touch places the pages).
  const std::size_t per = n / n_threads / 64 * 64;
  on_threads(n_threads, [&](std::size_t t) {
    for (std::size_t i = t * per; i < (t + 1) * per; ++i) buf[i] = 1.0f;
  });
  std::vector<float> sink(n_threads);
  for (int run = 0; run < 8; ++run) {
    const double s = on_threads(n_threads, [&](std::size_t t) {
      const auto* slice = reinterpret_cast<const std::byte*>(buf + t * per);
      const std::size_t half = per * sizeof(float) / 2;
      sink[t] += sum_pair(slice, slice + half, half);
    });
    if (run > 0) r.samples_gbps.push_back(static_cast<double>(per * n_threads * sizeof(float)) / s / 1e9);
  }
  std::free(buf);
  if (sink[0] == 0.5f) std::fprintf(stderr, " ");  // keeps the sums alive
  r.gbps = kestrel::bench::median(r.samples_gbps);
  return r;
}

/// The bytes decode streams per token: every layer matrix and the output
/// matrix (tied embeddings: the same memory, once), where the model placed them.
byte_runs decode_matrices(const kestrel::llama_weights& w) {
  byte_runs out;
  auto add = [&](const kestrel::weight_view& v) {
    if (v.data) out.emplace_back(static_cast<const std::byte*>(v.data), v.bytes());
  };
  for (const auto& L : w.layers)
    for (const auto* v : L.matrices()) add(*v);
  add(w.output);
  return out;
}

/// One streaming read of the matrices decode reads, as the model placed them
/// (huge-page copy or file mapping, wherever the host put those pages), split
/// into n_threads equal shares of the bytes, each share's probe_streams()
/// parts read side by side as decode reads its rows (read_parts); GB/s. The 1 GiB probe
/// measures a fresh buffer: on this shared host its rate moves by up to 2x
/// with where the buffer and the cores land (28 to 54 GB/s within one run),
/// while the weights stay where they are, so the decode bound is taken from
/// this one, sampled between the timed repetitions.
/// A model under 256 MiB is read several times over in one call (as decode
/// reads it once per token, from whatever cache level holds it), so that
/// starting the threads (~0.1 ms) stays small against the reading: a 1 MB
/// model read once measured 10 GB/s and a bound ratio of 3.6.
/// Where decode splits its float products in chunks claimed in order
/// (cpu/matvec.hpp, float_decode_for: AMD with AVX-512), the probe does
/// too: the threads claim chunks of the same size of the matrices laid end
/// to end, each read as two halves side by side. There one share per thread
/// (the threads half the weights apart) read slower than the chunks: on the
/// Zen 4 host llama.cpp read TinyLlama f16 / f32 at 1.13 / 1.06 of that
/// bound (bench/README.md, the run at f3471ae).
double probe_weights_once(const byte_runs& mats, std::size_t n_threads) {
  std::size_t total = 0;
  for (const auto& m : mats) total += m.size();
  if (total == 0) return 0;
  const std::size_t chunk = kestrel::cpu::detail::float_decode_chunk_bytes();
  std::vector<std::vector<byte_runs>> parts;
  if (chunk == 0) {
    parts = thread_parts(mats, n_threads, probe_streams());
  } else {
    for (std::size_t lo = 0; lo < total; lo += chunk) {
      const std::size_t hi = std::min(total, lo + chunk), mid = lo + (hi - lo) / 2;
      parts.push_back({slice_runs(mats, lo, mid), slice_runs(mats, mid, hi)});
    }
  }
  const std::size_t passes = std::max<std::size_t>(1, (std::size_t{256} << 20) / total);
  std::vector<float> sink(n_threads);
  std::atomic<std::size_t> next{0};
  const double s = on_threads(n_threads, [&](std::size_t t) {
    float acc = 0;
    if (chunk == 0) {
      for (std::size_t pass = 0; pass < passes; ++pass) acc += read_parts(parts[t]);
    } else {
      for (std::size_t c; (c = next.fetch_add(1, std::memory_order_relaxed)) < passes * parts.size();)
        acc += read_parts(parts[c % parts.size()]);
    }
    sink[t] = acc;
  });
  if (sink[0] == 0.5f) std::fprintf(stderr, " ");  // keeps the sums alive
  return static_cast<double>(total) * static_cast<double>(passes) / s / 1e9;
}

constexpr long peak_iters = 20'000'000;

/// 12 independent vpdpbusd chains per thread: 12 * 64 u8 x s8 products,
/// 2 ops each (multiply, add), per iteration.
__attribute__((target("avx512f,avx512vnni"))) std::int32_t vnni_loop(long iters) {
  __m512i a[12];
  for (int j = 0; j < 12; ++j) a[j] = _mm512_set1_epi32(j);
  __m512i x = _mm512_set1_epi8(1), y = _mm512_set1_epi8(-1);
  for (long i = 0; i < iters; ++i) {
    asm volatile("" : "+v"(x), "+v"(y));
    for (int j = 0; j < 12; ++j) a[j] = _mm512_dpbusd_epi32(a[j], x, y);
  }
  __m512i s = a[0];
  for (int j = 1; j < 12; ++j) s = _mm512_add_epi32(s, a[j]);
  return _mm512_reduce_add_epi32(s);
}

/// 12 independent FMA chains per thread: 12 * 16 multiply-adds per iteration.
__attribute__((target("avx512f"))) float fma_loop(long iters) {
  __m512 a[12];
  for (int j = 0; j < 12; ++j) a[j] = _mm512_set1_ps(static_cast<float>(j));
  __m512 x = _mm512_set1_ps(0.999f), y = _mm512_set1_ps(0.001f);
  for (long i = 0; i < iters; ++i) {
    asm volatile("" : "+v"(x), "+v"(y));
    for (int j = 0; j < 12; ++j) a[j] = _mm512_fmadd_ps(a[j], x, y);
  }
  __m512 s = a[0];
  for (int j = 1; j < 12; ++j) s = _mm512_add_ps(s, a[j]);
  return _mm512_reduce_add_ps(s);
}

/// Without AVX-512 VNNI, the int8 dot's instruction pair (what a u8 x s8
/// kernel on AVX2 issues per 32 products, as vpdpbusd does per 64): 12
/// independent chains of vpmaddubsw + vpmaddwd, 2 ops per product. Each
/// chain feeds its own result back as the next bytes (the values are
/// meaningless; the timing does not depend on them), so the compiler cannot
/// hoist a product out of the loop.
__attribute__((target("avx2"))) std::int32_t maddubs_loop(long iters) {
  __m256i a[12];
  for (int j = 0; j < 12; ++j) a[j] = _mm256_set1_epi32(j);
  __m256i y = _mm256_set1_epi8(-1);
  const __m256i ones = _mm256_set1_epi16(1);
  for (long i = 0; i < iters; ++i) {
    asm volatile("" : "+x"(y));
    for (int j = 0; j < 12; ++j) a[j] = _mm256_madd_epi16(_mm256_maddubs_epi16(a[j], y), ones);
  }
  __m256i s = a[0];
  for (int j = 1; j < 12; ++j) s = _mm256_add_epi32(s, a[j]);
  alignas(32) std::int32_t l[8];
  _mm256_store_si256(reinterpret_cast<__m256i*>(l), s);
  return l[0] + l[1] + l[2] + l[3] + l[4] + l[5] + l[6] + l[7];
}

/// 12 independent 256-bit FMA chains per thread: 12 * 8 multiply-adds per iteration.
__attribute__((target("avx2,fma"))) float fma_loop_avx2(long iters) {
  __m256 a[12];
  for (int j = 0; j < 12; ++j) a[j] = _mm256_set1_ps(static_cast<float>(j));
  __m256 x = _mm256_set1_ps(0.999f), y = _mm256_set1_ps(0.001f);
  for (long i = 0; i < iters; ++i) {
    asm volatile("" : "+x"(x), "+x"(y));
    for (int j = 0; j < 12; ++j) a[j] = _mm256_fmadd_ps(a[j], x, y);
  }
  __m256 s = a[0];
  for (int j = 1; j < 12; ++j) s = _mm256_add_ps(s, a[j]);
  alignas(32) float l[8];
  _mm256_store_ps(l, s);
  return l[0] + l[1] + l[2] + l[3] + l[4] + l[5] + l[6] + l[7];
}

#if defined(KESTREL_AMX)
/// The AMX peak loops' frame: every tile 16 rows x 64 bytes, the A and B
/// tiles (4-7) `pattern` in every 16-bit lane, the C tiles (0-3) zeros,
/// then step() (four independent tile products) iters times. Returns the
/// first value of C tile 0, so that the loop is kept.
template <class T, class Step>
T amx_peak_loop(long iters, std::uint16_t pattern, Step step) {
  namespace am = kestrel::quant::detail::amx;
  am::tile_config c;
  for (int t = 0; t < 8; ++t) c.colsb[t] = 64, c.rows[t] = 16;
  asm volatile("ldtilecfg %0" ::"m"(c));
  alignas(64) std::uint16_t operand[16][32];
  std::fill(&operand[0][0], &operand[0][0] + 16 * 32, pattern);
  asm volatile("" ::: "memory");  // tileloadd names no memory operand
  _tile_loadd(4, operand, 64);
  _tile_loadd(5, operand, 64);
  _tile_loadd(6, operand, 64);
  _tile_loadd(7, operand, 64);
  _tile_zero(0);
  _tile_zero(1);
  _tile_zero(2);
  _tile_zero(3);
  for (long i = 0; i < iters; ++i) step();
  alignas(64) T out[16][16];
  _tile_stored(0, out, 64);
  am::release();
  return out[0][0];
}

/// Where the prefill kernels run on AMX tiles (quant::amx_enabled()), the
/// tiles' int8 peak: 4 independent TDPBSSD accumulations per iteration,
/// each 16 x 16 x 64 multiply-adds (of bytes 1).
std::int64_t amx_loop(long iters) {
  return amx_peak_loop<std::int32_t>(iters, 0x0101, [] {
    _tile_dpbssd(0, 4, 6);
    _tile_dpbssd(1, 4, 7);
    _tile_dpbssd(2, 5, 6);
    _tile_dpbssd(3, 5, 7);
  });
}
#endif

#if defined(KESTREL_AMX_BF16)
/// Where float prompts run on AMX bf16 tiles (cpu::amx_bf16_enabled()),
/// the tiles' bf16 peak: 4 independent TDPBF16PS accumulations per
/// iteration, each 16 x 16 x 32 multiply-adds (of bf16 2^-7).
float amx_bf16_loop(long iters) {
  return amx_peak_loop<float>(iters, 0x3c00, [] {
    _tile_dpbf16ps(0, 4, 6);
    _tile_dpbf16ps(1, 4, 7);
    _tile_dpbf16ps(2, 5, 6);
    _tile_dpbf16ps(3, 5, 7);
  });
}
#endif

struct compute_probe {
  std::size_t n_threads = 0;
  double int8_gops = 0, f32_gflops = 0;  // medians of 3
  double amx_int8_gops = 0;              // where the prefill kernels use AMX tiles, else 0
  double amx_bf16_gflops = 0;            // where float prompts run on AMX bf16 tiles, else 0
};

/// The peak loops: int8 (quantized files), f32 FMA (float files), the bf16
/// tiles (float files' prompts where they run on them).
enum class peak_kind { int8, f32, bf16_tiles, bf16_tiles_2 };

#if defined(KESTREL_AMX)
/// One run of an AMX peak loop (amx_peak_loop's, loop(iters)) on each of
/// n_threads threads: GOP/s, counting ops_per_iter an iteration.
template <class Loop>
double tiles_gops_once(std::size_t n_threads, double ops_per_iter, Loop loop) {
  std::atomic<long> sink{0};
  const long iters = peak_iters / 16;  // one tile product takes about as long as 16 vpdpbusd or 16-float FMAs
  const double t = on_threads(n_threads, [&](std::size_t) { sink += static_cast<long>(loop(iters)); });
  if (sink.load() == 42) std::fprintf(stderr, " ");
  return static_cast<double>(iters) * static_cast<double>(n_threads) * ops_per_iter / t / 1e9;
}
#endif

/// The tiles' bf16 GFLOP/s on n_threads threads (one run), or 0 where
/// float prompts do not run on them.
double probe_bf16_tiles_once(std::size_t n_threads) {
#if defined(KESTREL_AMX_BF16)
  if (kestrel::cpu::amx_bf16_enabled()) return tiles_gops_once(n_threads, 4 * 16 * 16 * 32 * 2, amx_bf16_loop);
#endif
  (void)n_threads;
  return 0;
}

/// One run of a peak loop on n_threads threads: GOP/s (for the bf16 tiles,
/// the tiles' GFLOP/s over the tile products each product takes: 3, or 2
/// for bf16 weights, bf16_tiles_2), or 0 where the CPU has no such loop.
double probe_peak_once(std::size_t n_threads, peak_kind kind) {
  const bool int8 = kind == peak_kind::int8;
  if (kind == peak_kind::bf16_tiles) return probe_bf16_tiles_once(n_threads) / 3;
  if (kind == peak_kind::bf16_tiles_2) return probe_bf16_tiles_once(n_threads) / 2;
  const double total_iters = static_cast<double>(peak_iters) * static_cast<double>(n_threads);
  std::atomic<long> sink{0};
  double gops = 0;
  if (int8 && has_vnni()) {
    const double t = on_threads(n_threads, [&](std::size_t) { sink += vnni_loop(peak_iters); });
    gops = total_iters * 12 * 64 * 2 / t / 1e9;
  } else if (int8 && has_avx2()) {
    const double t = on_threads(n_threads, [&](std::size_t) { sink += maddubs_loop(peak_iters); });
    gops = total_iters * 12 * 32 * 2 / t / 1e9;
  } else if (!int8 && has_avx512()) {
    const double t = on_threads(n_threads, [&](std::size_t) { sink += static_cast<long>(fma_loop(peak_iters)); });
    gops = total_iters * 12 * 16 * 2 / t / 1e9;
  } else if (!int8 && has_avx2()) {
    const double t = on_threads(n_threads, [&](std::size_t) { sink += static_cast<long>(fma_loop_avx2(peak_iters)); });
    gops = total_iters * 12 * 8 * 2 / t / 1e9;
  }
  if (sink.load() == 42) std::fprintf(stderr, " ");
  return gops;
}

compute_probe probe_compute(std::size_t n_threads) {
  compute_probe r;
  r.n_threads = n_threads;
  std::vector<double> s8, s32;
  for (int run = 0; run < 3; ++run) {
    if (const double g = probe_peak_once(n_threads, peak_kind::int8); g > 0) s8.push_back(g);
    if (const double g = probe_peak_once(n_threads, peak_kind::f32); g > 0) s32.push_back(g);
  }
#if defined(KESTREL_AMX)
  if (kestrel::quant::amx_enabled()) {
    std::vector<double> amx;
    for (int run = 0; run < 3; ++run) amx.push_back(tiles_gops_once(n_threads, 4 * 16 * 16 * 64 * 2, amx_loop));
    r.amx_int8_gops = kestrel::bench::median(amx);
  }
#endif
  std::vector<double> bf16;
  for (int run = 0; run < 3; ++run)
    if (const double g = probe_bf16_tiles_once(n_threads); g > 0) bf16.push_back(g);
  r.amx_bf16_gflops = kestrel::bench::median(bf16);
  r.int8_gops = kestrel::bench::median(s8);
  r.f32_gflops = kestrel::bench::median(s32);
  return r;
}

// ---- the model's facts -------------------------------------------------------

struct model_facts {
  std::string type;             // llama-bench's model_type: "llama 1.1B Q4_0"
  std::uint64_t size = 0;       // bytes of all tensors (llama-bench's model_size)
  std::uint64_t n_params = 0;   // elements of all tensors
  std::uint64_t file_size = 0;
  std::uint64_t decode_bytes = 0;   // weight bytes read per decoded token
  std::uint64_t layer_params = 0;   // elements of the layers' matrices
  std::uint64_t output_params = 0;  // elements of the output matrix
  std::uint64_t last_token_params = 0;  // the last layer's wq, wo and FFN: a prompt needs them for its last token only
  bool quantized = false;
  bool bf16_layers = false;  // the layers' matrices are bf16 (two tile products a product on AMX bf16 tiles)
  std::size_t cols_gcd = 0;  // the greatest common divisor of the layers' matrices' widths (cpu::takes_bf16_tiles)
  std::string ftype;
};

std::uint64_t matrix_elems(const kestrel::weight_view& w) { return static_cast<std::uint64_t>(w.rows) * w.cols; }

std::string params_label(std::uint64_t n) {
  char buf[32];
  if (n >= 1'000'000'000) std::snprintf(buf, sizeof buf, "%.1fB", static_cast<double>(n) / 1e9);
  else std::snprintf(buf, sizeof buf, "%.0fM", static_cast<double>(n) / 1e6);
  return buf;
}

model_facts facts_of(const kestrel::model_file& f) {
  model_facts m;
  const auto& w = f.weights;
  std::error_code ec;
  m.file_size = std::filesystem::is_directory(f.path, ec) ? 0 : std::filesystem::file_size(f.path, ec);
  std::uint64_t mat_bytes = 0;
  std::size_t quant_bytes = 0, float_bytes = 0;
  auto add_layer_matrix = [&](const kestrel::weight_view& v) {
    if (!v.data) return;
    m.layer_params += matrix_elems(v);
    m.cols_gcd = std::gcd(m.cols_gcd, v.cols);
    mat_bytes += v.bytes();
    (kestrel::is_quantized(v.type) ? quant_bytes : float_bytes) += v.bytes();
  };
  for (const auto& L : w.layers)
    for (const auto* v : L.matrices()) add_layer_matrix(*v);
  if (!w.layers.empty()) {
    const auto& L = w.layers.back();
    for (const auto* v : {&L.wq, &L.wo, &L.ffn_gate, &L.ffn_up, &L.ffn_down})
      if (v->data) m.last_token_params += matrix_elems(*v);
  }
  m.output_params = matrix_elems(w.output);
  m.decode_bytes = mat_bytes + w.output.bytes();
  m.quantized = quant_bytes > float_bytes;
  m.bf16_layers = !w.layers.empty() && w.layers[0].wq.type == kestrel::dtype::bf16;
  if (f.gguf) {
    for (const auto& t : f.gguf->tensors()) {
      m.size += t.size_bytes;
      m.n_params += t.n_elements();
    }
    if (auto ft = f.gguf->get_optional<std::uint32_t>("general.file_type"))
      for (const auto& e : kestrel::quant::mix_table)
        if (e.ftype == *ft) m.ftype = e.name;
  } else {
    m.size = m.decode_bytes + (w.output.data == w.token_embd.data ? 0 : w.token_embd.bytes());
    m.n_params = m.layer_params + m.output_params + (w.output.data == w.token_embd.data ? 0 : matrix_elems(w.token_embd));
  }
  if (m.ftype.empty()) m.ftype = std::string(kestrel::name_of(w.layers.empty() ? w.output.type : w.layers[0].wq.type));
  m.type = std::string(kestrel::name_of(w.hparams.arch)) + " " + params_label(m.n_params) + " " + m.ftype;
  return m;
}

// ---- memory ------------------------------------------------------------------

/// Resets the peak RSS (VmHWM) to the current RSS (Linux >= 4.0).
void reset_peak_rss() {
  std::ofstream f("/proc/self/clear_refs");
  f << "5";
}

std::uint64_t peak_rss_bytes() {
  std::ifstream f("/proc/self/status");
  std::string line;
  while (std::getline(f, line))
    if (line.rfind("VmHWM:", 0) == 0) return std::strtoull(line.c_str() + 6, nullptr, 10) * 1024;
  return 0;
}

/// The commit the binary was built from (bench/build_info.h, written by
/// Meson's vcs_tag: "git describe --always --dirty" at build time).
std::string build_commit() { return KESTREL_BUILD_COMMIT; }

std::string utc_now() {
  char buf[64];
  const std::time_t t = std::time(nullptr);
  std::strftime(buf, sizeof buf, "%FT%TZ", std::gmtime(&t));
  return buf;
}

// ---- tests -------------------------------------------------------------------

struct result {
  std::string model_filename;
  model_facts facts;
  std::size_t n_threads = 0, n_prompt = 0, n_gen = 0, n_depth = 0, n_batch = 0, n_ubatch = 0;
  std::string test_time;
  std::vector<std::uint64_t> samples_ns;
  std::vector<double> samples_ts;
  double bound_ts = 0;
  std::uint64_t peak_rss = 0, kv_bytes = 0;
  kestrel::weight_placement placement = kestrel::weight_placement::automatic;  // -mmp 1: file
  std::uint64_t copied_bytes = 0;  // of the matrices, by prepare_weights
  std::string cache_type = "f16";
  std::uint64_t load_ns = 0;  // the model's construction (weights placed)
  std::vector<double> weights_gbps;  // tg: reads of the decode matrices between repetitions
  std::vector<double> peak_gops;     // pp: the compute peak the bound uses, between repetitions
};

const char* placement_name(kestrel::weight_placement p) {
  switch (p) {
    case kestrel::weight_placement::file: return "file";
    case kestrel::weight_placement::huge_pages: return "huge_pages";
    case kestrel::weight_placement::automatic: return "automatic";
  }
  return "?";
}

/// The table's note after "load ms": which placement ran, and for the
/// automatic one how much it copied.
std::string placement_note(const result& r) {
  if (r.placement == kestrel::weight_placement::file) return " (mmap)";
  if (r.placement == kestrel::weight_placement::huge_pages) return "";
  char buf[64];
  std::snprintf(buf, sizeof buf, " (auto, %.0f MiB copied)", static_cast<double>(r.copied_bytes) / (1 << 20));
  return buf;
}

struct printer {
  std::string format, commit;
  bool first = true;

  void begin() {
    if (format == "json") std::printf("[\n");
    if (format == "md") std::printf("build_commit: %s\n\n", commit.c_str());
  }
  void object(const std::string& body) {
    if (format == "json") {
      std::printf("%s  {%s}", first ? "" : ",\n", body.c_str());
    } else if (format == "jsonl") {
      std::printf("{%s}\n", body.c_str());
    }
    first = false;
    std::fflush(stdout);
  }
  void bandwidth(const bandwidth_probe& b) {
    char buf[256];
    std::snprintf(buf, sizeof buf,
                  "\"probe\": \"read_bandwidth\", \"build_commit\": \"%s\", \"n_threads\": %zu, \"buffer_bytes\": %zu, "
                  "\"gbps\": %.2f, \"samples_gbps\": ",
                  commit.c_str(), b.n_threads, b.bytes, b.gbps);
    if (format == "md")
      std::printf("probe: read bandwidth, %zu threads: %.1f GB/s (median of %zu, 1 GiB)\n", b.n_threads, b.gbps,
                  b.samples_gbps.size());
    else
      object(buf + json_list(b.samples_gbps, "%.2f"));
  }
  void compute(const compute_probe& c) {
    char buf[320];
    std::snprintf(buf, sizeof buf,
                  "\"probe\": \"compute_peak\", \"build_commit\": \"%s\", \"n_threads\": %zu, \"int8_gops\": %.1f, "
                  "\"f32_gflops\": %.1f, \"amx_int8_gops\": %.1f, \"amx_bf16_gflops\": %.1f",
                  commit.c_str(), c.n_threads, c.int8_gops, c.f32_gflops, c.amx_int8_gops, c.amx_bf16_gflops);
    if (format == "md")
      std::printf("probe: compute peak, %zu threads: int8 %.0f GOP/s, f32 FMA %.0f GFLOP/s%s%s\n", c.n_threads,
                  c.int8_gops, c.f32_gflops,
                  c.amx_int8_gops > 0 ? (", AMX int8 " + std::to_string(static_cast<long>(c.amx_int8_gops)) + " GOP/s").c_str()
                                      : "",
                  c.amx_bf16_gflops > 0
                      ? (", AMX bf16 " + std::to_string(static_cast<long>(c.amx_bf16_gflops)) + " GFLOP/s").c_str()
                      : "");
    else
      object(buf);
  }
  bool md_header = false, csv_header = false;
  /// One test's scalar fields in order, as JSON and CSV print them: the
  /// value's text, and whether it is a string (quoted) or a number / bool.
  struct field {
    const char* name;
    std::string text;
    bool quoted;
  };
  static std::string num(const char* fmt, double v) {
    char b[64];
    std::snprintf(b, sizeof b, fmt, v);
    return b;
  }
  static std::string u64(std::uint64_t v) { return std::to_string(v); }
  std::vector<field> fields(const result& r) const {
    const double avg_ts = mean(r.samples_ts), sd_ts = stddev(r.samples_ts);
    const double ratio = r.bound_ts > 0 ? avg_ts / r.bound_ts : 0;
    std::vector<field> f = {
        {"build_commit", commit, true},
        {"model_filename", r.model_filename, true},
        {"model_type", r.facts.type, true},
        {"model_size", u64(r.facts.size), false},
        {"model_n_params", u64(r.facts.n_params), false},
        {"n_batch", u64(r.n_batch), false},
        {"n_ubatch", u64(r.n_ubatch), false},
        {"n_threads", u64(r.n_threads), false},
        {"n_prompt", u64(r.n_prompt), false},
        {"n_gen", u64(r.n_gen), false},
        {"n_depth", u64(r.n_depth), false},
        {"test_time", r.test_time, true},
        {"avg_ns", num("%.0f", std::floor(mean(r.samples_ns))), false},
        {"stddev_ns", num("%.0f", std::floor(stddev(r.samples_ns))), false},
        {"avg_ts", num("%.6f", avg_ts), false},
        {"stddev_ts", num("%.6f", sd_ts), false},
        {"bound_ts", num("%.6f", r.bound_ts), false},
        {"bound_ratio", num("%.4f", ratio), false},
        {"peak_rss_bytes", u64(r.peak_rss), false},
        {"file_size", u64(r.facts.file_size), false},
        {"kv_cache_bytes", u64(r.kv_bytes), false},
        {"decode_bytes_per_token", u64(r.facts.decode_bytes), false},
        {"type_k", r.cache_type, true},
        {"type_v", r.cache_type, true},
        {"use_mmap", r.placement == kestrel::weight_placement::file ? "true" : "false", false},
        {"weight_placement", placement_name(r.placement), true},
        {"weights_copied_bytes", u64(r.copied_bytes), false},
        {"load_ns", u64(r.load_ns), false},
    };
    // tg and pp+tg: the weights' read rate (empty for pp: JSON leaves it out, CSV's column is empty)
    f.push_back({"weights_gbps", r.weights_gbps.empty() ? "" : num("%.2f", kestrel::bench::median(r.weights_gbps)), false});
    // pp and pp+tg: the compute peak of the bound (int8, f32, or the bf16 tiles' over 3: the file's)
    f.push_back({"peak_gops", r.peak_gops.empty() ? "" : num("%.1f", kestrel::bench::median(r.peak_gops)), false});
    return f;
  }
  /// A CSV field: quoted, its quotes doubled (RFC 4180).
  static std::string csv_quote(const std::string& s) {
    std::string out = "\"";
    for (char c : s) out += c == '"' ? std::string("\"\"") : std::string(1, c);
    return out + "\"";
  }
  void test(const result& r) {
    if (format == "md") {
      const double avg_ts = mean(r.samples_ts), sd_ts = stddev(r.samples_ts);
      const double ratio = r.bound_ts > 0 ? avg_ts / r.bound_ts : 0;
      if (!md_header) {
        std::printf("\n| model | size | params | threads | test | t/s | bound t/s | bound ratio | weights GB/s | peak RSS | file + KV | load ms |\n"
                    "| --- | ---: | ---: | ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n");
        md_header = true;
      }
      std::string test = r.n_prompt ? "pp" + std::to_string(r.n_prompt) : "";
      if (r.n_gen) test += (test.empty() ? "tg" : "+tg") + std::to_string(r.n_gen);
      if (r.n_depth) test += " @ d" + std::to_string(r.n_depth);
      if (r.n_prompt && std::min(r.n_batch, r.n_ubatch) < model_chunk)
        test += " ub" + std::to_string(std::min(r.n_batch, r.n_ubatch));
      char gbps[32] = "-";
      if (!r.weights_gbps.empty()) std::snprintf(gbps, sizeof gbps, "%.1f", kestrel::bench::median(r.weights_gbps));
      std::printf("| %s | %.2f MiB | %.2f M | %zu | %s | %.2f ± %.2f | %.2f | %.3f | %s | %.1f MiB | %.1f MiB | %.0f%s |\n",
                  r.facts.type.c_str(), static_cast<double>(r.facts.size) / (1 << 20),
                  static_cast<double>(r.facts.n_params) / 1e6, r.n_threads, test.c_str(), avg_ts, sd_ts, r.bound_ts,
                  ratio, gbps, static_cast<double>(r.peak_rss) / (1 << 20),
                  static_cast<double>(r.facts.file_size + r.kv_bytes) / (1 << 20), static_cast<double>(r.load_ns) / 1e6,
                  placement_note(r).c_str());
      std::fflush(stdout);
      return;
    }
    const std::vector<field> f = fields(r);
    if (format == "csv") {
      std::string header, row;
      for (const field& x : f) {
        const char* sep = &x == &f.front() ? "" : ",";
        header += sep + std::string(x.name);
        row += sep + (x.quoted ? csv_quote(x.text) : x.text);
      }
      if (!csv_header) std::printf("%s\n", header.c_str());
      csv_header = true;
      std::printf("%s\n", row.c_str());
      std::fflush(stdout);
      return;
    }
    std::string body;
    for (const field& x : f)
      if (x.quoted || !x.text.empty()) body += "\"" + std::string(x.name) + "\": " + (x.quoted ? json_string(x.text) : x.text) + ", ";
    if (!r.weights_gbps.empty()) body += "\"samples_weights_gbps\": " + json_list(r.weights_gbps, "%.2f") + ", ";
    if (!r.peak_gops.empty()) body += "\"samples_peak_gops\": " + json_list(r.peak_gops, "%.1f") + ", ";
    object(body + "\"samples_ns\": " + json_list(r.samples_ns, "%llu") + ", \"samples_ts\": " + json_list(r.samples_ts, "%.6f"));
  }
  void end() {
    if (format == "json") std::printf("\n]\n");
    std::fflush(stdout);
  }
};

}  // namespace

int main(int argc, char** argv) {
  std::vector<std::string> models;
  std::vector<long> threads{static_cast<long>(std::max(1u, std::thread::hardware_concurrency()))};
  std::vector<long> prompts{512}, gens{128}, depths{0};
  std::vector<std::pair<long, long>> prompt_gens;  // -pg
  std::vector<long> batches{2048}, ubatches{512};
  long reps = 5;
  bool warmup = true;
  kestrel::weight_placement placement = kestrel::weight_placement::automatic;
  std::string format = "md", type_k = "f16", type_v = "f16";
  for (int i = 1; i < argc; ++i) {
    const std::string_view a = argv[i];
    auto value = [&]() -> std::string_view {
      if (i + 1 >= argc) die(std::string(a) + " needs a value");
      return argv[++i];
    };
    if (a == "-h" || a == "--help") {
      std::printf("%s", usage);
      return 0;
    } else if (a == "-m" || a == "--model") {
      for (auto& m : split(value()))
        if (!m.empty()) models.push_back(m);
    } else if (a == "-t" || a == "--threads") threads = numbers(a, value(), 1);
    else if (a == "-p" || a == "--n-prompt") prompts = numbers(a, value(), 0);
    else if (a == "-n" || a == "--n-gen") gens = numbers(a, value(), 0);
    else if (a == "-pg" || a == "--n-pg") {
      const std::vector<long> pg = numbers(a, value(), 1);
      if (pg.size() != 2) die(std::string(a) + " takes two numbers, P,N (prompt and generated tokens)");
      prompt_gens.emplace_back(pg[0], pg[1]);
    } else if (a == "-d" || a == "--n-depth") depths = numbers(a, value(), 0);
    else if (a == "-b" || a == "--batch-size") batches = numbers(a, value(), 1);
    else if (a == "-ub" || a == "--ubatch-size") ubatches = numbers(a, value(), 1);
    else if (a == "-r" || a == "--repetitions") reps = kestrel::cli::parse_number<long>(a, value());
    else if (a == "-o" || a == "--output") format = std::string(value());
    else if (a == "-mmp" || a == "--mmap") {
      const long mmp = kestrel::cli::parse_number<long>(a, value());
      if (mmp != 0 && mmp != 1) die(std::string(a) + " must be 0 or 1, got " + std::to_string(mmp));
      placement = mmp == 1 ? kestrel::weight_placement::file : kestrel::weight_placement::huge_pages;
    }
    else if (a == "-ctk" || a == "--cache-type-k") type_k = std::string(value());
    else if (a == "-ctv" || a == "--cache-type-v") type_v = std::string(value());
    else if (a == "--no-warmup") warmup = false;
    else {
      std::fprintf(stderr, "error: unknown argument '%s'\n%s", argv[i], usage);
      return 1;
    }
  }
  if (models.empty()) die("no model given (-m FILE)");
  for (const auto& m : models)  // before the probes' seconds
    if (!std::filesystem::is_regular_file(m))
      die(m + (std::filesystem::is_directory(m) ? ": is a directory, not a model file" : ": no such file"));
  for (long t : threads)  // the probes start t threads each: a typo of -t 5000 would run for minutes
    if (t > static_cast<long>(kestrel::cpu::thread_pool::max_threads))
      die("-t " + std::to_string(t) + " exceeds " + std::to_string(kestrel::cpu::thread_pool::max_threads) +
          " threads");
  if (reps < 1) die("-r must be >= 1");
  if (format != "md" && format != "csv" && format != "json" && format != "jsonl")
    die("-o must be md, csv, json or jsonl, got " + format);
  if (type_k != "f16" && type_k != "f32") die("-ctk must be f16 or f32, got " + type_k);
  if (type_v != type_k) die("-ctv " + type_v + " differs from -ctk " + type_k + ": kestrel's caches hold one type");
  for (long ub : ubatches)
    if (ub > static_cast<long>(model_chunk))
      die("-ub " + std::to_string(ub) + " is more than the " + std::to_string(model_chunk) +
          " tokens the model prefills per pass");

  printer out{format, build_commit()};
  out.begin();
  // Probes first, once per thread count, while no model is resident.
  std::vector<std::pair<bandwidth_probe, compute_probe>> probes;
  for (long t : threads) {
    probes.emplace_back(probe_bandwidth(static_cast<std::size_t>(t)), probe_compute(static_cast<std::size_t>(t)));
    out.bandwidth(probes.back().first);
    out.compute(probes.back().second);
  }

  std::mt19937 rng(1234);
  try {
    for (const auto& path : models) {
      const auto file = kestrel::load_model_file(path);
      const model_facts facts = facts_of(file);
      const auto& hp = file.weights.hparams;
      const std::size_t n_vocab = hp.n_vocab;
      const bool add_bos = file.tokenizer.add_bos();
      const kestrel::token_id bos = file.tokenizer.bos();
      auto random_token = [&] { return static_cast<kestrel::token_id>(rng() % n_vocab); };
      for (std::size_t ti = 0; ti < threads.size(); ++ti) {
        const std::size_t n_threads = static_cast<std::size_t>(threads[ti]);
        struct test_shape { std::size_t n_prompt, n_gen, n_depth, n_batch, n_ubatch; };
        std::vector<test_shape> tests;
        for (long b : batches)
          for (long ub : ubatches)
            for (long d : depths) {
              const auto D = static_cast<std::size_t>(d), Bt = static_cast<std::size_t>(b), U = static_cast<std::size_t>(ub);
              for (long p : prompts)
                if (p > 0) tests.push_back({static_cast<std::size_t>(p), 0, D, Bt, U});
              for (long n : gens)
                if (n > 0) tests.push_back({0, static_cast<std::size_t>(n), D, Bt, U});
              for (const auto& [p, n] : prompt_gens)
                tests.push_back({static_cast<std::size_t>(p), static_cast<std::size_t>(n), D, Bt, U});
            }
        for (const auto& [n_prompt, n_gen, n_depth, n_batch, n_ubatch] : tests) {
          result r;
          r.model_filename = path;
          r.facts = facts;
          r.n_threads = n_threads;
          r.n_prompt = n_prompt;
          r.n_gen = n_gen;
          r.n_depth = n_depth;
          r.n_batch = n_batch;
          r.n_ubatch = n_ubatch;
          // tokens per prefill call, as llama.cpp's ubatches
          const std::size_t chunk = std::min(n_batch, n_ubatch);
          r.test_time = utc_now();
          const std::size_t n_ctx = n_depth + n_prompt + n_gen;
          r.cache_type = type_k;
          // The rest of the test, on a model with the cache the flags chose.
          auto run_test = [&]<class Cache>(std::type_identity<Cache>) {
            using kv_element = typename Cache::element_type;
            const std::uint64_t kv_bytes_per_pos = 2ull * hp.n_layer * hp.kv_dim() * sizeof(kv_element);
            r.kv_bytes = kv_bytes_per_pos * n_ctx;
            // Each test's peak is its own model's: the file mapping outlives
            // the models, and what the previous test's model mapped of it
            // (the token embeddings its prompt looked up: 66 MiB of
            // TinyLlama q8_0's 70 MB table after pp512) would count until
            // this model's placement gives the pages back (tg128 after
            // pp512: 1135 MiB, against 1083 run alone). Not with --mmap 1,
            // where the model reads every matrix in place: its pages count
            // in the file size, and llama-bench keeps them mapped too.
            if (placement != kestrel::weight_placement::file)
              for (const auto& m : file.weights.mapped) kestrel::release_pages(m.data(), m.size());
            reset_peak_rss();
            r.placement = placement;
            const std::uint64_t t_load = now_ns();
            kestrel::llama_model<kestrel::dynamic_llama_config, kestrel::cpu_backend, Cache> model(
                file.weights, n_ctx, kestrel::cpu_backend(n_threads, placement));
            r.load_ns = now_ns() - t_load;
            r.copied_bytes = model.weights().copied_bytes;
            // The first token of an empty cache is BOS where the vocabulary adds one.
            auto first_token = [&] { return add_bos && model.n_past() == 0 ? bos : random_token(); };
            std::vector<kestrel::token_id> depth(n_depth), prompt(n_prompt);
            auto prefill = [&](std::span<const kestrel::token_id> tokens) {  // in calls of chunk tokens
              for (std::size_t at = 0; at < tokens.size(); at += chunk)
                model.prefill(tokens.subspan(at, std::min(chunk, tokens.size() - at)));
            };
            auto fill_depth = [&] {  // untimed: the cache at depth n_depth
              model.reset();
              for (std::size_t i = 0; i < n_depth; ++i) depth[i] = i == 0 ? first_token() : random_token();
              prefill(depth);
            };
            auto run_prompt = [&] {
              for (std::size_t i = 0; i < n_prompt; ++i) prompt[i] = i == 0 ? first_token() : random_token();
              prefill(prompt);
            };
            auto run_gen = [&](std::size_t n) {
              kestrel::token_id t = first_token();
              for (std::size_t i = 0; i < n; ++i) {
                model.decode(t);
                t = random_token();
              }
            };
            if (warmup) {
              fill_depth();
              if (n_prompt) run_prompt();
              if (n_gen) run_gen(1);
            }
            // tg: the weights' read rate before the first repetition and
            // after each, two passes each time (untimed).
            const auto mats = decode_matrices(model.weights());
            auto probe_weights = [&] {
              if (n_gen)
                for (int pass = 0; pass < 2; ++pass) r.weights_gbps.push_back(probe_weights_once(mats, n_threads));
            };
            // pp: the compute peak likewise, one run of its loop before the
            // first repetition and after each (this host's speed moves
            // within seconds, so a peak from the start of the process
            // alone can be from another moment than the test's).
            const peak_kind kind = facts.quantized ? peak_kind::int8
                                   : kestrel::cpu::takes_bf16_tiles(facts.cols_gcd, static_cast<std::size_t>(n_prompt))
                                       ? (facts.bf16_layers ? peak_kind::bf16_tiles_2 : peak_kind::bf16_tiles)
                                       : peak_kind::f32;
            auto probe_peak = [&] {
              if (n_prompt) r.peak_gops.push_back(probe_peak_once(n_threads, kind));
            };
            probe_weights();
            probe_peak();
            for (long rep = 0; rep < reps; ++rep) {
              fill_depth();
              const std::uint64_t t0 = now_ns();
              if (n_prompt) run_prompt();
              if (n_gen) run_gen(n_gen);
              const std::uint64_t ns = now_ns() - t0;
              r.samples_ns.push_back(ns);
              r.samples_ts.push_back(1e9 * static_cast<double>(n_prompt + n_gen) / static_cast<double>(ns));
              probe_weights();
              probe_peak();
            }
            r.peak_rss = peak_rss_bytes();
            // The bound's seconds: the prompt's at the compute peak plus the
            // generated tokens' at the weights' read rate (pp+tg both).
            double bound_s = 0;
            if (n_prompt) {
              // The work a prompt needs: every layer's matrices per token
              // but the last layer's queries, output and FFN (and the output
              // matrix) for each pass's last token alone (a pass: one prefill
              // call, chunk <= model_chunk tokens); attention not counted.
              const double np = static_cast<double>(n_prompt);
              const double passes = static_cast<double>((n_prompt + chunk - 1) / chunk);
              const double ops = 2.0 * (np * static_cast<double>(facts.layer_params - facts.last_token_params) +
                                        passes * static_cast<double>(facts.last_token_params + facts.output_params));
              const double peak_ops = kestrel::bench::median(r.peak_gops) * 1e9;
              bound_s += ops / peak_ops;
            }
            if (n_gen) {
              // decoding position p + i (p = n_depth + n_prompt) reads the
              // cache's p + i + 1 positions: their mean
              const double kv_read = static_cast<double>(kv_bytes_per_pos) *
                                     (static_cast<double>(n_depth + n_prompt) + static_cast<double>(n_gen + 1) / 2);
              const double per_token = (static_cast<double>(facts.decode_bytes) + kv_read) /
                                       (kestrel::bench::median(r.weights_gbps) * 1e9);
              bound_s += static_cast<double>(n_gen) * per_token;
            }
            r.bound_ts = bound_s > 0 ? static_cast<double>(n_prompt + n_gen) / bound_s : 0;
          };
          if (type_k == "f16")
            run_test(std::type_identity<kestrel::f16_kv_cache>{});
          else
            run_test(std::type_identity<kestrel::contiguous_kv_cache>{});
          out.test(r);
        }
      }
    }
  } catch (const std::exception& e) {
    die(e.what());
  }
  out.end();
}
