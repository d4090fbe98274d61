// tests/quant/test_legacy_tokens.cpp: the legacy-format tile kernel
// (quant::dot_tile: panels of rows x groups of tokens) against its exact-order
// scalar twin quant::ref::dot_fused, bit for bit, and dot_fused against the
// plain twin quant::ref::dot within a derived bound; and the decode kernel
// (quant::dot_rows_decode, legacy_decode.hpp) within gamma_(nb+6) T of the
// exact sum, a token in a group equal to the token alone bit for bit; and
// without VNNI the AVX2 prefill tiles (legacy_tiles_avx2.hpp) within
// gamma_(nb+4) T of exact, the same bits in every tile shape.
//
// Bit for bit: dot_tile's per-(row, token) arithmetic is dot_fused's (exact
// integer block sums, then one fma per block term in block order), so any
// difference, for any number of rows or tokens in a call, is a bug. In
// particular a token computed in a group equals the same token alone.
//
// dot_fused vs ref::dot: both sum the same terms d_w d_a isum_b (and m_w s_a
// for the _1 types), with d_w d_a and isum_b exact. dot_fused rounds once per
// fma: k = nb fmas (2 nb for the _1 types), |err| <= gamma_k T with T = sum_b
// (|d_w d_a isum_b| + |m_w s_a|) (Higham's bound for recursive summation,
// each partial sum rounded once). ref::dot rounds the product d_w d_a isum_b,
// the product m_w s_a, their sum, and the running sum: at most 4 roundings on
// any term's path over nb blocks, |err| <= gamma_(nb+3) T. So |dot_fused -
// ref::dot| <= (gamma_(2nb) + gamma_(nb+3)) T.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#if defined(__unix__)
#include <sys/mman.h>
#include <unistd.h>
#endif

#include "cpu/helpers.hpp"
#include "quant/legacy_extremes.hpp"
#include "kestrel/quant/legacy.hpp"
#include "kestrel/quant/legacy_decode.hpp"
#include "kestrel/quant/legacy_tiles_avx2.hpp"
#include "kestrel/quant/legacy_tokens.hpp"

namespace q = kestrel::quant;
using kestrel::test::extreme_acts;
using kestrel::test::extreme_weights;
using kestrel::test::gamma_n;
using kestrel::test::random_floats;

namespace {

template <class Block> std::vector<Block> quantized(const std::vector<float>& x) {
  std::vector<Block> b(x.size() / 32);
  q::quantize_row(x.data(), b.data(), x.size());
  return b;
}

bool same_bits(float a, float b) { return std::memcmp(&a, &b, sizeof a) == 0; }

/// dot_tile over (rows, tokens) == dot_fused per pair, and == dot_tile of each
/// token alone, bit for bit.
template <class W>
void check_tile(const std::vector<W>& w, const std::vector<q::activation_of_t<W>>& a, std::size_t rows,
                std::size_t n_tokens, std::size_t n) {
  const std::size_t nb = n / 32;
  std::vector<float> out(n_tokens * rows + 1, -7.0f);
  q::dot_tile(w.data(), nb, rows, a.data(), n, n_tokens, out.data(), rows);
  std::size_t bad = 0, alone_bad = 0;
  for (std::size_t t = 0; t < n_tokens; ++t) {
    std::vector<float> alone(rows, -7.0f);
    q::dot_tile(w.data(), nb, rows, a.data() + t * nb, n, 1, alone.data(), rows);
    for (std::size_t r = 0; r < rows; ++r) {
      const float want = q::ref::dot_fused(w.data() + r * nb, a.data() + t * nb, n);
      bad += !same_bits(out[t * rows + r], want);
      alone_bad += !same_bits(alone[r], out[t * rows + r]);
    }
  }
  CAPTURE(rows);
  CAPTURE(n_tokens);
  CAPTURE(n);
  CHECK(bad == 0);
  CHECK(alone_bad == 0);
  CHECK(out[n_tokens * rows] == -7.0f);  // nothing written past the tile
}

template <class W> void check_random(std::size_t rows, std::size_t n_tokens, std::size_t n, std::uint32_t seed) {
  using A = q::activation_of_t<W>;
  const auto w = quantized<W>(random_floats(rows * n, seed));
  const auto a = quantized<A>(random_floats(n_tokens * n, seed + 1, -3.0f, 3.0f));
  check_tile(w, a, rows, n_tokens, n);
}

}  // namespace

#define TILE_TYPES q::block_q4_0, q::block_q4_1, q::block_q5_0, q::block_q5_1, q::block_q8_0

TEST_CASE_TEMPLATE("quant: dot_tile == ref::dot_fused bit for bit; a token in a group == the token alone", W,
                   TILE_TYPES) {
  for (std::size_t rows : {1, 5, 16, 17, 33})
    for (std::size_t n_tokens = 0; n_tokens <= 9; ++n_tokens)
      for (std::size_t n : {32, 96, 1024})
        check_random<W>(rows, n_tokens, n, static_cast<std::uint32_t>(rows * 1000 + n_tokens * 10 + n));
  check_random<W>(19, 13, 2080, 5);  // odd token count (8 + 4 + 1), odd block count
  check_random<W>(3, 11, 32 * 65, 6);
}

// The largest integer sums the bound in legacy_tokens.hpp allows: every
// weight code at its extreme (u = 255 for q8_0: q = 127; u = 0 and u = 15 / 31
// for the nibble types) against activations all 127 or all -128 (below
// quantize_row's -127), and the scales at their f16 extremes.
TEST_CASE_TEMPLATE("quant: dot_tile's integer sums at the extremes are exact", W, TILE_TYPES) {
  using A = q::activation_of_t<W>;
  const std::size_t rows = 17, n_tokens = 3, n = 64, nb = n / 32;
  for (int pattern = 0; pattern < 4; ++pattern) {
    const auto w = extreme_weights<W>(rows * nb, pattern);
    const auto a = extreme_acts<A>(n_tokens * nb, pattern);  // 127 or -128
    CAPTURE(pattern);
    check_tile(w, a, rows, n_tokens, n);
  }
}

TEST_CASE_TEMPLATE("quant: ref::dot_fused within (gamma_2nb + gamma_(nb+3)) T of ref::dot", W, TILE_TYPES) {
  using A = q::activation_of_t<W>;
  for (std::size_t n : {32, 320, 4096})
    for (std::uint32_t seed : {1u, 2u, 3u}) {
      const auto w = quantized<W>(random_floats(n, seed * 7 + static_cast<std::uint32_t>(n)));
      const auto a = quantized<A>(random_floats(n, seed * 13 + static_cast<std::uint32_t>(n), -4.0f, 4.0f));
      const std::size_t nb = n / 32;
      double T = 0;
      for (std::size_t b = 0; b < nb; ++b) {
        std::vector<float> wf(32), af(32);
        q::dequantize_row(&w[b], wf.data(), 32);
        // |d_w d_a isum| + |m_w s_a| <= sum |(d_w q_w) (d_a q_a)| + 2 |m_w s_a|
        // (for the _1 types d_w q_w = value - m_w)
        double s = 0;
        int qa[32];
        for (int j = 0; j < 32; ++j) qa[j] = a[b].qs[j];
        double m = 0, sa = 0;
        if constexpr (q::has_offset_m<W>) {
          m = kestrel::to_f32(w[b].m);
          sa = kestrel::to_f32(a[b].s);
        }
        const double da = kestrel::to_f32(a[b].d);
        for (int j = 0; j < 32; ++j) s += std::fabs((double(wf[j]) - m) * da * qa[j]);
        T += s + std::fabs(m * sa);
      }
      const double tol = (gamma_n(2 * nb) + gamma_n(nb + 3)) * T;
      const float fused = q::ref::dot_fused(w.data(), a.data(), n), plain = q::ref::dot(w.data(), a.data(), n);
      CAPTURE(n);
      CAPTURE(seed);
      CHECK_MESSAGE(std::fabs(double(fused) - plain) <= tol, "fused " << fused << " plain " << plain << " tol " << tol);
    }
}

TEST_CASE("quant: dot_tile and dot_fused need whole blocks") {
  std::vector<q::block_q4_0> w(2);
  std::vector<q::block_q8_0> a(2);
  float out[2];
  CHECK_THROWS_AS(q::dot_tile(w.data(), 2, 1, a.data(), 40, 1, out, 1), kestrel::invalid_argument);
  CHECK_THROWS_AS(q::ref::dot_fused(w.data(), a.data(), 40), kestrel::invalid_argument);
  CHECK(q::ref::dot_fused(w.data(), a.data(), 0) == 0.0f);
}

// ---- the decode kernel (legacy_decode.hpp) ----
//
// Against the exact dot (integers exact, products d_w d_a exact, summed in
// double: within 2^-53 relative of exact, far below the tolerance):
// |got - exact| <= gamma_(nb+6) T, T = sum_b (|d_w d_a| sum_j |(q_w - o) q_a|
// + |m_w s_a|), the bound derived in legacy_decode.hpp (scalar twin: ref::dot,
// within gamma_(nb+3) T of the same exact sum, test_legacy.cpp). Each token's
// outputs are the same bits whether it is alone or in a group (every token
// runs the same instruction sequence), each row's whether it is alone or in a
// run of rows split anywhere (rows are paired for the kernel, every row
// summed by the same tree: how threads split the rows must not matter), and
// nothing is written past the rows.

namespace {

/// The exact dot of row r and token t (integers exact, d_w d_a exact, summed
/// in double) and its T = sum_b (|d_w d_a| sum_j |(q_w - o) q_a| + |m_w s_a|).
template <class W>
std::pair<double, double> exact_dot(const std::vector<W>& w, const std::vector<q::activation_of_t<W>>& a,
                                    std::size_t r, std::size_t t, std::size_t nb) {
  double exact = 0, T = 0;
  for (std::size_t b = 0; b < nb; ++b) {
    const W& wb = w[r * nb + b];
    const auto& ab = a[t * nb + b];
    int q[32];
    if constexpr (std::is_same_v<W, q::block_q8_0>) {
      for (int j = 0; j < 32; ++j) q[j] = wb.qs[j];
    } else {
      q::detail::unpack<q::ref::detail::fused_traits<W>::bits>(wb, q);
    }
    long isum = 0, iabs = 0;
    for (int j = 0; j < 32; ++j) {
      const long v = long(q[j] - q::ref::detail::fused_traits<W>::offset) * ab.qs[j];
      isum += v;
      iabs += v < 0 ? -v : v;
    }
    const double dd = double(kestrel::to_f32(wb.d)) * kestrel::to_f32(ab.d);
    exact += dd * double(isum);
    T += std::fabs(dd) * double(iabs);
    if constexpr (q::has_offset_m<W>) {
      const double ms = double(kestrel::to_f32(wb.m)) * kestrel::to_f32(ab.s);
      exact += ms;
      T += std::fabs(ms);
    }
  }
  return {exact, T};
}

template <class W>
void check_decode(const std::vector<W>& w, const std::vector<q::activation_of_t<W>>& a, std::size_t rows,
                  std::size_t n_tokens, std::size_t n) {
  const std::size_t nb = n / 32;
  std::vector<q::decode_acts<W>> acts(n_tokens);
  std::vector<const q::decode_acts<W>*> ap(n_tokens);
  for (std::size_t t = 0; t < n_tokens; ++t) {
    acts[t].prepare(a.data() + t * nb, nb);
    ap[t] = &acts[t];
  }
  const auto* base = reinterpret_cast<const std::byte*>(w.data());
  std::vector<float> out(n_tokens * rows + 1, -7.0f);
  q::dot_rows_decode<W>(base, nb * sizeof(W), rows, ap.data(), n_tokens, out.data(), rows);
  std::size_t bad = 0, alone_bad = 0, split_bad = 0;
  // Every row alone, and the rows split in two at a third, all tokens.
  std::vector<float> row_alone(n_tokens * rows, -7.0f), split(n_tokens * rows, -7.0f);
  for (std::size_t r = 0; r < rows; ++r)
    q::dot_rows_decode<W>(base + r * nb * sizeof(W), nb * sizeof(W), 1, ap.data(), n_tokens, row_alone.data() + r, rows);
  const std::size_t cut = rows / 3;
  q::dot_rows_decode<W>(base, nb * sizeof(W), cut, ap.data(), n_tokens, split.data(), rows);
  q::dot_rows_decode<W>(base + cut * nb * sizeof(W), nb * sizeof(W), rows - cut, ap.data(), n_tokens,
                        split.data() + cut, rows);
  for (std::size_t i = 0; i < n_tokens * rows; ++i)
    split_bad += !same_bits(row_alone[i], out[i]) + !same_bits(split[i], out[i]);
  // Every row plan (cpu/streaming.hpp: rows in pairs 256 bytes or 2 KiB
  // ahead, or in eights for one token on Intel, far as wide), whichever the
  // host takes: the same bits.
  std::size_t plan_bad = 0;
  for (auto plan : {kestrel::cpu::row_streams::pairs, kestrel::cpu::row_streams::pairs_ahead,
                    kestrel::cpu::row_streams::wide, kestrel::cpu::row_streams::far}) {
    std::vector<float> got(n_tokens * rows + 1, -7.0f);
    q::dot_rows_decode<W>(base, nb * sizeof(W), rows, ap.data(), n_tokens, got.data(), rows, plan);
    for (std::size_t i = 0; i < n_tokens * rows; ++i) plan_bad += !same_bits(got[i], out[i]);
    for (std::size_t t = 0; t < n_tokens; ++t) {
      std::vector<float> alone(rows, -7.0f);
      q::dot_rows_decode<W>(base, nb * sizeof(W), rows, ap.data() + t, 1, alone.data(), rows, plan);
      for (std::size_t r = 0; r < rows; ++r) plan_bad += !same_bits(alone[r], out[t * rows + r]);
    }
  }
  CHECK(plan_bad == 0);
  double worst = 0;
  for (std::size_t t = 0; t < n_tokens; ++t) {
    std::vector<float> alone(rows, -7.0f);
    q::dot_rows_decode<W>(base, nb * sizeof(W), rows, ap.data() + t, 1, alone.data(), rows);
    for (std::size_t r = 0; r < rows; ++r) {
      const auto [exact, T] = exact_dot(w, a, r, t, nb);
      const double tol = gamma_n(nb + 6) * T, err = std::fabs(double(out[t * rows + r]) - exact);
      bad += !(err <= tol);
      if (tol > 0) worst = std::max(worst, err / tol);
      alone_bad += !same_bits(alone[r], out[t * rows + r]);
    }
  }
  CAPTURE(rows);
  CAPTURE(n_tokens);
  CAPTURE(n);
  CAPTURE(worst);
  CHECK(bad == 0);
  CHECK(alone_bad == 0);
  CHECK(split_bad == 0);
  CHECK(out[n_tokens * rows] == -7.0f);
}

}  // namespace

TEST_CASE_TEMPLATE("quant: dot_rows_decode within gamma_(nb+6) T of exact; a token in a group == the token alone", W,
                   TILE_TYPES) {
  using A = q::activation_of_t<W>;
  // Block counts 1, 2, 3 (a partial unit of 4 blocks), 4, 16, 17, 24 (n_embd
  // 768), 65 (partial last unit); rows odd and even (paired as two streams;
  // 8, 11 and 19 as eight, with 0-3 left over).
  for (std::size_t rows : {1, 3, 8, 11, 19})
    for (std::size_t n_tokens = 1; n_tokens <= q::decode_kernel_tokens; ++n_tokens)
      for (std::size_t nb : {1, 2, 3, 4, 16, 17, 24, 65}) {
        const std::size_t n = nb * 32;
        const auto seed = static_cast<std::uint32_t>(rows * 1000 + n_tokens * 10 + n);
        const auto w = quantized<W>(random_floats(rows * n, seed));
        const auto a = quantized<A>(random_floats(n_tokens * n, seed + 1, -3.0f, 3.0f));
        check_decode(w, a, rows, n_tokens, n);
      }
  // The extremes of dot_tile's test: codes at their ends against 127 / -128
  // (-127 without the kernel: quant::dot's AVX2 path needs |q_a| <= 127, as
  // quantize_row gives; legacy.hpp).
#if defined(KESTREL_LEGACY_DECODE)
  constexpr int a_min = 0x80;
#else
  constexpr int a_min = 0x81;
#endif
  for (int pattern = 0; pattern < 4; ++pattern) {
    const std::size_t rows = 5, n_tokens = 3, nb = 19, n = nb * 32;
    const auto w = extreme_weights<W>(rows * nb, pattern);
    const auto a = extreme_acts<A>(n_tokens * nb, pattern, a_min);
    CAPTURE(pattern);
    check_decode(w, a, rows, n_tokens, n);
  }
}

#if defined(__unix__)
// The decode kernel reads nothing past the rows' bytes: the rows end where a
// PROT_NONE page starts (a read there faults), for row lengths ending on a
// whole unit of 4 blocks and on a partial one.
TEST_CASE_TEMPLATE("quant: dot_rows_decode reads nothing past the last row", W, TILE_TYPES) {
  using A = q::activation_of_t<W>;
  const std::size_t page = static_cast<std::size_t>(sysconf(_SC_PAGESIZE));
  for (std::size_t nb : {1, 3, 4, 5, 8, 24}) {
    const std::size_t rows = 3, n = nb * 32, bytes = rows * nb * sizeof(W);
    const std::size_t data_pages = (bytes + page - 1) / page;
    void* m = mmap(nullptr, (data_pages + 1) * page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    REQUIRE(m != MAP_FAILED);
    auto* base = static_cast<std::byte*>(m);
    REQUIRE(mprotect(base + data_pages * page, page, PROT_NONE) == 0);
    std::byte* rows_at = base + data_pages * page - bytes;  // the last row ends at the guard page
    const auto w = quantized<W>(random_floats(rows * n, static_cast<std::uint32_t>(nb)));
    std::memcpy(rows_at, w.data(), bytes);
    const auto a = quantized<A>(random_floats(n, static_cast<std::uint32_t>(nb) + 7));
    q::decode_acts<W> acts;
    acts.prepare(a.data(), nb);
    const q::decode_acts<W>* ap[1] = {&acts};
    float out[rows];
    q::dot_rows_decode<W>(rows_at, nb * sizeof(W), rows, ap, 1, out, rows);
    for (std::size_t r = 0; r < rows; ++r) {
      CAPTURE(nb);
      CAPTURE(r);
      const float want = q::ref::dot(w.data() + r * nb, a.data(), n);
      CHECK(std::fabs(out[r] - want) <= 1e-3f * (1.0f + std::fabs(want)));
    }
    munmap(m, (data_pages + 1) * page);
  }
}
#endif

#if defined(KESTREL_LEGACY_TILES_AVX2)
// The AVX2 prefill tiles (legacy_tiles_avx2.hpp): every (row, token) within
// gamma_(nb+4) T of the exact dot (the header's bound), and the same bits in
// every tile shape it can sit in (1..tile_rows_avx2 rows x 1..tile_tokens_avx2
// tokens), since each runs the same operations in block order.
TEST_CASE_TEMPLATE("quant: dot_tile_avx2 within gamma_(nb+4) T of exact; any tile shape, the same bits", W,
                   TILE_TYPES) {
  using A = q::activation_of_t<W>;
  constexpr std::size_t R = q::tile_rows_avx2, TT = q::tile_tokens_avx2;
  for (std::size_t nb : {1, 2, 3, 24, 65}) {
    const std::size_t n = nb * 32, rows = R, n_tokens = TT;
    const auto seed = static_cast<std::uint32_t>(nb * 31 + 5);
    const auto w = quantized<W>(random_floats(rows * n, seed));
    const auto a = quantized<A>(random_floats(n_tokens * n, seed + 1, -3.0f, 3.0f));
    std::vector<q::token_aux> aux(n_tokens * nb);
    const std::size_t np = nb / 2;
    std::vector<q::act_pair> pairs(n_tokens * np + 1);
    for (std::size_t t = 0; t < n_tokens; ++t) {
      q::make_token_aux<W>(a.data() + t * nb, aux.data() + t * nb, nb);
      q::make_act_pairs<W>(a.data() + t * nb, pairs.data() + t * np, nb);
    }
    const auto* base = reinterpret_cast<const std::byte*>(w.data());
    std::vector<float> full(rows * n_tokens + 1, -7.0f);
    q::dot_tile_avx2<W>(base, nb * sizeof(W), rows, a.data(), aux.data(), pairs.data(), nb, n_tokens, full.data(),
                        rows);
    std::size_t bad = 0, shape_bad = 0;
    for (std::size_t r = 0; r < rows; ++r)
      for (std::size_t t = 0; t < n_tokens; ++t) {
        const auto [exact, T] = exact_dot(w, a, r, t, nb);
        bad += !(std::fabs(double(full[t * rows + r]) - exact) <= gamma_n(nb + 4) * T);
        // (r, t) as the first of a tile of every shape that fits it.
        for (std::size_t nr = 1; nr <= rows - r; ++nr)
          for (std::size_t nt = 1; nt <= n_tokens - t; ++nt) {
            std::vector<float> part(nr * nt, -7.0f);
            q::dot_tile_avx2<W>(base + r * nb * sizeof(W), nb * sizeof(W), nr, a.data() + t * nb, aux.data() + t * nb,
                                pairs.data() + t * np, nb, nt, part.data(), nr);
            shape_bad += !same_bits(part[0], full[t * rows + r]);
          }
      }
    CAPTURE(nb);
    CHECK(bad == 0);
    CHECK(shape_bad == 0);
    CHECK(full[rows * n_tokens] == -7.0f);
  }
}
#endif
