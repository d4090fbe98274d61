// tests/quant/test_kquants.cpp: the k-quant formats q2_K .. q6_K and q8_K.
//
// - dequantize_row against gguf-py's numpy decoder (an independent
//   implementation), bit for bit, on random blocks (data/kquants_reference.inc,
//   made by tools/gen_kquant_reference.py);
// - quantize -> dequantize error against the error of an ideal uniform
//   quantizer of the same bit width (gguf-py has no k-quant quantizer, so
//   byte-identity with ggml is not checked);
// - vec_dot (SIMD) and ref::vec_dot (its scalar twin) against
//   dequantize-then-dot, within derived rounding bounds (SIMD == twin on
//   random and extreme blocks: test_kquants_simd.cpp).
#include <doctest/doctest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "data/kquants_reference.inc"
#include "kestrel/quant/kquants.hpp"

namespace q = kestrel::quant;
namespace ref = kestrel::test::kquants_ref;

namespace {

constexpr double u = 1.0 / 16777216.0;  // unit roundoff of float, 2^-24
double gamma_n(double n) { return n * u / (1.0 - n * u); }

std::vector<float> random_floats(std::size_t n, std::uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  std::vector<float> v(n);
  for (auto& x : v) x = dist(rng);
  return v;
}

template <class B, std::size_t NB, std::size_t NV>
void check_reference(const char* name, const std::uint8_t (&bytes)[NB], const std::uint32_t (&values)[NV]) {
  static_assert(NB % sizeof(B) == 0 && NV == NB / sizeof(B) * q::qk_k);
  std::vector<B> blocks(NB / sizeof(B));
  std::memcpy(blocks.data(), bytes, NB);
  std::vector<float> y(NV);
  q::dequantize_row(blocks.data(), y.data(), NV);
  std::size_t bad = 0;
  for (std::size_t i = 0; i < NV; ++i) {
    if (std::bit_cast<std::uint32_t>(y[i]) != values[i]) {
      if (bad++ == 0)
        FAIL_CHECK(std::string(name) << ": value " << i << " is " << y[i] << ", gguf-py gives " << std::bit_cast<float>(values[i]));
    }
  }
  CHECK_MESSAGE(bad == 0, std::string(name) << ": " << bad << " of " << NV << " values differ");
}

/// sum_i (|scale q_i| + |min|) |a_i|: the magnitude the dot's rounding
/// errors are relative to.
template <class B>
double dot_magnitude(const B* w, const q::block_q8_K* a, std::size_t n) {
  q::unpacked up;
  double t = 0;
  for (std::size_t b = 0; b < n / q::qk_k; ++b) {
    q::unpack(w[b], up);
    for (std::size_t i = 0; i < q::qk_k; ++i)
      t += (std::fabs(double(up.scale[i / 16]) * up.q[i]) + std::fabs(double(up.min[i / 16]))) *
           std::fabs(double(a[b].d) * a[b].qs[i]);
  }
  return t;
}

template <class B>
void check_dot(const char* name, const std::vector<B>& w, std::uint32_t seed) {
  const std::size_t n = w.size() * q::qk_k;
  const auto x = random_floats(n, seed);
  std::vector<q::block_q8_K> a(n / q::qk_k);
  q::quantize_row(x.data(), a.data(), n);
  std::vector<float> wd(n), ad(n);
  q::dequantize_row(w.data(), wd.data(), n);
  q::dequantize_row(a.data(), ad.data(), n);
  double want = 0;
  for (std::size_t i = 0; i < n; ++i) want += double(wd[i]) * double(ad[i]);
  // Each dequantized weight carries <= 2 roundings (scale*q, then - min),
  // each ad[i] one (d*q); the scalar dot rounds scale*isum, min*bsum, their
  // difference, 16 partial sums, the d8 product and n/256 block sums; all
  // relative to the magnitude T, so |got - want| <= gamma_{n/256 + 24} T.
  // The SIMD dot rounds 2 n/256 + 6 times on a term's path instead of
  // n/256 + 20 (test_kquants_simd.cpp): gamma_{2 n/256 + 10} T.
  const double nb = double(n / q::qk_k), t = dot_magnitude(w.data(), a.data(), n);
  const float got_ref = q::ref::vec_dot(w.data(), a.data(), n), got = q::vec_dot(w.data(), a.data(), n);
  CHECK_MESSAGE(std::fabs(double(got_ref) - want) <= gamma_n(nb + 24) * t,
                std::string(name) << ": scalar dot " << got_ref << " vs " << want << ", bound " << gamma_n(nb + 24) * t);
  CHECK_MESSAGE(std::fabs(double(got) - want) <= gamma_n(2 * nb + 10) * t,
                std::string(name) << ": dot " << got << " vs " << want << ", bound " << gamma_n(2 * nb + 10) * t);
}

/// Quantize random values in [-1, 1] and compare the RMS error with that of
/// an ideal b-bit uniform quantizer over each group's own range,
/// step / sqrt(12) with step = range / (levels - 1). The k-quants also round
/// each group's scale (and min) to a few bits against a super-scale, which
/// the factor allows for.
template <class B>
void check_roundtrip(const char* name, int levels, std::size_t group, double factor) {
  const std::size_t n = 64 * q::qk_k;
  const auto x = random_floats(n, 7);
  std::vector<B> blocks(n / q::qk_k);
  q::quantize_row(x.data(), blocks.data(), n);
  std::vector<float> y(n);
  q::dequantize_row(blocks.data(), y.data(), n);
  double err2 = 0, ideal2 = 0;
  for (std::size_t g = 0; g < n / group; ++g) {
    float lo = x[g * group], hi = lo;
    for (std::size_t i = g * group; i < (g + 1) * group; ++i) {
      lo = std::min(lo, x[i]);
      hi = std::max(hi, x[i]);
      err2 += double(x[i] - y[i]) * double(x[i] - y[i]);
    }
    const double step = (double(hi) - lo) / (levels - 1);
    ideal2 += group * step * step / 12;
  }
  const double rmse = std::sqrt(err2 / n), ideal = std::sqrt(ideal2 / n);
  MESSAGE(std::string(name) << ": rmse " << rmse << ", ideal uniform " << ideal << " (ratio " << rmse / ideal << ")");
  CHECK(rmse <= factor * ideal);
  check_dot(name, blocks, 11);
}

}  // namespace

TEST_CASE("kquants: block sizes match ggml") {
  CHECK(sizeof(q::block_q2_K) == 84);
  CHECK(sizeof(q::block_q3_K) == 110);
  CHECK(sizeof(q::block_q4_K) == 144);
  CHECK(sizeof(q::block_q5_K) == 176);
  CHECK(sizeof(q::block_q6_K) == 210);
  CHECK(sizeof(q::block_q8_K) == 292);
}

TEST_CASE("kquants: dequantize equals gguf-py bit for bit") {
  check_reference<q::block_q2_K>("q2_K", ref::q2_K_bytes, ref::q2_K_values);
  check_reference<q::block_q3_K>("q3_K", ref::q3_K_bytes, ref::q3_K_values);
  check_reference<q::block_q4_K>("q4_K", ref::q4_K_bytes, ref::q4_K_values);
  check_reference<q::block_q5_K>("q5_K", ref::q5_K_bytes, ref::q5_K_values);
  check_reference<q::block_q6_K>("q6_K", ref::q6_K_bytes, ref::q6_K_values);
}

TEST_CASE("kquants: n must be a multiple of 256") {
  std::vector<q::block_q4_K> w(2);
  std::vector<q::block_q8_K> a(2);
  std::vector<float> y(512);
  CHECK_THROWS_AS(q::dequantize_row(w.data(), y.data(), 300), kestrel::invalid_argument);
  CHECK_THROWS_AS(q::quantize_row(y.data(), w.data(), 100), kestrel::invalid_argument);
  CHECK_THROWS_AS(q::quantize_row(y.data(), a.data(), 257), kestrel::invalid_argument);
  CHECK_THROWS_AS((void)q::vec_dot(w.data(), a.data(), 511), kestrel::invalid_argument);
  CHECK_NOTHROW(q::dequantize_row(w.data(), y.data(), 0));
}

TEST_CASE("kquants: q8_K rounds each value to within half a step") {
  const std::size_t n = 8 * q::qk_k;
  auto x = random_floats(n, 3);
  x[5] = 0;
  std::vector<q::block_q8_K> a(n / q::qk_k);
  q::quantize_row(x.data(), a.data(), n);
  std::vector<float> y(n);
  q::dequantize_row(a.data(), y.data(), n);
  for (std::size_t b = 0; b < n / q::qk_k; ++b) {
    int s = 0;
    for (int i = 0; i < 16; ++i) s += a[b].qs[i];
    CHECK(a[b].bsums[0] == s);
    // |x - d q| <= d/2 from rounding, plus the roundings of 1/iscale, of
    // iscale * x and of d * q, each relative to a value <= 127 d.
    const double d = std::fabs(a[b].d);
    for (std::size_t i = b * q::qk_k; i < (b + 1) * q::qk_k; ++i)
      REQUIRE(std::fabs(double(x[i]) - y[i]) <= d / 2 + 4 * u * 128 * d);
  }
  std::vector<float> zeros(q::qk_k, 0.0f);
  q::quantize_row(zeros.data(), a.data(), q::qk_k);
  CHECK(a[0].d == 0.0f);
  q::dequantize_row(a.data(), y.data(), q::qk_k);
  CHECK(y[0] == 0.0f);
}

// Factors: measured ratios are printed; the limits leave room over them for
// the scale quantization (4-bit scales for q2_K, 6-bit for q3_K..q5_K, 8-bit
// for q6_K) but would catch a wrong layout or an off-by-one level count.
TEST_CASE("kquants: quantize round trip and dot on quantized weights") {
  check_roundtrip<q::block_q2_K>("q2_K", 4, 16, 1.2);
  check_roundtrip<q::block_q3_K>("q3_K", 8, 16, 1.2);
  check_roundtrip<q::block_q4_K>("q4_K", 16, 32, 1.2);
  check_roundtrip<q::block_q5_K>("q5_K", 32, 32, 1.2);
  check_roundtrip<q::block_q6_K>("q6_K", 64, 16, 1.2);
}

TEST_CASE("kquants: dot on random blocks equals dequantize-then-dot") {
  auto as = []<class B>(const std::uint8_t* bytes, std::size_t nbytes) {
    std::vector<B> v(nbytes / sizeof(B));
    std::memcpy(v.data(), bytes, nbytes);
    return v;
  };
  check_dot("q2_K", as.operator()<q::block_q2_K>(ref::q2_K_bytes, sizeof ref::q2_K_bytes), 21);
  check_dot("q3_K", as.operator()<q::block_q3_K>(ref::q3_K_bytes, sizeof ref::q3_K_bytes), 22);
  check_dot("q4_K", as.operator()<q::block_q4_K>(ref::q4_K_bytes, sizeof ref::q4_K_bytes), 23);
  check_dot("q5_K", as.operator()<q::block_q5_K>(ref::q5_K_bytes, sizeof ref::q5_K_bytes), 24);
  check_dot("q6_K", as.operator()<q::block_q6_K>(ref::q6_K_bytes, sizeof ref::q6_K_bytes), 25);
}
