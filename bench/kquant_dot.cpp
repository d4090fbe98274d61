// kestrel-bench-kquant: the quantized dot products and decode's matvec, fast
// against scalar twin, side by side in one process, one thread.
//
//   kestrel-bench-kquant [-r REPEATS (7)] [--rows R (5632)] [--cols C (2048)] [--tokens T (64)]
//   kestrel-bench-kquant --prefill [-r REPEATS (5)] [--rows R (5632)] [--cols C (2048)] [--tokens T (512)]
//                        [--types q8_0,q4_0,q4_K]
//
// --prefill: prefill's quantized matmul Y = X W^T (T tokens, W rows x cols,
// activations quantized in the call) through cpu::matmul on 1 and 2
// threads, against the int8 peak measured in the same run (a
// register-resident loop of 12 independent vpdpbusd zmm chains on as many
// threads), interleaved so both see the same load on the shared machine:
//   {"bench":"kquant_prefill","type":..,"threads":..,"gops":..,
//    "int8_peak_gops":..,"pct_of_peak":..}
// with GOP/s = 2 * T * rows * cols / time (one multiply, one add per MAC).
//
// For each weight type (q2_K .. q6_K against q8_K activations, and the
// legacy q4_0 / q8_0 against q8_0 for comparison), JSON lines:
//   {"bench":"kquant_dot","type":..,"test":"dot",...}: ns per 256 weights of
//     one row dot (4096 values, in L1), scalar twin vs SIMD, and the ratio;
//   {"bench":"kquant_dot","type":..,"test":"matvec",...}: y = W x with W
//     (rows, cols) and (cols, rows) (TinyLlama's FFN up/gate and down by
//     default), through cpu::matvec (activations quantized in the call) and
//     ref::matvec, as GB/s of weight bytes; "rowwise" is the plain loop of
//     quant dots one row at a time, for comparing matvec's row scheduling;
//     "x16" (q4_K, q6_K) the same matrix interleaved by 16 rows as
//     cpu_backend places a file's (quant/kquant_x16.hpp), through
//     cpu::matmul, GB/s of the row-major bytes, timed alternately with the
//     row-major matmul alone ("x16_vs_matvec");
//   {"bench":"kquant_dot","type":..,"test":"matmul",...}: prefill's Y = X W^T
//     for T tokens through cpu::matmul against one dot per (row, token)
//     ("rowwise", the loop before token groups) and against token groups with
//     each row meeting every token before the next row ("rows_outer", no
//     cache blocking; legacy types: empty), as GMAC/s. With AVX-512 VNNI,
//     cpu::matmul takes the k-quant prefill panels from
//     quant::kpanel_min_tokens tokens on (16 or 32; the default T is 64).
// Every figure is a median of REPEATS runs, the compared variants
// interleaved within each repeat; the machine is shared, so compare ratios
// from one run rather than absolute numbers across runs. Note: 2048 x 5632
// weights are 3.3 to 8.6 MB, so they may stay in L3 (32 MB) between runs:
// this measures the kernels' streaming rate, not DRAM's.
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <string_view>
#include <thread>
#include <type_traits>
#include <vector>

#if defined(__AVX512VNNI__)
#include <immintrin.h>
#endif

#include "common.hpp"
#include "kestrel/cpu/matmul.hpp"
#include "kestrel/cpu/matvec.hpp"
#include "kestrel/cpu/quantized.hpp"
#include "kestrel/cpu/thread_pool.hpp"
#include "kestrel/cpu/ref/linear.hpp"
#include "kestrel/quant/kquant_x16.hpp"
#include "kestrel/quant/kquants.hpp"
#include "kestrel/quant/legacy.hpp"

namespace q = kestrel::quant;
using kestrel::bench::median;
using kestrel::bench::now_ms;

namespace {

volatile float sink;

/// Makes the compiler assume memory changed: without it a loop of dots on the
/// same inputs may be computed once.
inline void clobber() { asm volatile("" ::: "memory"); }

std::vector<float> random_floats(std::size_t n, std::uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> d(-1.0f, 1.0f);
  std::vector<float> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

/// Times each function once per repeat, interleaved; returns the medians in ms.
std::vector<double> time_interleaved(int repeats, const std::vector<std::function<void()>>& fs) {
  std::vector<std::vector<double>> t(fs.size());
  for (auto& f : fs) f();  // warm-up
  for (int r = 0; r < repeats; ++r)
    for (std::size_t i = 0; i < fs.size(); ++i) {
      const double t0 = now_ms();
      fs[i]();
      t[i].push_back(now_ms() - t0);
    }
  std::vector<double> m;
  for (auto& v : t) m.push_back(median(v));
  return m;
}

template <class B, class A>
void bench_type(const char* name, kestrel::dtype type, std::size_t rows, std::size_t cols, std::size_t n_tokens,
                int repeats) {
  constexpr std::size_t qk = sizeof(A) == sizeof(q::block_q8_K) ? 256 : 32;
  auto fast_dot = [](const B* w, const A* a, std::size_t n) {
    if constexpr (qk == 256) return q::vec_dot(w, a, n); else return q::dot(w, a, n);
  };
  auto ref_dot = [](const B* w, const A* a, std::size_t n) {
    if constexpr (qk == 256) return q::ref::vec_dot(w, a, n); else return q::ref::dot(w, a, n);
  };

  // ---- one row's dot, in L1 ----
  {
    const std::size_t n = 4096, inner = 2000;
    const auto xw = random_floats(n, 1), xa = random_floats(n, 2);
    std::vector<B> w(n / qk);
    std::vector<A> a(n / qk);
    q::quantize_row(xw.data(), w.data(), n);
    q::quantize_row(xa.data(), a.data(), n);
    const auto m = time_interleaved(repeats, {
        [&] {
          float s = 0;
          for (std::size_t i = 0; i < inner / 8; ++i) { clobber(); s += ref_dot(w.data(), a.data(), n); }
          sink = s;
        },
        [&] {
          float s = 0;
          for (std::size_t i = 0; i < inner; ++i) { clobber(); s += fast_dot(w.data(), a.data(), n); }
          sink = s;
        },
    });
    const double per256_ref = m[0] * 1e6 / (double(inner / 8) * n / 256), per256 = m[1] * 1e6 / (double(inner) * n / 256);
    std::printf("{\"bench\":\"kquant_dot\",\"type\":\"%s\",\"test\":\"dot\",\"n\":%zu,\"ns_per_256_ref\":%.2f,"
                "\"ns_per_256_simd\":%.2f,\"speedup\":%.2f,\"repeats\":%d}\n",
                name, n, per256_ref, per256, per256_ref / per256, repeats);
    std::fflush(stdout);
  }

  // ---- matvec: one quantized weight buffer seen as (rows, cols) and (cols, rows) ----
  const auto xw = random_floats(rows * cols, 3);
  std::vector<B> w(rows * cols / qk);
  q::quantize_row(xw.data(), w.data(), rows * cols);
  const double bytes = double(w.size() * sizeof(B));
  for (auto [r_, c_] : {std::pair{rows, cols}, std::pair{cols, rows}})
    for (std::size_t n_threads : {std::size_t{1}, std::size_t{2}})
      for (std::size_t nt : {std::size_t{1}, std::size_t{2}, std::size_t{4}}) {
        if (nt > 1 && qk == 256) continue;
        const std::size_t R = r_, C = c_;
        kestrel::weight_view view;
        view.type = type;
        view.data = w.data();
        view.rows = R;
        view.cols = C;
        kestrel::cpu::thread_pool pool(n_threads);
        kestrel::cpu::thread_pool* pp = n_threads > 1 ? &pool : nullptr;
        const auto x = random_floats(nt * C, 4);
        std::vector<float> y(nt * R);
        std::vector<A> act(nt * (C / qk));
        const bool with_ref = n_threads == 1 && nt == 1;
        // q4_K and q6_K: the same matrix interleaved by 16 rows, as
        // cpu_backend places a file's (dtype::q4_k_x16 / q6_k_x16, quant/kquant_x16.hpp)
        std::vector<std::byte> x16_bytes;
        kestrel::weight_view x16_view;
#if defined(KESTREL_X16_KERNEL)
        auto make_x16 = [&]<class X>(kestrel::dtype xt) {
          const std::size_t n_panels = (R + 15) / 16;
          x16_bytes.resize(n_panels * (C / X::values) * sizeof(X) + 64);
          auto* out = reinterpret_cast<X*>((reinterpret_cast<std::uintptr_t>(x16_bytes.data()) + 63) / 64 * 64);
          q::pack_x16_panels(reinterpret_cast<const std::byte*>(w.data()), (C / qk) * sizeof(B), R, C, 0, n_panels, out);
          x16_view = {xt, out, R, C};
        };
        if constexpr (std::is_same_v<B, q::block_q4_K>) make_x16.template operator()<q::block_q4_K_x16>(kestrel::dtype::q4_k_x16);
        if constexpr (std::is_same_v<B, q::block_q6_K>) make_x16.template operator()<q::block_q6_K_x16>(kestrel::dtype::q6_k_x16);
#endif
        const bool with_x16 = x16_view.data != nullptr;
        const auto m = time_interleaved(repeats, {
            [&] { if (with_ref) kestrel::cpu::ref::matvec(view, x.data(), y.data(), nullptr); },
            [&] {  // the per-row SIMD dot (quant::dot / quant::vec_dot), rows split over the threads
              for (std::size_t t = 0; t < nt; ++t) q::quantize_row(x.data() + t * C, act.data() + t * (C / qk), C);
              kestrel::cpu::parallel_for(pp, R, [&](std::size_t r0, std::size_t r1) {
                for (std::size_t r = r0; r < r1; ++r)
                  for (std::size_t t = 0; t < nt; ++t)
                    y[t * R + r] = fast_dot(w.data() + r * (C / qk), act.data() + t * (C / qk), C);
              }, nt * R * C);
            },
            [&] {  // legacy types: the 16-row x token-group tiles (quantized_linear's path before decode kernels)
#if defined(KESTREL_LEGACY_PANEL)
              if constexpr (qk == 32) {
                for (std::size_t t = 0; t < nt; ++t) q::quantize_row(x.data() + t * C, act.data() + t * (C / qk), C);
                kestrel::cpu::detail::legacy_panels<B>(reinterpret_cast<const std::byte*>(w.data()), (C / qk) * sizeof(B),
                                                       R, act.data(), C / qk, nt, y.data(), pp);
              }
#endif
            },
            [&] { kestrel::cpu::matmul(view, x.data(), nt, y.data(), pp); },
            [&] {  // legacy types: the decode kernel on all nt tokens (quantized_linear takes it up to decode_max_tokens)
#if defined(KESTREL_LEGACY_DECODE)
              if constexpr (qk == 32) {
                thread_local q::decode_acts<B> acts[q::decode_kernel_tokens];
                const q::decode_acts<B>* ap[q::decode_kernel_tokens];
                for (std::size_t t = 0; t < nt; ++t) {
                  q::quantize_row(x.data() + t * C, act.data() + t * (C / qk), C);
                  acts[t].prepare(act.data() + t * (C / qk), C / qk);
                  ap[t] = &acts[t];
                }
                kestrel::cpu::parallel_for(pp, R, [&](std::size_t r0, std::size_t r1) {
                  q::dot_rows_decode<B>(reinterpret_cast<const std::byte*>(w.data()) + r0 * (C / qk) * sizeof(B),
                                        (C / qk) * sizeof(B), r1 - r0, ap, nt, y.data() + r0, R);
                }, nt * R * C);
              }
#endif
            },
        });
        // x16 against the row-major matmul in a pair of their own, so each
        // finds its matrix in the caches as the other does (after the list
        // above, the row-major one was warmer).
        std::vector<double> mx{1.0, 1.0};
        if (with_x16)
          mx = time_interleaved(repeats, {[&] { kestrel::cpu::matmul(view, x.data(), nt, y.data(), pp); },
                                          [&] { kestrel::cpu::matmul(x16_view, x.data(), nt, y.data(), pp); }});
        const double b1 = bytes / 1e6;
        std::printf("{\"bench\":\"kquant_dot\",\"type\":\"%s\",\"test\":\"matvec\",\"rows\":%zu,\"cols\":%zu,"
                    "\"n_tokens\":%zu,\"threads\":%zu,\"weight_mb\":%.2f,\"gbps_ref\":%.2f,\"gbps_rowwise\":%.2f,"
                    "\"gbps_tile\":%.2f,\"gbps_decode_kernel\":%.2f,\"gbps_matvec\":%.2f,\"matvec_vs_rowwise\":%.2f,\"matvec_vs_tile\":%.2f,"
                    "\"gbps_x16\":%.2f,\"x16_vs_matvec\":%.2f,\"repeats\":%d}\n",
                    name, R, C, nt, n_threads, b1, with_ref ? b1 / m[0] : 0.0, b1 / m[1], qk == 32 ? b1 / m[2] : 0.0, qk == 32 ? b1 / m[4] : 0.0,
                    b1 / m[3], m[1] / m[3], qk == 32 ? m[2] / m[3] : 0.0, with_x16 ? b1 / mx[1] : 0.0,
                    with_x16 ? mx[0] / mx[1] : 0.0, repeats);
        std::fflush(stdout);
      }

  // ---- prefill: Y = X W^T for n_tokens tokens, one thread ----
  {
    const std::size_t R = rows, C = cols, T = n_tokens;
    kestrel::weight_view view;
    view.type = type;
    view.data = w.data();
    view.rows = R;
    view.cols = C;
    const auto x = random_floats(T * C, 5);
    std::vector<float> y(T * R);
    std::vector<A> act(T * (C / qk));
    const auto m = time_interleaved(repeats, {
        [&] {  // every (row, token) pair its own dot: the loop before token groups
          for (std::size_t t = 0; t < T; ++t) q::quantize_row(x.data() + t * C, act.data() + t * (C / qk), C);
          for (std::size_t r = 0; r < R; ++r)
            for (std::size_t t = 0; t < T; ++t)
              y[t * R + r] = fast_dot(w.data() + r * (C / qk), act.data() + t * (C / qk), C);
        },
        [&] {  // token groups, but each row against every token before the next row
          for (std::size_t t = 0; t < T; ++t) q::quantize_row(x.data() + t * C, act.data() + t * (C / qk), C);
          if constexpr (qk == 256)
            for (std::size_t r = 0; r < R; ++r) q::vec_dot_tokens(w.data() + r * (C / qk), act.data(), C, T, y.data() + r, R);
        },
        [&] { kestrel::cpu::matmul(view, x.data(), T, y.data(), nullptr); },
    });
    const double macs = double(R) * double(C) * double(T);
    char rows_outer[96] = "\"ms_rows_outer\":null,";  // legacy types have no token groups
    if (qk == 256) std::snprintf(rows_outer, sizeof rows_outer, "\"ms_rows_outer\":%.2f,", m[1]);
    char vs_rows_outer[96] = "\"matmul_vs_rows_outer\":null,";
    if (qk == 256) std::snprintf(vs_rows_outer, sizeof vs_rows_outer, "\"matmul_vs_rows_outer\":%.2f,", m[1] / m[2]);
    std::printf("{\"bench\":\"kquant_dot\",\"type\":\"%s\",\"test\":\"matmul\",\"rows\":%zu,\"cols\":%zu,"
                "\"n_tokens\":%zu,\"ms_rowwise\":%.2f,%s\"ms_matmul\":%.2f,\"gmacs_rowwise\":%.2f,"
                "\"gmacs_matmul\":%.2f,\"matmul_vs_rowwise\":%.2f,%s\"repeats\":%d}\n",
                name, R, C, T, m[0], rows_outer, m[2], macs / m[0] / 1e6, macs / m[2] / 1e6, m[0] / m[2], vs_rows_outer,
                repeats);
    std::fflush(stdout);
  }
}

// ---- prefill: quantized matmul vs the int8 peak, same run ----

constexpr long peak_iters = 4'000'000;

KESTREL_INTRINSICS_BEGIN  // _mm512_reduce_add_epi32 on GCC 12 (kestrel/core/diagnostics.hpp)
/// 12 independent vpdpbusd zmm chains (register-resident): 12 * 64 u8 x s8
/// products, 2 ops each, per iteration. 0 without AVX-512 VNNI.
double vnni_peak_ms(long iters) {
#if defined(__AVX512VNNI__)
  __m512i a[12];
  for (int j = 0; j < 12; ++j) a[j] = _mm512_set1_epi32(j);
  __m512i x = _mm512_set1_epi8(1), y = _mm512_set1_epi8(-1);
  const double t0 = now_ms();
  for (long i = 0; i < iters; ++i) {
    asm volatile("" : "+v"(x), "+v"(y));
    for (int j = 0; j < 12; ++j) a[j] = _mm512_dpbusd_epi32(a[j], x, y);
  }
  __m512i s = a[0];
  for (int j = 1; j < 12; ++j) s = _mm512_add_epi32(s, a[j]);
  sink = static_cast<float>(_mm512_reduce_add_epi32(s));
  return now_ms() - t0;
#else
  (void)iters;
  return 0;
#endif
}
KESTREL_INTRINSICS_END

/// The peak loop on n threads at once; GOP/s over all of them.
double vnni_peak_gops(std::size_t n_threads) {
  std::vector<std::thread> th;
  std::vector<double> ms(n_threads);
  const double t0 = now_ms();
  for (std::size_t i = 0; i < n_threads; ++i) th.emplace_back([&, i] { ms[i] = vnni_peak_ms(peak_iters); });
  for (auto& t : th) t.join();
  const double wall = now_ms() - t0;
  if (ms[0] == 0) return 0;
  return double(peak_iters) * double(n_threads) * 12 * 64 * 2 / wall / 1e6;
}

template <class B, class A>
void bench_prefill(const char* name, kestrel::dtype type, std::size_t rows, std::size_t cols, std::size_t n_tokens,
                   int repeats) {
  constexpr std::size_t qk = sizeof(A) == sizeof(q::block_q8_K) ? 256 : 32;
  const auto xw = random_floats(rows * cols, 3);
  std::vector<B> w(rows * cols / qk);
  q::quantize_row(xw.data(), w.data(), rows * cols);
  kestrel::weight_view view;
  view.type = type;
  view.data = w.data();
  view.rows = rows;
  view.cols = cols;
  const auto x = random_floats(n_tokens * cols, 5);
  std::vector<float> y(n_tokens * rows);
  const double ops = 2.0 * double(rows) * double(cols) * double(n_tokens);
  for (std::size_t n_threads : {std::size_t{1}, std::size_t{2}}) {
    kestrel::cpu::thread_pool pool(n_threads);
    kestrel::cpu::thread_pool* p = n_threads > 1 ? &pool : nullptr;
    std::vector<double> peak;
    const auto m = time_interleaved(repeats, {
        [&] { kestrel::cpu::matmul(view, x.data(), n_tokens, y.data(), p); },
        [&] { peak.push_back(vnni_peak_gops(n_threads)); },
    });
    const double gops = ops / m[0] / 1e6, pk = median(peak);
    std::printf("{\"bench\":\"kquant_prefill\",\"type\":\"%s\",\"rows\":%zu,\"cols\":%zu,\"n_tokens\":%zu,"
                "\"threads\":%zu,\"ms\":%.2f,\"gops\":%.1f,\"int8_peak_gops\":%.1f,\"pct_of_peak\":%.1f,"
                "\"repeats\":%d}\n",
                name, rows, cols, n_tokens, n_threads, m[0], gops, pk, pk > 0 ? 100 * gops / pk : 0.0, repeats);
    std::fflush(stdout);
  }
}

}  // namespace

int main(int argc, char** argv) {
  int repeats = 7;
  std::size_t rows = 5632, cols = 2048, n_tokens = 64;
  bool prefill = false, tokens_set = false, repeats_set = false, types_set = false;
  std::string types = "q8_0,q4_0,q4_K";
  for (int i = 1; i < argc; ++i) {
    const std::string_view a = argv[i];
    if (a == "--prefill") prefill = true;
    else if (i + 1 < argc && a == "--types") { types = argv[++i]; types_set = true; }
    else if (i + 1 < argc && a == "-r") { repeats = std::atoi(argv[++i]); repeats_set = true; }
    else if (i + 1 < argc && a == "--rows") rows = std::strtoull(argv[++i], nullptr, 10);
    else if (i + 1 < argc && a == "--cols") cols = std::strtoull(argv[++i], nullptr, 10);
    else if (i + 1 < argc && a == "--tokens") { n_tokens = std::strtoull(argv[++i], nullptr, 10); tokens_set = true; }
    else {
      std::fprintf(stderr, "usage: kestrel-bench-kquant [-r REPEATS (7)] [--rows R (5632)] [--cols C (2048)] [--tokens T (64)] [--types q4_0,q8_0,...]\n"
                           "       kestrel-bench-kquant --prefill [-r REPEATS (5)] [--rows R] [--cols C] [--tokens T (512)] [--types q8_0,q4_0,q4_K]\n");
      return 2;
    }
  }
  if (repeats < 1 || rows % 256 || cols % 256 || rows == 0 || cols == 0) {
    std::fprintf(stderr, "kestrel-bench-kquant: need -r >= 1 and rows, cols positive multiples of 256\n");
    return 2;
  }
  using kestrel::dtype;
  auto want = [&](std::string_view t) { return ("," + types + ",").find("," + std::string(t) + ",") != std::string::npos; };
  if (prefill) {
    if (!tokens_set) n_tokens = 512;
    if (!repeats_set) repeats = 5;
    if (want("q8_0")) bench_prefill<q::block_q8_0, q::block_q8_0>("q8_0", dtype::q8_0, rows, cols, n_tokens, repeats);
    if (want("q4_0")) bench_prefill<q::block_q4_0, q::block_q8_0>("q4_0", dtype::q4_0, rows, cols, n_tokens, repeats);
    if (want("q4_1")) bench_prefill<q::block_q4_1, q::block_q8_1>("q4_1", dtype::q4_1, rows, cols, n_tokens, repeats);
    if (want("q5_0")) bench_prefill<q::block_q5_0, q::block_q8_0>("q5_0", dtype::q5_0, rows, cols, n_tokens, repeats);
    if (want("q5_1")) bench_prefill<q::block_q5_1, q::block_q8_1>("q5_1", dtype::q5_1, rows, cols, n_tokens, repeats);
    if (want("q4_K")) bench_prefill<q::block_q4_K, q::block_q8_K>("q4_K", dtype::q4_k, rows, cols, n_tokens, repeats);
    if (want("q6_K")) bench_prefill<q::block_q6_K, q::block_q8_K>("q6_K", dtype::q6_k, rows, cols, n_tokens, repeats);
    return 0;
  }
  if (!types_set) types = "q2_K,q3_K,q4_K,q5_K,q6_K,q4_0,q8_0";
  if (want("q2_K")) bench_type<q::block_q2_K, q::block_q8_K>("q2_K", dtype::q2_k, rows, cols, n_tokens, repeats);
  if (want("q3_K")) bench_type<q::block_q3_K, q::block_q8_K>("q3_K", dtype::q3_k, rows, cols, n_tokens, repeats);
  if (want("q4_K")) bench_type<q::block_q4_K, q::block_q8_K>("q4_K", dtype::q4_k, rows, cols, n_tokens, repeats);
  if (want("q5_K")) bench_type<q::block_q5_K, q::block_q8_K>("q5_K", dtype::q5_k, rows, cols, n_tokens, repeats);
  if (want("q6_K")) bench_type<q::block_q6_K, q::block_q8_K>("q6_K", dtype::q6_k, rows, cols, n_tokens, repeats);
  if (want("q4_0")) bench_type<q::block_q4_0, q::block_q8_0>("q4_0", dtype::q4_0, rows, cols, n_tokens, repeats);
  if (want("q4_1")) bench_type<q::block_q4_1, q::block_q8_1>("q4_1", dtype::q4_1, rows, cols, n_tokens, repeats);
  if (want("q5_0")) bench_type<q::block_q5_0, q::block_q8_0>("q5_0", dtype::q5_0, rows, cols, n_tokens, repeats);
  if (want("q5_1")) bench_type<q::block_q5_1, q::block_q8_1>("q5_1", dtype::q5_1, rows, cols, n_tokens, repeats);
  if (want("q8_0")) bench_type<q::block_q8_0, q::block_q8_0>("q8_0", dtype::q8_0, rows, cols, n_tokens, repeats);
}
