// tests/cpu/test_linear.cpp: matvec and matmul against their scalar twins,
// for f32, f16 and bf16 weights, with and without a thread pool, and for
// k-quant weights (q2_K .. q6_K) and legacy weights (q4_0 .. q8_0) through
// quantized_linear (their own tolerances below).
//
// Tolerance: the weights convert exactly to f32 in both kernels, so each
// output is a dot product of length cols computed in two summation orders;
// each is within gamma_cols sum_c |x_c w_rc| of exact, so they differ by at
// most 2 gamma_cols sum_c |x_c w_rc|. On AVX2 without VNNI, quantized calls
// of cpu::detail::dequant_gemm_min_tokens tokens or more take the float
// GEMM over the dequantized weights, held to that same bound
// (check_dequant_gemm) instead of the int8 kernels' tolerances. Where the
// CPU has AMX-BF16, float products of cpu::gemm_amx_min_tokens tokens or
// more run on bf16 tiles, held to the splits' bound (amx_tol).
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <random>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "helpers.hpp"
#include "kestrel/cpu/gemm_amx.hpp"
#include "kestrel/cpu/matmul.hpp"
#include "kestrel/cpu/matvec.hpp"
#include "kestrel/cpu/ref/linear.hpp"
#include "kestrel/cpu/thread_pool.hpp"
#include "kestrel/quant/kquant_panels.hpp"
#include "kestrel/quant/kquants.hpp"
#include "kestrel/quant/legacy.hpp"
#include "kestrel/quant/legacy_tokens.hpp"

namespace cpu = kestrel::cpu;
namespace ref = kestrel::cpu::ref;
using kestrel::dtype;
using kestrel::test::gamma_n;
using kestrel::test::random_floats;
using kestrel::test::random_weight;

namespace {

constexpr dtype all_types[] = {dtype::f32, dtype::f16, dtype::bf16};

/// Per-output tolerance 2 gamma_cols sum_c |x(t, c) w(r, c)|. y: (n_tokens, rows)
std::vector<double> linear_tol(const random_weight& w, const std::vector<float>& x, std::size_t n_tokens) {
  const std::size_t rows = w.view.rows, cols = w.view.cols;
  std::vector<double> tol(n_tokens * rows);
  for (std::size_t t = 0; t < n_tokens; ++t)
    for (std::size_t r = 0; r < rows; ++r) {
      double s = 0;
      for (std::size_t c = 0; c < cols; ++c) s += std::fabs(double(x[t * cols + c]) * w.values[r * cols + c]);
      tol[t * rows + r] = 2 * gamma_n(cols) * s;
    }
  return tol;
}

}  // namespace

TEST_CASE("cpu: matvec == ref::matvec") {
  cpu::thread_pool pool3(3);
  const std::size_t row_counts[] = {0, 1, 2, 3, 4, 5, 7, 8, 9, 16, 33};
  const std::size_t col_counts[] = {0, 1, 2, 3, 4, 5, 7, 8, 9, 15, 16, 17, 31, 32, 33, 63, 64, 65, 67, 127, 128, 129, 1000};
  for (dtype t : all_types)
    for (std::size_t rows : row_counts)
      for (std::size_t cols : col_counts) {
        const auto seed = static_cast<std::uint32_t>(rows * 10007 + cols);
        random_weight w(t, rows, cols, seed);
        const auto x = random_floats(cols, seed + 1);
        std::vector<float> want(rows), got1(rows, -1.0f), got3(rows, -1.0f);
        ref::matvec(w.view, x.data(), want.data(), nullptr);
        cpu::matvec(w.view, x.data(), got1.data(), nullptr);
        cpu::matvec(w.view, x.data(), got3.data(), &pool3);
        const auto tol = linear_tol(w, x, 1);
        INFO(kestrel::name_of(t) << " rows " << rows << " cols " << cols);
        kestrel::test::check_within(got1.data(), want.data(), tol, rows);
        // Threads split rows, never a row's sum: bit-identical to one thread.
        CHECK(got3 == got1);
      }
  // Every column count 1..67 on a few rows, one thread.
  for (dtype t : all_types)
    for (std::size_t cols = 1; cols <= 67; ++cols) {
      random_weight w(t, 6, cols, static_cast<std::uint32_t>(cols));
      const auto x = random_floats(cols, 99);
      std::vector<float> want(6), got(6);
      ref::matvec(w.view, x.data(), want.data(), nullptr);
      cpu::matvec(w.view, x.data(), got.data(), nullptr);
      INFO(kestrel::name_of(t) << " cols " << cols);
      kestrel::test::check_within(got.data(), want.data(), linear_tol(w, x, 1), 6);
    }
}

TEST_CASE("cpu: matvec's rows give the same bits walked as every row_streams plan") {
  // The plan (cpu/streaming.hpp) only orders the rows' reads: 2 or 8
  // streams side by side, the rows past a multiple of the streams alone,
  // and how far ahead each stream is prefetched (pairs_ahead: 16-bit rows
  // only; far: into L2). Row counts around 8 and 16, and ranges starting
  // past 0, as threads get.
  const std::size_t row_counts[] = {1, 2, 7, 8, 9, 15, 16, 17, 33, 70};
  for (dtype t : all_types)
    for (std::size_t rows : row_counts)
      for (std::size_t cols : {std::size_t{5}, std::size_t{64}, std::size_t{129}, std::size_t{1100}}) {
        random_weight w(t, rows, cols, static_cast<std::uint32_t>(rows * 31 + cols));
        const auto x = random_floats(cols, 7);
        std::vector<float> want(rows), pairs(rows, -1.0f), ahead(rows, -2.0f), wide(rows, -3.0f), far(rows, -4.0f);
        ref::matvec(w.view, x.data(), want.data(), nullptr);
        cpu::visit_weight(w.view, [&](const auto* data) {
          for (std::size_t r0 : {std::size_t{0}, rows / 3}) {
            for (auto [lo, hi] : {std::pair{r0, rows}, std::pair{std::size_t{0}, r0}}) {
              cpu::detail::matvec_rows_as<cpu::row_streams::pairs>(data, cols, x.data(), pairs.data(), lo, hi);
              cpu::detail::matvec_rows_as<cpu::row_streams::pairs_ahead>(data, cols, x.data(), ahead.data(), lo, hi);
              cpu::detail::matvec_rows_as<cpu::row_streams::wide>(data, cols, x.data(), wide.data(), lo, hi);
              cpu::detail::matvec_rows_as<cpu::row_streams::far>(data, cols, x.data(), far.data(), lo, hi);
            }
            INFO(kestrel::name_of(t) << " rows " << rows << " cols " << cols << " split at " << r0);
            CHECK(std::memcmp(pairs.data(), wide.data(), rows * sizeof(float)) == 0);
            CHECK(std::memcmp(pairs.data(), ahead.data(), rows * sizeof(float)) == 0);
            CHECK(std::memcmp(pairs.data(), far.data(), rows * sizeof(float)) == 0);
            kestrel::test::check_within(wide.data(), want.data(), linear_tol(w, x, 1), rows);
          }
        });
      }
}

TEST_CASE("cpu: KESTREL_ROW_STREAMS names the plan") {
  // detect_row_streams reads the variable on every call (host_row_streams
  // caches the first); an unknown value falls back to the host's plan.
  const char* old = std::getenv("KESTREL_ROW_STREAMS");
  const std::string saved = old ? old : "";
  ::unsetenv("KESTREL_ROW_STREAMS");
  const cpu::row_streams host = cpu::detect_row_streams();
  const std::pair<const char*, cpu::row_streams> names[] = {{"pairs", cpu::row_streams::pairs},
                                                             {"pairs_ahead", cpu::row_streams::pairs_ahead},
                                                             {"wide", cpu::row_streams::wide},
                                                             {"far", cpu::row_streams::far}};
  for (const auto& [name, plan] : names) {
    ::setenv("KESTREL_ROW_STREAMS", name, 1);
    CHECK(cpu::detect_row_streams() == plan);
  }
  // Float rows (16-bit and f32) in huge pages walk as far where the host's
  // plan is wide; every other plan, and rows in small pages, keep the host's.
  const cpu::row_streams cached = cpu::host_row_streams();
  const cpu::row_streams in_huge = cached == cpu::row_streams::wide ? cpu::row_streams::far : cached;
  CHECK(cpu::float_row_streams(false, 2) == cached);
  CHECK(cpu::float_row_streams(false, 4) == cached);
  CHECK(cpu::float_row_streams(true, 4) == in_huge);
  CHECK(cpu::float_row_streams(true, 2) == in_huge);
  CHECK(cpu::walks_wide(cpu::row_streams::far));
  CHECK_FALSE(cpu::walks_wide(cpu::row_streams::pairs_ahead));
  ::setenv("KESTREL_ROW_STREAMS", "sideways", 1);
  CHECK(cpu::detect_row_streams() == host);
  if (old) ::setenv("KESTREL_ROW_STREAMS", saved.c_str(), 1);
  else ::unsetenv("KESTREL_ROW_STREAMS");
}

TEST_CASE("cpu: matmul == ref::matmul") {
  cpu::thread_pool pool2(2), pool4(4);
  struct shape { std::size_t rows, cols; };
  // (50, 4096): f16/bf16 weights take several converted tiles of 16 rows.
  const shape shapes[] = {{1, 1},     {3, 5},       {16, 16},   {17, 33}, {64, 67},
                          {100, 129}, {129, 1000}, {50, 4096}, {5, 6500}};
  // 1..3: matvec and skinny tails; 7, 16, 17, 24, 25: both sides of the skinny / GEMM
  // thresholds (16 for f32, 24 for f16/bf16); 25 and 64: the GEMM's full
  // 8-token tiles and its 1- and 6-token tails (25, 30); cols 1000 and 4096 span
  // several of its 128-column passes (AVX-512), 6500 two of AVX2's 6144-column ones.
  for (dtype t : all_types)
    for (auto [rows, cols] : shapes)
      for (std::size_t n_tokens : {0, 1, 2, 3, 7, 16, 17, 24, 25, 30, 64}) {
        if (rows * cols * n_tokens > 10'000'000) continue;  // keep the scalar twin quick
        const auto seed = static_cast<std::uint32_t>(rows * 131 + cols * 7 + n_tokens);
        random_weight w(t, rows, cols, seed);
        const auto x = random_floats(n_tokens * cols, seed + 1);
        const std::size_t n = n_tokens * rows;
        std::vector<float> want(n), got(n, -1.0f), got2(n, -1.0f), got4(n, -1.0f);
        ref::matmul(w.view, x.data(), n_tokens, want.data(), nullptr);
        cpu::matmul(w.view, x.data(), n_tokens, got.data(), nullptr);
        cpu::matmul(w.view, x.data(), n_tokens, got2.data(), &pool2);
        cpu::matmul(w.view, x.data(), n_tokens, got4.data(), &pool4);
        const auto tol = linear_tol(w, x, n_tokens);
        INFO(kestrel::name_of(t) << " rows " << rows << " cols " << cols << " n_tokens " << n_tokens);
        kestrel::test::check_within(got.data(), want.data(), tol, n);
        kestrel::test::check_within(got2.data(), want.data(), tol, n);
        kestrel::test::check_within(got4.data(), want.data(), tol, n);
      }
}

namespace {
/// For each float type: the first `part` tokens of an `all`-token product
/// (on 2 threads) equal a `part`-token product (inline), bit for bit.
void check_rows_independent(std::size_t rows, std::size_t cols, std::size_t all, std::size_t part) {
  cpu::thread_pool pool2(2);
  for (dtype t : all_types) {
    random_weight w(t, rows, cols, 5);
    const auto x = random_floats(all * cols, 6);
    std::vector<float> y_all(all * rows), y_part(part * rows);
    cpu::matmul(w.view, x.data(), all, y_all.data(), &pool2);
    cpu::matmul(w.view, x.data(), part, y_part.data(), nullptr);
    INFO(kestrel::name_of(t));
    CHECK(std::equal(y_part.begin(), y_part.end(), y_all.begin()));
  }
}
}  // namespace

TEST_CASE("cpu: the GEMM gives a token the same row whatever tokens share its call") {
  // Each output is one fma chain over the columns in order (cpu/gemm.hpp),
  // so the first 25 tokens of a 64-token product equal a 25-token product
  // bit for bit, on any pool: tiles, tails and threads only move work.
  // (300 columns: not whole 32-column chunks, so never the bf16 tiles.)
  check_rows_independent(70, 300, 64, 25);
}

TEST_CASE("cpu: the GEMM's columns in one pass or in passes of 128 give the same bits") {
  // Each pass continues the fma chains in y (cpu/gemm.hpp), so kc only
  // moves work; 300 columns: passes of 128, 128 and 44.
  for (dtype t : all_types) {
    random_weight w(t, 70, 300, 9);
    const auto x = random_floats(37 * 300, 10);
    std::vector<float> one(37 * 70, -1.0f), passes(37 * 70, -2.0f), want(37 * 70);
    cpu::visit_weight(w.view, [&](const auto* data) {
      cpu::detail::gemm_rows(data, 70, 300, x.data(), 37, one.data(), 0, 70, 300);
      cpu::detail::gemm_rows(data, 70, 300, x.data(), 37, passes.data(), 0, 70, 128);
    });
    ref::matmul(w.view, x.data(), 37, want.data(), nullptr);
    INFO(kestrel::name_of(t));
    CHECK(std::memcmp(one.data(), passes.data(), one.size() * sizeof(float)) == 0);
    kestrel::test::check_within(one.data(), want.data(), linear_tol(w, x, 37), one.size());
  }
}

// The bf16 tiles (cpu/gemm_amx.hpp): each operand x = hi + lo + e, |e| <=
// 2^-16 |x|, and each product x_k w_k taken as hi*hi + hi*lo + lo*hi, within
// bf16_split_rel |x_k w_k| of it (cpu/amx_bf16.hpp). Those 3 cols partial
// products are exact in f32 (8-bit by 8-bit significands) and summed in
// f32 in some order: within gamma_{3 cols} of their magnitudes, which are
// at most (1 + 2^-8)^2 (1 + 2^-7) < 1.02 times sum_k |x_k w_k|. Halves
// below 2^-126 are flushed to zero (split32, and the tiles' reads), as are
// the tiles' results below it: with operands within 1 in magnitude (as
// here) each of the 3 cols partial products loses at most 2^-126 that way,
// its sum at most 2^-126 more (a flushed half times the other operand's
// half, within 1.004: 7 cols 2^-126 covers both). With the twin's own
// gamma_cols, per output:
//   (bf16_split_rel + 1.02 gamma_{3 cols} + gamma_cols) sum_k |x_k w_k| + 7 cols 2^-126.
namespace {
std::vector<double> amx_tol(const random_weight& w, const std::vector<float>& x, std::size_t n_tokens) {
  const std::size_t rows = w.view.rows, cols = w.view.cols;
  const double rel = cpu::bf16_split_rel + 1.02 * gamma_n(3 * cols) + gamma_n(cols);
  std::vector<double> tol(n_tokens * rows);
  for (std::size_t t = 0; t < n_tokens; ++t)
    for (std::size_t r = 0; r < rows; ++r) {
      double s = 0;
      for (std::size_t c = 0; c < cols; ++c) s += std::fabs(double(x[t * cols + c]) * w.values[r * cols + c]);
      tol[t * rows + r] = rel * s + 7.0 * static_cast<double>(cols) * std::ldexp(1.0, -126);
    }
  return tol;
}
}  // namespace

TEST_CASE("cpu: matmul on bf16 tiles == ref::matmul within the splits' bound, the same bits on any pool") {
  if (!cpu::gemm_amx_available(32)) {
    MESSAGE("skipped: no AMX-BF16 here (or not in this build, or KESTREL_AMX=0)");
    return;
  }
  cpu::thread_pool pool2(2), pool4(4);
  struct shape { std::size_t rows, cols; };
  // rows: under one row tile, between tiles, past a 32-row panel and a
  // group of 8 panels (256); cols: 1 to 32 chunks, passes of 4 and a part
  // (512, 32) with 513 tokens: an output of 1 MiB or more, streamed past the caches
  const shape shapes[] = {{1, 32}, {17, 64}, {70, 96}, {100, 320}, {33, 1024}, {300, 160}, {512, 32}};
  // tokens: the threshold, a partial 16-token tile, a partial pair, two
  // blocks of 512 (the second of 1 token)
  for (dtype t : all_types)
    for (auto [rows, cols] : shapes)
      for (std::size_t n_tokens : {cpu::gemm_amx_min_tokens, std::size_t{33}, std::size_t{47}, std::size_t{64},
                                   std::size_t{100}, std::size_t{513}}) {
        if (rows * cols * n_tokens > 10'000'000) continue;  // keep the scalar twin quick
        REQUIRE(cpu::gemm_amx_takes(cols, n_tokens));
        const auto seed = static_cast<std::uint32_t>(rows * 131 + cols * 7 + n_tokens);
        random_weight w(t, rows, cols, seed);
        const auto x = random_floats(n_tokens * cols, seed + 1);
        const std::size_t n = n_tokens * rows, guard = 37;
        // Y 64-byte aligned, as the model's buffers are (the streamed stores need it), a guard after
        auto aligned = [&](std::vector<float>& v, float fill) {
          v.assign(n + guard + 16, fill);
          const auto a = (64 - reinterpret_cast<std::uintptr_t>(v.data()) % 64) % 64 / sizeof(float);
          return std::span<float>(v.data() + a, n + guard);
        };
        std::vector<float> want(n), b1, b2, b4;
        const auto got = aligned(b1, -1.0f), got2 = aligned(b2, -2.0f), got4 = aligned(b4, -3.0f);
        ref::matmul(w.view, x.data(), n_tokens, want.data(), nullptr);
        cpu::matmul(w.view, x.data(), n_tokens, got.data(), nullptr);
        cpu::matmul(w.view, x.data(), n_tokens, got2.data(), &pool2);
        cpu::matmul(w.view, x.data(), n_tokens, got4.data(), &pool4);
        INFO(kestrel::name_of(t) << " rows " << rows << " cols " << cols << " n_tokens " << n_tokens);
        kestrel::test::check_within(got.data(), want.data(), amx_tol(w, x, n_tokens), n);
        CHECK(std::memcmp(got.data(), got2.data(), n * sizeof(float)) == 0);
        CHECK(std::memcmp(got.data(), got4.data(), n * sizeof(float)) == 0);
        // nothing written past Y
        CHECK(std::all_of(got.begin() + n, got.end(), [](float v) { return v == -1.0f; }));
        CHECK(std::all_of(got2.begin() + n, got2.end(), [](float v) { return v == -2.0f; }));
        CHECK(std::all_of(got4.begin() + n, got4.end(), [](float v) { return v == -3.0f; }));
      }
}

TEST_CASE("cpu: the bf16 tiles give a token the same row whatever tokens share its call") {
  if (!cpu::gemm_amx_available(32)) {
    MESSAGE("skipped: no AMX-BF16 here (or not in this build, or KESTREL_AMX=0)");
    return;
  }
  // Each output's sum runs over the chunks in one order (cpu/gemm_amx.hpp),
  // so the first 40 tokens of a 600-token product (two blocks) equal a
  // 40-token product bit for bit.
  check_rows_independent(70, 320, 600, 40);
}

TEST_CASE("cpu: matmul with zero columns gives zeros") {
  random_weight w(dtype::f32, 5, 0, 1);
  std::vector<float> y(3 * 5, 7.0f);
  cpu::matmul(w.view, nullptr, 3, y.data(), nullptr);
  for (float v : y) CHECK(v == 0.0f);
}

// ---- k-quant weights: quantized_linear's SIMD dots vs the scalar twins ----
//
// Both paths quantize x to q8_K with the same function, so they see the same
// integers; each output is one k-quant dot of nb = cols / 256 blocks. The
// dot's tests (tests/quant/test_kquants_simd.cpp) derive |simd - exact| <=
// gamma_{2nb+6} T and |twin - exact| <= gamma_{nb+20} T, T = sum_i
// (|scale_i q_i| + |min_i|) |d8 a_i| over the row's unpacked weights and
// quantized activations; the tolerance here is the sum of the two.

namespace {

namespace q = kestrel::quant;

/// rows x cols random values in [-1, 1] quantized to block type B.
template <class B>
struct kquant_weight {
  std::vector<B> blocks;  // (rows, cols / 256)
  kestrel::weight_view view;
  kquant_weight(dtype t, std::size_t rows, std::size_t cols, std::uint32_t seed) : blocks(rows * cols / q::qk_k) {
    const auto x = random_floats(rows * cols, seed);
    q::quantize_row(x.data(), blocks.data(), rows * cols);  // rows are whole blocks: one call does all
    view.type = t;
    view.data = blocks.data();
    view.rows = rows;
    view.cols = cols;
  }
};

template <class B>
std::vector<double> kquant_tol(const kquant_weight<B>& w, const std::vector<float>& x, std::size_t n_tokens) {
  const std::size_t rows = w.view.rows, cols = w.view.cols, nb = cols / q::qk_k;
  std::vector<q::block_q8_K> a(n_tokens * nb);
  for (std::size_t t = 0; t < n_tokens; ++t) q::quantize_row(x.data() + t * cols, a.data() + t * nb, cols);
  const double g = gamma_n(2 * nb + 6) + gamma_n(nb + 20);
  std::vector<double> tol(n_tokens * rows);
  q::unpacked up;
  for (std::size_t r = 0; r < rows; ++r)
    for (std::size_t b = 0; b < nb; ++b) {
      q::unpack(w.blocks[r * nb + b], up);
      for (std::size_t t = 0; t < n_tokens; ++t) {
        const q::block_q8_K& ab = a[t * nb + b];
        double s = 0;
        for (std::size_t i = 0; i < q::qk_k; ++i)
          s += (std::fabs(double(up.scale[i / 16]) * up.q[i]) + std::fabs(double(up.min[i / 16]))) *
               std::fabs(double(ab.d) * ab.qs[i]);
        tol[t * rows + r] += g * s;
      }
    }
  return tol;
}

/// Prefill on AVX2 without VNNI (cpu::detail::dequant_gemm, calls of at
/// least dequant_gemm_min_tokens tokens): the float GEMM over the weights'
/// dequantized values with x unquantized. Against ref::matmul over the same
/// values in f32 both are dot products of length cols in two summation
/// orders: within 2 gamma_cols sum_c |x_c w_rc|, as the float types. Threads
/// split panels, never a row's sum; a token's row does not depend on the
/// tokens beside it once the call takes this path.
void check_dequant_gemm(const kestrel::weight_view& v, const std::vector<float>& x, std::size_t n_tokens) {
  cpu::thread_pool pool2(2), pool3(3);
  const std::size_t rows = v.rows, cols = v.cols, n = n_tokens * rows, m = cpu::detail::dequant_gemm_min_tokens;
  REQUIRE(n_tokens >= m);
  std::vector<float> wf(rows * cols);
  for (std::size_t r = 0; r < rows; ++r) cpu::row_to_f32(v, r, wf.data() + r * cols);
  const kestrel::weight_view fv{dtype::f32, wf.data(), rows, cols};
  std::vector<float> want(n), got(n, -1.0f), got2(n, -1.0f), got3(n, -1.0f);
  ref::matmul(fv, x.data(), n_tokens, want.data(), nullptr);
  cpu::matmul(v, x.data(), n_tokens, got.data(), nullptr);
  cpu::matmul(v, x.data(), n_tokens, got2.data(), &pool2);
  cpu::matmul(v, x.data(), n_tokens, got3.data(), &pool3);
  std::vector<double> tol(n);
  for (std::size_t t = 0; t < n_tokens; ++t)
    for (std::size_t r = 0; r < rows; ++r) {
      double s = 0;
      for (std::size_t c = 0; c < cols; ++c) s += std::fabs(double(x[t * cols + c]) * wf[r * cols + c]);
      tol[t * rows + r] = 2 * gamma_n(cols) * s;
    }
  kestrel::test::check_within(got.data(), want.data(), tol, n);
  CHECK(got2 == got);
  CHECK(got3 == got);
  std::vector<float> first(m * rows, -1.0f), last(m * rows, -1.0f);
  cpu::matmul(v, x.data(), m, first.data(), nullptr);
  cpu::matmul(v, x.data() + (n_tokens - m) * cols, m, last.data(), &pool3);
  CHECK(std::equal(first.begin(), first.end(), got.begin()));
  CHECK(std::equal(last.begin(), last.end(), got.begin() + (n_tokens - m) * rows));
}

template <class B>
void check_kquant_linear(dtype type) {
  cpu::thread_pool pool2(2), pool3(3);
  struct shape { std::size_t rows, cols; };
  // 48 and 160 rows: decode's pairs of panels (cpu::detail::decode_panels)
  // with a lone whole panel left over, and five pairs split between threads
  const shape shapes[] = {{1, 256}, {5, 512}, {17, 1024}, {64, 2048}, {33, 4096}, {3, 4096}, {48, 256}, {160, 256}};
  for (auto [rows, cols] : shapes)
    for (std::size_t n_tokens : {1, 2, 3, 4, 5, 8, 9, 17, 33, 61, 100}) {
      if (n_tokens == 100 && rows * cols > 17 * 1024 && rows != 3) continue;  // AVX2's dequantizing GEMM
      // 61 tokens of 4096 values pass a tile boundary (56 tokens of 16 q8_K
      // blocks in 256 KiB, for token groups and panels alike); keep the
      // scalar twin's share quick elsewhere. From 17 (q4/q5_K) or 33 tokens
      // on, calls take the prefill panels.
      if (n_tokens == 61 && rows != 3) continue;
      if (n_tokens == 17 && rows * cols > 64 * 1024) continue;
      if (n_tokens == 33 && rows * cols > 160 * 1024) continue;  // up to 33 x 4096: 3 panels in tiles of 2
      const auto seed = static_cast<std::uint32_t>(rows * 31 + cols + n_tokens);
      kquant_weight<B> w(type, rows, cols, seed);
      const auto x = random_floats(n_tokens * cols, seed + 7);
      INFO(kestrel::name_of(type) << " rows " << rows << " cols " << cols << " n_tokens " << n_tokens);
      if (n_tokens >= cpu::detail::dequant_gemm_min_tokens) {
        check_dequant_gemm(w.view, x, n_tokens);
        continue;
      }
      const std::size_t n = n_tokens * rows;
      std::vector<float> want(n), got(n, -1.0f), got2(n, -1.0f), got3(n, -1.0f);
      ref::matmul(w.view, x.data(), n_tokens, want.data(), nullptr);
      cpu::matmul(w.view, x.data(), n_tokens, got.data(), nullptr);
      cpu::matmul(w.view, x.data(), n_tokens, got2.data(), &pool2);
      cpu::matmul(w.view, x.data(), n_tokens, got3.data(), &pool3);
      kestrel::test::check_within(got.data(), want.data(), kquant_tol(w, x, n_tokens), n);
      // Threads split rows, never a row's sum: bit-identical to one thread.
      CHECK(got2 == got);
      CHECK(got3 == got);
      if (n_tokens == 1) {
        std::vector<float> mv(rows, -1.0f), mv_ref(rows, -1.0f), mv3(rows, -1.0f);
        ref::matvec(w.view, x.data(), mv_ref.data(), nullptr);
        cpu::matvec(w.view, x.data(), mv.data(), nullptr);
        cpu::matvec(w.view, x.data(), mv3.data(), &pool3);
        CHECK(mv_ref == want);
        CHECK(mv == got);
        CHECK(mv3 == got);
      }
      // A token's outputs do not depend on the other tokens in the call
      // (groups of tokens, tiles): below quant::kpanel_min_tokens each
      // equals that token's matvec; from there on (the prefill panels,
      // another rounding order) the first kpanel_min_tokens tokens equal a
      // call with just them.
      bool same = true;
      if (n_tokens < q::kpanel_min_tokens<B>) {
        for (std::size_t t = 0; t < n_tokens; ++t) {
          std::vector<float> one(rows, -1.0f);
          cpu::matvec(w.view, x.data() + t * cols, one.data(), nullptr);
          same = same && std::equal(one.begin(), one.end(), got.begin() + t * rows);
        }
      } else {
        // the first and the last kpanel_min_tokens tokens (groups of 8 and
        // the 4 / 2 / 1 tail land on different tokens in each)
        const std::size_t m = q::kpanel_min_tokens<B>;
        std::vector<float> first(m * rows, -1.0f), last(m * rows, -1.0f);
        cpu::matmul(w.view, x.data(), m, first.data(), nullptr);
        cpu::matmul(w.view, x.data() + (n_tokens - m) * cols, m, last.data(), nullptr);
        same = std::equal(first.begin(), first.end(), got.begin()) &&
               std::equal(last.begin(), last.end(), got.begin() + (n_tokens - m) * rows);
      }
      CHECK(same);
    }
}

}  // namespace

TEST_CASE("cpu: k-quant matvec / matmul == scalar twins") {
  check_kquant_linear<q::block_q2_K>(dtype::q2_k);
  check_kquant_linear<q::block_q3_K>(dtype::q3_k);
  check_kquant_linear<q::block_q4_K>(dtype::q4_k);
  check_kquant_linear<q::block_q5_K>(dtype::q5_k);
  check_kquant_linear<q::block_q6_K>(dtype::q6_k);
}

// ---- the k-quants interleaved by 16 rows (dtype::q2_k_x16 .. q6_k_x16, quant/kquant_x16.hpp) ----
//
// The same matrix row-major and interleaved: the interleaved matmul /
// matvec / fused forms within kquant_tol of the row-major scalar twin (the
// x16 kernel's bound gamma_(nb+3) T is inside gamma_(2nb+6) T); the x16
// scalar twin equal to the row-major twin bit for bit; every token's
// outputs the same whatever the token count or thread count, except with
// AVX-512 VNNI from kpanel_min_tokens on (prefill), where they equal the
// row-major q4_K's bit for bit; row_to_f32 equal.

namespace {

/// W (kquant_weight or legacy_weight of X's row-major type) interleaved.
template <class X>
struct x16_weight {
  using B = typename q::x16_source<X>::type;
  std::vector<X> panels;
  kestrel::weight_view view;
  template <class W>
  x16_weight(const W& w, dtype type) {
    const std::size_t rows = w.view.rows, nb = w.view.cols / X::values, n_panels = (rows + 15) / 16;
    panels.resize(n_panels * nb);
    q::pack_x16_panels(reinterpret_cast<const std::byte*>(w.blocks.data()), nb * sizeof(B), rows, w.view.cols, 0,
                       n_panels, panels.data());
    view = {type, panels.data(), rows, w.view.cols};
    REQUIRE(view.bytes() == panels.size() * sizeof(X));
  }
};

/// X W^T on the interleaved matrix wx of w's rows: the scalar twin the same
/// bits from either layout, the fast path the same bits on 1, 2 and 3
/// threads; returns {the twin's, the fast path's} outputs.
std::pair<std::vector<float>, std::vector<float>> x16_products(const kestrel::weight_view& w,
                                                               const kestrel::weight_view& wx,
                                                               const std::vector<float>& x, std::size_t n_tokens) {
  cpu::thread_pool pool2(2), pool3(3);
  const std::size_t n = n_tokens * w.rows;
  std::vector<float> want(n), twin(n, -1.0f), got(n, -1.0f), got2(n, -1.0f), got3(n, -1.0f);
  ref::matmul(w, x.data(), n_tokens, want.data(), nullptr);
  ref::matmul(wx, x.data(), n_tokens, twin.data(), nullptr);
  cpu::matmul(wx, x.data(), n_tokens, got.data(), nullptr);
  cpu::matmul(wx, x.data(), n_tokens, got2.data(), &pool2);
  cpu::matmul(wx, x.data(), n_tokens, got3.data(), &pool3);
  CHECK(twin == want);
  CHECK(got2 == got);
  CHECK(got3 == got);
  return {want, got};
}

/// Each token alone (matvec, 3 threads) gives the bits it got among the
/// n_tokens of got = X w^T.
void check_tokens_alone(const kestrel::weight_view& w, const std::vector<float>& x, std::size_t n_tokens,
                        const std::vector<float>& got) {
  cpu::thread_pool pool3(3);
  bool same = true;
  for (std::size_t t = 0; t < n_tokens; ++t) {
    std::vector<float> one(w.rows, -1.0f);
    cpu::matvec(w, x.data() + t * w.cols, one.data(), &pool3);
    same = same && std::equal(one.begin(), one.end(), got.begin() + t * w.rows);
  }
  CHECK(same);
}

/// Decode's fused forms on the interleaved matrix wx (w row-major, got its
/// matvec of x): beside other, a row-major matrix of another row count, in
/// matvec_fused, and as SwiGLU's gate with w as the up matrix (row blocks of
/// 16 and 4): the bits of each matvec alone.
void check_x16_fused(const kestrel::weight_view& wx, const kestrel::weight_view& w, const kestrel::weight_view& other,
                     const std::vector<float>& x, const std::vector<float>& got) {
  cpu::thread_pool pool3(3);
  const std::size_t rows = w.rows;
  std::vector<float> y0(rows, -1.0f), y1(other.rows, -1.0f), y1_want(other.rows), h(rows), up(rows), h_want(rows),
      up_want(rows);
  const cpu::matvec_job jobs[] = {{&wx, y0.data()}, {&other, y1.data()}};
  cpu::matvec_fused(jobs, x.data(), &pool3);
  CHECK(std::equal(y0.begin(), y0.end(), got.begin()));
  cpu::matvec(other, x.data(), y1_want.data(), nullptr);
  CHECK(y1 == y1_want);
  cpu::matvec_swiglu(wx, w, x.data(), h.data(), up.data(), &pool3);
  cpu::matvec(w, x.data(), up_want.data(), nullptr);
  cpu::swiglu(h_want.data(), got.data(), up_want.data(), rows);
  CHECK(h == h_want);
}

/// row_to_f32 of every third row the same from a as from b.
void check_same_rows(const kestrel::weight_view& a, const kestrel::weight_view& b) {
  std::vector<float> r0(a.cols), r1(b.cols);
  for (std::size_t r = 0; r < a.rows; r += 3) {
    cpu::row_to_f32(a, r, r0.data());
    cpu::row_to_f32(b, r, r1.data());
    CHECK(r0 == r1);
  }
}

template <class X>
void check_x16_linear(dtype row_major, dtype interleaved) {
  using B = typename q::x16_source<X>::type;
  cpu::thread_pool pool2(2);
  struct shape { std::size_t rows, cols; };
  // 48 and 160 rows: decode's pairs of panels (cpu::detail::decode_panels)
  // with a lone whole panel left over, and five pairs split between threads
  const shape shapes[] = {{1, 256}, {5, 512}, {17, 1024}, {64, 2048}, {33, 4096}, {3, 4096}, {48, 256}, {160, 256}};
  for (auto [rows, cols] : shapes)
    for (std::size_t n_tokens : {1, 2, 3, 5, 8, 17, 33, 61, 100}) {
      if (n_tokens == 61 && rows != 3) continue;  // 61 x 4096: past a token tile; the twin's share kept quick
      if (n_tokens == 33 && rows * cols > 64 * 1024) continue;
      if (n_tokens == 100 && rows * cols > 17 * 1024 && rows != 3) continue;
      const auto seed = static_cast<std::uint32_t>(rows * 37 + cols + n_tokens);
      kquant_weight<B> w(row_major, rows, cols, seed);
      x16_weight<X> wx(w, interleaved);
      const auto x = random_floats(n_tokens * cols, seed + 5);
      INFO(kestrel::name_of(interleaved) << " rows " << rows << " cols " << cols << " n_tokens " << n_tokens);
      const std::size_t n = n_tokens * rows;
      const auto [want, got] = x16_products(w.view, wx.view, x, n_tokens);
      kestrel::test::check_within(got.data(), want.data(), kquant_tol(w, x, n_tokens), n);
#if defined(KESTREL_KQUANT_X16)
      const bool prefill_panels = q::x16_kernel<X> && n_tokens >= q::kpanel_min_tokens<B>;
#else
      const bool prefill_panels = false;  // the AVX2 x16 kernel (or the twin) takes every token count
#endif
      if (prefill_panels) {
        // prefill: the row-major q4_K's panels, packed from x16: the same bits
        std::vector<float> row_major(n, -1.0f);
        cpu::matmul(w.view, x.data(), n_tokens, row_major.data(), &pool2);
        CHECK(got == row_major);
      } else {
        check_tokens_alone(wx.view, x, n_tokens, got);
      }
      if (n_tokens == 1) check_x16_fused(wx.view, w.view, kquant_weight<B>(row_major, cols / 64 + 1, cols, seed + 9).view, x, got);
      check_same_rows(w.view, wx.view);
    }
}

}  // namespace

TEST_CASE("cpu: q2_K_x16 / q3_K_x16 / q4_K_x16 / q5_K_x16 / q6_K_x16 matvec / matmul / fused forms == the row-major scalar twins") {
  check_x16_linear<q::block_q4_K_x16>(dtype::q4_k, dtype::q4_k_x16);
  check_x16_linear<q::block_q5_K_x16>(dtype::q5_k, dtype::q5_k_x16);  // the twin where no kernel (x16_kernel)
  check_x16_linear<q::block_q3_K_x16>(dtype::q3_k, dtype::q3_k_x16);
  check_x16_linear<q::block_q2_K_x16>(dtype::q2_k, dtype::q2_k_x16);
  check_x16_linear<q::block_q6_K_x16>(dtype::q6_k, dtype::q6_k_x16);
}

// ---- legacy weights (q4_0, q4_1, q5_0, q5_1, q8_0) ----
//
// Both paths quantize x to q8_0 / q8_1 with the same function, so they see the
// same integers. With AVX-512 VNNI, calls of more than
// quant::decode_max_tokens tokens take quant::dot_tile's arithmetic, equal
// bit for bit to quant::ref::dot_fused of the row and token (checked exactly
// here: any tiling or thread count gives the same bits); calls of up to
// decode_max_tokens tokens take the row-streaming decode kernel
// (quant/legacy_decode.hpp, within gamma_(nb+6) T of exact). With AVX2
// alone, decode takes the AVX2 decode kernel (the same bound) and longer
// calls the AVX2 tiles (quant/legacy_tiles_avx2.hpp, gamma_(nb+4) T);
// without AVX2 it is quant::dot per (row, token). The reference path
// is quant::ref::dot. tests/quant/test_legacy_tokens.cpp derives |dot_fused -
// ref::dot| <= (gamma_2nb + gamma_(nb+3)) T and tests/quant/test_legacy.cpp
// |dot - exact|, |ref::dot - exact| <= gamma_(nb+8) T, T = sum_b (|d_w d_a
// isum_b| + |m_w s_a|) <= sum_i |(w_i - m_w)(d_a a_i)| + sum_b |m_w s_a|; the
// tolerance here is 2 gamma_(2nb+8) T, which covers both pairings.
//
// Decode vs prefill (a token alone vs among more than decode_max_tokens):
// no longer the same bits. The decode kernel is within gamma_(nb+6) T of the
// exact sum (legacy_decode.hpp), the tile kernel (dot_fused: nb fmas, 2nb for
// the _1 types) within gamma_(2nb) T, so they are within (gamma_(nb+6) +
// gamma_(2nb)) T <= 2 gamma_(2nb+8) T of each other: the same tolerance.
// Thread counts still give the same bits on either path.

namespace {

template <class B>
struct legacy_weight {
  std::vector<B> blocks;  // (rows, cols / 32)
  kestrel::weight_view view;
  legacy_weight(dtype t, std::size_t rows, std::size_t cols, std::uint32_t seed) : blocks(rows * cols / 32) {
    const auto x = random_floats(rows * cols, seed);
    q::quantize_row(x.data(), blocks.data(), rows * cols);
    view.type = t;
    view.data = blocks.data();
    view.rows = rows;
    view.cols = cols;
  }
};

/// x's n_tokens rows quantized as the legacy paths quantize them.
template <class B>
std::vector<q::activation_of_t<B>> legacy_acts(const std::vector<float>& x, std::size_t n_tokens, std::size_t cols) {
  std::vector<q::activation_of_t<B>> a(n_tokens * (cols / 32));
  for (std::size_t t = 0; t < n_tokens; ++t) q::quantize_row(x.data() + t * cols, a.data() + t * (cols / 32), cols);
  return a;
}

/// The tolerance of each (token, row) output above: 2 gamma_(2nb+8) T.
template <class B>
std::vector<double> legacy_tol(const legacy_weight<B>& w, const std::vector<q::activation_of_t<B>>& a,
                               std::size_t n_tokens) {
  const std::size_t rows = w.view.rows, cols = w.view.cols, nb = cols / 32;
  std::vector<double> tol(n_tokens * rows);
  std::vector<float> wf(cols);
  for (std::size_t r = 0; r < rows; ++r) {
    q::dequantize_row(w.blocks.data() + r * nb, wf.data(), cols);
    for (std::size_t t = 0; t < n_tokens; ++t) {
      double T = 0;
      for (std::size_t b = 0; b < nb; ++b) {
        const auto& ab = a[t * nb + b];
        double m = 0, s = 0;
        if constexpr (q::has_offset_m<B>) {
          m = kestrel::to_f32(w.blocks[r * nb + b].m);
          s = kestrel::to_f32(ab.s);
        }
        const double da = kestrel::to_f32(ab.d);
        for (std::size_t j = 0; j < 32; ++j) T += std::fabs((double(wf[b * 32 + j]) - m) * da * ab.qs[j]);
        T += std::fabs(m * s);
      }
      tol[t * rows + r] = 2 * gamma_n(2 * nb + 8) * T;
    }
  }
  return tol;
}

template <class B>
void check_legacy_linear(dtype type) {
  cpu::thread_pool pool2(2), pool3(3);
  struct shape { std::size_t rows, cols; };
  // 16-row panels (partial ones too); 70 rows x 4096 columns pass a tile of
  // panels (3 panels of 128 blocks in 256 KiB) and 45 tokens a tile of tokens
  // (40 tokens of 128 blocks).
  // 48 and 160 rows: as check_x16_linear's
  const shape shapes[] = {{1, 32}, {5, 96}, {16, 512}, {17, 1024}, {33, 2048}, {70, 4096}, {48, 64}, {160, 64}};
  for (auto [rows, cols] : shapes)
    for (std::size_t n_tokens : {1, 2, 3, 4, 5, 7, 8, 9, 13, 45, 100}) {
      if ((n_tokens == 45) != (rows == 70)) continue;  // keep the scalar twins' share quick
      // 100 tokens: AVX2's dequantizing GEMM with rows of 3 blocks and of 32
      // (a partial 256-column chunk, and 4 whole ones)
      if (n_tokens == 100 && rows != 5 && rows != 17) continue;
      const auto seed = static_cast<std::uint32_t>(rows * 37 + cols + n_tokens);
      legacy_weight<B> w(type, rows, cols, seed);
      const auto x = random_floats(n_tokens * cols, seed + 7, -2.0f, 2.0f);
      INFO(kestrel::name_of(type) << " rows " << rows << " cols " << cols << " n_tokens " << n_tokens);
      if (cpu::detail::takes_dequant_gemm(w.view, n_tokens)) {
        check_dequant_gemm(w.view, x, n_tokens);
        continue;
      }
      const std::size_t n = n_tokens * rows;
      std::vector<float> want(n), got(n, -1.0f), got2(n, -1.0f), got3(n, -1.0f);
      ref::matmul(w.view, x.data(), n_tokens, want.data(), nullptr);
      cpu::matmul(w.view, x.data(), n_tokens, got.data(), nullptr);
      cpu::matmul(w.view, x.data(), n_tokens, got2.data(), &pool2);
      cpu::matmul(w.view, x.data(), n_tokens, got3.data(), &pool3);

      const auto a = legacy_acts<B>(x, n_tokens, cols);
      const auto tol = legacy_tol(w, a, n_tokens);
      bool fused_same = true;
#if defined(KESTREL_LEGACY_PANEL)
      const std::size_t nb = cols / 32;
      for (std::size_t r = 0; r < rows && n_tokens > q::decode_max_tokens; ++r)  // else the decode kernel: bounded
        for (std::size_t t = 0; t < n_tokens; ++t) {
          const float f = q::ref::dot_fused(w.blocks.data() + r * nb, a.data() + t * nb, cols);
          fused_same = fused_same && std::memcmp(&f, &got[t * rows + r], sizeof f) == 0;
        }
#endif
      kestrel::test::check_within(got.data(), want.data(), tol, n);
      CHECK(fused_same);
      // Threads split panels of rows, never a row's sum: bit-identical to one thread.
      CHECK(got2 == got);
      CHECK(got3 == got);
      // Decode vs prefill: each token's matvec within the derived bound of its
      // outputs here (bit for bit when both take the same kernel, n_tokens <=
      // decode_max_tokens); matvec on 1 or 3 threads bit for bit.
      bool same = true, threads_same = true;
      std::vector<float> decoded(n);
      for (std::size_t t = 0; t < n_tokens; ++t) {
        std::vector<float> one(rows, -1.0f), one3(rows, -1.0f);
        cpu::matvec(w.view, x.data() + t * cols, one.data(), nullptr);
        cpu::matvec(w.view, x.data() + t * cols, one3.data(), &pool3);
        std::copy(one.begin(), one.end(), decoded.begin() + t * rows);
        same = same && std::equal(one.begin(), one.end(), got.begin() + t * rows);
        threads_same = threads_same && one3 == one;
      }
      kestrel::test::check_within(decoded.data(), got.data(), tol, n);
      CHECK(threads_same);
      if (n_tokens <= q::decode_max_tokens) CHECK(same);
    }
}

}  // namespace

// ---- q4_0, q4_1, q5_0 and q5_1 interleaved by 16 rows (dtype::q4_0_x16, ..., quant/legacy_x16.hpp) ----
//
// The same matrix row-major and interleaved: the x16 scalar twin equal to
// the row-major twin bit for bit; the interleaved matmul / matvec / fused
// forms within the legacy tolerance of the twin; with the AVX2 x16 kernel,
// every output equal to ref::dot_fused of its row and token bit for bit
// (the kernel runs its per-block steps), and for q4_0 past
// decode_max_tokens the same bits as the row-major q4_0 (whose prefill packs
// the same panels per call); every token's outputs the same bits alone or
// among others, on 1-3 threads; row_to_f32 equal. From
// dequant_gemm_min_tokens tokens on (AVX2 without VNNI), q4_1, q5_0 and q5_1
// take the float GEMM over dequantized panels, from either layout.

namespace {

template <class X>
void check_legacy_x16_linear(dtype row_major, dtype interleaved) {
  using B = typename q::x16_source<X>::type;
  cpu::thread_pool pool2(2);
  struct shape { std::size_t rows, cols; };
  // 48 and 160 rows: as check_x16_linear's
  const shape shapes[] = {{1, 32}, {5, 96}, {16, 512}, {17, 1024}, {33, 2048}, {70, 4096}, {48, 64}, {160, 64}};
  for (auto [rows, cols] : shapes)
    for (std::size_t n_tokens : {1, 2, 3, 5, 8, 13, 45}) {
      if ((n_tokens == 45) != (rows == 70)) continue;  // keep the scalar twins' share quick
      const auto seed = static_cast<std::uint32_t>(rows * 41 + cols + n_tokens);
      legacy_weight<B> w(row_major, rows, cols, seed);
      x16_weight<X> wx(w, interleaved);
      const auto x = random_floats(n_tokens * cols, seed + 7, -2.0f, 2.0f);
      INFO(kestrel::name_of(interleaved) << " rows " << rows << " cols " << cols << " n_tokens " << n_tokens);
      const std::size_t n = n_tokens * rows;
      const auto a = legacy_acts<B>(x, n_tokens, cols);
      const auto [want, got] = x16_products(w.view, wx.view, x, n_tokens);
      kestrel::test::check_within(got.data(), want.data(), legacy_tol(w, a, n_tokens), n);
#if defined(KESTREL_LEGACY_X16_AVX2)
      bool fused = true;
      const std::size_t nb = cols / 32;
      for (std::size_t t = 0; t < n_tokens; ++t)
        for (std::size_t r = 0; r < rows; ++r)
          fused = fused && got[t * rows + r] == q::ref::dot_fused(w.blocks.data() + r * nb, a.data() + t * nb, cols);
      CHECK(fused);
      if (std::is_same_v<B, q::block_q4_0> && n_tokens > q::decode_max_tokens) {
        std::vector<float> row_major_y(n, -1.0f);
        cpu::matmul(w.view, x.data(), n_tokens, row_major_y.data(), &pool2);
        CHECK(got == row_major_y);
      }
#endif
      check_tokens_alone(wx.view, x, n_tokens, got);
      if (n_tokens == 1) check_x16_fused(wx.view, w.view, legacy_weight<B>(row_major, cols / 8 + 1, cols, seed + 9).view, x, got);
      check_same_rows(w.view, wx.view);
    }
#if defined(KESTREL_DEQUANT_GEMM)
  if constexpr (!std::is_same_v<B, q::block_q4_0>) {
    // From dequant_gemm_min_tokens tokens on, the float GEMM over the
    // dequantized panels (q4_0 keeps its kernel): the row-major matrix's bits.
    const std::size_t n_tokens = cpu::detail::dequant_gemm_min_tokens + 4, rows = 37, cols = 512;
    legacy_weight<B> w(row_major, rows, cols, 77);
    x16_weight<X> wx(w, interleaved);
    const auto x = random_floats(n_tokens * cols, 78, -2.0f, 2.0f);
    INFO(kestrel::name_of(interleaved) << " through the dequantizing GEMM");
    check_dequant_gemm(wx.view, x, n_tokens);
    std::vector<float> y_rows(n_tokens * rows, -1.0f), y_x16(n_tokens * rows, -2.0f);
    cpu::matmul(w.view, x.data(), n_tokens, y_rows.data(), &pool2);
    cpu::matmul(wx.view, x.data(), n_tokens, y_x16.data(), &pool2);
    CHECK(y_rows == y_x16);
  }
#endif
}

}  // namespace

TEST_CASE("cpu: q4_0_x16 / q4_1_x16 / q5_0_x16 / q5_1_x16 / q8_0_x16 matvec / matmul / fused forms == the row-major scalar twins") {
  check_legacy_x16_linear<q::block_q4_0_x16>(dtype::q4_0, dtype::q4_0_x16);
  check_legacy_x16_linear<q::block_q4_1_x16>(dtype::q4_1, dtype::q4_1_x16);
  check_legacy_x16_linear<q::block_q5_0_x16>(dtype::q5_0, dtype::q5_0_x16);
  check_legacy_x16_linear<q::block_q5_1_x16>(dtype::q5_1, dtype::q5_1_x16);
  check_legacy_x16_linear<q::block_q8_0_x16>(dtype::q8_0, dtype::q8_0_x16);
}

#if defined(KESTREL_LEGACY_X16_AVX2)
TEST_CASE("cpu: q8_0_x16 with the extreme codes: -128 and 127 against activations at +-127, bit for bit") {
  // The kernel's vpmaddubsw takes |w| (128 for -128) by a carrying w's sign:
  // a pair's sum reaches 2 * 128 * 127 here, just inside int16; the result
  // is ref::dot_fused's, whose block sums are exact.
  const std::size_t rows = 19, cols = 256, nb = cols / 32;
  std::mt19937 rng(11);
  legacy_weight<q::block_q8_0> w(dtype::q8_0, rows, cols, 5);
  for (auto& b : w.blocks)
    for (auto& c : b.qs) {
      const auto pick = rng() % 4;
      c = static_cast<std::int8_t>(pick == 0 ? -128 : pick == 1 ? 127 : static_cast<int>(rng() % 256) - 128);
    }
  x16_weight<q::block_q8_0_x16> wx(w, dtype::q8_0_x16);
  for (std::size_t n_tokens : {1, 2, 5}) {
    std::vector<float> x(n_tokens * cols);
    for (auto& v : x) v = (rng() & 1) ? 1.0f : -1.0f;  // every activation code +-127
    const auto a = legacy_acts<q::block_q8_0>(x, n_tokens, cols);
    std::vector<float> got(n_tokens * rows, -1.0f);
    cpu::matmul(wx.view, x.data(), n_tokens, got.data(), nullptr);
    for (std::size_t t = 0; t < n_tokens; ++t)
      for (std::size_t r = 0; r < rows; ++r) {
        CAPTURE(n_tokens);
        CAPTURE(r);
        CHECK(got[t * rows + r] == q::ref::dot_fused(w.blocks.data() + r * nb, a.data() + t * nb, cols));
      }
  }
}
#endif

TEST_CASE("cpu: legacy-quant matvec / matmul == scalar twins, decode == prefill") {
  check_legacy_linear<q::block_q4_0>(dtype::q4_0);
  check_legacy_linear<q::block_q4_1>(dtype::q4_1);
  check_legacy_linear<q::block_q5_0>(dtype::q5_0);
  check_legacy_linear<q::block_q5_1>(dtype::q5_1);
  check_legacy_linear<q::block_q8_0>(dtype::q8_0);
}

TEST_CASE("cpu: matmul_shared == one matmul per matrix, bit for bit (x quantized once; mixed types fall back)") {
  cpu::thread_pool pool(2);
  constexpr std::size_t cols = 512, n_tokens = 37;
  const auto x = random_floats(n_tokens * cols, 91);
  legacy_weight<q::block_q8_0> a(dtype::q8_0, 48, cols, 92), b(dtype::q8_0, 16, cols, 93);
  legacy_weight<q::block_q4_0> c(dtype::q4_0, 40, cols, 94);  // q8_0 activations too
  kquant_weight<q::block_q4_K> d(dtype::q4_k, 32, cols, 95);
  kquant_weight<q::block_q6_K> e(dtype::q6_k, 24, cols, 96);
  auto check = [&](std::vector<const kestrel::weight_view*> ws) {
    std::vector<std::vector<float>> shared(ws.size()), alone(ws.size());
    std::vector<cpu::matvec_job> jobs;
    for (std::size_t i = 0; i < ws.size(); ++i) {
      shared[i].assign(n_tokens * ws[i]->rows, -1.0f);
      alone[i].assign(n_tokens * ws[i]->rows, -2.0f);
      jobs.push_back({ws[i], shared[i].data()});
    }
    cpu::matmul_shared(jobs, x.data(), n_tokens, &pool);
    for (std::size_t i = 0; i < ws.size(); ++i) {
      cpu::matmul(*ws[i], x.data(), n_tokens, alone[i].data(), &pool);
      CHECK(std::memcmp(shared[i].data(), alone[i].data(), shared[i].size() * sizeof(float)) == 0);
    }
  };
  check({&a.view, &b.view, &c.view});  // legacy blocks: one q8_0 quantization of x
  check({&d.view, &e.view});           // k-quants: one q8_K quantization
  check({&a.view, &d.view});           // different activation blocks: each quantizes its own
  // float matrices of one width: one layout of x for the bf16 tiles where
  // they run (37 tokens: past gemm_amx_min_tokens)
  random_weight f(dtype::f32, 70, cols, 97), g(dtype::f16, 32, cols, 98), h(dtype::bf16, 17, cols, 99);
  check({&f.view, &g.view, &h.view});
  check({&f.view, &a.view});  // float and quantized: each its own path
}

TEST_CASE("cpu: matmul_swiglu == matmul_shared of gate and up, then swiglu, bit for bit (fused where built, else the fallback)") {
  cpu::thread_pool pool(2);
  // h 64-byte aligned, as the model's buffers are: a large enough call
  // streams its outputs (quant/amx.hpp), and the check covers that too.
  auto check = [&](const kestrel::weight_view& g, const kestrel::weight_view& u, std::size_t n_tokens,
                   std::uint32_t seed) {
    const std::size_t rows = g.rows, n = n_tokens * rows;
    const auto x = random_floats(n_tokens * g.cols, seed);
    std::vector<float> want(n, -1.0f), up(n, -1.0f), h_buf(n + 1 + 16, -7.0f), scratch(n, -5.0f);
    float* const h = h_buf.data() + (64 - reinterpret_cast<std::uintptr_t>(h_buf.data()) % 64) % 64 / sizeof(float);
    const cpu::matvec_job jobs[2] = {{&g, want.data()}, {&u, up.data()}};
    cpu::matmul_shared(jobs, x.data(), n_tokens, &pool);
    cpu::swiglu(want.data(), want.data(), up.data(), n);
    cpu::matmul_swiglu(g, u, x.data(), n_tokens, h, scratch.data(), &pool);
    CAPTURE(name_of(g.type));
    CAPTURE(name_of(u.type));
    CAPTURE(rows);
    CAPTURE(n_tokens);
    CHECK(std::memcmp(h, want.data(), n * sizeof(float)) == 0);
    CHECK(h[n] == -7.0f);  // nothing written past h
  };
  auto legacy_pair = [&]<class B>(dtype t, std::size_t rows, std::size_t cols, std::uint32_t seed,
                                  std::initializer_list<std::size_t> tokens) {
    legacy_weight<B> g(t, rows, cols, seed), u(t, rows, cols, seed + 1);
    for (std::size_t n_tokens : tokens) check(g.view, u.view, n_tokens, seed + 2 + static_cast<std::uint32_t>(n_tokens));
  };
  // rows: two panels and a part; tokens: one, one past a token group, tiles
  // with a tail. Where AMX is usable these take the tiles; KESTREL_AMX=0
  // checks the VNNI panels' pairs.
  legacy_pair.operator()<q::block_q4_0>(dtype::q4_0, 40, 256, 100, {1, 9, 37});
  legacy_pair.operator()<q::block_q4_1>(dtype::q4_1, 40, 96, 110, {9, 37});
  legacy_pair.operator()<q::block_q5_0>(dtype::q5_0, 33, 256, 120, {37});
  legacy_pair.operator()<q::block_q5_1>(dtype::q5_1, 17, 64, 130, {37});
  legacy_pair.operator()<q::block_q8_0>(dtype::q8_0, 48, 256, 140, {2, 37});
  legacy_pair.operator()<q::block_q4_0>(dtype::q4_0, 2048, 64, 150, {150});  // 1.2 MB of h: streamed
  // k-quants: q2_K, q4_K and q5_K on tiles, row-major and interleaved by 16
  // rows; q6_K (VNNI panels) falls back
  auto kquant_pair = [&]<class B>(dtype t, std::size_t rows, std::uint32_t seed) {
    kquant_weight<B> g(t, rows, 512, seed), u(t, rows, 512, seed + 1);
    for (std::size_t n_tokens : {15, 16, 37}) check(g.view, u.view, n_tokens, seed + 2 + static_cast<std::uint32_t>(n_tokens));
  };
  kquant_pair.operator()<q::block_q4_K>(dtype::q4_k, 40, 160);
  kquant_pair.operator()<q::block_q5_K>(dtype::q5_k, 17, 163);
  kquant_pair.operator()<q::block_q2_K>(dtype::q2_k, 33, 166);
  kquant_pair.operator()<q::block_q6_K>(dtype::q6_k, 32, 169);
  {
    kquant_weight<q::block_q4_K> g(dtype::q4_k, 40, 512, 180), u(dtype::q4_k, 40, 512, 181);
    x16_weight<q::block_q4_K_x16> gx(g, dtype::q4_k_x16), ux(u, dtype::q4_k_x16);
    check(gx.view, ux.view, 37, 182);
    check(gx.view, ux.view, 3, 183);
    kquant_weight<q::block_q6_K> g6(dtype::q6_k, 40, 512, 185), u6(dtype::q6_k, 40, 512, 186);
    x16_weight<q::block_q6_K_x16> g6x(g6, dtype::q6_k_x16), u6x(u6, dtype::q6_k_x16);
    check(g6x.view, u6x.view, 37, 187);  // falls back
  }
  // No fusion: gate and up of different types
  legacy_weight<q::block_q8_0> mg(dtype::q8_0, 32, 256, 170);
  legacy_weight<q::block_q4_0> mu(dtype::q4_0, 32, 256, 171);
  check(mg.view, mu.view, 37, 172);
}
