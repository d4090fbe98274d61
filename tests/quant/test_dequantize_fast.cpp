// tests/quant/test_dequantize_fast.cpp: quant::dequantize_row_fast (AVX2
// kernels for q4_0, q8_0, q4_K, q6_K) against its twin dequantize_row, bit
// for bit. Every kernel computes the twin's value with the same roundings
// (quant/dequantize_fast.hpp), so no tolerance is needed. The blocks are
// random bytes, so every code, shift and sign pattern occurs, with the f16
// scales replaced by finite ones (the bytes could spell NaN or infinity).
#include <doctest/doctest.h>

#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "kestrel/quant/dequantize_fast.hpp"

namespace q = kestrel::quant;

namespace {

template <class B>
void check_type(const char* name, std::size_t qk) {
  std::mt19937 rng(17);
  std::uniform_real_distribution<float> scale(-3.0f, 3.0f);
  const std::size_t nb = 37;  // an odd count of blocks
  std::vector<B> blocks(nb);
  auto* bytes = reinterpret_cast<unsigned char*>(blocks.data());
  for (std::size_t i = 0; i < nb * sizeof(B); ++i) bytes[i] = static_cast<unsigned char>(rng());
  for (auto& b : blocks) {
    b.d = kestrel::to_f16(scale(rng) * 1e-2f);
    if constexpr (requires { b.dmin; }) b.dmin = kestrel::to_f16(scale(rng) * 1e-2f);
  }
  for (std::size_t n : {qk, 5 * qk, nb * qk}) {
    std::vector<float> want(n, -1.0f), got(n, -2.0f);
    q::dequantize_row(blocks.data(), want.data(), n);
    q::dequantize_row_fast(blocks.data(), got.data(), n);
    INFO(std::string(name) << " n " << n);
    CHECK(std::memcmp(want.data(), got.data(), n * sizeof(float)) == 0);
  }
  std::vector<float> y(2 * qk);
  CHECK_THROWS(q::dequantize_row_fast(blocks.data(), y.data(), qk + 1));  // not whole blocks: the twin's error
}

}  // namespace

TEST_CASE("quant: dequantize_row_fast == dequantize_row, bit for bit") {
  check_type<q::block_q4_0>("q4_0", 32);
  check_type<q::block_q8_0>("q8_0", 32);
  check_type<q::block_q4_K>("q4_K", 256);
  check_type<q::block_q6_K>("q6_K", 256);
  check_type<q::block_q5_K>("q5_K (the twin)", 256);
  check_type<q::block_q4_1>("q4_1 (the twin)", 32);
}
