// tests/sampler/test_llama2c.cpp: llama2c_sampler against run.c's rules,
// with coins from an independent evaluation of run.c's generator.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <numeric>
#include <vector>

#include "kestrel/sampler/samplers.hpp"
#include "sampler_test_util.hpp"

using namespace kestrel;
using kestrel::test::invalid_argument_message;
using kestrel::test::logits_of;

namespace {

/// run.c's coins, evaluated here without the library.
struct coins {
  std::uint64_t s;
  float next() {
    s ^= s >> 12;
    s ^= s << 25;
    s ^= s >> 27;
    const auto u = static_cast<std::uint32_t>((s * 0x2545F4914F6CDD1Dull) >> 32);
    return float(u >> 8) / 16777216.0f;
  }
};

/// Index of the interval of `bounds` (ascending upper edges) holding x, or -1
/// when x is within `margin` of an edge (rounding could go either way there).
int interval(double x, const std::vector<double>& bounds, double margin = 1e-5) {
  for (std::size_t i = 0; i < bounds.size(); ++i) {
    if (std::abs(x - bounds[i]) < margin) return -1;
    if (x < bounds[i]) return int(i);
  }
  return int(bounds.size()) - 1;
}

}  // namespace

TEST_CASE("plain multinomial when topp is 0 or 1: first i with coin < cdf") {
  // Probabilities 0.5, 0.25, 0.125, 0.125: cdf edges 0.5, 0.75, 0.875, 1.
  const auto logits = logits_of({0.5, 0.25, 0.125, 0.125});
  for (float topp : {0.0f, 1.0f}) {
    CAPTURE(topp);
    llama2c_sampler s(1.0f, topp, 133742);
    coins c{133742};
    int checked = 0;
    for (int i = 0; i < 2000; ++i) {
      auto l = logits;
      const token_id t = s.sample(l);
      const int expected = interval(c.next(), {0.5, 0.75, 0.875, 1.0});
      if (expected < 0) continue;
      REQUIRE(t == expected);
      ++checked;
    }
    CHECK(checked > 1990);
  }
}

TEST_CASE("nucleus: sorted by probability, cut where the cumulative first exceeds topp, r = coin * cumulative") {
  SUBCASE("ids out of order") {
    // ids: 0.1, 0.4, 0.2, 0.3. topp 0.6: sorted 0.4 (id 1), 0.3 (id 3): the
    // cumulative 0.7 > 0.6, so r = coin * 0.7 picks id 1 below 0.4, else id 3.
    const auto logits = logits_of({0.1, 0.4, 0.2, 0.3});
    llama2c_sampler s(1.0f, 0.6f, 7);
    coins c{7};
    for (int i = 0; i < 2000; ++i) {
      auto l = logits;
      const token_id t = s.sample(l);
      const int k = interval(c.next() * 0.7, {0.4, 0.7});
      if (k < 0) continue;
      REQUIRE(t == (k == 0 ? 1 : 3));
    }
  }
  SUBCASE("ties keep index order, and the cut can split them") {
    // 0.5, 0.25, 0.125 (id 2), 0.125 (id 3), an exact tie. topp 0.8: the
    // cumulative passes 0.8 at id 2 (0.875): id 3 is never drawn, r = coin * 0.875.
    const auto logits = logits_of({0.5, 0.25, 0.125, 0.125});
    llama2c_sampler s(1.0f, 0.8f, 99);
    coins c{99};
    for (int i = 0; i < 3000; ++i) {
      auto l = logits;
      const token_id t = s.sample(l);
      REQUIRE(t != 3);
      const int k = interval(c.next() * 0.875, {0.5, 0.75, 0.875});
      if (k < 0) continue;
      REQUIRE(t == k);
    }
  }
  SUBCASE("never exceeding topp keeps every candidate above the cutoff") {
    // topp 0.99, n 4: cutoff 0.01 / 3. 0.6, 0.39, 0.008, 0.002: the cumulative
    // of the three kept is 0.998 > 0.99 only at the third, so all three stay.
    const auto logits = logits_of({0.6, 0.39, 0.008, 0.002});
    llama2c_sampler s(1.0f, 0.99f, 5);
    coins c{5};
    for (int i = 0; i < 3000; ++i) {
      auto l = logits;
      const token_id t = s.sample(l);
      REQUIRE(t != 3);
      const int k = interval(c.next() * 0.998, {0.6, 0.99, 0.998});
      if (k < 0) continue;
      REQUIRE(t == k);
    }
  }
}

TEST_CASE("temperature divides the logits before the softmax") {
  // logits log(0.5), log(0.25)... at T = 0.5 become probabilities
  // proportional to 0.25, 0.0625: 0.8 and 0.2.
  const auto logits = logits_of({0.5, 0.25});
  llama2c_sampler s(0.5f, 0.0f, 3);
  coins c{3};
  for (int i = 0; i < 2000; ++i) {
    auto l = logits;
    const token_id t = s.sample(l);
    const int k = interval(c.next(), {0.8, 1.0});
    if (k < 0) continue;
    REQUIRE(t == k);
  }
}

TEST_CASE("the logits are left as run.c leaves them: probabilities") {
  std::vector<float> l{1.0f, 2.0f, 3.0f};
  llama2c_sampler s(1.0f, 0.9f, 1);
  s.sample(l);
  CHECK(std::accumulate(l.begin(), l.end(), 0.0) == doctest::Approx(1.0).epsilon(1e-6));
  CHECK(l[2] == doctest::Approx(std::exp(3.0) / (std::exp(1.0) + std::exp(2.0) + std::exp(3.0))).epsilon(1e-6));
}

TEST_CASE("same seed, same tokens; reset replays; temperature 0 is argmax without a draw") {
  splitmix64 g(8);
  std::vector<std::vector<float>> steps(300, std::vector<float>(512));
  for (auto& v : steps)
    for (auto& x : v) x = (g.next_float() - 0.5f) * 12.0f;
  auto run = [&](llama2c_sampler& s) {
    std::vector<token_id> out;
    for (auto v : steps) out.push_back(s.sample(v));
    return out;
  };
  llama2c_sampler a(1.0f, 0.9f, 133742), b(1.0f, 0.9f, 133742), c(1.0f, 0.9f, 133743);
  const auto ta = run(a);
  CHECK(ta == run(b));
  CHECK(ta != run(c));
  a.reset();
  CHECK(ta == run(a));
  llama2c_rng r(133742);
  for (int i = 0; i < 300; ++i) r.next_u32();
  CHECK(b.rng().state() == r.state());  // exactly one draw per call

  llama2c_sampler greedy(0.0f, 0.9f, 133742);
  greedy_sampler ref;
  for (auto v : steps) {
    auto w = v;
    REQUIRE(greedy.sample(v) == ref.sample(w));
  }
  CHECK(greedy.rng().state() == 133742);
}

TEST_CASE("run.c's undefined corners are defined here") {
  llama2c_sampler s(1.0f, 0.9f, 11);
  std::vector<float> one{3.0f};
  CHECK(s.sample(one) == 0);  // run.c: division by zero in the cutoff
  CHECK(s.rng().state() != 11);

  // Flat distribution with topp < 1/n: no probability reaches the cutoff.
  llama2c_sampler flat(1.0f, 0.001f, 11);
  std::vector<float> uniform(512, 0.0f);
  const token_id t = flat.sample(uniform);
  CHECK(t >= 0);
  CHECK(t < 512);

  // logits / temperature overflows: the argmax.
  llama2c_sampler cold(1e-30f, 0.9f, 11);
  std::vector<float> big{1e30f, 3e38f, -3e38f};
  CHECK(cold.sample(big) == 1);
}

TEST_CASE("llama2c_sampler rejects bad parameters and bad logits") {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  auto msg = [](float t, float p, std::uint64_t seed) {
    return invalid_argument_message([&] { llama2c_sampler s(t, p, seed); });
  };
  CHECK(msg(-1.0f, 0.9f, 1).find("llama2c_sampler: temperature = -1") == 0);
  CHECK(msg(nan, 0.9f, 1).find("temperature = nan") != std::string::npos);
  CHECK(msg(1.0f, 1.5f, 1).find("topp = 1.5") != std::string::npos);
  CHECK(msg(1.0f, -0.1f, 1).find("topp = -0.1") != std::string::npos);
  CHECK(msg(1.0f, 0.9f, 0).find("seed = 0") != std::string::npos);
  CHECK(msg(1.0f, 0.9f, 1).empty());

  llama2c_sampler s(1.0f, 0.9f, 1);
  std::vector<float> empty, bad{0.0f, nan};
  CHECK_THROWS_AS(s.sample(empty), kestrel::invalid_argument);
  CHECK_THROWS_AS(s.sample(bad), kestrel::invalid_argument);
}
