// tests/cpu/test_kernels.cpp: the element-wise kernels, dot, exp, rope and
// attend against their scalar twins in kestrel::cpu::ref.
//
// Every tolerance below is derived from rounding-error bounds (u = 2^-24,
// gamma_n = n u / (1 - n u)); the comment above each says how. Fast and
// reference kernels are each within a bound B of the exact result, so they
// are within 2B of each other.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "helpers.hpp"
#include "kestrel/cpu/kernels.hpp"
#include "kestrel/cpu/ref/kernels.hpp"

namespace cpu = kestrel::cpu;
namespace ref = kestrel::cpu::ref;
using kestrel::test::gamma_n;
using kestrel::test::random_floats;
using kestrel::test::sizes;
using kestrel::test::u;

namespace {

// glibc's expf is within 1 ulp, i.e. a relative error <= 2u.
constexpr double ref_exp_rel_error = 2 * u;

}  // namespace

TEST_CASE("cpu: simd width follows the compile flags") {
  MESSAGE("xsimd " << XSIMD_VERSION_MAJOR << "." << XSIMD_VERSION_MINOR << ", arch " << std::string(xsimd::default_arch::name())
                   << ", " << cpu::simd::width << " floats per batch");
  CHECK(cpu::simd::width >= 1);
}

namespace {

/// Checks exp's contract (cpu/math.hpp) on f, which maps W floats (in) to
/// their e^x (out): a dense sweep of the normal range within exp_rel_error,
/// results in [0, 2^-126] below it (-inf included), e^0 = 1.
template <class F>
void check_exp_contract(const char* name, std::size_t W, F&& f) {
  double worst = 0;
  std::vector<float> in(W), out(W);
  const float lo = cpu::exp_min_normal_x, hi = cpu::exp_max_x;
  const std::size_t steps = 1 << 20;
  for (std::size_t s = 0; s < steps; s += W) {
    for (std::size_t l = 0; l < W; ++l) in[l] = lo + (hi - lo) * static_cast<float>(s + l) / steps;
    f(in.data(), out.data());
    for (std::size_t l = 0; l < W; ++l) {
      const double e = std::exp(static_cast<double>(in[l]));
      worst = std::max(worst, std::fabs(out[l] - e) / e);
    }
  }
  MESSAGE(std::string(name) << ": worst relative error " << worst / u << " u");
  CHECK(worst <= cpu::exp_rel_error);
  for (float x : {-87.5f, -90.0f, -104.0f, -1000.0f, -std::numeric_limits<float>::infinity(), 0.0f}) {
    std::fill(in.begin(), in.end(), x);
    f(in.data(), out.data());
    INFO(std::string(name) << "(" << x << ")");
    if (x == 0.0f) {
      CHECK(out[0] == 1.0f);
    } else {
      CHECK(out[0] >= 0.0f);
      CHECK(out[0] <= std::ldexp(1.0f, -126));
    }
  }
}

}  // namespace

TEST_CASE("cpu: exp meets its documented error contract") {
  check_exp_contract("exp", cpu::simd::width, [](const float* in, float* out) {
    cpu::exp(cpu::simd::fbatch::load_unaligned(in)).store_unaligned(out);
  });
#if defined(__AVX512F__)
  auto scalef = [](const float* in, float* out) { _mm512_storeu_ps(out, cpu::exp_scalef(_mm512_loadu_ps(in))); };
  check_exp_contract("exp_scalef", 16, scalef);
  std::vector<float> nan_in(16, std::numeric_limits<float>::quiet_NaN()), nan_out(16);
  scalef(nan_in.data(), nan_out.data());
  CHECK(std::isnan(nan_out[0]));
#endif
}

TEST_CASE("cpu: dot == ref::dot") {
  // Any summation order of the n products is within gamma_n sum |a_i b_i| of
  // the exact dot product, so fast and ref are within 2 gamma_n sum |a_i b_i|.
  for (std::size_t n : sizes()) {
    const auto a = random_floats(n, 1 + n), b = random_floats(n, 1000 + n);
    double abs_sum = 0;
    for (std::size_t i = 0; i < n; ++i) abs_sum += std::fabs(double(a[i]) * b[i]);
    const float got = cpu::dot(a.data(), b.data(), n), want = ref::dot(a.data(), b.data(), n);
    INFO("n = " << n);
    CHECK(std::fabs(double(got) - want) <= 2 * gamma_n(n) * abs_sum);
  }
}

TEST_CASE("cpu: add == ref::add (exact)") {
  // One rounding of the same operands: bit-identical.
  for (std::size_t n : sizes()) {
    auto y1 = random_floats(n, 7 + n), y2 = y1;
    const auto x = random_floats(n, 70 + n);
    cpu::add(y1.data(), x.data(), n);
    ref::add(y2.data(), x.data(), n);
    INFO("n = " << n);
    CHECK(y1 == y2);
  }
}

TEST_CASE("cpu: rmsnorm == ref::rmsnorm, also in place") {
  // Both sums of squares are within gamma_n (relative: the terms are
  // positive); /n, +eps, sqrt (halves the error), 1/: scale within
  // gamma_n/2 + 3u; two multiplies: out within gamma_n/2 + 5u relative.
  // Fast vs ref: 2x that, plus 2u for second-order terms.
  const float eps = 1e-5f;
  for (std::size_t n : sizes()) {
    const auto x = random_floats(n, 11 + n, -3.0f, 3.0f), w = random_floats(n, 110 + n);
    std::vector<float> got(n), want(n);
    cpu::rmsnorm(got.data(), x.data(), w.data(), n, eps);
    ref::rmsnorm(want.data(), x.data(), w.data(), n, eps);
    std::vector<double> tol(n);
    for (std::size_t i = 0; i < n; ++i) tol[i] = (gamma_n(n) + 12 * u) * std::fabs(want[i]);
    kestrel::test::check_within(got.data(), want.data(), tol, n);
    auto in_place = x;
    cpu::rmsnorm(in_place.data(), in_place.data(), w.data(), n, eps);
    CHECK(in_place == got);
  }
}

namespace {

/// Tolerance of fast vs ref softmax, per element, relative to p:
/// exp errors E (fast) and E_r (ref) per term; the sums within gamma_n plus
/// the exps' error (positive terms); the divide (ref) or reciprocal and
/// multiply (fast): p_fast within 2E + gamma_n + 2u, p_ref within
/// 2E_r + gamma_n + u. The absolute term covers results the fast exp flushes
/// to zero below 2^-126.
double softmax_rel_tol(std::size_t n) { return 2 * cpu::exp_rel_error + 2 * ref_exp_rel_error + 2 * gamma_n(n) + 4 * u; }
constexpr double softmax_abs_tol = 1e-37;

}  // namespace

TEST_CASE("cpu: softmax == ref::softmax") {
  for (std::size_t n : sizes()) {
    for (float range : {1.0f, 30.0f, 200.0f}) {  // 200: some terms underflow
      auto got = random_floats(n, 21 + n, -range, range), want = got;
      if (n > 3) got[n / 2] = want[n / 2] = -std::numeric_limits<float>::infinity();  // a masked score
      cpu::softmax(got.data(), n);
      ref::softmax(want.data(), n);
      std::vector<double> tol(n);
      for (std::size_t i = 0; i < n; ++i) tol[i] = softmax_rel_tol(n) * want[i] + softmax_abs_tol;
      INFO("range " << range);
      kestrel::test::check_within(got.data(), want.data(), tol, n);
      double sum = 0;
      for (float p : got) sum += p;
      if (n) CHECK(std::fabs(sum - 1.0) <= softmax_rel_tol(n));
    }
  }
  cpu::softmax(nullptr, 0);  // n == 0 touches nothing
}

TEST_CASE("cpu: swiglu == ref::swiglu, also in place") {
  // exp(-g) within E; 1 + e within E + u relative; the divide and the
  // multiply by up: 2u. Fast within E + 3u, ref within E_r + 3u relative.
  // Absolute term: for g < -88.3 the fast exp may overflow to inf, giving
  // -0 where the reference gives |g| e^g |up| < 1e-36 |up|.
  for (std::size_t n : sizes()) {
    for (float range : {8.0f, 100.0f}) {
      const auto g = random_floats(n, 31 + n, -range, range), up = random_floats(n, 310 + n);
      std::vector<float> got(n), want(n);
      cpu::swiglu(got.data(), g.data(), up.data(), n);
      ref::swiglu(want.data(), g.data(), up.data(), n);
      std::vector<double> tol(n);
      for (std::size_t i = 0; i < n; ++i)
        tol[i] = (cpu::exp_rel_error + ref_exp_rel_error + 6 * u) * std::fabs(want[i]) + 1e-36 * std::fabs(up[i]);
      INFO("range " << range);
      kestrel::test::check_within(got.data(), want.data(), tol, n);
      auto in_place = g;
      cpu::swiglu(in_place.data(), in_place.data(), up.data(), n);
      CHECK(in_place == got);
    }
  }
}

TEST_CASE("cpu: rope == ref::rope, both pairings, with and without scaling") {
  // Both use the same cos/sin (cpu::rope_cos_sin); each output a c - b s has
  // at most two roundings: within gamma_2 (|a c| + |b s|) of exact.
  struct shape { std::size_t n_heads, head_dim, n_rot; };
  const auto factors = random_floats(256, 77, 1.0f, 8.0f);
  for (auto mode : {cpu::rope_mode::normal, cpu::rope_mode::neox})
    for (bool scaled : {false, true})
      for (auto [n_heads, head_dim, n_rot] :
           {shape{1, 2, 2}, shape{1, 64, 64}, shape{6, 48, 48}, shape{4, 128, 128}, shape{2, 128, 64},
            shape{3, 80, 32}, shape{2, 512, 512}, shape{1, 8, 0}}) {
        const cpu::rope_spec r{n_rot, scaled ? 500000.0f : 10000.0f, mode, scaled ? 0.25f : 1.0f,
                               scaled ? factors.data() : nullptr};
        for (std::size_t pos : {0, 1, 7, 100, 4095}) {
          const std::size_t n = n_heads * head_dim;
          const auto x = random_floats(n, static_cast<std::uint32_t>(41 + pos + n));
          auto got = x, want = x;
          cpu::rope(got.data(), n_heads, head_dim, pos, r);
          ref::rope(want.data(), n_heads, head_dim, pos, r);
          std::vector<double> tol(n, 0.0);
          std::vector<bool> rotated(head_dim, false);
          for (std::size_t h = 0; h < n_heads; ++h)
            for (std::size_t i = 0; i < n_rot / 2; ++i) {
              float c, sn;
              cpu::rope_cos_sin(pos, i, r, c, sn);
              std::size_t ia, ib;
              cpu::rope_pair(r, i, ia, ib);
              rotated[ia] = rotated[ib] = true;
              const std::size_t ja = h * head_dim + ia, jb = h * head_dim + ib;
              const double t = 2 * gamma_n(2) * (std::fabs(x[ja] * c) + std::fabs(x[jb] * sn) +
                                                 std::fabs(x[ja] * sn) + std::fabs(x[jb] * c));
              tol[ja] = tol[jb] = t;
            }
          INFO("mode " << static_cast<int>(mode) << " scaled " << scaled << " n_heads " << n_heads << " head_dim "
                       << head_dim << " n_rot " << n_rot << " pos " << pos);
          kestrel::test::check_within(got.data(), want.data(), tol, n);
          // Exactly the first n_rot dims of each head rotate; the rest are untouched.
          for (std::size_t d = 0; d < head_dim; ++d) CHECK(rotated[d] == (d < n_rot));
          for (std::size_t h = 0; h < n_heads; ++h)
            for (std::size_t d = n_rot; d < head_dim; ++d) CHECK(got[h * head_dim + d] == x[h * head_dim + d]);
        }
      }
}

TEST_CASE("cpu: rope's vector path (8 pairs at a time) == its scalar loop, bit for bit") {
  // Every pair takes rope_rotate_one's two FMAs either way; pairs one call
  // each go through the scalar loop alone.
  for (auto mode : {cpu::rope_mode::normal, cpu::rope_mode::neox})
    for (std::size_t n_rot : {std::size_t{16}, std::size_t{34}, std::size_t{64}}) {
      const std::size_t head_dim = n_rot + 6, n_heads = 3, n_pairs = n_rot / 2;
      const cpu::rope_spec r{n_rot, 10000.0f, mode};
      std::vector<float> cs(n_pairs), sn(n_pairs);
      cpu::rope_angles(77, r, cs.data(), sn.data());
      const auto x = random_floats(n_heads * head_dim, static_cast<std::uint32_t>(300 + n_rot));
      auto a = x, b = x;
      cpu::detail::rope_rotate_pairs(a.data(), n_heads, head_dim, 0, n_pairs, cs.data(), sn.data(), r);
      for (std::size_t i = 0; i < n_pairs; ++i)
        cpu::detail::rope_rotate_pairs(b.data(), n_heads, head_dim, i, i + 1, cs.data() + i, sn.data() + i, r);
      CAPTURE(n_rot);
      CHECK(a == b);
    }
}

TEST_CASE("cpu: rope_rotate with rope_angles' table gives rope's bits") {
  // The model computes each position's angles once for all layers; the
  // rotation must not change by a bit.
  const auto factors = random_floats(256, 78, 1.0f, 8.0f);  // n_rot / 2 divisors for the largest n_rot
  for (auto mode : {cpu::rope_mode::normal, cpu::rope_mode::neox})
    for (bool scaled : {false, true})
      for (std::size_t n_rot : {std::size_t{0}, std::size_t{2}, std::size_t{32}, std::size_t{64}, std::size_t{512}}) {
        const std::size_t head_dim = std::max<std::size_t>(n_rot, 64), n_heads = 3;
        const cpu::rope_spec r{n_rot, scaled ? 500000.0f : 10000.0f, mode, scaled ? 0.25f : 1.0f,
                               scaled ? factors.data() : nullptr};
        for (std::size_t pos : {0, 5, 4095}) {
          const auto x = random_floats(n_heads * head_dim, static_cast<std::uint32_t>(90 + pos + n_rot));
          auto a = x, b = x;
          cpu::rope(a.data(), n_heads, head_dim, pos, r);
          std::vector<float> cs(n_rot / 2 + 1), sn(n_rot / 2 + 1);
          cpu::rope_angles(pos, r, cs.data(), sn.data());
          cpu::rope_rotate(b.data(), n_heads, head_dim, cs.data(), sn.data(), r);
          CAPTURE(n_rot);
          CAPTURE(pos);
          CHECK(a == b);
        }
      }
}

TEST_CASE("cpu: neox rope pairs dim i with i + n_rot/2 (Hugging Face's rotate_half)") {
  // At pos 1 with theta 10000, pair 0 turns by 1 radian: x[0], x[n_rot/2] rotate.
  std::vector<float> x(8, 0.0f);
  x[0] = 1.0f;
  cpu::rope(x.data(), 1, 8, 1, cpu::rope_spec{8, 10000.0f, cpu::rope_mode::neox});
  CHECK(x[0] == doctest::Approx(std::cos(1.0f)));
  CHECK(x[4] == doctest::Approx(std::sin(1.0f)));
  CHECK(x[1] == 0.0f);
  // Linear scaling 1/4 at pos 4 is the unscaled angle at pos 1; a factor 2
  // halves pair 0's frequency.
  float c1, s1, c2, s2;
  const float ff[4] = {2.0f, 1.0f, 1.0f, 1.0f};
  cpu::rope_cos_sin(4, 0, cpu::rope_spec{8, 10000.0f, cpu::rope_mode::neox, 0.25f}, c1, s1);
  cpu::rope_cos_sin(2, 0, cpu::rope_spec{8, 10000.0f, cpu::rope_mode::neox, 1.0f, ff}, c2, s2);
  CHECK(c1 == doctest::Approx(std::cos(1.0f)));
  CHECK(c2 == doctest::Approx(std::cos(1.0f)));
}

TEST_CASE("cpu: layernorm == ref::layernorm, with and without bias, also in place") {
  // Ref sums in double (exact to ~1e-16 here). Fast: the mean's sum is within
  // gamma_n sum|x|, so each deviation d_i = x_i - mean is off by at most
  // D = gamma_n mean|x| + u |d_i|; the variance's sum of squares is within
  // gamma_n + 2 D / rms(d) relative, the scale (sqrt halves it) within
  // gamma_n/2 + D / rms(d) + 3u. out_i = d_i s w_i + b_i: within
  // |w_i| s (D + |d_i| (scale error + 2u)) + u |out_i|. Doubled for the
  // second-order terms this first-order bound drops.
  const float eps = 1e-5f;
  for (std::size_t n : sizes()) {
    for (bool with_bias : {false, true}) {
      const auto x = random_floats(n, 13 + n, -1.0f, 5.0f), w = random_floats(n, 130 + n), b = random_floats(n, 131 + n);
      const float* bias = with_bias ? b.data() : nullptr;
      std::vector<float> got(n), want(n);
      cpu::layernorm(got.data(), x.data(), w.data(), bias, n, eps);
      ref::layernorm(want.data(), x.data(), w.data(), bias, n, eps);
      double mean = 0, mabs = 0, var = 0, dmax = 0;
      for (float v : x) mean += v, mabs += std::fabs(v);
      mean /= n, mabs /= n;
      for (float v : x) var += (v - mean) * (v - mean), dmax = std::max(dmax, std::fabs(v - mean));
      const double rms = std::sqrt(var / n + eps), s = 1.0 / rms;
      std::vector<double> tol(n);
      for (std::size_t i = 0; i < n; ++i) {
        const double d = std::fabs(x[i] - mean), D = gamma_n(n) * mabs + u * d;
        const double scale_err = gamma_n(n) / 2 + (gamma_n(n) * mabs + u * dmax) / rms + 3 * u;
        tol[i] = 2 * (std::fabs(w[i]) * s * (D + d * (scale_err + 2 * u)) + u * std::fabs(want[i]));
      }
      INFO("n " << n << " bias " << with_bias);
      kestrel::test::check_within(got.data(), want.data(), tol, n);
      auto in_place = x;
      cpu::layernorm(in_place.data(), in_place.data(), w.data(), bias, n, eps);
      CHECK(in_place == got);
    }
  }
}

TEST_CASE("cpu: gelu == ref::gelu, also in place") {
  // Fast: x / (1 + e^a), a = -2 sqrt(2/pi) (x + 0.044715 x^3) computed with
  // 5 roundings (absolute error 5u|a|, which e^a turns into relative error),
  // then the exp's bound, the add and the divide: within
  // exp_rel_error + 5u|a| + 3u of exact, relative. Ref: 0.5 x (1 + tanh(y))
  // with tanh within ~1u absolute, so within 2u |x| absolute plus 4u relative
  // (the cancellation in 1 + tanh for negative x is absolute, not relative).
  for (std::size_t n : sizes()) {
    for (float range : {3.0f, 12.0f}) {
      const auto x = random_floats(n, 17 + n, -range, range);
      std::vector<float> got(n), want(n);
      cpu::gelu(got.data(), x.data(), n);
      ref::gelu(want.data(), x.data(), n);
      std::vector<double> tol(n);
      for (std::size_t i = 0; i < n; ++i) {
        const double v = x[i], a = 2 * 0.7978845608 * std::fabs(v + 0.044715 * v * v * v);
        tol[i] = (cpu::exp_rel_error + 5 * u * a + 7 * u) * std::fabs(want[i]) + 2 * u * std::fabs(v) + 1e-37;
      }
      INFO("n " << n << " range " << range);
      kestrel::test::check_within(got.data(), want.data(), tol, n);
      auto in_place = x;
      cpu::gelu(in_place.data(), in_place.data(), n);
      CHECK(in_place == got);
    }
  }
  // Reference values of the tanh approximation: gelu(1) = 0.841192, gelu(-1) = -0.158808.
  const float x[2] = {1.0f, -1.0f};
  float y[2];
  cpu::gelu(y, x, 2);
  CHECK(y[0] == doctest::Approx(0.841192).epsilon(1e-5));
  CHECK(y[1] == doctest::Approx(-0.158808).epsilon(1e-5));
}

TEST_CASE("cpu: rope angles follow llama2.c") {
  // llama2.c: for even j < head_size, freq = 1 / powf(10000, (j % head_size) / (float)head_size).
  const std::size_t head_size = 64, pos = 37;
  for (std::size_t j = 0; j < head_size; j += 2) {
    const float freq = 1.0f / std::pow(10000.0f, static_cast<float>(j % head_size) / static_cast<float>(head_size));
    const float val = static_cast<float>(pos) * freq;
    float c, s;
    cpu::rope_cos_sin(pos, j / 2, cpu::rope_spec{head_size, 10000.0f}, c, s);
    CHECK(c == std::cos(val));
    CHECK(s == std::sin(val));
  }
}

TEST_CASE("cpu: row_to_f32 is exact for every f16 and bf16 value") {
  // One row holding all 65536 bit patterns; NaNs only need to stay NaN
  // (F16C quiets signalling NaNs).
  const std::size_t n = 65536;
  // Twice the room needed: visit_weight also instantiates the f32 path,
  // whose reads GCC would otherwise flag as out of bounds.
  std::vector<std::uint16_t> bits(2 * n);
  for (std::size_t i = 0; i < n; ++i) bits[i] = static_cast<std::uint16_t>(i);
  for (kestrel::dtype t : {kestrel::dtype::f16, kestrel::dtype::bf16}) {
    kestrel::weight_view w{t, bits.data(), 1, n};
    std::vector<float> got(n), want(n);
    cpu::row_to_f32(w, 0, got.data());
    ref::row_to_f32(w, 0, want.data());
    std::size_t bad = 0;
    for (std::size_t i = 0; i < n; ++i)
      if (!(std::isnan(want[i]) ? std::isnan(got[i]) : std::bit_cast<std::uint32_t>(got[i]) == std::bit_cast<std::uint32_t>(want[i])))
        ++bad;
    INFO(kestrel::name_of(t));
    CHECK(bad == 0);
  }
  // Rows of every tail length, in the middle of a matrix, all dtypes.
  for (kestrel::dtype t : {kestrel::dtype::f32, kestrel::dtype::f16, kestrel::dtype::bf16})
    for (std::size_t cols : sizes()) {
      kestrel::test::random_weight w(t, 3, cols, static_cast<std::uint32_t>(cols));
      std::vector<float> got(cols);
      cpu::row_to_f32(w.view, 1, got.data());
      INFO(kestrel::name_of(t) << " cols " << cols);
      CHECK(std::equal(got.begin(), got.end(), w.values.begin() + static_cast<std::ptrdiff_t>(cols)));
    }
}

namespace {

/// The tolerance of a fast attend-like computation against ref::attend, per
/// element of the output (derivation in "cpu: attend == ref::attend"). k, v:
/// the n_kv attended rows; p_ref: ref::attend's weights (its scratch).
///
/// bf16_split: the fast computation is attend_block_amx's (cpu/attend_amx.hpp),
/// whose products are of operands split into two bf16, x = hi + lo + e with
/// |e| <= 2^-16 |x| (hi rounds x to 8 bits: |x - hi| <= 2^-8 |x|; lo rounds
/// that to 8 bits), summed as hi*hi + hi*lo + lo*hi. Per product x y: the
/// splits' errors 2 * 2^-16 (1 + 2^-16) |x y|, the dropped lo*lo (each lo
/// <= 2^-8 (1 + 2^-8) of its operand) 2^-16 (1 + 2^-8)^2 |x y|: together
/// within split_rel = 3.1 * 2^-16 (cpu::bf16_split_rel) of |x y|.
/// The 3n products of n pairs are exact in f32 (8 x 8 bits) and summed in f32 in some order: gamma_{3n}
/// times their magnitudes, which are within 1.02 |x y|. So a score is within
/// (split_rel + 1.02 gamma_{3d}) scale sum |q k_t| + u |s_t| of exact (the
/// scale multiply after), and a weighted sum within (split_rel + 1.02
/// gamma_{3 n_kv}) of sum_t p_t |v_t| over the fast weights, which are
/// within (1 + rho) of the reference's. The kernel sums exp(s_t - max)
/// and divides the sum by their sum at the end (1 / sum, then a multiply):
/// the weights' normalization, rounded on the output instead, 2u more.
/// (The tiles flush denormal results to 0: absolute errors below 2^-126 per
/// addition, far under softmax_abs_tol.)
std::vector<double> attend_tol(const float* q, const float* k, const float* v, std::size_t n_kv, std::size_t head_dim,
                               std::size_t kv_stride, float scale, const float* p_ref, bool bf16_split = false) {
  const double split_rel = cpu::bf16_split_rel;
  const double fast_dot = bf16_split ? split_rel + 1.02 * gamma_n(3 * head_dim) : gamma_n(head_dim);
  const double fast_sum = bf16_split ? split_rel + 1.02 * gamma_n(3 * n_kv) + 2 * u : gamma_n(n_kv);
  double d = 0;
  for (std::size_t t = 0; t < n_kv; ++t) {
    double qk = 0, s = 0;
    for (std::size_t i = 0; i < head_dim; ++i) {
      qk += std::fabs(double(q[i]) * k[t * kv_stride + i]);
      s += double(q[i]) * k[t * kv_stride + i];
    }
    d = std::max(d, (fast_dot + gamma_n(head_dim)) * scale * qk + 2 * u * std::fabs(scale * s));
  }
  const double rho = std::expm1(2 * d) + softmax_rel_tol(n_kv);
  std::vector<double> tol(head_dim);
  for (std::size_t j = 0; j < head_dim; ++j) {
    double pv = 0;
    for (std::size_t t = 0; t < n_kv; ++t) pv += p_ref[t] * std::fabs(v[t * kv_stride + j]);
    tol[j] = (rho * (1 + rho) + fast_sum * (1 + rho) + gamma_n(n_kv)) * pv + softmax_abs_tol;
  }
  return tol;
}

/// A random block case: nq queries of `group` heads (rows q_stride =
/// group * head_dim + 5 apart), and keys and values of pos0 + nq + 2
/// positions kv_stride apart, of which those the block must not read (before
/// its first key, after its last, the stride gap) are NaN.
struct block_case {
  std::size_t q_stride;
  std::vector<float> q, k, v;
};
block_case random_block_case(std::uint32_t seed, std::size_t nq, std::size_t group, std::size_t head_dim,
                             std::size_t kv_stride, std::size_t pos0, std::size_t window) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const std::size_t q_stride = group * head_dim + 5, n_pos = pos0 + nq, first = cpu::attend_first(pos0, window);
  block_case c{q_stride, random_floats(nq * q_stride, seed, -3.0f, 3.0f),
               random_floats((n_pos + 2) * kv_stride, seed + 1, -3.0f, 3.0f),
               random_floats((n_pos + 2) * kv_stride, seed + 2)};
  for (std::size_t t = 0; t < n_pos + 2; ++t)
    for (std::size_t j = 0; j < kv_stride; ++j)
      if (t < first || t >= n_pos || j >= head_dim) c.k[t * kv_stride + j] = c.v[t * kv_stride + j] = nan;
  return c;
}

/// attend_block arguments: nq queries of `group` heads at positions pos0..,
/// rows q_stride apart in q and out, the scale 1 / sqrt(head_dim).
template <class T>
cpu::basic_attend_block_args<T> block_args(const float* q, std::size_t q_stride, const T* k, const T* v,
                                           std::size_t kv_stride, float* out, std::size_t nq, std::size_t group,
                                           std::size_t head_dim, std::size_t pos0, std::size_t window) {
  cpu::basic_attend_block_args<T> a;
  a.q = q;
  a.q_stride = q_stride;
  a.k = k;
  a.v = v;
  a.kv_stride = kv_stride;
  a.out = out;
  a.out_stride = q_stride;
  a.nq = nq;
  a.group = group;
  a.head_dim = head_dim;
  a.pos0 = pos0;
  a.window = window;
  a.scale = 1.0f / std::sqrt(static_cast<float>(head_dim));
  return a;
}

/// Checks the rows a block call `a` wrote against ref::attend of each
/// query over its own keys (k, v: the cache's values as floats), within
/// attend_tol(bf16_split), and that the floats after each token's heads
/// still hold `sentinel`. Returns ref::attend's rows, in row order.
template <class T>
std::vector<float> check_block_rows(const cpu::basic_attend_block_args<T>& a, const float* k, const float* v,
                                    bool bf16_split, float sentinel) {
  const std::size_t head_dim = a.head_dim;
  std::vector<float> got_rows, want_rows, p(a.pos0 + a.nq), o(head_dim);
  std::vector<double> tol;
  for (std::size_t i = 0; i < a.nq; ++i) {
    const std::size_t pos = a.pos0 + i, f = cpu::attend_first(pos, a.window);
    const float *kf = k + f * a.kv_stride, *vf = v + f * a.kv_stride;
    for (std::size_t g = 0; g < a.group; ++g) {
      const float* qr = a.q + i * a.q_stride + g * head_dim;
      ref::attend(qr, kf, vf, pos + 1 - f, head_dim, a.kv_stride, a.scale, o.data(), p.data());
      const auto t = attend_tol(qr, kf, vf, pos + 1 - f, head_dim, a.kv_stride, a.scale, p.data(), bf16_split);
      tol.insert(tol.end(), t.begin(), t.end());
      const float* gr = a.out + i * a.out_stride + g * head_dim;
      got_rows.insert(got_rows.end(), gr, gr + head_dim);
      want_rows.insert(want_rows.end(), o.begin(), o.end());
    }
  }
  kestrel::test::check_within(got_rows.data(), want_rows.data(), tol, got_rows.size());
  std::size_t outside = 0;  // nothing outside the rows is written
  for (std::size_t i = 0; i < a.nq; ++i)
    for (std::size_t j = a.group * head_dim; j < a.out_stride; ++j) outside += a.out[i * a.out_stride + j] != sentinel;
  CHECK(outside == 0);
  return want_rows;
}

}  // namespace

TEST_CASE("cpu: attend == ref::attend") {
  // Scores: each within gamma_d |scale| sum_i |q_i k_ti| (dot) plus u |s_t|
  // (the scale multiply) of exact; fast vs ref differ by at most
  // D = 2 max_t (gamma_d |scale| sum |q k_t| + u |s_t|). Shifting the scores
  // by at most D changes each p_t by a factor within [e^-2D, e^2D]; softmax's
  // own rounding adds softmax_rel_tol. With rho = (e^2D - 1) + softmax_rel_tol
  // the weights differ by rho p_t, and the weighted sums (n_kv terms, FMA or
  // not) by gamma_{n_kv}: |out_f - out_r| <= (rho (1 + rho) + 2 gamma_{n_kv}) sum_t p_t |v_tj|.
  for (std::size_t head_dim : {1, 3, 16, 64, 67, 128}) {
    for (std::size_t n_kv : {0, 1, 2, 5, 17, 100, 300}) {
      for (std::size_t kv_stride : {head_dim, 3 * head_dim + 1}) {
        const auto seed = static_cast<std::uint32_t>(head_dim * 1000 + n_kv * 10 + kv_stride);
        const auto q = random_floats(head_dim, seed, -3.0f, 3.0f);
        const auto k = random_floats(n_kv * kv_stride + head_dim, seed + 1, -3.0f, 3.0f);
        const auto v = random_floats(n_kv * kv_stride + head_dim, seed + 2);
        const float scale = 1.0f / std::sqrt(static_cast<float>(head_dim));
        std::vector<float> got(head_dim), want(head_dim), s1(n_kv + 1), s2(n_kv + 1);
        cpu::attend(q.data(), k.data(), v.data(), n_kv, head_dim, kv_stride, scale, got.data(), s1.data());
        ref::attend(q.data(), k.data(), v.data(), n_kv, head_dim, kv_stride, scale, want.data(), s2.data());
        const auto tol = attend_tol(q.data(), k.data(), v.data(), n_kv, head_dim, kv_stride, scale, s2.data());
        INFO("head_dim " << head_dim << " n_kv " << n_kv << " kv_stride " << kv_stride);
        kestrel::test::check_within(got.data(), want.data(), tol, head_dim);
      }
    }
  }
}

TEST_CASE("cpu: attention over an f16 cache == over its values as f32, bit for bit") {
  // An f16 cache's elements are converted exactly as they are loaded
  // (every f16 is a float), and every kernel then runs the f32 path's
  // operations in the same order: attend and attend_block (decode's
  // query-head scores for nq = 1 and group <= 8, the tiles otherwise) give
  // the same bits from the f16 rows as from their f32 values. head_dim 67
  // exercises the partial loads.
  // n_past 300: several key tiles and a long value pass; window 100: rows
  // whose ranges start at different keys.
  const float nan = std::numeric_limits<float>::quiet_NaN();
  for (std::size_t head_dim : {8, 64, 67})
    for (std::size_t group : {1, 3, 8})
      for (std::size_t nq : {1, 5, 19})
        for (std::size_t n_past : {0, 37, 300})
          for (std::size_t window : {0, 100}) {
          if (window && n_past < 300) continue;
          const std::size_t kv_stride = head_dim + 4, n_pos = n_past + nq;
          const auto seed = static_cast<std::uint32_t>((head_dim * 11 + group) * 13 + nq * 7 + n_past);
          const auto q = random_floats(nq * group * head_dim, seed, -3.0f, 3.0f);
          const auto kf = random_floats(n_pos * kv_stride, seed + 1, -3.0f, 3.0f);
          const auto vf = random_floats(n_pos * kv_stride, seed + 2);
          std::vector<kestrel::f16> k16(kf.size()), v16(vf.size());
          std::vector<float> k(kf.size()), v(vf.size());  // the f16 values as floats
          for (std::size_t i = 0; i < kf.size(); ++i) {
            k16[i] = kestrel::to_f16(kf[i]);
            v16[i] = kestrel::to_f16(vf[i]);
            k[i] = kestrel::to_f32(k16[i]);
            v[i] = kestrel::to_f32(v16[i]);
          }
          INFO("head_dim " << head_dim << " group " << group << " nq " << nq << " n_past " << n_past << " window "
                           << window);
          const float scale = 1.0f / std::sqrt(static_cast<float>(head_dim));
          // attend and its twin, one head over all n_pos positions.
          std::vector<float> a16(head_dim), a32(head_dim), p16(n_pos), p32(n_pos);
          cpu::attend(q.data(), k16.data(), v16.data(), n_pos, head_dim, kv_stride, scale, a16.data(), p16.data());
          cpu::attend(q.data(), k.data(), v.data(), n_pos, head_dim, kv_stride, scale, a32.data(), p32.data());
          CHECK(std::memcmp(a16.data(), a32.data(), head_dim * sizeof(float)) == 0);
          // The scalar twin: each instantiation is within attend_tol of the
          // exact result (the compiler may contract its scalar loops into
          // FMAs in one and not the other), so the two are within twice it.
          ref::attend(q.data(), k16.data(), v16.data(), n_pos, head_dim, kv_stride, scale, a16.data(), p16.data());
          ref::attend(q.data(), k.data(), v.data(), n_pos, head_dim, kv_stride, scale, a32.data(), p32.data());
          auto tol = attend_tol(q.data(), k.data(), v.data(), n_pos, head_dim, kv_stride, scale, p32.data());
          for (double& t : tol) t *= 2;
          kestrel::test::check_within(a16.data(), a32.data(), tol, head_dim);
          // attend_block: nq queries at positions n_past.. of `group` heads.
          std::vector<float> o16(nq * group * head_dim, nan), o32(o16.size(), nan);
          const auto b16 = block_args(q.data(), group * head_dim, k16.data(), v16.data(), kv_stride, o16.data(), nq,
                                      group, head_dim, n_past, window);
          const auto b32 = block_args(q.data(), group * head_dim, k.data(), v.data(), kv_stride, o32.data(), nq,
                                      group, head_dim, n_past, window);
          std::vector<float> s16(cpu::attend_block_scratch_size(b16), nan), s32(cpu::attend_block_scratch_size(b32), nan);
          cpu::attend_block(b16, s16.data());
          cpu::attend_block(b32, s32.data());
          CHECK(std::memcmp(o16.data(), o32.data(), o16.size() * sizeof(float)) == 0);
        }
}

TEST_CASE("cpu: attend_block == ref::attend per (query, head)") {
  // A row of attend_block is attend()'s computation for that query: one dot
  // product per key (an FMA chain over d against the transposed key tile
  // instead of dot()'s two accumulators: another order of the same terms,
  // within the same gamma_d), the same scale multiply, the same softmax over
  // the row's own n_kv keys, and a weighted sum in which masked keys add
  // exact zeros (so still within gamma_{n_kv}). The bound derived for attend
  // therefore holds per row, with that row's q, keys and n_kv (attend_tol).
  //
  // Shapes: head_dim below, at and between register widths; blocks of 1
  // query to more than two key tiles; GQA groups; a first block (pos0 0) and
  // one after cached tokens; no window, a window shorter than the block and
  // one longer; kv_stride == head_dim and larger. Cache rows the block must
  // not read (before its first key, after its last, the stride gap) hold
  // NaN, as does the scratch, so reading them would show.
  const float nan = std::numeric_limits<float>::quiet_NaN(), sentinel = 12345.0f;
  std::size_t cases = 0;
  for (std::size_t head_dim : {8, 16, 20, 40, 64, 80, 128}) {  // 20: a partial 8 x 8 block
    for (std::size_t group : {1, 2, 4, 5, 8}) {
      for (std::size_t nq : {1, 3, 17, 70}) {
        for (std::size_t pos0 : {0, 45}) {
          for (std::size_t window : {0, 7, 40}) {
            for (std::size_t kv_stride : {head_dim, 2 * head_dim + 3}) {
              const auto seed = static_cast<std::uint32_t>(((head_dim * 5 + group) * 71 + nq) * 97 + pos0 * 3 + window + kv_stride);
              const auto [q_stride, q, k, v] = random_block_case(seed, nq, group, head_dim, kv_stride, pos0, window);
              std::vector<float> got(nq * q_stride, sentinel);
              const auto a = block_args(q.data(), q_stride, k.data(), v.data(), kv_stride, got.data(), nq, group,
                                        head_dim, pos0, window);
              std::vector<float> scratch(cpu::attend_block_scratch_size(a), nan);
              cpu::attend_block(a, scratch.data());
              auto ref_args = a;
              std::vector<float> want(nq * q_stride, sentinel);
              ref_args.out = want.data();
              ref::attend_block(ref_args);

              INFO("head_dim " << head_dim << " group " << group << " nq " << nq << " pos0 " << pos0 << " window "
                               << window << " kv_stride " << kv_stride);
              const auto want_rows = check_block_rows(a, k.data(), v.data(), false, sentinel);
              // ref::attend_block's rows are ref::attend's.
              std::vector<float> ref_rows;
              for (std::size_t i = 0; i < nq; ++i)
                ref_rows.insert(ref_rows.end(), want.begin() + static_cast<std::ptrdiff_t>(i * q_stride),
                                want.begin() + static_cast<std::ptrdiff_t>(i * q_stride + group * head_dim));
              CHECK(ref_rows == want_rows);

              // A row does not depend on the block around it: the last query
              // alone (one key range, no masked keys, other tiles) gives the
              // same bits, so masked keys contributed exactly 0. Alone, a
              // query of up to 8 heads takes decode's score_query_heads
              // (with AVX-512VL), so this also holds it to the tiles' bits.
              auto one = a;
              one.q = q.data() + (nq - 1) * q_stride;
              one.pos0 = pos0 + nq - 1;
              one.nq = 1;
              std::vector<float> alone(q_stride, sentinel), scratch1(cpu::attend_block_scratch_size(one), nan);
              one.out = alone.data();
              cpu::attend_block(one, scratch1.data());
              CHECK(std::equal(alone.begin(), alone.begin() + static_cast<std::ptrdiff_t>(group * head_dim),
                               got.begin() + static_cast<std::ptrdiff_t>((nq - 1) * q_stride)));
              ++cases;
            }
          }
        }
      }
    }
  }
  MESSAGE("attend_block: " << cases << " shapes");
}

TEST_CASE("cpu: attend_block_amx == ref::attend per (query, head)") {
  // Each row within attend_tol(bf16_split) of ref::attend of its query (the
  // derivation is there), over an f32 cache and an f16 one (whose values
  // the splits hold exactly, so the same bound holds with room). Shapes:
  // heads of 1, 2 and 4 chunks of 32; one row to several row tiles of 16
  // (rows = nq x group not a multiple of 16: padded rows); blocks after
  // cached tokens; windows shorter and longer than the block; strides
  // larger than the head. Cache rows the block must not read, and the
  // scratch, hold NaN; nothing outside the rows may be written.
  if (!cpu::attend_amx_available(64)) {
    MESSAGE("skipped: attend_block_amx needs a build for AMX-BF16 (-march=native on such a CPU), the CPU's tiles, "
            "and KESTREL_AMX unset or not 0");
    return;
  }
  const float nan = std::numeric_limits<float>::quiet_NaN(), sentinel = 12345.0f;
  std::size_t cases = 0;
  for (bool f16_cache : {false, true})
    for (std::size_t head_dim : {32, 64, 128})
      for (std::size_t group : {1, 3, 8})
        for (std::size_t nq : {1, 5, 40})
          for (std::size_t pos0 : {0, 70})
            for (std::size_t window : {0, 9, 50}) {
              const std::size_t kv_stride = f16_cache ? head_dim + 8 : head_dim;
              const auto seed = static_cast<std::uint32_t>(((head_dim * 5 + group) * 71 + nq) * 97 + pos0 * 3 + window + f16_cache);
              auto [q_stride, q, k, v] = random_block_case(seed, nq, group, head_dim, kv_stride, pos0, window);
              std::vector<kestrel::f16> k16(k.size()), v16(v.size());
              if (f16_cache)  // the reference reads the f16 values (NaN where unread) as floats
                for (std::size_t i = 0; i < k.size(); ++i) {
                  k16[i] = kestrel::to_f16(k[i]);
                  v16[i] = kestrel::to_f16(v[i]);
                  k[i] = kestrel::to_f32(k16[i]);
                  v[i] = kestrel::to_f32(v16[i]);
                }
              std::vector<float> got(nq * q_stride, sentinel);
              auto run = [&](const auto* kp, const auto* vp) {
                const auto a = block_args(q.data(), q_stride, kp, vp, kv_stride, got.data(), nq, group, head_dim, pos0, window);
                std::vector<float> scratch(cpu::attend_block_amx_scratch_size(a), nan);
                cpu::attend_block_amx(a, scratch.data());
                INFO("f16 cache " << f16_cache << " head_dim " << head_dim << " group " << group << " nq " << nq
                                  << " pos0 " << pos0 << " window " << window);
                check_block_rows(a, k.data(), v.data(), true, sentinel);
              };
              if (f16_cache)
                run(k16.data(), v16.data());
              else
                run(k.data(), v.data());
              ++cases;
            }
  MESSAGE("attend_block_amx: " << cases << " shapes");
}

namespace {

/// `rows` x `cols` random weights of block type B (whole blocks per row),
/// quantized from values in [-1, 1]; view points into `blocks`.
template <class B>
kestrel::weight_view quantized_weight(std::vector<B>& blocks, kestrel::dtype t, std::size_t rows, std::size_t cols,
                                      std::uint32_t seed) {
  const auto x = random_floats(rows * cols, seed);
  blocks.resize(rows * cols / kestrel::block_size(t));
  kestrel::quant::quantize_row(x.data(), blocks.data(), rows * cols);
  kestrel::weight_view v;
  v.type = t;
  v.rows = rows;
  v.cols = cols;
  v.data = blocks.data();
  return v;
}

}  // namespace

TEST_CASE("cpu: matvec_fused quantizes x once only for matrices that take the same activation blocks") {
  // q4_0 and q8_0 take q8_0 blocks, q4_1 q8_1 blocks, q4_K q8_K blocks, f16
  // none: a region over a mix quantizes x per chunk for each (shared_acts
  // gives null), one over q4_0 and q8_0 once. Either way each product is
  // matvec's, bit for bit.
  namespace q = kestrel::quant;
  using kestrel::dtype;
  CHECK(cpu::detail::same_activations(dtype::q4_0, dtype::q8_0));
  CHECK(cpu::detail::same_activations(dtype::q4_0, dtype::q4_0_x16));
  CHECK(cpu::detail::same_activations(dtype::q4_k, dtype::q6_k_x16));
  CHECK_FALSE(cpu::detail::same_activations(dtype::q4_0, dtype::q4_1));
  CHECK_FALSE(cpu::detail::same_activations(dtype::q8_0, dtype::q4_k));
  const std::size_t cols = 256;
  std::vector<q::block_q4_0> b40;
  std::vector<q::block_q8_0> b80;
  std::vector<q::block_q4_1> b41;
  std::vector<q::block_q4_K> b4k;
  kestrel::test::random_weight f16w(dtype::f16, 20, cols, 5);
  const kestrel::weight_view w40 = quantized_weight(b40, dtype::q4_0, 36, cols, 1);
  const kestrel::weight_view w80 = quantized_weight(b80, dtype::q8_0, 20, cols, 2);
  const kestrel::weight_view w41 = quantized_weight(b41, dtype::q4_1, 24, cols, 3);
  const kestrel::weight_view w4k = quantized_weight(b4k, dtype::q4_k, 28, cols, 4);
  const auto x = random_floats(cols, 9, -2.0f, 2.0f);
  const std::vector<std::vector<const kestrel::weight_view*>> regions = {
      {&w40, &w80}, {&w40, &w41}, {&w40, &w4k, &w80}, {&w80, &f16w.view}, {&w4k, &w4k}};
  cpu::thread_pool pool(2);
  for (const auto& region : regions) {
    const bool shared = region.size() == 2 && region[0]->type != dtype::f16 && region[1]->type != dtype::f16 &&
                        cpu::detail::same_activations(region[0]->type, region[1]->type);
    std::vector<std::vector<float>> want(region.size()), got(region.size());
    std::vector<cpu::matvec_job> jobs;
    for (std::size_t j = 0; j < region.size(); ++j) {
      want[j].resize(region[j]->rows);
      got[j].assign(region[j]->rows, -1.0f);
      cpu::matvec(*region[j], x.data(), want[j].data(), nullptr);
      jobs.push_back({region[j], got[j].data()});
    }
    INFO(kestrel::name_of(region[0]->type) << " + " << kestrel::name_of(region[1]->type) << " (" << region.size()
                                           << " matrices)");
    if (region.size() == 2) CHECK((cpu::detail::shared_acts(jobs, x.data()) != nullptr) == shared);
    cpu::matvec_fused(jobs, x.data(), &pool);
    for (std::size_t j = 0; j < region.size(); ++j) CHECK(got[j] == want[j]);
  }
}

TEST_CASE("cpu: matvec_fused's threads split bytes (a q6_K v beside q4_K q and k), every row once") {
  // Q4_K_M's attn_v is q6_K in a third of the layers: split by row blocks,
  // the thread with the last blocks read 30% more (210 bytes a 256-value
  // block against 144). block_at_bytes maps equal fractions of the bytes to
  // blocks: 0 and every block at the ends, monotone, and the middle within
  // one block of the bytes' middle; the products stay matvec's bit for bit.
  namespace q = kestrel::quant;
  using kestrel::dtype;
  const std::size_t cols = 512;
  std::vector<q::block_q4_K> bq, bk;
  std::vector<q::block_q6_K> bv;
  const kestrel::weight_view wq = quantized_weight(bq, dtype::q4_k, 512, cols, 31);
  const kestrel::weight_view wk = quantized_weight(bk, dtype::q4_k, 128, cols, 32);
  const kestrel::weight_view wv = quantized_weight(bv, dtype::q6_k, 384, cols, 33);
  std::vector<float> yq(wq.rows), yk(wk.rows), yv(wv.rows);
  const cpu::matvec_job jobs[3] = {{&wq, yq.data()}, {&wk, yk.data()}, {&wv, yv.data()}};
  std::size_t blocks = 0, bytes = 0;
  for (const cpu::matvec_job& j : jobs) {
    blocks += cpu::detail::matvec_blocks(*j.w);
    bytes += cpu::detail::matvec_blocks(*j.w) * cpu::detail::block_bytes(*j.w);
  }
  CHECK(cpu::detail::block_at_bytes(jobs, 0, blocks) == 0);
  CHECK(cpu::detail::block_at_bytes(jobs, blocks, blocks) == blocks);
  std::size_t last = 0;
  for (std::size_t u = 0; u <= blocks; ++u) {
    const std::size_t b = cpu::detail::block_at_bytes(jobs, u, blocks);
    CHECK(b >= last);
    last = b;
  }
  // The byte offset where block b starts.
  auto start = [&](std::size_t b) {
    std::size_t at = 0;
    for (const cpu::matvec_job& j : jobs) {
      const std::size_t k = std::min(b, cpu::detail::matvec_blocks(*j.w));
      at += k * cpu::detail::block_bytes(*j.w);
      b -= k;
    }
    return at;
  };
  const std::size_t mid = cpu::detail::block_at_bytes(jobs, blocks / 2, blocks);
  const std::size_t v_block = cpu::detail::block_bytes(wv);
  CHECK(start(mid) >= bytes * (blocks / 2) / blocks);
  CHECK(start(mid) < bytes * (blocks / 2) / blocks + v_block);
  CHECK(mid > blocks / 2);  // the denser v at the end: by blocks the second half would read more

  const auto x = random_floats(cols, 34, -2.0f, 2.0f);
  std::vector<float> want[3] = {std::vector<float>(wq.rows), std::vector<float>(wk.rows), std::vector<float>(wv.rows)};
  for (int j = 0; j < 3; ++j) cpu::matvec(*jobs[j].w, x.data(), want[j].data(), nullptr);
  cpu::thread_pool pool2(2), pool3(3);
  for (cpu::thread_pool* pool : {&pool2, &pool3}) {
    for (auto* y : {&yq, &yk, &yv}) std::fill(y->begin(), y->end(), -1.0f);
    cpu::matvec_fused(jobs, x.data(), pool);
    INFO("threads " << pool->size());
    CHECK(yq == want[0]);
    CHECK(yk == want[1]);
    CHECK(yv == want[2]);
  }

  // Matrices of no columns hold no bytes: the map still sends every block
  // to the last chunk, so each y is written (zeros, as matvec's).
  kestrel::weight_view eq = wq, ev = wv;
  eq.cols = ev.cols = 0;
  const cpu::matvec_job empty[2] = {{&eq, yq.data()}, {&ev, yv.data()}};
  const std::size_t empty_blocks = cpu::detail::matvec_blocks(eq) + cpu::detail::matvec_blocks(ev);
  CHECK(cpu::detail::block_at_bytes(empty, 0, empty_blocks) == 0);
  CHECK(cpu::detail::block_at_bytes(empty, 1, empty_blocks) == 0);
  CHECK(cpu::detail::block_at_bytes(empty, empty_blocks, empty_blocks) == empty_blocks);
  std::fill(yq.begin(), yq.end(), -1.0f);
  std::fill(yv.begin(), yv.end(), -1.0f);
  cpu::matvec_fused(empty, x.data(), &pool2);
  CHECK(std::count(yq.begin(), yq.end(), 0.0f) == static_cast<long>(yq.size()));
  CHECK(std::count(yv.begin(), yv.end(), 0.0f) == static_cast<long>(yv.size()));
}

TEST_CASE("cpu: float decode products in fixed chunks (float_decode_for) give one thread's bits") {
  // Threads split rows, never a row's sum, so any chunking gives the bits of
  // one thread: chunks from below one row block to the whole matrix, and
  // the host's default (float_decode_chunk_bytes; 512 KiB on AMD with
  // AVX-512) through matvec, matvec_fused and matvec_swiglu on matrices
  // larger than a chunk.
  cpu::thread_pool pool2(2), pool3(3);
  for (kestrel::dtype t : {kestrel::dtype::f32, kestrel::dtype::f16, kestrel::dtype::bf16}) {
    const std::size_t rows = 1003, cols = 300;
    kestrel::test::random_weight w(t, rows, cols, 11);
    const auto x = random_floats(cols, 12, -2.0f, 2.0f);
    std::vector<float> want(rows);
    cpu::matvec(w.view, x.data(), want.data(), nullptr);
    const std::size_t blocks = (rows + 3) / 4;
    for (std::size_t chunk_bytes : {std::size_t{0}, std::size_t{1}, std::size_t{4096}, std::size_t{1} << 19,
                                    std::size_t{1} << 30})
      for (cpu::thread_pool* pool : {&pool2, &pool3}) {
        std::vector<float> got(rows, -1.0f);
        cpu::visit_weight(w.view, [&](const auto* data) {
          cpu::detail::float_decode_for(
              pool, blocks, 4 * cols * sizeof(*data), rows * cols,
              [&](std::size_t b0, std::size_t b1) {
                cpu::detail::matvec_rows(data, cols, x.data(), got.data(), 4 * b0, std::min(rows, 4 * b1),
                                         cpu::host_row_streams());
              },
              chunk_bytes);
        });
        INFO(kestrel::name_of(t) << " chunk_bytes " << chunk_bytes << " threads " << pool->size());
        CHECK(got == want);
      }

    // The defaults, on matrices of 1.2-4.8 MiB (several 512 KiB chunks).
    const std::size_t big_rows = 2048, big_cols = 600;
    kestrel::test::random_weight a(t, big_rows, big_cols, 21), b(t, big_rows, big_cols, 22);
    const auto xb = random_floats(big_cols, 23, -2.0f, 2.0f);
    std::vector<float> wa(big_rows), wb(big_rows), ga(big_rows, -1.0f), gb(big_rows, -1.0f), h(big_rows, -1.0f),
        scratch(big_rows), want_h(big_rows);
    cpu::matvec(a.view, xb.data(), wa.data(), nullptr);
    cpu::matvec(b.view, xb.data(), wb.data(), nullptr);
    cpu::matvec(a.view, xb.data(), ga.data(), &pool3);
    INFO(kestrel::name_of(t));
    CHECK(ga == wa);
    ga.assign(big_rows, -1.0f);
    const cpu::matvec_job jobs[2] = {{&a.view, ga.data()}, {&b.view, gb.data()}};
    cpu::matvec_fused(jobs, xb.data(), &pool2);
    CHECK(ga == wa);
    CHECK(gb == wb);
    cpu::swiglu(want_h.data(), wa.data(), wb.data(), big_rows);
    cpu::matvec_swiglu(a.view, b.view, xb.data(), h.data(), scratch.data(), &pool2);
    CHECK(h == want_h);
  }
}

TEST_CASE("cpu: matvec_fused and matvec_swiglu == matvec per matrix (exact), every pool size") {
  // Fusing only changes which thread computes a row, never a row's sum:
  // a row's operations do not depend on the rows read beside it, so the
  // results must equal matvec's bit for bit (and matvec is checked against ref::matvec in test_linear.cpp).
  // Weight sizes: multiples of 4, ragged, and a GQA-like small k / v.
  cpu::thread_pool pool2(2), pool3(3);
  for (kestrel::dtype t : {kestrel::dtype::f32, kestrel::dtype::f16, kestrel::dtype::bf16, kestrel::dtype::q8_0,
                           kestrel::dtype::q4_0}) {
    for (std::size_t cols : {64, 96, 256}) {
      const std::size_t rows[3] = {cols, 18, 37};
      std::vector<kestrel::quant::block_q8_0> q8[3];
      std::vector<kestrel::quant::block_q4_0> q4[3];
      kestrel::weight_view w[3];
      std::vector<std::unique_ptr<kestrel::test::random_weight>> own;
      for (int j = 0; j < 3; ++j) {
        const auto seed = static_cast<std::uint32_t>(cols * 7 + j);
        if (t == kestrel::dtype::q8_0)
          w[j] = quantized_weight(q8[j], t, rows[j], cols, seed);
        else if (t == kestrel::dtype::q4_0)
          w[j] = quantized_weight(q4[j], t, rows[j], cols, seed);
        else {
          own.push_back(std::make_unique<kestrel::test::random_weight>(t, rows[j], cols, seed));
          w[j] = own.back()->view;
        }
      }
      const auto x = random_floats(cols, static_cast<std::uint32_t>(cols), -2.0f, 2.0f);
      for (cpu::thread_pool* pool : {static_cast<cpu::thread_pool*>(nullptr), &pool2, &pool3}) {
        std::vector<float> want[3], got[3];
        for (int j = 0; j < 3; ++j) {
          want[j].resize(rows[j]);
          got[j].assign(rows[j], -1.0f);
          cpu::matvec(w[j], x.data(), want[j].data(), pool);
        }
        const cpu::matvec_job jobs[3] = {{&w[0], got[0].data()}, {&w[1], got[1].data()}, {&w[2], got[2].data()}};
        cpu::matvec_fused(jobs, x.data(), pool);
        INFO(kestrel::name_of(t) << " cols " << cols << " threads " << (pool ? pool->size() : 1));
        for (int j = 0; j < 3; ++j) CHECK(got[j] == want[j]);

        // swiglu over two same-shape matrices (w[0] as gate, a second one as up).
        const kestrel::weight_view& gate = w[0];
        kestrel::weight_view up = w[0];
        up.rows = rows[0] - 1;  // a different matrix of the same shape: w[0] without its first row
        up.data = w[0].row(1);
        kestrel::weight_view g = gate;
        g.rows = up.rows;
        std::vector<float> hg(g.rows), hu(g.rows), h(g.rows, -1.0f), scratch(g.rows);
        cpu::matvec(g, x.data(), hg.data(), pool);
        cpu::matvec(up, x.data(), hu.data(), pool);
        cpu::swiglu(hg.data(), hg.data(), hu.data(), g.rows);
        cpu::matvec_swiglu(g, up, x.data(), h.data(), scratch.data(), pool);
        CHECK(h == hg);
      }
    }
  }
}
