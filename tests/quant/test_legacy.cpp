// tests/quant/test_legacy.cpp: the legacy GGUF block formats (q4_0, q4_1,
// q5_0, q5_1, q8_0, q8_1) against gguf-py's independent implementation
// (byte-identical blocks, bit-identical dequantized values), their round-trip
// error bounds, and their dot products (the fast one and its scalar twin in
// quant::ref) against dequantize-then-dot.
//
// Tolerances are derived, not chosen: u = 2^-24 (float unit roundoff),
// gamma_n = n u / (1 - n u), and f16_err(v) = max(2^-11 |v|, 2^-25), the most
// that rounding v to f16 moves it (half an ulp: 2^-11 relative in the normal
// range, 2^-25 absolute among subnormals).
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>
#include <vector>

#include "cpu/helpers.hpp"
#include "kestrel/quant/legacy.hpp"

namespace q = kestrel::quant;
using kestrel::test::gamma_n;
using kestrel::test::random_floats;
using kestrel::test::u;

namespace {

struct legacy_row {
  const char* name;
  std::size_t n;
  const char* input;  // n floats, hex
};
struct legacy_case {
  const char* type;
  std::size_t row;          // index into legacy_rows
  std::uint64_t dequant_fnv;
  const char* blocks;       // hex
  const char* dequant;      // n floats, hex; empty for long rows (hash only)
};
#include "data/legacy_reference.inc"

std::vector<std::uint8_t> from_hex(std::string_view h) {
  auto nib = [](char c) { return c <= '9' ? c - '0' : c - 'a' + 10; };
  std::vector<std::uint8_t> b(h.size() / 2);
  for (std::size_t i = 0; i < b.size(); ++i) b[i] = static_cast<std::uint8_t>(nib(h[2 * i]) << 4 | nib(h[2 * i + 1]));
  return b;
}
std::vector<float> floats_from_hex(std::string_view h) {
  const auto b = from_hex(h);
  std::vector<float> f(b.size() / 4);
  std::memcpy(f.data(), b.data(), b.size());
  return f;
}
std::uint64_t fnv1a64(const void* p, std::size_t n) {
  std::uint64_t h = 0xcbf29ce484222325ull;
  for (std::size_t i = 0; i < n; ++i) h = (h ^ static_cast<const std::uint8_t*>(p)[i]) * 0x100000001b3ull;
  return h;
}

double f16_err(double v) { return std::max(std::ldexp(std::fabs(v), -11), std::ldexp(1.0, -25)); }

template <class Block> struct info;
template <> struct info<q::block_q4_0> { static constexpr const char* name = "q4_0"; };
template <> struct info<q::block_q4_1> { static constexpr const char* name = "q4_1"; };
template <> struct info<q::block_q5_0> { static constexpr const char* name = "q5_0"; };
template <> struct info<q::block_q5_1> { static constexpr const char* name = "q5_1"; };
template <> struct info<q::block_q8_0> { static constexpr const char* name = "q8_0"; };
template <> struct info<q::block_q8_1> { static constexpr const char* name = "q8_1"; };

template <class Block> std::vector<Block> quantized(const std::vector<float>& x) {
  std::vector<Block> b(x.size() / 32);
  q::quantize_row(x.data(), b.data(), x.size());
  return b;
}
template <class Block> std::vector<float> dequantized(const std::vector<Block>& b) {
  std::vector<float> x(b.size() * 32);
  q::dequantize_row(b.data(), x.data(), x.size());
  return x;
}

// Row lengths for the property tests: one block to 4096, odd block counts.
const std::size_t row_sizes[] = {32, 64, 96, 160, 256, 352, 1024, 4096};

// Rows with varied scales per block: random values times a block factor
// spanning 2^-20..2^10, with a zero block and a constant block.
std::vector<float> varied_row(std::size_t n, std::uint32_t seed) {
  auto x = random_floats(n, seed);
  auto f = random_floats(n / 32, seed + 1, -20.0f, 10.0f);
  for (std::size_t i = 0; i < n; ++i) x[i] *= std::exp2(std::round(f[i / 32]));
  if (n >= 96) {
    std::fill(x.begin() + 32, x.begin() + 64, 0.0f);
    std::fill(x.begin() + 64, x.begin() + 96, -0.3f);
  }
  return x;
}

}  // namespace

#define LEGACY_TYPES q::block_q4_0, q::block_q4_1, q::block_q5_0, q::block_q5_1, q::block_q8_0, q::block_q8_1

TEST_CASE_TEMPLATE("quant: legacy blocks match gguf-py byte for byte", Block, LEGACY_TYPES) {
  std::size_t checked = 0;
  for (const auto& c : legacy_cases) {
    if (std::string_view(c.type) != info<Block>::name) continue;
    const auto& row = legacy_rows[c.row];
    CAPTURE(row.name);
    const auto x = floats_from_hex(row.input);
    REQUIRE(x.size() == row.n);
    const auto want = from_hex(c.blocks);
    REQUIRE(want.size() == row.n / 32 * sizeof(Block));

    // quantize: byte-identical
    const auto got = quantized<Block>(x);
    std::size_t first_bad = want.size();
    for (std::size_t i = 0; i < want.size(); ++i)
      if (reinterpret_cast<const std::uint8_t*>(got.data())[i] != want[i]) { first_bad = i; break; }
    CHECK_MESSAGE(first_bad == want.size(), "first differing byte " << first_bad << " (block " << first_bad / sizeof(Block) << ")");

    // dequantize the reference blocks: bit-identical floats
    std::vector<Block> blocks(row.n / 32);
    std::memcpy(blocks.data(), want.data(), want.size());
    const auto deq = dequantized(blocks);
    CHECK(fnv1a64(deq.data(), deq.size() * 4) == c.dequant_fnv);
    if (*c.dequant) {
      const auto want_deq = floats_from_hex(c.dequant);
      REQUIRE(want_deq.size() == row.n);
      CHECK(std::memcmp(deq.data(), want_deq.data(), deq.size() * 4) == 0);
    }
    ++checked;
  }
  CHECK(checked == std::size(legacy_rows));
}

namespace {

// The most quantize -> dequantize may move x[j] of block xb (32 values).
//
// q8_0 / q8_1: d = amax/127, q = round(x/d), |q| <= 127: |x - d q| <= d/2,
//   and the stored d' = f16(d) moves d q by at most 127 f16_err(d).
// q4_0 / q5_0 (H = 8 / 16): d = max/-H, q = trunc(x/d + H + 0.5) clipped to
//   2H - 1: within d/2 except where the clip bites (x/d > H - 0.5, on the
//   side opposite the max), where the error is |x| - (H - 1)|d| <= |d|;
//   the stored d' moves d (q - H) by at most H f16_err(d).
// q4_1 / q5_1 (T = 15 / 31): d = (max - min)/T, q = trunc((x - min)/d + 0.5)
//   in 0..T: within d/2; f16 rounding of d and min adds T f16_err(d) +
//   f16_err(min); the dequantizing addition rounds once, u |x'|.
// Every bound also carries the float roundings of x/d (computed as x * id,
// id = 1/d, offsets added): a few u relative to the quant, i.e. (T + 1) 4u
// times d, written as 64 * 4u * d (64 >= the largest T + 1, 32 for q5; 128
// for q8 below).
template <class Block> double roundtrip_bound(const float* xb, std::size_t j) {
  float lo = xb[0], hi = xb[0], amax = 0, max = 0;
  for (std::size_t k = 0; k < 32; ++k) {
    lo = std::min(lo, xb[k]);
    hi = std::max(hi, xb[k]);
    if (amax < std::fabs(xb[k])) { amax = std::fabs(xb[k]); max = xb[k]; }
  }
  const double x = xb[j];
  if constexpr (std::is_same_v<Block, q::block_q8_0> || std::is_same_v<Block, q::block_q8_1>) {
    const double d = amax / 127.0;
    return d / 2 + 127 * f16_err(d) + 128 * 4 * u * d;
  } else if constexpr (std::is_same_v<Block, q::block_q4_0> || std::is_same_v<Block, q::block_q5_0>) {
    const double H = std::is_same_v<Block, q::block_q4_0> ? 8 : 16;
    const double d = std::fabs(max) / H;
    return d / 2 + std::max(0.0, std::fabs(x) - (H - 0.5) * d) + H * f16_err(d) + 64 * 4 * u * d;
  } else {
    const double T = std::is_same_v<Block, q::block_q4_1> ? 15 : 31;
    const double d = (static_cast<double>(hi) - lo) / T;
    return d / 2 + T * f16_err(d) + f16_err(lo) + 64 * 4 * u * d + u * (std::fabs(x) + d);
  }
}

}  // namespace

TEST_CASE_TEMPLATE("quant: legacy quantize -> dequantize within the type's bound", Block, LEGACY_TYPES) {
  for (std::size_t n : row_sizes) {
    for (std::uint32_t seed : {1u, 2u}) {
      CAPTURE(n);
      CAPTURE(seed);
      const auto x = varied_row(n, seed * 1000 + static_cast<std::uint32_t>(n));
      const auto y = dequantized(quantized<Block>(x));
      std::size_t bad = 0, first = n;
      double worst = 0;  // in units of the bound
      for (std::size_t i = 0; i < n; ++i) {
        const double b = roundtrip_bound<Block>(&x[i / 32 * 32], i % 32);
        const double e = std::fabs(static_cast<double>(x[i]) - y[i]);
        worst = std::max(worst, e / b);
        if (!(e <= b)) { if (!bad++) first = i; }
      }
      CHECK_MESSAGE(bad == 0, bad << " values past the bound, first at " << first << ": " << x[first] << " -> " << y[first]);
      if (n == 4096 && seed == 1) MESSAGE(std::string(info<Block>::name) << ": worst round-trip error " << worst << " of the bound");
    }
  }
}

namespace {

// The quantized dot against the dequantize-then-dot twin (in double, exact
// up to 2^-53 relative: the dequantized values are exact floats, so their
// products are exact in double).
//
// The quantized dot scales each block's exact integer sum by d_w d_a (exact:
// two 11-bit significands) in one rounding, adds m_w s_a for the _1 types
// (one more rounding, one more addition), and sums nb block terms: within
// gamma_(nb + 3) sum_b |terms| for the scalar twin. The SIMD dot splits each
// block's integer sum over 8 lanes (|lane sums| <= the block's sum of
// |products|), accumulates nb terms per lane, adds the lanes in a tree of
// depth 3 and, for the _1 types, the separately summed offsets once more:
// gamma_(nb + 3 + 3 + 1); gamma_(nb + 8) covers both. For the _1 types s_a = f16(fl(d sum q_a)),
// with d the unrounded scale, differs from the twin's d' sum q_a by at most
// f16_err(s_a) + u |s_a| + |sum q_a| f16_err(d'), times |m_w|.
// (f16_err is evaluated at the rounded value; half an ulp of the rounded
// value bounds the error up to a factor 1 + 2^-10, covered by the 1.01.)
template <class W> void check_dot(std::size_t n, std::uint32_t seed) {
  using A = q::activation_of_t<W>;
  const auto wq = quantized<W>(varied_row(n, seed));
  const auto aq = quantized<A>(random_floats(n, seed + 7, -4.0f, 4.0f));
  const auto w = dequantized(wq), a = dequantized(aq);

  double twin = 0;
  for (std::size_t i = 0; i < n; ++i) twin += static_cast<double>(w[i]) * a[i];

  const std::size_t nb = n / 32;
  double terms = 0, s_dev = 0;
  for (std::size_t b = 0; b < nb; ++b) {
    double block = 0;
    for (std::size_t j = 0; j < 32; ++j) block += std::fabs(static_cast<double>(w[b * 32 + j]) * a[b * 32 + j]);
    terms += block;  // >= |d_w d_a sum q_w q_a| + |m_w s_a| up to the s deviation below
    if constexpr (std::is_same_v<A, q::block_q8_1>) {
      const double m = kestrel::to_f32(wq[b].m), s = kestrel::to_f32(aq[b].s), d = kestrel::to_f32(aq[b].d);
      int qsum = 0;
      for (int v : aq[b].qs) qsum += v;
      const double dev = std::fabs(m) * (f16_err(s) + u * std::fabs(s) + std::abs(qsum) * f16_err(d));
      s_dev += dev;
      terms += 2 * std::fabs(m * s) + dev;  // |m s| appears in the term, and the split may cancel
    }
  }
  const double tol = 1.01 * (gamma_n(nb + 8) * terms + s_dev);
  const float got = q::dot(wq.data(), aq.data(), n);
  const float ref = q::ref::dot(wq.data(), aq.data(), n);
  CAPTURE(n);
  CAPTURE(seed);
  CHECK_MESSAGE(std::fabs(got - twin) <= tol, "dot " << got << " twin " << twin << " tol " << tol);
  CHECK_MESSAGE(std::fabs(ref - twin) <= tol, "ref::dot " << ref << " twin " << twin << " tol " << tol);
}

}  // namespace

TEST_CASE_TEMPLATE("quant: legacy dot equals dequantize-then-dot", W, q::block_q4_0, q::block_q4_1, q::block_q5_0,
                   q::block_q5_1, q::block_q8_0) {
  for (std::size_t n : row_sizes)
    for (std::uint32_t seed : {11u, 12u, 13u}) check_dot<W>(n, seed * 100 + static_cast<std::uint32_t>(n));
  CHECK(q::dot(static_cast<const W*>(nullptr), static_cast<const q::activation_of_t<W>*>(nullptr), 0) == 0.0f);
  CHECK(q::ref::dot(static_cast<const W*>(nullptr), static_cast<const q::activation_of_t<W>*>(nullptr), 0) == 0.0f);
}

TEST_CASE_TEMPLATE("quant: legacy rows must hold whole blocks", Block, LEGACY_TYPES) {
  std::vector<float> x(96, 1.0f);
  std::vector<Block> b(3);
  for (std::size_t n : {1u, 31u, 33u, 48u, 95u}) {
    CAPTURE(n);
    CHECK_THROWS_AS(q::quantize_row(x.data(), b.data(), n), kestrel::invalid_argument);
    CHECK_THROWS_AS(q::dequantize_row(b.data(), x.data(), n), kestrel::invalid_argument);
  }
  if constexpr (!std::is_same_v<Block, q::block_q8_1>) {
    std::vector<q::activation_of_t<Block>> a(3);
    CHECK_THROWS_AS(q::dot(b.data(), a.data(), 40), kestrel::invalid_argument);
    CHECK_THROWS_AS(q::ref::dot(b.data(), a.data(), 40), kestrel::invalid_argument);
  }
  CHECK_NOTHROW(q::quantize_row(x.data(), b.data(), 0));
}
