// tests/sampler/test_alloc.cpp: after the first call for a given n_vocab,
// sampling allocates nothing. Counts calls of the global operator new, which
// this file replaces for the whole test_sampler executable.
#include <doctest/doctest.h>

#include <atomic>
#include <cstdlib>
#include <new>
#include <vector>

#include "kestrel/sampler/samplers.hpp"

namespace {
std::atomic<long> allocations{0};
}

void* operator new(std::size_t n) {
  allocations.fetch_add(1, std::memory_order_relaxed);
  if (void* p = std::malloc(n ? n : 1)) return p;
  throw std::bad_alloc();
}
void* operator new[](std::size_t n) { return ::operator new(n); }
void operator delete(void* p) noexcept { std::free(p); }
void operator delete[](void* p) noexcept { std::free(p); }
void operator delete(void* p, std::size_t) noexcept { std::free(p); }
void operator delete[](void* p, std::size_t) noexcept { std::free(p); }

using namespace kestrel;

TEST_CASE("no allocation per call after warm-up") {
  splitmix64 g(3);
  std::vector<float> logits(32000);
  for (auto& x : logits) x = (g.next_float() - 0.5f) * 16.0f;
  std::vector<float> scratch(logits.size());

  sampler_chain defaults;
  sampler_chain no_top_k({.temperature = 1.0f, .top_k = 0, .top_p = 0.9f, .min_p = 0.0f, .seed = 1});
  llama2c_sampler l2c(1.0f, 0.9f, 1);
  greedy_sampler greedy;
  sampler_chain penalized({.temperature = 1.0f, .seed = 2, .penalty_last_n = 16, .penalty_repeat = 1.1f,
                           .penalty_freq = 0.1f, .penalty_present = 0.1f});
  token_id next = 0;

  auto run_all = [&] {
    for (int i = 0; i < 20; ++i) {
      scratch = logits;
      penalized.accept(next);  // storage made at construction; the window of 16 fills and turns over
      next = penalized.sample(scratch);
      scratch = logits;  // same size: no allocation
      defaults.sample(scratch);
      scratch = logits;
      no_top_k.sample(scratch);
      scratch = logits;
      l2c.sample(scratch);
      scratch = logits;
      greedy.sample(scratch);
    }
  };
  run_all();  // warm-up sizes the scratch vectors
  const long before = allocations.load();
  run_all();
  const long after = allocations.load();
  CHECK(after - before == 0);
}
