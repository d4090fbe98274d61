// tests/cpu/test_thread_pool.cpp: parallel_for covers every index exactly
// once, in contiguous chunks, for any n and thread count, call after call,
// also after the workers went to sleep; misuse is an error, not a hang.
#include <doctest/doctest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "fixtures.hpp"
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
      CHECK(chunks.size() == pool.chunk_count(n));
      CHECK(chunks.size() <= (threads == 1 ? std::min<std::size_t>(n, 1) : std::min(n, 5 * threads)));
      for (auto [b, e] : chunks) CHECK(b < e);  // no empty calls
      // The chunks are pool.chunk_begin's, and shrink: no chunk is longer
      // than one before it, give or take the one item of rounding.
      std::sort(chunks.begin(), chunks.end());
      for (std::size_t i = 0; i < chunks.size(); ++i) {
        CHECK(chunks[i].first == pool.chunk_begin(i, n));
        CHECK(chunks[i].second == pool.chunk_begin(i + 1, n));
        if (i > 0) CHECK(chunks[i].second - chunks[i].first <= chunks[i - 1].second - chunks[i - 1].first + 1);
      }
      // Two rounds or more (the first chunks half a share) once n allows them.
      if (threads > 1 && n >= 2 * threads) CHECK(chunks.size() >= 2 * threads);
    }
  }
}

TEST_CASE("cpu: thread_pool's rounds cap: 0 gives each thread its share; parallel_for(work) caps by min_chunk_work") {
  for (std::size_t threads : {2, 3, 4}) {
    cpu::thread_pool pool(threads);
    for (std::size_t n : {7, 64, 1000}) {
      for (std::size_t max_r : {0, 1, 2, 9}) {
        std::mutex m;
        std::vector<std::pair<std::size_t, std::size_t>> chunks;
        pool.parallel_for(n, [&](std::size_t b, std::size_t e) {
          std::lock_guard lock(m);
          chunks.emplace_back(b, e);
        }, max_r);
        INFO("threads " << threads << " n " << n << " max_r " << max_r);
        CHECK(chunks.size() == pool.chunk_count(n, max_r));
        CHECK(chunks.size() <= threads * (std::min<std::size_t>(max_r, cpu::thread_pool::max_rounds) + 1));
        std::sort(chunks.begin(), chunks.end());
        std::size_t at = 0;
        for (std::size_t i = 0; i < chunks.size(); ++i) {
          CHECK(chunks[i].first == at);
          CHECK(chunks[i].first == pool.chunk_begin(i, n, max_r));
          at = chunks[i].second;
        }
        CHECK(at == n);
        if (max_r == 0)  // one chunk per thread, the shares as even as n allows
          for (auto [b, e] : chunks) CHECK(e - b >= n / threads);
      }
    }
  }
  // The cap from the work: no last-round chunk below min_chunk_work, and
  // never more than max_rounds.
  using cpu::guided_rounds, cpu::min_chunk_work;
  CHECK(guided_rounds(0, 2) == 0);
  CHECK(guided_rounds(4 * min_chunk_work - 1, 2) == 0);
  CHECK(guided_rounds(4 * min_chunk_work, 2) == 1);
  CHECK(guided_rounds(32 * min_chunk_work, 2) == 4);
  CHECK(guided_rounds(std::size_t{1} << 40, 2) == cpu::thread_pool::max_rounds);
  for (std::size_t work = 1; work < (std::size_t{1} << 36); work *= 3) {
    const std::size_t r = guided_rounds(work, 3);
    if (r > 0) CHECK(work / (std::size_t{3} << r) >= min_chunk_work);
    if (r < cpu::thread_pool::max_rounds) CHECK(work / (std::size_t{3} << (r + 1)) < min_chunk_work);
  }
}

TEST_CASE("cpu: thread_pool's fixed chunks (parallel_for_chunks) cover every index once, chunk after chunk") {
  for (std::size_t threads : {1, 2, 3}) {
    cpu::thread_pool pool(threads);
    for (std::size_t n : {0, 1, 5, 100, 1000})
      for (std::size_t chunk : {0, 1, 3, 64, 5000}) {
        std::vector<std::atomic<int>> hits(n);
        std::mutex m;
        std::vector<std::pair<std::size_t, std::size_t>> chunks;
        pool.parallel_for_chunks(n, chunk, [&](std::size_t b, std::size_t e) {
          for (std::size_t i = b; i < e; ++i) hits[i].fetch_add(1, std::memory_order_relaxed);
          std::lock_guard lock(m);
          chunks.emplace_back(b, e);
        });
        INFO("threads " << threads << " n " << n << " chunk " << chunk);
        std::size_t bad = 0;
        for (auto& h : hits) bad += h.load() != 1;
        CHECK(bad == 0);
        if (n == 0) {
          CHECK(chunks.empty());
          continue;
        }
        if (threads == 1 || n == 1) {  // inline: one call over everything
          CHECK(chunks.size() == 1);
          continue;
        }
        const std::size_t c = std::max<std::size_t>(chunk, 1);
        CHECK(chunks.size() == (n + c - 1) / c);
        for (auto [b, e] : chunks) {
          CHECK(b % c == 0);
          CHECK(e == std::min(n, b + c));
        }
      }
    // More items than the claim counter holds chunks of the size asked for:
    // the chunks grow to ceil(n / max_chunks).
    const std::size_t n = 3 * cpu::thread_pool::max_chunks + 5;
    std::atomic<std::size_t> calls{0}, items{0}, longest{0};
    pool.parallel_for_chunks(n, 1, [&](std::size_t b, std::size_t e) {
      calls += 1;
      items += e - b;
      std::size_t l = longest.load();
      while (e - b > l && !longest.compare_exchange_weak(l, e - b)) {
      }
    });
    INFO("threads " << threads);
    CHECK(items == n);
    if (threads > 1) {
      CHECK(calls <= cpu::thread_pool::max_chunks);
      CHECK(longest == 4);
    }
  }
  // An exception in a chunk reaches the caller after the other chunks, and
  // the pool goes on.
  cpu::thread_pool pool(2);
  CHECK_THROWS_AS(pool.parallel_for_chunks(100, 10, [](std::size_t b, std::size_t) {
    if (b == 50) throw std::runtime_error("chunk failed");
  }), std::runtime_error);
  std::atomic<std::size_t> total{0};
  pool.parallel_for_chunks(100, 10, [&](std::size_t b, std::size_t e) { total += e - b; });
  CHECK(total == 100);
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

TEST_CASE("cpu: thread_pool wakes workers that went to sleep between calls") {
  // A worker spins for a few tens of microseconds after a call and then
  // sleeps on the condition variable: a pause of 1 or 5 ms between calls
  // makes every later call wake the workers up.
  for (std::size_t threads : {2, 4}) {
    cpu::thread_pool pool(threads);
    for (int ms : {1, 5}) {
      std::vector<int> data(64, 0);
      for (int call = 0; call < 10; ++call) {
        std::this_thread::sleep_for(std::chrono::milliseconds(ms));
        pool.parallel_for(data.size(), [&](std::size_t b, std::size_t e) {
          for (std::size_t i = b; i < e; ++i) ++data[i];
        });
      }
      std::size_t bad = 0;
      for (int x : data) bad += x != 10;
      INFO("threads " << threads << " sleep " << ms << " ms");
      CHECK(bad == 0);
    }
  }
}

TEST_CASE("cpu: thread_pool destroyed right after construction") {
  // Workers may not have started their loop yet when shutdown comes.
  for (int round = 0; round < 50; ++round) {
    cpu::thread_pool pool(static_cast<std::size_t>(2 + round % 7));
  }
  CHECK(true);  // reaching here means no hang and no crash
}

TEST_CASE("cpu: thread_pool rejects a second caller while a call runs, and more than max_threads") {
  cpu::thread_pool pool(3);
  std::atomic<bool> first_inside{false}, second_done{false};
  std::string second_error;
  std::thread second([&] {
    while (!first_inside.load()) std::this_thread::yield();
    second_error = kestrel::test::invalid_argument_message([&] {
      pool.parallel_for(9, [](std::size_t, std::size_t) {});
    });
    second_done = true;
  });
  std::atomic<std::size_t> covered{0};
  pool.parallel_for(9, [&](std::size_t b, std::size_t e) {
    first_inside = true;
    // Hold the call open until the other thread has tried (bounded, so a
    // regression fails instead of hanging).
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (!second_done.load() && std::chrono::steady_clock::now() < deadline) std::this_thread::yield();
    covered += e - b;
  });
  second.join();
  CHECK(second_done.load());
  CHECK(covered == 9);  // the rejected call did not disturb the running one
  CHECK(second_error.find("thread_pool: parallel_for called concurrently from two threads") == 0);
  // Nothing was left marked busy: the pool keeps working, from either thread.
  std::atomic<std::size_t> total{0};
  std::thread([&] { pool.parallel_for(7, [&](std::size_t b, std::size_t e) { total += e - b; }); }).join();
  pool.parallel_for(5, [&](std::size_t b, std::size_t e) { total += e - b; });
  CHECK(total == 12);

  CHECK(cpu::thread_pool::max_threads == 1024);
  CHECK(kestrel::test::invalid_argument_message([] { cpu::thread_pool p(1025); }) ==
        "thread_pool: n_threads = 1025 exceeds the limit of 1024");
  CHECK_THROWS_AS(cpu::thread_pool(static_cast<std::size_t>(-1)), kestrel::invalid_argument);
}
