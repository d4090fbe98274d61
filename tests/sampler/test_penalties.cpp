// tests/sampler/test_penalties.cpp: penalties_step (llama.cpp's repetition,
// frequency and presence penalties) and its place in sampler_chain.
#include <doctest/doctest.h>

#include <cstdint>
#include <limits>
#include <map>
#include <set>
#include <vector>

#include "kestrel/sampler/samplers.hpp"
#include "sampler_test_util.hpp"

using namespace kestrel;
using kestrel::test::invalid_argument_message;

namespace {

constexpr float inf = std::numeric_limits<float>::infinity();

/// The candidates' logits by id after `step` is applied to `logits`.
std::map<token_id, float> penalized(const penalties_step& step, const std::vector<float>& logits) {
  candidate_set c;
  c.assign(logits);
  step.apply(c);
  std::map<token_id, float> out;
  for (const auto& x : c.items()) out[x.id] = x.logit;
  return out;
}

sampler_params greedy_with(float repeat, std::int32_t last_n = 64, float freq = 0.0f, float present = 0.0f) {
  return {.temperature = 0.0f, .top_k = 0, .top_p = 1.0f, .min_p = 0.0f, .penalty_last_n = last_n,
          .penalty_repeat = repeat, .penalty_freq = freq, .penalty_present = present};
}

}  // namespace

TEST_CASE("penalties: a positive logit is divided, a negative one multiplied, then count * freq + present is subtracted") {
  penalties_step p(64, 2.0f, 0.5f, 0.25f);
  p.accept(0);
  p.accept(1);
  p.accept(1);
  p.accept(4);
  const auto out = penalized(p, {2.0f, -2.0f, 1.0f, 0.5f, 0.0f});
  // Every value below is exact in binary floating point.
  CHECK(out.at(0) == 2.0f / 2.0f - (1.0f * 0.5f + 0.25f));   // 0.25
  CHECK(out.at(1) == -2.0f * 2.0f - (2.0f * 0.5f + 0.25f));  // -5.25
  CHECK(out.at(2) == 1.0f);                                  // not seen
  CHECK(out.at(3) == 0.5f);
  CHECK(out.at(4) == 0.0f * 2.0f - (0.5f + 0.25f));  // 0 counts as "not positive": multiplied
}

TEST_CASE("penalties: only the last last_n accepted tokens count (against a brute-force count)") {
  const std::int32_t n = 7;
  penalties_step p(n, 1.5f);
  splitmix64 g(11);
  std::vector<token_id> seq;
  for (int i = 0; i < 300; ++i) {
    const auto t = static_cast<token_id>(g.next_u64() % 9);
    seq.push_back(t);
    p.accept(t);
    std::map<token_id, std::int32_t> ref;
    for (std::size_t j = seq.size() > std::size_t(n) ? seq.size() - n : 0; j < seq.size(); ++j) ++ref[seq[j]];
    for (token_id id = 0; id < 9; ++id) {
      const auto it = ref.find(id);
      REQUIRE(p.count(id) == (it == ref.end() ? 0 : it->second));
    }
  }
  p.reset();
  for (token_id id = 0; id < 9; ++id) CHECK(p.count(id) == 0);
}

TEST_CASE("penalties: the values that disable them leave every logit as it was") {
  const std::vector<float> logits = {1.0f, -1.0f, 3.0f};
  for (const auto& p : {penalties_step(0, 1.3f, 0.5f, 0.5f), penalties_step(64, 1.0f, 0.0f, 0.0f)}) {
    auto q = p;
    q.accept(0);
    q.accept(2);
    CHECK_FALSE(q.active());
    CHECK(q.count(0) == 0);
    const auto out = penalized(q, logits);
    CHECK(out.at(0) == 1.0f);
    CHECK(out.at(1) == -1.0f);
    CHECK(out.at(2) == 3.0f);
  }
}

TEST_CASE("penalties: a masked (-inf) or out-of-vocabulary token in the history is passed over") {
  penalties_step p(8, 2.0f);
  p.accept(1);
  p.accept(100);
  const auto out = penalized(p, {4.0f, -inf, 2.0f});
  CHECK(out.size() == 2);
  CHECK(out.at(0) == 4.0f);
  CHECK(out.at(2) == 2.0f);
}

TEST_CASE("penalties: impossible parameters are refused by name") {
  CHECK(invalid_argument_message([] { penalties_step(-1, 1.1f); }).find("penalty_last_n = -1") != std::string::npos);
  CHECK(invalid_argument_message([] { penalties_step(penalties_step::max_last_n + 1, 1.1f); })
            .find("penalty_last_n = 16777217 is invalid (must be in [0, 2^24]") != std::string::npos);
  CHECK(invalid_argument_message([] { penalties_step(64, 0.0f); }).find("penalty_repeat = 0") != std::string::npos);
  CHECK(invalid_argument_message([] { penalties_step(64, -1.1f); }).find("penalty_repeat = -1.1") != std::string::npos);
  CHECK(invalid_argument_message([] { penalties_step(64, inf); }).find("penalty_repeat = inf") != std::string::npos);
  CHECK(invalid_argument_message([] { penalties_step(64, 1.0f, std::nanf("")); }).find("penalty_freq = nan") !=
        std::string::npos);
  CHECK(invalid_argument_message([] { penalties_step(64, 1.0f, 0.0f, -inf); }).find("penalty_present = -inf") !=
        std::string::npos);
  sampler_params bad;
  bad.penalty_repeat = 0.0f;
  CHECK(invalid_argument_message([&] { validate(bad); }).find("sampler_params: penalty_repeat = 0") !=
        std::string::npos);
  CHECK(invalid_argument_message([&] { sampler_chain{bad}; }).find("penalty_repeat") != std::string::npos);
}

TEST_CASE("sampler_chain: greedy takes the argmax of the penalized logits; reset() forgets the history") {
  sampler_chain s(greedy_with(4.0f));
  std::vector<float> logits = {1.0f, 3.0f, 2.0f};
  auto scratch = logits;
  CHECK(s.sample(scratch) == 1);
  s.accept(1);  // 3 / 4 = 0.75 < 2
  scratch = logits;
  CHECK(s.sample(scratch) == 2);
  s.accept(2);  // 2 / 4 = 0.5 < 1
  scratch = logits;
  CHECK(s.sample(scratch) == 0);
  s.reset();
  scratch = logits;
  CHECK(s.sample(scratch) == 1);
  // Ties after the penalty: the lowest id, as without it.
  sampler_chain t(greedy_with(1.5f));
  t.accept(1);
  std::vector<float> tie = {1.0f, 1.5f};  // 1.5 / 1.5 == 1
  CHECK(t.sample(tie) == 0);
}

TEST_CASE("sampler_chain: a token under a huge presence penalty is never drawn; without history it is") {
  const std::vector<float> logits = {0.0f, 0.5f, 1.0f, 0.2f};
  sampler_params p{.temperature = 1.0f, .top_k = 0, .top_p = 1.0f, .min_p = 0.0f, .seed = 5, .penalty_last_n = 4,
                   .penalty_present = 1e30f};
  sampler_chain s(p);
  s.accept(2);
  std::set<token_id> drawn;
  for (int i = 0; i < 400; ++i) {
    auto scratch = logits;
    drawn.insert(s.sample(scratch));
  }
  CHECK(drawn == std::set<token_id>{0, 1, 3});
  // Four other tokens push it out of the window of 4.
  for (token_id t : {0, 1, 3, 0}) s.accept(t);
  drawn.clear();
  for (int i = 0; i < 400; ++i) {
    auto scratch = logits;
    drawn.insert(s.sample(scratch));
  }
  CHECK(drawn.count(2) == 1);
  CHECK(drawn.count(0) == 0);  // still in the window
}
