// kestrel/cpu/thread_pool.hpp: a persistent pool of threads for the kernels'
// parallel loops.
//
// The model calls parallel_for about ten times per layer per token, so one
// call must cost microseconds, not the tens of microseconds of creating
// threads or allocating: workers live as long as the pool, a call publishes
// a (function pointer, context) pair without allocating, workers poll for
// the next call for about a millisecond (spin_time: the next product
// usually follows within microseconds) and then sleep on a condition
// variable, so an idle pool costs no CPU. Each call is cut into a few
// chunks per thread, longest first, that the threads claim one at a time,
// so on a shared machine a descheduled worker delays a call by at most one
// chunk (or not at all when it has not yet claimed one) rather than by its
// whole share, and the threads finish within a short last chunk of each
// other (chunk_begin); publishing a call and joining it take no lock unless
// a thread has gone to sleep.
//
// Contract: one parallel_for at a time per pool (the pool is not a queue):
// a second thread calling while a call is running gets invalid_argument
// rather than corrupting the published job. A nested call from inside f
// (on the caller or a worker) runs inline on the calling thread.
#pragma once

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <mutex>
#include <string>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

#include "kestrel/core/error.hpp"

namespace kestrel::cpu {

namespace detail {
inline void cpu_relax() noexcept {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield");
#endif
}
}  // namespace detail

class thread_pool {
 public:
  /// Far above any core count the pool is meant for; a larger request is a
  /// bug (a negative number cast to size_t, say), not a wish for more threads.
  static constexpr std::size_t max_threads = 1024;

  /// n_threads in 1..max_threads threads in all; the thread calling
  /// parallel_for is one of them, so n_threads - 1 workers are started.
  explicit thread_pool(std::size_t n_threads)
      : n_threads_(n_threads), oversubscribed_(n_threads > std::thread::hardware_concurrency()) {
    require(n_threads >= 1, "thread_pool: n_threads must be at least 1");
    require(n_threads <= max_threads, "thread_pool: n_threads = " + std::to_string(n_threads) +
                                          " exceeds the limit of " + std::to_string(max_threads));
    workers_.reserve(n_threads - 1);
    try {
      for (std::size_t i = 1; i < n_threads; ++i) workers_.emplace_back([this, i] { worker_loop(i); });
    } catch (...) {
      shutdown();
      throw;
    }
  }
  thread_pool(const thread_pool&) = delete;
  thread_pool& operator=(const thread_pool&) = delete;
  ~thread_pool() { shutdown(); }

  std::size_t size() const noexcept { return n_threads_; }

  /// Halving rounds of the guided schedule (chunk_begin): at most
  /// max_rounds + 1 chunks per thread and call keeps the claiming cost (one
  /// contended compare-exchange per chunk, ~100 ns) small against a decode
  /// matvec (tens of microseconds).
  static constexpr std::size_t max_rounds = 4;

  /// How many chunks parallel_for(n, f) splits [0, n) into: a few per
  /// thread, so a thread that the OS deschedules (2 cores shared with other
  /// processes) holds up at most one chunk while the others take the rest,
  /// instead of a whole 1/size() share. The chunks shrink (chunk_begin):
  /// rounds(n, max_r) + 1 per thread.
  std::size_t chunk_count(std::size_t n, std::size_t max_r = max_rounds) const noexcept {
    return chunk_count_in(n, rounds(n, max_r));
  }

  /// Where chunk i (< chunk_count(n)) of [0, n) begins; chunk i ends where
  /// chunk i + 1 begins (chunk_begin(chunk_count(n), n) = n). The schedule
  /// is guided: chunks are claimed in order, round r of size() chunks each
  /// of 2^-(r+1) of a thread's share, r < R = rounds(n), then a last round
  /// the size of round R - 1's, so every thread's chunks sum to its share.
  /// The last chunks are small: when one thread takes the last chunk, the
  /// others wait at most its length, 1/2^R of a share (1/16 at R = 4, 1/32
  /// of the call on 2 threads), where chunks of equal length (4 per thread,
  /// before) made them wait up to 1/4 of a share. A decode matvec is tens
  /// of microseconds, so that wait was a few percent of decode on 2
  /// threads. The price: a thread descheduled in its first chunk holds up
  /// half a share instead of a quarter. Measured (Zen 3 guest, 2 threads,
  /// 110M q4_0, per-token decode times alternated with the equal chunks,
  /// with matvec_fused's single quantization, bench/README.md): median
  /// token 0.93-0.98 of before.
  /// max_r caps the rounds (parallel_for's argument; 0: one chunk per
  /// thread, each its share).
  std::size_t chunk_begin(std::size_t i, std::size_t n, std::size_t max_r = max_rounds) const noexcept {
    return chunk_begin_in(i, n, rounds(n, max_r));
  }

  /// Splits [0, n) into chunk_count(n, max_r) contiguous chunks, longest
  /// first (chunk_begin), and calls f(begin, end) once per chunk; the caller and the
  /// workers claim chunks one at a time until none is left (a worker that
  /// has not woken up by then simply misses the call). Returns when all are
  /// done. The first exception thrown by f is rethrown here after every
  /// chunk has finished. Throws invalid_argument, touching nothing, when
  /// another thread's call on this pool is running.
  template <class F>
  void parallel_for(std::size_t n, F&& f, std::size_t max_r = max_rounds) {
    run(n, std::forward<F>(f), rounds(n, max_r), 0);
  }

  /// The most chunks one call can have (the claim counter's 16 bits).
  static constexpr std::size_t max_chunks = 0xffff;

  /// As parallel_for, but in chunks of `chunk` items each (the last one
  /// shorter), claimed in order: [0, chunk), [chunk, 2 chunk), ... A chunk
  /// of 0 counts as 1, and one too small for max_chunks chunks is enlarged
  /// to ceil(n / max_chunks). For decode's float products, whose threads
  /// then read neighbouring stretches of a matrix and share its end to
  /// within one chunk (cpu/matvec.hpp, float_decode_for).
  template <class F>
  void parallel_for_chunks(std::size_t n, std::size_t chunk, F&& f) {
    run(n, std::forward<F>(f), 0, std::max({chunk, std::size_t{1}, (n + max_chunks - 1) / max_chunks}));
  }

 private:
  /// One call: the guided schedule of r rounds (chunk_begin_in) when chunk
  /// is 0, else chunks of `chunk` items.
  template <class F>
  void run(std::size_t n, F&& f, std::size_t r, std::size_t chunk) {
    if (n == 0) return;
    if (n_threads_ == 1 || n == 1 || current_pool() == this) {
      f(std::size_t{0}, n);
      return;
    }
    // Acquire pairs with the release below: this call sees everything the
    // previous one (on whatever thread) did.
    if (busy_.exchange(true, std::memory_order_acquire))
      throw invalid_argument(
          "thread_pool: parallel_for called concurrently from two threads; a pool runs one call at a time "
          "(give each calling thread its own pool)");
    struct release_busy {
      std::atomic<bool>& busy;
      ~release_busy() { busy.store(false, std::memory_order_release); }
    } const release{busy_};
    using fn_t = std::remove_reference_t<F>;
    const std::uint64_t total = chunk ? (n + chunk - 1) / chunk : chunk_count_in(n, r);
    job_fn_ = [](void* ctx, std::size_t b, std::size_t e) { (*static_cast<fn_t*>(ctx))(b, e); };
    job_ctx_ = const_cast<void*>(static_cast<const void*>(std::addressof(f)));
    job_n_ = n;
    job_rounds_ = r;
    job_chunk_ = chunk;
    error_ = nullptr;
    done_chunks_.store(0, std::memory_order_relaxed);
    // Publishing the new generation (with its chunk count, next chunk 0)
    // releases the job above to whoever claims a chunk of it. The mutex and
    // notify (a futex call) are paid only when a worker has gone to sleep:
    // this store and the sleepers_ load, and a sleeper's increment and
    // state check (worker_loop), are all seq_cst, so either this load sees
    // the sleeper or the sleeper sees the new generation.
    generation_ += 1;
    state_.store(std::uint64_t{generation_} << 32 | total << 16, std::memory_order_seq_cst);
    if (sleepers_.load(std::memory_order_seq_cst) != 0) {
      { std::lock_guard lock(mutex_); }  // orders the notify after a sleeper's check
      wake_.notify_all();
    }

    run_chunks(generation_);

    // Wait for chunks that workers claimed and are still running: spin
    // first (a chunk is short), then sleep.
    auto all_done = [&] { return done_chunks_.load(std::memory_order_seq_cst) == total; };
    if (!spin_until(all_done)) {
      std::unique_lock lock(mutex_);
      caller_sleeping_.store(true, std::memory_order_seq_cst);
      done_.wait(lock, all_done);
      caller_sleeping_.store(false, std::memory_order_relaxed);
    }
    std::atomic_thread_fence(std::memory_order_acquire);  // the workers' chunks happen before our return
    if (error_) std::rethrow_exception(std::exchange(error_, nullptr));
  }

  /// How long a thread waiting for the next call (a worker) or for the
  /// call's last chunks (the caller) polls before it sleeps; sleeping costs
  /// the next call a futex wake, 10-45 us in a virtual machine. The gaps a
  /// decode step leaves are the other thread's last chunk (up to a few
  /// hundred microseconds for TinyLlama's f32 rows) and the serial work
  /// between products. 2000 PAUSEs, the bound before, are about 20 us on
  /// the AMX Xeon host (140-cycle PAUSE) and less on AMD: there the worker
  /// slept about once a layer, and the products after a sleep started
  /// 4-45 us late (a /tmp decode profile, TinyLlama q8_0, 2 threads;
  /// bench/README.md). Measured in time, not PAUSEs, so that it does not
  /// depend on the CPU. A pool with more threads than the machine has
  /// cores also yields the core every 64 polls, so that a thread with work
  /// gets to run. bench/ab_decode.sh against the 2000 PAUSEs, median
  /// [quartiles] of the token time (the control: the old build listed
  /// again): TinyLlama q8_0 0.943 [0.937, 0.952] (control 1.010) and 0.959
  /// in a second run, f32 0.972 [0.969, 0.975] (1.003), q4_0 1.010
  /// (0.996; in a second run the old build read 1.018 of the new); 110M
  /// q8_0 1.016 [0.995, 1.029] (1.007), and its 512-token prompt 0.973
  /// [0.958, 0.983] (1.004).
  static constexpr std::chrono::microseconds spin_time{1000};
  /// Polls done() with PAUSE (and yields, oversubscribed_) until it holds
  /// or spin_time has passed; returns done().
  template <class Done>
  bool spin_until(Done&& done) const noexcept {
    const auto until = std::chrono::steady_clock::now() + spin_time;
    for (unsigned i = 1;; ++i) {
      if (done()) return true;
      detail::cpu_relax();
      if (i % 64 == 0) {
        if (std::chrono::steady_clock::now() >= until) return done();
        if (oversubscribed_) std::this_thread::yield();
      }
    }
  }
  /// The guided schedule's rounds for n items: the most, up to max_r (and
  /// max_rounds), that leave every chunk at least one item (size() << R <= n).
  std::size_t rounds(std::size_t n, std::size_t max_r = max_rounds) const noexcept {
    std::size_t r = 0;
    while (r < std::min(max_r, max_rounds) && (n_threads_ << (r + 1)) <= n) ++r;
    return r;
  }

  /// chunk_count and chunk_begin with the rounds given (r_max = rounds(n, max_r)).
  std::size_t chunk_count_in(std::size_t n, std::size_t r_max) const noexcept {
    if (n_threads_ == 1) return n ? 1 : 0;
    if (n < n_threads_) return n;
    return n_threads_ * (r_max + 1);
  }
  std::size_t chunk_begin_in(std::size_t i, std::size_t n, std::size_t r_max) const noexcept {
    const std::size_t t = n_threads_;
    if (t == 1) return i == 0 ? 0 : n;  // one chunk, run inline
    if (n < t) return std::min(i, n);
    const std::size_t total = t * (r_max + 1);
    if (i >= total) return n;
    // In units of the last round's chunks: u = t << r_max in all.
    const std::size_t r = i / t, j = i % t;
    const std::size_t before = r < r_max ? t * ((std::size_t{1} << r_max) - (std::size_t{1} << (r_max - r))) +
                                               j * (std::size_t{1} << (r_max - r - 1))
                                         : t * ((std::size_t{1} << r_max) - 1) + j;
    return before * n / (t << r_max);
  }

  static thread_pool*& current_pool() noexcept {
    thread_local thread_pool* pool = nullptr;
    return pool;
  }

  /// Claims and runs chunks of generation `gen` until none is left (or the
  /// call has moved on). state_ packs (generation << 32 | total << 16 |
  /// next): a claim is a compare-exchange that fails once the generation
  /// changes, so a late worker never touches a newer call's counter, and
  /// the job fields are read only after a successful claim, while the
  /// caller is still waiting for that chunk.
  void run_chunks(std::uint32_t gen) noexcept {
    std::uint64_t s = state_.load(std::memory_order_acquire);
    for (;;) {
      if (static_cast<std::uint32_t>(s >> 32) != gen) return;
      const std::uint64_t total = (s >> 16) & 0xffff, next = s & 0xffff;
      if (next >= total) return;
      if (!state_.compare_exchange_weak(s, s + 1, std::memory_order_acq_rel, std::memory_order_acquire)) continue;
      const std::size_t n = job_n_, r = job_rounds_, c = job_chunk_;
      const std::size_t b = c ? std::min(n, next * c) : chunk_begin_in(next, n, r);
      const std::size_t e = c ? std::min(n, (next + 1) * c) : chunk_begin_in(next + 1, n, r);
      thread_pool* const outer = std::exchange(current_pool(), this);
      try {
        job_fn_(job_ctx_, b, e);
      } catch (...) {
        std::lock_guard lock(error_mutex_);
        if (!error_) error_ = std::current_exception();
      }
      current_pool() = outer;
      if (done_chunks_.fetch_add(1, std::memory_order_seq_cst) + 1 == total &&
          caller_sleeping_.load(std::memory_order_seq_cst)) {
        // Only when the caller gave up spinning. Its flag store and check,
        // and this increment and flag load, are seq_cst: either it sees the
        // count or we see the flag. Taking the mutex orders the notify
        // after its check (made under the mutex).
        std::lock_guard lock(mutex_);
        done_.notify_one();
      }
      s = state_.load(std::memory_order_acquire);
    }
  }

  void worker_loop(std::size_t) {
    // Generation 0 is the pool's start, not a job. (Reading state_ here
    // instead would miss a first call made before this thread got going.)
    std::uint32_t seen = 0;
    auto generation = [&] { return static_cast<std::uint32_t>(state_.load(std::memory_order_seq_cst) >> 32); };
    for (;;) {
      std::uint32_t g = seen;
      spin_until([&] { return (g = generation()) != seen; });
      if (g == seen) {
        std::unique_lock lock(mutex_);
        sleepers_.fetch_add(1, std::memory_order_seq_cst);
        wake_.wait(lock, [&] { return generation() != seen; });
        sleepers_.fetch_sub(1, std::memory_order_relaxed);
        g = generation();
      }
      seen = g;
      if (stop_.load(std::memory_order_acquire)) return;
      run_chunks(g);
    }
  }

  void shutdown() noexcept {
    {
      std::lock_guard lock(mutex_);
      stop_.store(true, std::memory_order_release);
      generation_ += 1;
      state_.store(std::uint64_t{generation_} << 32, std::memory_order_seq_cst);  // no chunks
    }
    wake_.notify_all();
    for (auto& w : workers_)
      if (w.joinable()) w.join();
    workers_.clear();
  }

  std::size_t n_threads_;
  bool oversubscribed_;  // more threads than hardware threads (unknown counts as 0): idle polls yield
  std::vector<std::thread> workers_;  // (n_threads_ - 1)

  // The published job; written by the caller before bumping generation_.
  void (*job_fn_)(void*, std::size_t, std::size_t) = nullptr;
  void* job_ctx_ = nullptr;
  std::size_t job_n_ = 0;
  std::size_t job_rounds_ = 0;  // rounds(job_n_, the call's max_r)
  std::size_t job_chunk_ = 0;   // items per chunk (parallel_for_chunks), or 0: guided

  std::uint32_t generation_ = 0;        // the current call's number; written by the caller only
  std::atomic<std::uint64_t> state_{0};  // (generation << 32 | chunks << 16 | next chunk to claim)
  std::atomic<std::uint32_t> done_chunks_{0};  // chunks of the current call finished
  std::atomic<bool> stop_{false};
  std::atomic<bool> busy_{false};    // a parallel_for is running (not counting inline nested calls)
  std::atomic<std::uint32_t> sleepers_{0};    // workers asleep (or about to be) on wake_
  std::atomic<bool> caller_sleeping_{false};  // the caller is asleep (or about to be) on done_
  std::mutex mutex_;                 // guards sleeping on wake_ and done_
  std::condition_variable wake_;     // workers sleep here between calls
  std::condition_variable done_;     // the caller sleeps here until every chunk is done

  std::mutex error_mutex_;
  std::exception_ptr error_;
};

/// Below this many multiply-adds a kernel runs on the calling thread alone.
/// One parallel_for costs ~0.3 us when the workers are spinning but 50-100 us
/// when one has to be woken (or is descheduled on a busy machine), while 64K
/// multiply-adds take ~4-8 us on one core: splitting less work than that
/// loses whenever the workers have gone to sleep, which is what happens
/// between the few large products of a small model. (Measured on
/// stories260K, whose matrices have 4K-33K elements: with 2 threads its
/// decode fell to ~200-300 tokens/s under load when everything was split,
/// and was still 1.5-2x slower than 1 thread with a 32K threshold, because
/// the 32K-element classifier woke the sleeping worker once per token.)
inline constexpr std::size_t min_parallel_work = std::size_t{1} << 16;

/// The least work (multiply-adds) of a last-round chunk that
/// parallel_for(pool, n, f, work) lets the guided schedule make: the
/// rounds stop before the chunks get smaller (guided_rounds). Each chunk
/// starts its reads of memory afresh (decode's kernels: two streams per
/// thread, cold), so a small region pays for many chunks more than it
/// gains in balance. Measured (Zen 3 guest, 2 threads, a /tmp version of
/// bench/ab_decode.sh with an f32 KV cache, 110M Q4_K_M, median token
/// time over one chunk per thread / guided with 4 rounds): every region at 0 rounds 0.963 [0.905, 0.997],
/// at 1 round 0.970, at 2 rounds 0.982 (122 rounds); TinyLlama Q4_K_M
/// 1.007 [0.962, 1.057] at 0 rounds, 1.011 at 1 (50 rounds): its matrices
/// are 4-50 times larger. With 2^20, the 110M regions of q, k, v and o,
/// gate and up, and down (0.6-3.1 M) take 0 rounds and its output matrix
/// (24.6 M) 3; TinyLlama's take 1-4; prefill keeps 4. This cap against
/// 4 rounds everywhere, 110M Q4_K_M: 0.977 [0.921, 1.037] (216 rounds,
/// beside 0 rounds everywhere at 0.981), and 0.988 [0.942, 1.045] with an
/// f16 cache (bench/ab_decode.sh, 204 rounds).
inline constexpr std::size_t min_chunk_work = std::size_t{1} << 20;

/// The rounds (thread_pool::chunk_begin) for `work` on n_threads: the
/// most, up to thread_pool::max_rounds, whose last chunks (1 / (n_threads
/// 2^R) of the work) hold min_chunk_work or more.
inline constexpr std::size_t guided_rounds(std::size_t work, std::size_t n_threads) noexcept {
  std::size_t r = 0;
  while (r < thread_pool::max_rounds && work / (n_threads << (r + 1)) >= min_chunk_work) ++r;
  return r;
}

/// Runs f(0, n) on the pool, or inline when pool is null or `work` (in
/// multiply-adds, or any comparable unit) is below min_parallel_work; the
/// pool's chunks no smaller than min_chunk_work (guided_rounds).
template <class F>
inline void parallel_for(thread_pool* pool, std::size_t n, F&& f, std::size_t work) {
  if (work < min_parallel_work) pool = nullptr;
  if (pool)
    pool->parallel_for(n, std::forward<F>(f), guided_rounds(work, pool->size()));
  else if (n)
    f(std::size_t{0}, n);
}

/// Runs f(0, n) on the pool, or inline when pool is null.
template <class F>
inline void parallel_for(thread_pool* pool, std::size_t n, F&& f) {
  if (pool)
    pool->parallel_for(n, std::forward<F>(f));
  else if (n)
    f(std::size_t{0}, n);
}

}  // namespace kestrel::cpu
