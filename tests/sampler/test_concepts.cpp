// tests/sampler/test_concepts.cpp: which types model Sampler, and which don't.
#include <doctest/doctest.h>

#include <span>
#include <vector>

#include "kestrel/sampler/samplers.hpp"

namespace {

struct no_sample {};
struct returns_float {
  float sample(std::span<float>) { return 0; }
};
struct takes_vector {
  kestrel::token_id sample(std::vector<float>&) { return 0; }
};
struct takes_const_span {  // promises not to write: still a Sampler
  kestrel::token_id sample(std::span<const float>) { return 0; }
};
struct with_history {
  kestrel::token_id sample(std::span<float>) { return last; }
  void accept(kestrel::token_id t) { last = t; }
  kestrel::token_id last = 0;
};

}  // namespace

using namespace kestrel;

static_assert(Sampler<greedy_sampler>);
static_assert(Sampler<sampler_chain>);
static_assert(Sampler<llama2c_sampler>);
static_assert(ResettableSampler<sampler_chain> && ResettableSampler<llama2c_sampler>);
static_assert(AcceptingSampler<sampler_chain>);  // its penalties keep a history
static_assert(Sampler<takes_const_span>);
static_assert(AcceptingSampler<with_history> && !ResettableSampler<with_history>);

static_assert(!Sampler<int>);
static_assert(!Sampler<no_sample>);
static_assert(!Sampler<returns_float>);
static_assert(!Sampler<takes_vector>);
static_assert(!Sampler<const sampler_chain>);  // sampling advances the generator

TEST_CASE("sampler_accept and sampler_reset call the optional members when present") {
  with_history h;
  sampler_accept(h, 7);
  CHECK(h.last == 7);
  sampler_reset(h);  // no reset(): a no-op that compiles
  greedy_sampler g;
  sampler_accept(g, 3);  // no accept(): a no-op that compiles
  std::vector<float> l{0.f, 1.f};
  CHECK(h.sample(l) == 7);
  CHECK(g.sample(l) == 1);
}
