// tests/cpu/test_thread_pool.cpp: parallel_for covers every index exactly
// once, in contiguous chunks, for any n and thread count, call after call.
#include <doctest/doctest.h>

#include <atomic>
#include <cstddef>
#include <mutex>
#include <stdexcept>
#include <utility>
#include <vector>

#include "kestrel/core/error.hpp"
#include "kestrel/cpu/thread_pool.hpp"

namespace cpu = kestrel::cpu;

TEST_CASE("cpu: thread_pool covers every index exactly once") {
  for (std::size_t threads : {1, 2, 3, 4, 7, 8}) {
    cpu::thread_pool pool(threads);
    CHECK(pool.size() == threads);
    for (std::size_t n : {0, 1, 2, 3, 5, 7, 8, 9, 13, 100, 1000, 1023}) {
      std::vector<std::atomic<int>> hits(n);
      std::mutex m;
      std::vector<std::pair<std::size_t, std::size_t>> chunks;
      pool.parallel_for(n, [&](std::size_t b, std::size_t e) {
        for (std::size_t i = b; i < e; ++i) hits[i].fetch_add(1, std::memory_order_relaxed);
        std::lock_guard lock(m);
        chunks.emplace_back(b, e);
      });
      std::size_t bad = 0;
      for (auto& h : hits) bad += h.load() != 1;
      INFO("threads " << threads << " n " << n);
      CHECK(bad == 0);
      CHECK(chunks.size() <= threads);
      CHECK(chunks.size() == std::min(n, threads));
      for (auto [b, e] : chunks) CHECK(b < e);  // no empty calls
    }
  }
}

TEST_CASE("cpu: thread_pool survives many back-to-back calls") {
  for (std::size_t threads : {2, 3, 4}) {
    cpu::thread_pool pool(threads);
    std::vector<int> data(257, 0);  // each call adds 1 to every element
    for (int call = 0; call < 2000; ++call)
      pool.parallel_for(data.size() - static_cast<std::size_t>(call % 7), [&](std::size_t b, std::size_t e) {
        for (std::size_t i = b; i < e; ++i) ++data[i];
      });
    // Element i was covered by every call whose n exceeded i.
    std::size_t bad = 0;
    for (std::size_t i = 0; i < data.size(); ++i) {
      int want = 0;
      for (int call = 0; call < 2000; ++call) want += i < data.size() - static_cast<std::size_t>(call % 7);
      bad += data[i] != want;
    }
    INFO("threads " << threads);
    CHECK(bad == 0);
  }
}

TEST_CASE("cpu: thread_pool rethrows, runs nested calls inline, rejects 0 threads") {
  cpu::thread_pool pool(3);
  CHECK_THROWS_AS(pool.parallel_for(9, [](std::size_t b, std::size_t) {
    if (b > 0) throw std::runtime_error("chunk failed");
  }), std::runtime_error);
  // Still usable after an exception.
  std::atomic<std::size_t> total{0};
  pool.parallel_for(9, [&](std::size_t b, std::size_t e) {
    // A nested call on the same pool runs inline rather than deadlocking.
    pool.parallel_for(e - b, [&](std::size_t b2, std::size_t e2) { total += e2 - b2; });
  });
  CHECK(total == 9);
  CHECK_THROWS_AS(cpu::thread_pool(0), kestrel::invalid_argument);
  // The free function accepts a null pool.
  std::size_t seen = 0;
  cpu::parallel_for(nullptr, 5, [&](std::size_t b, std::size_t e) { seen += e - b; });
  CHECK(seen == 5);
}
