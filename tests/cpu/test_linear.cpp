// tests/cpu/test_linear.cpp: matvec and matmul against their scalar twins,
// for f32, f16 and bf16 weights, with and without a thread pool.
//
// Tolerance: the weights convert exactly to f32 in both kernels, so each
// output is a dot product of length cols computed in two summation orders;
// each is within gamma_cols sum_c |x_c w_rc| of exact, so they differ by at
// most 2 gamma_cols sum_c |x_c w_rc|.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <vector>

#include "helpers.hpp"
#include "kestrel/cpu/matmul.hpp"
#include "kestrel/cpu/matvec.hpp"
#include "kestrel/cpu/ref/linear.hpp"
#include "kestrel/cpu/thread_pool.hpp"

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

TEST_CASE("cpu: matmul == ref::matmul") {
  cpu::thread_pool pool2(2), pool4(4);
  struct shape { std::size_t rows, cols; };
  // (50, 4096): f16/bf16 weights take several converted tiles of 16 rows.
  const shape shapes[] = {{1, 1}, {3, 5}, {16, 16}, {17, 33}, {64, 67}, {100, 129}, {129, 1000}, {50, 4096}};
  // 1..3: matvec and skinny tails; 7, 16, 17, 24, 25: both sides of the skinny / Eigen
  // thresholds (16 for f32, 24 for f16/bf16); 64: Eigen.
  for (dtype t : all_types)
    for (auto [rows, cols] : shapes)
      for (std::size_t n_tokens : {0, 1, 2, 3, 7, 16, 17, 24, 25, 64}) {
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

TEST_CASE("cpu: matmul with zero columns gives zeros") {
  random_weight w(dtype::f32, 5, 0, 1);
  std::vector<float> y(3 * 5, 7.0f);
  cpu::matmul(w.view, nullptr, 3, y.data(), nullptr);
  for (float v : y) CHECK(v == 0.0f);
}
