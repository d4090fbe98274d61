// tests/quant/test_quantize_acts.cpp: the vectorized activation quantizers
// (quant::quantize_acts) against their scalar twins (quant::quantize_row),
// byte for byte: the fast path's dots see exactly the activations the
// reference path sees, so no tolerance is involved.
#include <doctest/doctest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "kestrel/quant/quantize_acts.hpp"

namespace q = kestrel::quant;

namespace {

/// Rows that hit the rounding edges: ordinary values, exact ties after
/// scaling (a block whose largest magnitude is 127 has d = 1, so k + 0.5
/// values are ties for roundf and for lrintf), negative ties, zeros, -0.0,
/// a largest magnitude that occurs twice with both signs, and tiny / huge
/// magnitudes.
std::vector<std::vector<float>> edge_rows(std::size_t n) {
  std::vector<std::vector<float>> rows;
  std::mt19937 rng(7);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_int_distribution<int> k(-126, 126);
  for (float scale : {1.0f, 1e-30f, 3e30f, 0.01f}) {
    std::vector<float> r(n);
    for (float& v : r) v = scale * normal(rng);
    rows.push_back(r);
  }
  std::vector<float> ties(n), zeros(n, 0.0f), negzero(n, -0.0f), twins(n), sparse(n, 0.0f);
  for (std::size_t i = 0; i < n; ++i) {
    ties[i] = (i % 32 == 5) ? 127.0f : static_cast<float>(k(rng)) + ((i % 2) ? 0.5f : -0.5f);
    twins[i] = normal(rng);
  }
  for (std::size_t b = 0; b < n; b += 32) {
    twins[b + 3] = -9.0f;  // the same magnitude twice, negative first
    twins[b + 20] = 9.0f;
  }
  sparse[n / 2] = -1e-3f;
  std::vector<float> graded(n);  // block b's values about 2^(b % 24 - 8): every block its own scale
  for (std::size_t i = 0; i < n; ++i) graded[i] = std::ldexp(normal(rng), static_cast<int>((i / 32) % 24) - 8);
  rows.insert(rows.end(), {ties, zeros, negzero, twins, sparse, graded});
  return rows;
}

template <class Block>
void check_equal(std::size_t n) {
  for (const auto& x : edge_rows(n)) {
    const std::size_t nb = n / (sizeof(Block) == sizeof(q::block_q8_K) ? q::qk_k : 32);
    std::vector<Block> want(nb), got(nb);
    std::memset(want.data(), 0x5a, nb * sizeof(Block));  // padding bytes compare equal
    std::memset(got.data(), 0x5a, nb * sizeof(Block));
    q::quantize_row(x.data(), want.data(), n);
    q::quantize_acts(x.data(), got.data(), n);
    CHECK(std::memcmp(want.data(), got.data(), nb * sizeof(Block)) == 0);
  }
}

}  // namespace

TEST_CASE("quant: quantize_acts == quantize_row, byte for byte (q8_0, q8_1, q8_K)") {
  for (std::size_t n : {256, 512, 768, 2048}) {
    INFO("n " << n);
    check_equal<q::block_q8_0>(n);
    check_equal<q::block_q8_1>(n);
    check_equal<q::block_q8_K>(n);
  }
  check_equal<q::block_q8_0>(32);
  check_equal<q::block_q8_0>(544);  // 16 blocks at a time (AVX-512), then one
  check_equal<q::block_q8_1>(96);
}

TEST_CASE("quant: quantize_acts rejects a row that is not whole blocks") {
  std::vector<float> x(40, 1.0f);
  std::vector<q::block_q8_0> y8(2);
  std::vector<q::block_q8_K> yk(1);
  CHECK_THROWS(q::quantize_acts(x.data(), y8.data(), 40));
  CHECK_THROWS(q::quantize_acts(x.data(), yk.data(), 40));
}
