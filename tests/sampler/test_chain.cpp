// tests/sampler/test_chain.cpp: greedy_sampler, the filtering steps and
// sampler_chain: support of every filter, the drawn distribution, seeds,
// parameter and logit validation.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <numeric>
#include <set>
#include <vector>

#include "kestrel/sampler/samplers.hpp"
#include "sampler_test_util.hpp"

using namespace kestrel;
using kestrel::test::check_binomial;
using kestrel::test::invalid_argument_message;
using kestrel::test::logits_of;
using kestrel::test::softmax_ref;

namespace {

constexpr float inf = std::numeric_limits<float>::infinity();

sampler_params only_temperature(float t, std::uint64_t seed = 1) {
  return {.temperature = t, .top_k = 0, .top_p = 1.0f, .min_p = 0.0f, .seed = seed};
}

/// Token counts of n draws (the logits are passed as a fresh copy each time).
std::vector<std::size_t> histogram(sampler_chain& s, const std::vector<float>& logits, std::size_t n) {
  std::vector<std::size_t> count(logits.size());
  std::vector<float> scratch;
  for (std::size_t i = 0; i < n; ++i) {
    scratch = logits;
    const token_id t = s.sample(scratch);
    REQUIRE(t >= 0);
    REQUIRE(std::size_t(t) < logits.size());
    ++count[std::size_t(t)];
  }
  return count;
}

std::set<token_id> support(const std::vector<std::size_t>& count) {
  std::set<token_id> s;
  for (std::size_t i = 0; i < count.size(); ++i)
    if (count[i]) s.insert(token_id(i));
  return s;
}

std::vector<float> random_logits(std::size_t n, std::uint64_t seed, float scale) {
  splitmix64 g(seed);
  std::vector<float> l(n);
  for (auto& x : l) x = (g.next_float() * 2.0f - 1.0f) * scale;
  return l;
}

std::set<token_id> kept_ids(const sampler_chain& s) {
  std::set<token_id> ids;
  for (const auto& c : s.last_candidates().items()) ids.insert(c.id);
  return ids;
}

}  // namespace

TEST_CASE("greedy picks the argmax, the lowest index on ties") {
  greedy_sampler g;
  std::vector<float> a{0.1f, 2.0f, -3.0f, 1.9f};
  CHECK(g.sample(a) == 1);
  std::vector<float> ties{1.0f, 5.0f, 5.0f, 5.0f, -1.0f};
  CHECK(g.sample(ties) == 1);
  std::vector<float> masked{-inf, -inf, -7.0f, -inf};
  CHECK(g.sample(masked) == 2);
  std::vector<float> one{-123.0f};
  CHECK(g.sample(one) == 0);
  std::vector<float> all_low{std::numeric_limits<float>::lowest(), std::numeric_limits<float>::lowest()};
  CHECK(g.sample(all_low) == 0);
}

TEST_CASE("temperature 0 chain equals greedy and draws nothing") {
  greedy_sampler g;
  sampler_chain s({.temperature = 0.0f, .top_k = 5, .top_p = 0.5f, .min_p = 0.3f, .seed = 9});
  const auto state = s.rng().state();
  for (std::uint64_t k = 0; k < 200; ++k) {
    auto l = random_logits(257, k, 4.0f);
    if (k % 3 == 0) l[k % 257] = l[(k * 7) % 257] = 100.0f;  // ties at the top
    auto l2 = l;
    REQUIRE(s.sample(l) == g.sample(l2));
  }
  CHECK(s.rng().state() == state);
}

TEST_CASE("same seed, same tokens; other seed, other tokens; reset replays") {
  const auto logits = random_logits(1000, 5, 3.0f);
  auto run = [&](sampler_chain& s) {
    std::vector<token_id> out;
    for (int i = 0; i < 300; ++i) {
      auto l = logits;
      out.push_back(s.sample(l));
    }
    return out;
  };
  const sampler_params p{.temperature = 1.0f, .top_k = 0, .top_p = 0.99f, .min_p = 0.0f, .seed = 133742};
  sampler_chain a(p), b(p);
  auto sa = run(a);
  CHECK(sa == run(b));
  sampler_params q = p;
  q.seed = 133743;
  sampler_chain c(q);
  CHECK(sa != run(c));
  a.reset();
  CHECK(sa == run(a));
  // One generator step per non-greedy draw.
  splitmix64 g(133742);
  for (int i = 0; i < 300; ++i) g.next_u64();
  CHECK(b.rng().state() == g.state());
}

TEST_CASE("the draws follow softmax(logits / T)") {
  // 200000 draws per temperature; every probability below is >= 0.5%, so
  // n p >= 1000 and the 5-sigma binomial band of check_binomial applies.
  const std::vector<float> logits{1.0f, 2.0f, 0.5f, -1.0f, 3.0f, 0.0f};
  for (float t : {1.0f, 0.7f, 2.5f}) {
    CAPTURE(t);
    sampler_chain s(only_temperature(t, 77));
    const std::size_t n = 200000;
    const auto count = histogram(s, logits, n);
    const auto p = softmax_ref(logits, t);
    for (std::size_t i = 0; i < p.size(); ++i) check_binomial(count[i], n, p[i], i);
  }
}

TEST_CASE("-inf logits are never drawn") {
  const std::vector<float> logits{-inf, 0.0f, -inf, 0.0f, -inf};
  sampler_chain s(only_temperature(1.0f));
  const auto count = histogram(s, logits, 20000);
  CHECK(support(count) == std::set<token_id>{1, 3});
}

TEST_CASE("top-k keeps exactly the k largest") {
  // Ids deliberately not in logit order.
  const std::vector<float> logits{0.3f, 2.0f, -1.0f, 1.5f, 0.9f, 1.7f, -0.2f, 0.0f};
  sampler_params p = only_temperature(1.0f, 3);
  p.top_k = 3;
  sampler_chain s(p);
  const std::size_t n = 100000;
  const auto count = histogram(s, logits, n);
  CHECK(support(count) == std::set<token_id>{1, 3, 5});
  CHECK(s.last_candidates().size() == 3);
  // Within the top k, the renormalised softmax.
  const auto q = softmax_ref({logits[1], logits[3], logits[5]});
  check_binomial(count[1], n, q[0], 1);
  check_binomial(count[3], n, q[1], 3);
  check_binomial(count[5], n, q[2], 5);

  SUBCASE("k >= n_vocab keeps all, k == 1 is greedy, ties go to the lowest id") {
    p.top_k = 100;
    sampler_chain all(p);
    CHECK(support(histogram(all, logits, 50000)).size() == logits.size());
    p.top_k = 1;
    sampler_chain one(p);
    CHECK(support(histogram(one, logits, 1000)) == std::set<token_id>{1});
    p.top_k = 2;
    sampler_chain tie(p);
    CHECK(support(histogram(tie, {1.0f, 5.0f, 3.0f, 5.0f, 5.0f}, 5000)) == std::set<token_id>{1, 3});
  }
}

TEST_CASE("top-p keeps the smallest prefix with mass >= p") {
  // Probabilities 0.4 (id 2), 0.3 (id 0), 0.2 (id 3), 0.1 (id 1).
  const auto logits = logits_of({0.3, 0.1, 0.4, 0.2});
  struct row {
    float p;
    std::set<token_id> kept;
  };
  for (const row& r : {row{0.3f, {2}}, row{0.65f, {2, 0}}, row{0.85f, {2, 0, 3}}, row{0.95f, {2, 0, 3, 1}}}) {
    CAPTURE(r.p);
    sampler_params p = only_temperature(1.0f, 11);
    p.top_p = r.p;
    sampler_chain s(p);
    const std::size_t n = 50000;
    const auto count = histogram(s, logits, n);
    CHECK(support(count) == r.kept);
    if (r.p == 0.65f) {  // 0.4 / 0.7 and 0.3 / 0.7
      check_binomial(count[2], n, 4.0 / 7.0, 2);
      check_binomial(count[0], n, 3.0 / 7.0, 0);
    }
  }
}

TEST_CASE("top-p on a large vocabulary keeps exactly the reference nucleus") {
  // Checks the pre-filter before the sort: the kept set must equal a full
  // double-precision sort of the whole vocabulary.
  for (std::uint64_t seed = 0; seed < 20; ++seed) {
    const auto logits = random_logits(32000, seed, 8.0f);
    const auto prob = softmax_ref(logits);
    std::vector<token_id> order(logits.size());
    std::iota(order.begin(), order.end(), 0);
    std::sort(order.begin(), order.end(), [&](token_id a, token_id b) { return prob[a] > prob[b] || (prob[a] == prob[b] && a < b); });
    for (float top_p : {0.1f, 0.5f, 0.9f, 0.95f}) {
      CAPTURE(seed);
      CAPTURE(top_p);
      std::set<token_id> expected;
      double mass = 0.0;
      for (token_id t : order) {
        expected.insert(t);
        mass += prob[t];
        if (mass >= double(top_p)) break;
      }
      // Skip the (improbable) cases where the mass lands within rounding of p.
      if (std::abs(mass - prob[order[expected.size() - 1]] - top_p) < 1e-9 || std::abs(mass - top_p) < 1e-9) continue;
      sampler_params p = only_temperature(1.0f, seed);
      p.top_p = top_p;
      sampler_chain s(p);
      auto l = logits;
      const token_id t = s.sample(l);
      CHECK(expected.count(t) == 1);
      CHECK(kept_ids(s) == expected);
    }
  }
}

TEST_CASE("min-p drops tokens with p < min_p * p_max") {
  // p_max = 0.5; min_p 0.2 => threshold 0.1: 0.05 goes, 0.15 stays.
  const auto logits = logits_of({0.15, 0.5, 0.05, 0.3});
  sampler_params p = only_temperature(1.0f, 5);
  p.min_p = 0.2f;
  sampler_chain s(p);
  const std::size_t n = 60000;
  const auto count = histogram(s, logits, n);
  CHECK(support(count) == std::set<token_id>{0, 1, 3});
  check_binomial(count[1], n, 0.5 / 0.95, 1);

  SUBCASE("matches the definition on random logits") {
    for (std::uint64_t seed = 0; seed < 10; ++seed) {
      const auto l0 = random_logits(5000, 100 + seed, 6.0f);
      const auto prob = softmax_ref(l0);
      const double pmax = *std::max_element(prob.begin(), prob.end());
      for (float mp : {0.01f, 0.1f, 0.5f, 1.0f}) {
        std::set<token_id> expected;
        for (std::size_t i = 0; i < prob.size(); ++i)
          if (prob[i] >= double(mp) * pmax * (1 - 1e-12)) expected.insert(token_id(i));
        p.min_p = mp;
        sampler_chain m(p);
        auto l = l0;
        m.sample(l);
        CHECK(kept_ids(m) == expected);
      }
    }
  }
}

TEST_CASE("the chain order is top-k, top-p, min-p, temperature (llama.cpp)") {
  // 0.4, 0.3, 0.2, 0.1. top-k 2 leaves {0.4, 0.3}, renormalised 0.571, 0.429;
  // top-p 0.5 then keeps only id 0. (top-p first would keep ids 0 and 1.)
  const auto logits = logits_of({0.4, 0.3, 0.2, 0.1});
  sampler_chain s({.temperature = 1.0f, .top_k = 2, .top_p = 0.5f, .min_p = 0.0f, .seed = 1});
  CHECK(support(histogram(s, logits, 5000)) == std::set<token_id>{0});
  // Filters see untempered logits: a high temperature does not widen top-p.
  sampler_chain hot({.temperature = 50.0f, .top_k = 0, .top_p = 0.65f, .min_p = 0.0f, .seed = 1});
  const std::size_t n = 40000;
  const auto count = histogram(hot, logits, n);
  CHECK(support(count) == std::set<token_id>{0, 1});
  const auto q = softmax_ref({logits[0], logits[1]}, 50.0);
  check_binomial(count[0], n, q[0], 0);
}

TEST_CASE("default parameters are llama.cpp's") {
  const sampler_params p;
  CHECK(p.temperature == 0.8f);
  CHECK(p.top_k == 40);
  CHECK(p.top_p == 0.95f);
  CHECK(p.min_p == 0.05f);
  CHECK(p.seed == 0);
  sampler_chain s;
  auto l = random_logits(100, 1, 5.0f);
  const token_id t = s.sample(l);
  CHECK(kept_ids(s).count(t) == 1);
  CHECK(s.last_candidates().size() <= 40);
}

TEST_CASE("n_vocab 1 works everywhere") {
  std::vector<float> one{0.25f};
  sampler_chain s;
  CHECK(s.sample(one) == 0);
  greedy_sampler g;
  CHECK(g.sample(one) == 0);
  sampler_chain c({.temperature = 2.0f, .top_k = 3, .top_p = 0.1f, .min_p = 0.9f, .seed = 2});
  CHECK(c.sample(one) == 0);
}

TEST_CASE("invalid parameters throw, naming the parameter and the value") {
  auto msg = [](sampler_params p) { return invalid_argument_message([&] { sampler_chain s(p); }); };
  const float nan = std::numeric_limits<float>::quiet_NaN();
  struct row {
    sampler_params p;
    const char* name;
    const char* value;
  };
  const row rows[] = {
      {{.temperature = -0.5f}, "temperature", "-0.5"},
      {{.temperature = nan}, "temperature", "nan"},
      {{.temperature = inf}, "temperature", "inf"},
      {{.top_k = -1}, "top_k", "-1"},
      {{.top_p = 0.0f}, "top_p", "= 0 "},
      {{.top_p = 1.5f}, "top_p", "1.5"},
      {{.top_p = nan}, "top_p", "nan"},
      {{.min_p = -0.25f}, "min_p", "-0.25"},
      {{.min_p = 2.0f}, "min_p", "= 2 "},
      {{.min_p = nan}, "min_p", "nan"},
  };
  for (const row& r : rows) {
    const std::string m = msg(r.p);
    CAPTURE(m);
    CHECK(m.find("sampler_params") != std::string::npos);
    CHECK(m.find(r.name) != std::string::npos);
    CHECK(m.find(r.value) != std::string::npos);
    CHECK_THROWS_AS(validate(r.p), kestrel::invalid_argument);
  }
  CHECK_NOTHROW(validate(sampler_params{}));
  CHECK_NOTHROW(sampler_chain({.temperature = 0.0f, .top_k = 0, .top_p = 1.0f, .min_p = 1.0f}));
  CHECK(invalid_argument_message([] { top_k_step s(-3); }).find("top_k_step: top_k = -3") == 0);
}

TEST_CASE("bad logits throw invalid_argument; never UB") {
  std::vector<float> empty;
  std::vector<float> with_nan{0.0f, std::numeric_limits<float>::quiet_NaN(), 1.0f};
  std::vector<float> with_inf{0.0f, 1.0f, inf};
  std::vector<float> all_masked{-inf, -inf};
  sampler_chain s;
  greedy_sampler g;
  sampler_chain zero_t(only_temperature(0.0f));
  for (auto* l : {&empty, &with_nan, &with_inf, &all_masked}) {
    CHECK_THROWS_AS(s.sample(*l), kestrel::invalid_argument);
    CHECK_THROWS_AS(g.sample(*l), kestrel::invalid_argument);
    CHECK_THROWS_AS(zero_t.sample(*l), kestrel::invalid_argument);
  }
  CHECK(invalid_argument_message([&] { s.sample(with_nan); }).find("logits[1] is NaN") != std::string::npos);
  CHECK(invalid_argument_message([&] { g.sample(with_inf); }).find("logits[2] is +inf") != std::string::npos);
  CHECK(invalid_argument_message([&] { s.sample(empty); }).find("empty logits") != std::string::npos);
  CHECK(invalid_argument_message([&] { s.sample(all_masked); }).find("-inf") != std::string::npos);
}

TEST_CASE("extreme temperatures stay well defined") {
  const std::vector<float> logits{1e30f, -1e30f, 3e38f, 0.0f};
  sampler_chain cold(only_temperature(1e-30f));
  CHECK(support(histogram(cold, logits, 200)) == std::set<token_id>{2});
  sampler_chain tiny(only_temperature(std::numeric_limits<float>::denorm_min()));
  CHECK(support(histogram(tiny, {-3e38f, -3e38f, 1.0f}, 200)) == std::set<token_id>{2});
  // A huge temperature flattens to uniform.
  sampler_chain hot(only_temperature(1e30f, 4));
  const std::size_t n = 40000;
  const auto count = histogram(hot, {5.0f, -5.0f, 0.0f, 1.0f}, n);
  for (std::size_t i = 0; i < 4; ++i) check_binomial(count[i], n, 0.25, i);
}

TEST_CASE("steps compose by hand") {
  const auto logits = logits_of({0.05, 0.4, 0.3, 0.15, 0.1});
  candidate_set c;
  c.assign(logits);
  top_k_step(4).apply(c);
  CHECK(c.size() == 4);
  CHECK(c.sorted());
  CHECK(c.items()[0].id == 1);
  min_p_step(0.3f).apply(c);  // 0.4 * 0.3 = 0.12: 0.1 goes
  CHECK(c.size() == 3);
  temperature_step(0.0f).apply(c);
  CHECK(c.size() == 1);
  CHECK(c.items()[0].id == 1);
  splitmix64 g(1);
  CHECK(dist_step{}.draw(c, g) == 1);
}
