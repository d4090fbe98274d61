// kestrel/cpu/thread_pool.hpp: a persistent pool of threads for the kernels'
// parallel loops.
//
// The model calls parallel_for about ten times per layer per token, so one
// call must cost microseconds, not the tens of microseconds of creating
// threads or allocating: workers live as long as the pool, a call publishes
// a (function pointer, context) pair without allocating, workers spin briefly
// for the next call (the next matvec usually follows within microseconds) and
// then sleep on a condition variable so an idle pool costs no CPU.
//
// Contract: one parallel_for at a time per pool (the pool is not a queue):
// a second thread calling while a call is running gets invalid_argument
// rather than corrupting the published job. A nested call from inside f
// (on the caller or a worker) runs inline on the calling thread.
#pragma once

#include <atomic>
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
  explicit thread_pool(std::size_t n_threads) : n_threads_(n_threads) {
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

  /// Splits [0, n) into size() contiguous chunks of near-equal length and
  /// calls f(begin, end) once per non-empty chunk, the caller taking the
  /// first; returns when all are done. The first exception thrown by f is
  /// rethrown here after every chunk has finished. Throws invalid_argument,
  /// touching nothing, when another thread's call on this pool is running.
  template <class F>
  void parallel_for(std::size_t n, F&& f) {
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
    job_fn_ = [](void* ctx, std::size_t b, std::size_t e) { (*static_cast<fn_t*>(ctx))(b, e); };
    job_ctx_ = const_cast<void*>(static_cast<const void*>(std::addressof(f)));
    job_n_ = n;
    error_ = nullptr;
    pending_.store(static_cast<std::uint32_t>(n_threads_ - 1), std::memory_order_relaxed);
    // Release: workers that observe the new generation see the job above.
    // The bump happens under the mutex so a worker between its check and
    // its wait cannot miss it.
    {
      std::lock_guard lock(mutex_);
      generation_.fetch_add(1, std::memory_order_release);
    }
    wake_.notify_all();

    run_chunk(0);

    // Wait for the workers: spin first (chunks are balanced, so they finish
    // at about the same time as ours), then sleep.
    for (int spin = 0; spin < spin_iterations; ++spin) {
      if (pending_.load(std::memory_order_acquire) == 0) break;
      detail::cpu_relax();
    }
    if (pending_.load(std::memory_order_acquire) != 0) {
      std::unique_lock lock(mutex_);
      done_.wait(lock, [&] { return pending_.load(std::memory_order_acquire) == 0; });
    }
    if (error_) std::rethrow_exception(std::exchange(error_, nullptr));
  }

 private:
  // A few tens of microseconds of spinning (PAUSE is ~10-140 cycles): longer
  // than the gap between two kernels of a layer, short enough not to starve
  // other threads when the pool has more threads than cores.
  static constexpr int spin_iterations = 2000;

  static thread_pool*& current_pool() noexcept {
    thread_local thread_pool* pool = nullptr;
    return pool;
  }

  void run_chunk(std::size_t i) noexcept {
    // Chunk i is [i*n/T, (i+1)*n/T): lengths differ by at most one.
    const std::size_t n = job_n_, t = n_threads_;
    const std::size_t b = i * n / t, e = (i + 1) * n / t;
    if (b == e) return;
    thread_pool* const outer = std::exchange(current_pool(), this);
    try {
      job_fn_(job_ctx_, b, e);
    } catch (...) {
      std::lock_guard lock(error_mutex_);
      if (!error_) error_ = std::current_exception();
    }
    current_pool() = outer;
  }

  void worker_loop(std::size_t index) {
    // Generation 0 is the pool's start, not a job. (Reading generation_ here
    // instead would miss a first call made before this thread got going.)
    std::uint32_t seen = 0;
    for (;;) {
      std::uint32_t g = seen;
      for (int spin = 0; spin < spin_iterations && g == seen; ++spin) {
        detail::cpu_relax();
        g = generation_.load(std::memory_order_acquire);
      }
      if (g == seen) {
        std::unique_lock lock(mutex_);
        wake_.wait(lock, [&] { return generation_.load(std::memory_order_acquire) != seen; });
        g = generation_.load(std::memory_order_acquire);
      }
      seen = g;
      if (stop_.load(std::memory_order_acquire)) return;
      run_chunk(index);
      if (pending_.fetch_sub(1, std::memory_order_acq_rel) == 1) {
        // Taking the mutex orders this notify after the caller's check of
        // pending_ (done under the same mutex), so the wakeup cannot be lost.
        std::lock_guard lock(mutex_);
        done_.notify_one();
      }
    }
  }

  void shutdown() noexcept {
    {
      std::lock_guard lock(mutex_);
      stop_.store(true, std::memory_order_release);
      generation_.fetch_add(1, std::memory_order_release);
    }
    wake_.notify_all();
    for (auto& w : workers_)
      if (w.joinable()) w.join();
    workers_.clear();
  }

  std::size_t n_threads_;
  std::vector<std::thread> workers_;  // (n_threads_ - 1)

  // The published job; written by the caller before bumping generation_.
  void (*job_fn_)(void*, std::size_t, std::size_t) = nullptr;
  void* job_ctx_ = nullptr;
  std::size_t job_n_ = 0;

  std::atomic<std::uint32_t> generation_{0};  // bumped once per call (and at shutdown)
  std::atomic<std::uint32_t> pending_{0};     // workers still running the current call
  std::atomic<bool> stop_{false};
  std::atomic<bool> busy_{false};    // a parallel_for is running (not counting inline nested calls)
  std::mutex mutex_;                 // guards sleeping: bumps of generation_, the last pending_ notify
  std::condition_variable wake_;     // workers sleep here between calls
  std::condition_variable done_;     // the caller sleeps here until pending_ == 0

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

/// Runs f(0, n) on the pool, or inline when pool is null or `work` (in
/// multiply-adds, or any comparable unit) is below min_parallel_work.
template <class F>
inline void parallel_for(thread_pool* pool, std::size_t n, F&& f, std::size_t work) {
  if (work < min_parallel_work) pool = nullptr;
  if (pool)
    pool->parallel_for(n, std::forward<F>(f));
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
