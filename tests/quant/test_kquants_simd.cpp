// tests/quant/test_kquants_simd.cpp: the SIMD k-quant dots (quant::vec_dot,
// every instruction-set kernel the build can run) against their scalar twin
// quant::ref::vec_dot and against the exact value, on random blocks with
// random and extreme codes and scales, rows of 256 .. 4096 values; and the
// several-token form vec_dot_tokens against vec_dot, bit for bit.
//
// Tolerance, derived (u = 2^-24, gamma_k = k u / (1 - k u)): both dots
// compute the same integers exactly (isum_g = sum over a sub-block of
// q_i a_i, bsum_g) and round only in float afterwards. The exact value is
//   X = sum_b d8_b sum_g (d_b sc_g isum_g - dmin_b m_g bsum_g),
// and d_b sc_g, dmin_b m_g are exact in float (an 11-bit f16 significand
// times an integer below 2^8), as the twin computes them. Let T = sum_b
// |d8_b| sum_i (|d_b sc_g q_i| + |dmin_b m_g|) |a_i| (>= the sum of the
// magnitudes of every term above). Every rounding is relative to a partial
// sum of terms, so with k roundings on any term's path the error is at most
// gamma_k T (Higham 3.1):
// - twin: scale * isum (1), min * bsum (1), their difference (1), the
//   running sum over 16 sub-blocks (16), d8 * s (1), the running sum over
//   nb blocks (nb): k = nb + 20;
// - SIMD: int32 lane to float (1), d * d8 (1), the lane's FMA chain, one
//   per block (nb; the min terms have their own chain; 2 nb without FMA,
//   where multiply and add round apart), adding the two chains (1), the
//   final 8-lane sum (3): k = 2 nb + 6 covers both.
// So |simd - X| <= gamma_{2nb+6} T, |ref - X| <= gamma_{nb+20} T and
// |simd - ref| <= (gamma_{2nb+6} + gamma_{nb+20}) T. X is computed in
// double from the exact integers; its own error (a few 2^-53 T) is far
// below these bounds.
//
// The prefill panels (quant/kquant_panels.hpp) round float(T), d * d8, one
// FMA per block and the final sum: |panel - X| <= gamma_(nb+3) T, and
// |panel - ref| <= (gamma_(nb+3) + gamma_(nb+20)) T.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <type_traits>
#include <vector>

#include "cpu/helpers.hpp"
#include "kestrel/quant/kquant_amx.hpp"
#include "kestrel/quant/kquant_panels.hpp"
#include "kestrel/quant/kquant_x16.hpp"
#include "kestrel/quant/kquants.hpp"

namespace q = kestrel::quant;
using kestrel::f16;
using kestrel::test::gamma_n;

namespace {

/// A random finite f16 in +-[2^-24, 2]: subnormals, normals, zero rarely.
f16 random_f16(std::mt19937& rng) {
  const int e = std::uniform_int_distribution<int>(-26, 1)(rng);
  if (e == -26) return kestrel::to_f16(0.0f);
  const float m = std::uniform_real_distribution<float>(1.0f, 2.0f)(rng);
  return kestrel::to_f16((rng() & 1 ? -1.0f : 1.0f) * std::ldexp(m, e));
}

/// nb weight blocks: every byte random, or (one block in three) all bytes
/// one value from a list of extremes: 0x00 and 0xff give the smallest and
/// largest codes, scales and mins of every type, 0x80 q6_K's scale -128;
/// then the f16 super-scales set to random finite values.
template <class B>
std::vector<B> random_blocks(std::size_t nb, std::mt19937& rng) {
  static constexpr std::uint8_t extremes[] = {0x00, 0xff, 0x80, 0x7f, 0x55, 0xaa};
  std::vector<B> v(nb);
  for (auto& b : v) {
    auto* p = reinterpret_cast<std::uint8_t*>(&b);
    const unsigned pick = rng() % 18;
    for (std::size_t i = 0; i < sizeof(B); ++i) p[i] = pick < 6 ? extremes[pick] : static_cast<std::uint8_t>(rng());
    b.d = random_f16(rng);
    if constexpr (requires { b.dmin; }) b.dmin = random_f16(rng);
  }
  return v;
}

/// nb q8_K blocks: codes random in [-128, 127] or all one extreme (127,
/// -128, -127), d in +-[2^-10, 4], bsums filled to match.
std::vector<q::block_q8_K> random_activations(std::size_t nb, std::mt19937& rng) {
  std::vector<q::block_q8_K> v(nb);
  for (auto& b : v) {
    const unsigned pick = rng() % 6;
    for (auto& x : b.qs)
      x = static_cast<std::int8_t>(pick == 0 ? 127 : pick == 1 ? -128 : pick == 2 ? -127 : static_cast<int>(rng() % 256) - 128);
    for (int g = 0; g < 16; ++g) {
      int s = 0;
      for (int i = 16 * g; i < 16 * g + 16; ++i) s += b.qs[i];
      b.bsums[g] = static_cast<std::int16_t>(s);
    }
    const float m = std::uniform_real_distribution<float>(1.0f, 2.0f)(rng);
    b.d = (rng() & 1 ? -1.0f : 1.0f) * std::ldexp(m, std::uniform_int_distribution<int>(-10, 1)(rng));
  }
  return v;
}

struct exact_dot {
  double value = 0;      // X
  double magnitude = 0;  // T
};

template <class B>
exact_dot exact(const B* w, const q::block_q8_K* a, std::size_t nb) {
  exact_dot r;
  q::unpacked up;
  for (std::size_t b = 0; b < nb; ++b) {
    q::unpack(w[b], up);
    for (int g = 0; g < 16; ++g) {
      std::int64_t isum = 0;
      double mag = 0;
      for (int i = 16 * g; i < 16 * g + 16; ++i) {
        isum += std::int64_t(up.q[i]) * a[b].qs[i];
        mag += (std::fabs(double(up.scale[g]) * up.q[i]) + std::fabs(double(up.min[g]))) * std::abs(int(a[b].qs[i]));
      }
      r.value += double(a[b].d) * (double(up.scale[g]) * double(isum) - double(up.min[g]) * a[b].bsums[g]);
      r.magnitude += std::fabs(double(a[b].d)) * mag;
    }
  }
  return r;
}

template <class B>
void check_type(const char* name, std::uint32_t seed) {
  std::mt19937 rng(seed);
  std::size_t n_checked = 0;
  for (std::size_t n : {256, 512, 768, 1280, 2048, 4096}) {
    for (int rep = 0; rep < 20; ++rep) {
      const std::size_t nb = n / q::qk_k;
      const auto w = random_blocks<B>(nb, rng);
      const auto a = random_activations(nb, rng);
      const exact_dot x = exact(w.data(), a.data(), nb);
      const double k_ref = double(nb) + 20, k_simd = 2.0 * double(nb) + 6;
      const float want = q::ref::vec_dot(w.data(), a.data(), n);
      INFO(name << " n " << n << " rep " << rep << ": exact " << x.value << ", T " << x.magnitude << ", ref " << want);
      REQUIRE(std::fabs(want - x.value) <= gamma_n(k_ref) * x.magnitude);
      auto check = [&](const char* isa, float got) {
        INFO(isa << ": " << got);
        REQUIRE(std::fabs(got - x.value) <= gamma_n(k_simd) * x.magnitude);
        REQUIRE(std::fabs(double(got) - want) <= (gamma_n(k_simd) + gamma_n(k_ref)) * x.magnitude);
      };
      check("vec_dot", q::vec_dot(w.data(), a.data(), n));
#if defined(__AVX2__)
      check("avx2", q::detail::kq::dot<q::detail::kq::avx2>(w.data(), a.data(), nb));
#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
      check("avx512_vnni", q::detail::kq::dot<q::detail::kq::avx512_vnni>(w.data(), a.data(), nb));
#endif
#endif
      ++n_checked;
    }
  }
  CHECK(n_checked == 120);
}

}  // namespace

TEST_CASE("kquants simd: every kernel == scalar twin, random and extreme blocks") {
#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
  MESSAGE("kernels: avx2, avx512_vnni");
#elif defined(__AVX2__)
  MESSAGE("kernels: avx2");
#else
  MESSAGE("kernels: none compiled in, vec_dot is the scalar twin");
#endif
  check_type<q::block_q2_K>("q2_K", 101);
  check_type<q::block_q3_K>("q3_K", 102);
  check_type<q::block_q4_K>("q4_K", 103);
  check_type<q::block_q5_K>("q5_K", 104);
  check_type<q::block_q6_K>("q6_K", 105);
}

namespace {

/// The integer bounds' extremes: every code byte `fill`, every scale (and
/// min) byte `scale_fill`, d = 1 and dmin = 0.5; activations all `act`.
struct extreme_case {
  std::uint8_t fill, scale_fill;
  std::int8_t act;
};
template <class B>
std::vector<B> extreme_blocks(std::size_t nb, const extreme_case& e) {
  std::vector<B> w(nb);
  for (auto& b : w) {
    std::memset(&b, e.fill, sizeof b);
    std::memset(b.scales, e.scale_fill, sizeof b.scales);
    b.d = kestrel::to_f16(1.0f);
    if constexpr (requires { b.dmin; }) b.dmin = kestrel::to_f16(0.5f);
  }
  return w;
}
std::vector<q::block_q8_K> extreme_acts(std::size_t nb, std::int8_t act) {
  std::vector<q::block_q8_K> a(nb);
  for (auto& b : a) {
    std::memset(b.qs, static_cast<std::uint8_t>(act), sizeof b.qs);
    for (auto& s : b.bsums) s = static_cast<std::int16_t>(16 * act);
    b.d = 1.0f;
  }
  return a;
}
/// check.template operator()<B>(name, e) for every type and extreme case.
template <class F>
void for_each_extreme(F&& check) {
  for (std::uint8_t fill : {0x00, 0xff})
    for (std::uint8_t scale_fill : {0x00, 0xff, 0x80, 0x7f})
      for (std::int8_t act : {-128, 127}) {
        const extreme_case e{fill, scale_fill, act};
        INFO("fill " << int(fill) << " scales " << int(scale_fill) << " act " << int(act));
        check.template operator()<q::block_q2_K>("q2_K", e);
        check.template operator()<q::block_q3_K>("q3_K", e);
        check.template operator()<q::block_q4_K>("q4_K", e);
        check.template operator()<q::block_q5_K>("q5_K", e);
        check.template operator()<q::block_q6_K>("q6_K", e);
      }
}

}  // namespace

TEST_CASE("kquants simd: the largest integer sums (no int16 saturation, no int32 overflow)") {
  // Every code at its smallest or largest, every scale (and min) byte at an
  // extreme, activations all -128 or 127: the bounds in kquants.hpp's header
  // at or near equality (q6_K: codes 63 or 0 with scale -128).
  for_each_extreme([&]<class B>(const char* name, const extreme_case& e) {
    const auto w = extreme_blocks<B>(16, e);
    const auto a = extreme_acts(16, e.act);
    const std::size_t n = 16 * q::qk_k;
    const exact_dot x = exact(w.data(), a.data(), 16);
    const float got = q::vec_dot(w.data(), a.data(), n), want = q::ref::vec_dot(w.data(), a.data(), n);
    INFO(name << ": exact " << x.value << " simd " << got << " ref " << want);
    CHECK(std::fabs(got - x.value) <= gamma_n(2 * 16 + 6) * x.magnitude);
    CHECK(std::fabs(want - x.value) <= gamma_n(16 + 20) * x.magnitude);
  });
}

TEST_CASE("kquants simd: vec_dot_tokens == vec_dot per token, bit for bit") {
  std::mt19937 rng(9);
  auto run = [&]<class B>(const char* name) {
    for (std::size_t n : {256, 1024, 2560})
      for (std::size_t n_tokens = 0; n_tokens <= 9; ++n_tokens) {
        const std::size_t nb = n / q::qk_k, stride = 3;
        const auto w = random_blocks<B>(nb, rng);
        const auto a = random_activations(n_tokens * nb, rng);
        std::vector<float> out(n_tokens * stride + 1, -7.0f);
        q::vec_dot_tokens(w.data(), a.data(), n, n_tokens, out.data(), stride);
        bool same = true;
        for (std::size_t t = 0; t < n_tokens; ++t) {
          const float one = q::vec_dot(w.data(), a.data() + t * nb, n);
          same = same && std::memcmp(&one, &out[t * stride], sizeof one) == 0;
          for (std::size_t i = 1; i < stride; ++i) same = same && out[t * stride + i] == -7.0f;  // untouched
        }
        CHECK_MESSAGE(same, name << " n " << n << " n_tokens " << n_tokens);
      }
  };
  run.operator()<q::block_q2_K>("q2_K");
  run.operator()<q::block_q3_K>("q3_K");
  run.operator()<q::block_q4_K>("q4_K");
  run.operator()<q::block_q5_K>("q5_K");
  run.operator()<q::block_q6_K>("q6_K");
}

TEST_CASE("kquants simd: n = 0 and n not a multiple of 256") {
  std::vector<q::block_q6_K> w(2);
  std::vector<q::block_q8_K> a(2);
  CHECK(q::vec_dot(w.data(), a.data(), 0) == 0.0f);
  CHECK_THROWS_AS((void)q::vec_dot(w.data(), a.data(), 300), kestrel::invalid_argument);
  CHECK_THROWS_AS((void)q::ref::vec_dot(w.data(), a.data(), 300), kestrel::invalid_argument);
}

namespace {

/// out = dots(a, n_tokens): out[t * rows + r] for every row and token, then
/// 16 entries that must stay -7. Every output within gamma_(nb+3) T of exact
/// and (gamma_(nb+3) + gamma_(nb+20)) T of the twin; each token alone
/// (dots(a + t nb, 1)) the same bits as among the others.
template <class B, class Dots>
void check_tile_dots(const std::vector<B>& w, const std::vector<q::block_q8_K>& a, std::size_t rows,
                     std::size_t n_tokens, std::size_t nb, Dots&& dots) {
  const std::vector<float> out = dots(a.data(), n_tokens);
  bool within = true, alone_same = true;
  for (std::size_t t = 0; t < n_tokens; ++t) {
    const std::vector<float> one = dots(a.data() + t * nb, 1);
    for (std::size_t r = 0; r < rows; ++r) {
      const float got = out[t * rows + r];
      const exact_dot x = exact(w.data() + r * nb, a.data() + t * nb, nb);
      const float want = q::ref::vec_dot(w.data() + r * nb, a.data() + t * nb, nb * q::qk_k);
      const bool ok = std::fabs(got - x.value) <= gamma_n(double(nb) + 3) * x.magnitude &&
                      std::fabs(double(got) - want) <= (gamma_n(double(nb) + 3) + gamma_n(double(nb) + 20)) * x.magnitude;
      if (!ok) {
        INFO("row " << r << " token " << t << ": got " << got << " exact " << x.value << " T " << x.magnitude
                    << " ref " << want);
        CHECK(ok);
      }
      within = within && ok;
      alone_same = alone_same && one[r] == got;
    }
  }
  CHECK(within);
  CHECK(alone_same);  // a token's result does not depend on the tokens beside it
  bool tail_untouched = true;
  for (std::size_t i = n_tokens * rows; i < out.size(); ++i) tail_untouched = tail_untouched && out[i] == -7.0f;
  CHECK(tail_untouched);
}

}  // namespace

#if defined(KESTREL_KQUANT_PANEL)
namespace {

/// out[t * rows + r] for every row and token through the 16-row panels,
/// rows x nb blocks of w, n_tokens x nb blocks of a; out has 16 extra
/// entries past the last token that must stay untouched.
template <class B>
std::vector<float> panel_dots(const std::vector<B>& w, std::size_t rows, const q::block_q8_K* a, std::size_t n_tokens,
                              std::size_t nb) {
  namespace kp = q::detail::kp;
  const std::size_t n_panels = (rows + 15) / 16;
  std::vector<kp::kpanel_block> packed(n_panels * nb);
  std::vector<float> out(n_tokens * rows + 16, -7.0f);
  const auto* base = reinterpret_cast<const std::byte*>(w.data());
  for (std::size_t p = 0; p < n_panels; ++p) {
    const std::size_t nr = std::min<std::size_t>(16, rows - 16 * p);
    kp::pack_kpanel<B>(base + 16 * p * nb * sizeof(B), nb * sizeof(B), nr, nb, packed.data() + p * nb);
    kp::kpanel_tokens<B>(packed.data() + p * nb, nr, a, nb, n_tokens, out.data() + 16 * p, rows);
  }
  return out;
}

template <class B>
void check_panels(const char* name, std::uint32_t seed) {
  std::mt19937 rng(seed);
  for (std::size_t nb : {1, 3, 8})
    for (std::size_t rows : {1, 7, 16, 19})
      for (std::size_t n_tokens : {1, 2, 5, 8, 13}) {
        const auto w = random_blocks<B>(rows * nb, rng);
        const auto a = random_activations(n_tokens * nb, rng);
        INFO(name << " nb " << nb << " rows " << rows << " tokens " << n_tokens);
        check_tile_dots(w, a, rows, n_tokens, nb, [&](const q::block_q8_K* at, std::size_t nt) {
          return panel_dots(w, rows, at, nt, nb);
        });
      }
}

}  // namespace

TEST_CASE("kquant panels (prefill): every row and token within the derived bound of exact and of the twin") {
  check_panels<q::block_q2_K>("q2_K", 201);
  check_panels<q::block_q3_K>("q3_K", 202);
  check_panels<q::block_q4_K>("q4_K", 203);
  check_panels<q::block_q5_K>("q5_K", 204);
  check_panels<q::block_q6_K>("q6_K", 205);
}

TEST_CASE("kquant panels (prefill): the largest integer sums") {
  // As above for vec_dot: every code, scale and activation at an extreme.
  for_each_extreme([&]<class B>(const char* name, const extreme_case& e) {
    const auto w = extreme_blocks<B>(4, e);
    const auto a = extreme_acts(4, e.act);
    const exact_dot x = exact(w.data(), a.data(), 4);
    const float got = panel_dots(w, 1, a.data(), 1, 4)[0];
    INFO(name << ": exact " << x.value << " panel " << got);
    CHECK(std::fabs(got - x.value) <= gamma_n(4 + 3) * x.magnitude);
  });
}
#endif

// ---- q2_K, q4_K and q5_K prefill on AMX tiles (quant/kquant_amx.hpp) ----
//
// The tiles give the exact integers S_l + 8 S_h of each super-block, M
// comes from vpdpwssd as in the panels (4 per token with 32-value
// sub-blocks, against pair-summed bsums: the same integer), and the float
// step is the VNNI panels' (same instructions, same block order), so every
// output equals kpanel_tokens' bit for bit: any difference is a bug.

#if defined(KESTREL_KQUANT_AMX)
namespace {

template <class B>
bool tiles_match_panels(const std::vector<B>& w, std::size_t rows, const std::vector<q::block_q8_K>& a,
                        std::size_t n_tokens, std::size_t nb) {
  namespace kp = q::detail::kp;
  namespace am = q::detail::amx;
  const std::size_t n_panels = (rows + 15) / 16, n_tiles = (n_tokens + 15) / 16;
  std::vector<kp::kpanel_block> packed(nb);
  std::vector<am::kamx_block> tiles(n_panels * nb);
  std::vector<am::kact_block> acts(n_tiles * nb);
  std::vector<float> vnni(n_tokens * rows + 16, -7.0f), amx(n_tokens * rows + 16, -7.0f);
  const auto* base = reinterpret_cast<const std::byte*>(w.data());
  for (std::size_t p = 0; p < n_panels; ++p) {
    const std::size_t nr = std::min<std::size_t>(16, rows - 16 * p);
    kp::pack_kpanel<B>(base + 16 * p * nb * sizeof(B), nb * sizeof(B), nr, nb, packed.data());
    kp::kpanel_tokens<B>(packed.data(), nr, a.data(), nb, n_tokens, vnni.data() + 16 * p, rows);
    for (std::size_t b = 0; b < nb; ++b) am::pack_kamx<B>(packed[b], tiles[p * nb + b]);
  }
  for (std::size_t k = 0; k < n_tiles; ++k) am::pack_kacts<B>(a.data(), n_tokens, nb, k, acts.data() + k * nb);
  am::configure_tiles(am::k_tile_bytes, am::k_tile_rows);
  for (std::size_t p = 0; p < n_panels; ++p)
    am::kpanel_tiles<B>(tiles.data() + p * nb, std::min<std::size_t>(16, rows - 16 * p), acts.data(), nb, 0, n_tiles,
                        n_tokens, amx.data() + 16 * p, rows);
  am::release();
  return std::memcmp(vnni.data(), amx.data(), vnni.size() * sizeof(float)) == 0;
}

template <class B>
void check_tiles(const char* name, std::uint32_t seed) {
  std::mt19937 rng(seed);
  for (std::size_t nb : {1, 2, 3, 8})
    for (std::size_t rows : {1, 7, 16, 19, 40})
      for (std::size_t n_tokens : {1, 5, 16, 17, 40}) {
        const auto w = random_blocks<B>(rows * nb, rng);
        const auto a = random_activations(n_tokens * nb, rng);
        INFO(name << " nb " << nb << " rows " << rows << " tokens " << n_tokens);
        CHECK(tiles_match_panels(w, rows, a, n_tokens, nb));
      }
}

}  // namespace
#endif

TEST_CASE("kquant panels on AMX tiles (prefill): the VNNI panels' bits, random and extreme blocks") {
#if defined(KESTREL_KQUANT_AMX)
  if (!q::amx_enabled()) {
    MESSAGE("AMX built but not usable here (CPU, kernel or KESTREL_AMX=0): nothing checked");
    return;
  }
  check_tiles<q::block_q2_K>("q2_K", 301);
  check_tiles<q::block_q4_K>("q4_K", 302);
  check_tiles<q::block_q5_K>("q5_K", 303);
  for_each_extreme([&]<class B>(const char* name, const extreme_case& e) {
    if constexpr (q::kquant_on_tiles<B>) {
      INFO(name);
      CHECK(tiles_match_panels(extreme_blocks<B>(2 * 3, e), 2, extreme_acts(17 * 3, e.act), 17, 3));
    }
  });
#else
  MESSAGE("no AMX build (needs AMX-TILE, AMX-INT8 and AVX-512 VNNI): nothing checked");
#endif
}

// ---- q4_K and q6_K interleaved by 16 rows (quant/kquant_x16.hpp) ----
//
// pack_x16 / unpack_x16 are inverse bit for bit on any bytes (q4_K and q6_K
// use every bit of their blocks); the twin ref::vec_dot_x16 is ref::vec_dot
// of the unpacked row, so equal to it bit for bit. The AVX-512 kernel rounds
// as the prefill panels do (float(S), d * d8, one FMA per block, and with
// mins a second chain and the final sum): within gamma_(nb+3) T of exact and
// (gamma_(nb+3) + gamma_(nb+20)) T of the twin. Packed into the prefill
// panels' blocks, an x16 panel gives the same bits as the row-major rows.

namespace {

/// rows row-major rows of nb blocks as ceil(rows / 16) panels of nb x16 blocks.
template <class X, class B>
std::vector<X> pack_rows(const std::vector<B>& w, std::size_t rows, std::size_t nb) {
  const std::size_t n_panels = (rows + 15) / 16;
  std::vector<X> out(n_panels * nb);
  q::pack_x16_panels(reinterpret_cast<const std::byte*>(w.data()), nb * sizeof(B), rows, nb * q::qk_k, 0, n_panels,
                     out.data());
  return out;
}

template <class X>
void check_x16_roundtrip(const char* name, std::uint32_t seed) {
  using B = typename q::x16_source<X>::type;
  std::mt19937 rng(seed);
  for (std::size_t nb : {1, 3, 8})
    for (std::size_t rows : {1, 7, 16, 19, 40}) {
      const auto w = random_blocks<B>(rows * nb, rng);
      const auto packed = pack_rows<X>(w, rows, nb);
      INFO(name << " nb " << nb << " rows " << rows);
      bool same = true;
      std::vector<B> back(nb);
      for (std::size_t r = 0; r < rows; ++r) {
        q::unpack_x16(packed.data() + r / 16 * nb, r % 16, nb, back.data());
        same = same && std::memcmp(back.data(), w.data() + r * nb, nb * sizeof(B)) == 0;
        // the dequantized row agrees with the row-major one bit for bit
        std::vector<float> d0(nb * q::qk_k), d1(nb * q::qk_k);
        q::dequantize_row(w.data() + r * nb, d0.data(), d0.size());
        q::dequantize_x16_row(packed.data() + r / 16 * nb, r % 16, nb, d1.data());
        same = same && std::memcmp(d0.data(), d1.data(), d0.size() * sizeof(float)) == 0;
      }
      CHECK(same);
      bool zero_pad = true;
      for (std::size_t r = rows; r % 16 != 0; ++r) {
        q::unpack_x16(packed.data() + r / 16 * nb, r % 16, nb, back.data());
        const auto* bytes = reinterpret_cast<const std::uint8_t*>(back.data());
        zero_pad = zero_pad && std::all_of(bytes, bytes + nb * sizeof(B), [](std::uint8_t b) { return b == 0; });
      }
      CHECK(zero_pad);
      const auto a = random_activations(nb, rng);
      for (std::size_t r = 0; r < rows; ++r)
        CHECK(q::ref::vec_dot_x16(packed.data() + r / 16 * nb, r % 16, a.data(), nb * q::qk_k) ==
              q::ref::vec_dot(w.data() + r * nb, a.data(), nb * q::qk_k));
    }
}

}  // namespace

TEST_CASE("x16 layouts: pack then unpack gives every row back bit for bit; padding rows are zero") {
  check_x16_roundtrip<q::block_q4_K_x16>("q4_K", 301);
  check_x16_roundtrip<q::block_q5_K_x16>("q5_K", 321);
  check_x16_roundtrip<q::block_q3_K_x16>("q3_K", 331);
  check_x16_roundtrip<q::block_q2_K_x16>("q2_K", 341);
  check_x16_roundtrip<q::block_q6_K_x16>("q6_K", 311);
}

#if defined(KESTREL_X16_KERNEL)
namespace {

template <class X>
std::vector<float> x16_dots(const std::vector<X>& packed, std::size_t rows, const q::block_q8_K* a,
                            std::size_t n_tokens, std::size_t nb) {
  std::vector<float> out(n_tokens * rows + 16, -7.0f);
  for (std::size_t p = 0; p < (rows + 15) / 16; ++p)
    q::detail::x16::x16_tokens(packed.data() + p * nb, std::min<std::size_t>(16, rows - 16 * p), a, nb, n_tokens,
                               out.data() + 16 * p, rows);
  return out;
}

template <class X>
void check_x16_kernel(const char* name, std::uint32_t seed) {
  using B = typename q::x16_source<X>::type;
  std::mt19937 rng(seed);
  for (std::size_t nb : {1, 3, 8})
    for (std::size_t rows : {1, 7, 16, 19, 33})
      for (std::size_t n_tokens : {1, 2, 3, 4, 5, 7, 9}) {
        const auto w = random_blocks<B>(rows * nb, rng);
        const auto packed = pack_rows<X>(w, rows, nb);
        const auto a = random_activations(n_tokens * nb, rng);
        INFO(name << " nb " << nb << " rows " << rows << " tokens " << n_tokens);
        check_tile_dots(w, a, rows, n_tokens, nb, [&](const q::block_q8_K* at, std::size_t nt) {
          return x16_dots(packed, rows, at, nt, nb);
        });
#if defined(KESTREL_KQUANT_PANEL)
        // the prefill panels packed from x16 == packed from the rows, bit for bit
        if (n_tokens == 9) {
          namespace kp = q::detail::kp;
          std::vector<kp::kpanel_block> from_rows(nb), from_x16(nb);
          std::vector<float> o_rows(n_tokens * 16), o_x16(n_tokens * 16);
          bool panels_same = true;
          for (std::size_t p = 0; p < (rows + 15) / 16; ++p) {
            const std::size_t nr = std::min<std::size_t>(16, rows - 16 * p);
            kp::pack_kpanel<B>(reinterpret_cast<const std::byte*>(w.data() + 16 * p * nb), nb * sizeof(B), nr, nb,
                               from_rows.data());
            q::detail::x16::pack_kpanel(packed.data() + p * nb, nb, from_x16.data());
            kp::kpanel_tokens<B>(from_rows.data(), nr, a.data(), nb, n_tokens, o_rows.data(), 16);
            kp::kpanel_tokens<B>(from_x16.data(), nr, a.data(), nb, n_tokens, o_x16.data(), 16);
            for (std::size_t t = 0; t < n_tokens; ++t)
              panels_same = panels_same && std::equal(o_rows.begin() + 16 * t, o_rows.begin() + 16 * t + nr,
                                                      o_x16.begin() + 16 * t);
          }
          CHECK(panels_same);
        }
#endif
      }
}

}  // namespace

TEST_CASE("x16 kernel: every row and token within the derived bound of exact and of the twin") {
  check_x16_kernel<q::block_q4_K_x16>("q4_K", 302);
  check_x16_kernel<q::block_q6_K_x16>("q6_K", 312);
  if constexpr (q::x16_kernel<q::block_q5_K_x16>) check_x16_kernel<q::block_q5_K_x16>("q5_K", 322);
  if constexpr (q::x16_kernel<q::block_q3_K_x16>) check_x16_kernel<q::block_q3_K_x16>("q3_K", 332);
  if constexpr (q::x16_kernel<q::block_q2_K_x16>) check_x16_kernel<q::block_q2_K_x16>("q2_K", 342);
}

#if defined(KESTREL_KQUANT_X16)
TEST_CASE("x16 kernel: the same bits whichever way the blocks ahead are asked for (every row_streams plan) and two panels side by side") {
  auto check = [&]<class X>(const char* name, std::uint32_t seed) {
    using B = typename q::x16_source<X>::type;
    std::mt19937 rng(seed);
    // 11 blocks: both prefetch distances run past the panel's end; 16 panels,
    // the last partial: x16_pairs' 15 whole ones
    constexpr std::size_t nb = 11, rows = 243;
    const auto packed = pack_rows<X>(random_blocks<B>(rows * nb, rng), rows, nb);
    for (std::size_t n_tokens : {1, 3, 6}) {
      const auto a = random_activations(n_tokens * nb, rng);
      std::vector<float> out[3];
      using kestrel::cpu::row_streams;
      const row_streams plans[3] = {row_streams::pairs, row_streams::pairs_ahead, row_streams::wide};
      for (int k = 0; k < 3; ++k) {
        out[k].assign(n_tokens * rows, -7.0f);
        for (std::size_t p = 0; p < (rows + 15) / 16; ++p)
          q::detail::x16::x16_tokens(packed.data() + p * nb, std::min<std::size_t>(16, rows - 16 * p), a.data(), nb,
                                     n_tokens, out[k].data() + 16 * p, rows, plans[k]);
      }
      INFO(name << " tokens " << n_tokens);
      CHECK(q::detail::x16::x16_ahead_for(row_streams::pairs_ahead) == q::detail::x16::x16_ahead::next_l1);
      CHECK(std::count(out[0].begin(), out[0].end(), -7.0f) == 0);
      CHECK(std::memcmp(out[0].data(), out[1].data(), out[0].size() * sizeof(float)) == 0);
      CHECK(std::memcmp(out[0].data(), out[2].data(), out[0].size() * sizeof(float)) == 0);
      if (n_tokens == 1) {
        // Intel's decode walk (x16_pairs): 2 .. 14 panels, eight (q6_K) and four
        // side by side and the rest as a pair, the same bits as one at a time
        for (std::size_t half : {1, 2, 3, 4, 5, 7}) {
          INFO("x16_pairs, half " << half);
          std::vector<float> paired(32 * half, -7.0f);
          q::detail::x16::x16_pairs(packed.data(), half, a.data(), nb, paired.data());
          CHECK(std::memcmp(paired.data(), out[0].data(), paired.size() * sizeof(float)) == 0);
        }
      }
    }
  };
  check.template operator()<q::block_q4_K_x16>("q4_K", 303);
  check.template operator()<q::block_q6_K_x16>("q6_K", 313);
}
#endif

TEST_CASE("x16 kernel: the largest integer sums") {
  for_each_extreme([&]<class B>(const char* name, const extreme_case& e) {
    auto check = [&]<class X>() {
      const auto w = extreme_blocks<B>(4, e);
      const auto a = extreme_acts(4, e.act);
      const exact_dot x = exact(w.data(), a.data(), 4);
      const float got = x16_dots(pack_rows<X>(w, 1, 4), 1, a.data(), 1, 4)[0];
      INFO(name << ": exact " << x.value << " x16 " << got);
      CHECK(std::fabs(got - x.value) <= gamma_n(4 + 3) * x.magnitude);
    };
    if constexpr (std::is_same_v<B, q::block_q4_K>) check.template operator()<q::block_q4_K_x16>();
    if constexpr (std::is_same_v<B, q::block_q6_K>) check.template operator()<q::block_q6_K_x16>();
    if constexpr (std::is_same_v<B, q::block_q5_K> && q::x16_kernel<q::block_q5_K_x16>)
      check.template operator()<q::block_q5_K_x16>();
    if constexpr (std::is_same_v<B, q::block_q3_K> && q::x16_kernel<q::block_q3_K_x16>)
      check.template operator()<q::block_q3_K_x16>();
    if constexpr (std::is_same_v<B, q::block_q2_K> && q::x16_kernel<q::block_q2_K_x16>)
      check.template operator()<q::block_q2_K_x16>();
  });
}
#endif
