// kestrel/sampler/candidates.hpp: the working set of a sampling chain, and
// the steps (penalties, top-k, top-p, min-p, temperature) and the final
// draw that operate on it.
//
// Steps are small value types with `apply(candidate_set&) const`; they can be
// composed in any order by hand, and `sampler_chain` (chain.hpp) composes them
// in llama.cpp's default order. Each step follows llama.cpp's semantics for
// the same parameter, including the values that disable it.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <span>
#include <string_view>
#include <utility>
#include <vector>

#include "kestrel/core/token.hpp"
#include "kestrel/sampler/detail/check.hpp"
#include "kestrel/sampler/rng.hpp"

namespace kestrel {

/// One token still in the running.
struct candidate {
  token_id id;
  float logit;
  double weight;  // scratch: exp(logit - max logit), written by top-p and the draw
};

/// The candidates of one sampling step. The vector is scratch kept between
/// calls: after the first call for a given n_vocab, nothing allocates.
///
/// "Sorted" means in the total order (logit descending, id ascending); the
/// id tie-break makes every sort deterministic without std::stable_sort
/// (which allocates) and keeps the lowest id first among equal logits, like
/// greedy.
class candidate_set {
 public:
  /// Every token whose logit is > -inf, in index order. `logits` must have
  /// passed detail::checked_argmax (no NaN / +inf, at least one finite).
  void assign(std::span<const float> logits) {
    data_.clear();
    data_.reserve(logits.size());
    for (std::size_t i = 0; i < logits.size(); ++i)
      if (logits[i] > -std::numeric_limits<float>::infinity())
        data_.push_back({static_cast<token_id>(i), logits[i], 0.0});
    sorted_ = false;
  }

  std::span<candidate> items() noexcept { return data_; }
  std::span<const candidate> items() const noexcept { return data_; }
  std::size_t size() const noexcept { return data_.size(); }
  bool sorted() const noexcept { return sorted_; }

  static constexpr bool before(const candidate& a, const candidate& b) noexcept {
    return a.logit > b.logit || (a.logit == b.logit && a.id < b.id);
  }
  void sort() {
    if (!sorted_) std::sort(data_.begin(), data_.end(), before);
    sorted_ = true;
  }
  /// Sorts only the first k (k < size) and drops the rest: O(n log k).
  void keep_top(std::size_t k) {
    if (k >= data_.size()) return;
    if (!sorted_) std::partial_sort(data_.begin(), data_.begin() + static_cast<std::ptrdiff_t>(k), data_.end(), before);
    shrink_to(k);
    sorted_ = true;
  }
  /// Keeps the first n (n >= 1) in the current order.
  void truncate(std::size_t n) {
    if (n < data_.size()) shrink_to(std::max<std::size_t>(n, 1));
  }
  /// Keeps the candidates satisfying `pred`, in their current order.
  template <class Pred>
  void keep_if(Pred pred) {
    data_.erase(std::remove_if(data_.begin(), data_.end(), [&](const candidate& c) { return !pred(c); }), data_.end());
  }
  /// Drops the sorted flag after a step that may reorder or merge logits.
  void mark_unsorted() noexcept { sorted_ = false; }

  float max_logit() const noexcept {
    if (sorted_) return data_.front().logit;
    float m = -std::numeric_limits<float>::infinity();
    for (const auto& c : data_) m = std::max(m, c.logit);
    return m;
  }
  /// Writes weight = exp(logit - max) for each candidate; returns their sum.
  /// Double, summed in the current order: the mass of 128k tokens in float
  /// would lose the small ones, and a fixed order keeps it deterministic.
  double compute_weights() noexcept {
    const double m = max_logit();
    double total = 0.0;
    for (auto& c : data_) {
      c.weight = std::exp(static_cast<double>(c.logit) - m);
      total += c.weight;
    }
    return total;
  }

 private:
  // erase, not resize: resize has a growing branch that g++ 12 warns about
  // (-Warray-bounds) even where the size only shrinks.
  void shrink_to(std::size_t n) { data_.erase(data_.begin() + static_cast<std::ptrdiff_t>(n), data_.end()); }

  std::vector<candidate> data_;  // (<= n_vocab) candidates; capacity reused across calls
  bool sorted_ = false;
};

/// Repetition, frequency and presence penalties over the last `last_n`
/// tokens of the sequence (llama.cpp's penalties sampler): a candidate seen
/// c > 0 times there has its logit divided by `repeat` when positive,
/// multiplied by it otherwise (so a penalty > 1 always lowers it), then
/// lowered by c * freq + present. last_n == 0, or repeat == 1 with freq ==
/// present == 0, disables it. The history is what accept() was given since
/// construction or reset(), the oldest forgotten past last_n; its storage
/// is allocated once, at construction.
class penalties_step {
 public:
  explicit penalties_step(std::int32_t last_n = 0, float repeat = 1.0f, float freq = 0.0f, float present = 0.0f,
                          std::string_view who = "penalties_step")
      : last_n_(last_n), repeat_(repeat), freq_(freq), present_(present) {
    if (last_n < 0 || last_n > max_last_n)
      detail::throw_param(who, "penalty_last_n", last_n, "must be in [0, 2^24]; 0 disables the penalties");
    if (!(repeat > 0.0f && repeat < std::numeric_limits<float>::infinity()))
      detail::throw_param(who, "penalty_repeat", repeat, "must be finite and > 0; 1 disables it");
    if (!std::isfinite(freq)) detail::throw_param(who, "penalty_freq", freq, "must be finite; 0 disables it");
    if (!std::isfinite(present)) detail::throw_param(who, "penalty_present", present, "must be finite; 0 disables it");
    if (active()) {
      ring_.resize(static_cast<std::size_t>(last_n));
      counts_.reserve(static_cast<std::size_t>(last_n));
    }
  }

  /// The longest history: 16M tokens (64 MiB of it), beyond any context.
  static constexpr std::int32_t max_last_n = std::int32_t(1) << 24;

  bool active() const noexcept { return last_n_ > 0 && !(repeat_ == 1.0f && freq_ == 0.0f && present_ == 0.0f); }

  /// Token t joins the history (and the oldest leaves it when full).
  void accept(token_id t) {
    if (!active()) return;
    if (size_ == ring_.size()) {  // full: the oldest leaves, t takes its place
      const auto it = find(counts_, ring_[head_]);
      if (--it->second == 0) counts_.erase(it);
      ring_[head_] = t;
      head_ = (head_ + 1) % ring_.size();
    } else {
      ring_[(head_ + size_) % ring_.size()] = t;
      ++size_;
    }
    if (auto it = find(counts_, t); it != counts_.end()) ++it->second;
    else counts_.push_back({t, 1});  // within the capacity reserved: at most last_n distinct
  }

  void reset() noexcept {
    head_ = size_ = 0;
    counts_.clear();
  }

  /// Penalizes the candidates seen in the history. `c` must still be in id
  /// order (as candidate_set::assign leaves it): the first step of a chain.
  void apply(candidate_set& c) const {
    if (!active() || counts_.empty()) return;
    const auto items = c.items();
    for (const auto& [id, n] : counts_) {
      const auto it = std::lower_bound(items.begin(), items.end(), id,
                                       [](const candidate& x, token_id v) { return x.id < v; });
      if (it == items.end() || it->id != id) continue;  // masked (-inf) or out of the vocabulary
      it->logit = it->logit <= 0.0f ? it->logit * repeat_ : it->logit / repeat_;
      it->logit -= static_cast<float>(n) * freq_ + present_;
    }
    c.mark_unsorted();
  }

  std::int32_t last_n() const noexcept { return last_n_; }
  /// How many times t is in the history (for tests and diagnostics).
  std::int32_t count(token_id t) const noexcept {
    const auto it = find(counts_, t);
    return it == counts_.end() ? 0 : it->second;
  }

 private:
  /// The entry of t in `counts` (counts_, const or not), or its end.
  template <class Counts>
  static auto find(Counts& counts, token_id t) -> decltype(counts.begin()) {
    return std::find_if(counts.begin(), counts.end(), [t](const auto& e) { return e.first == t; });
  }

  std::int32_t last_n_;
  float repeat_, freq_, present_;
  std::vector<token_id> ring_;  // (last_n) the history, oldest at head_
  std::size_t head_ = 0, size_ = 0;
  std::vector<std::pair<token_id, std::int32_t>> counts_;  // (<= last_n) distinct tokens of the history
};

/// Keeps the k candidates with the largest logits (ties: lowest id).
/// k == 0 disables it; k >= size keeps everything (llama.cpp: k <= 0 off).
class top_k_step {
 public:
  explicit top_k_step(std::int32_t k = 0, std::string_view who = "top_k_step") : k_(k) {
    if (k < 0) detail::throw_param(who, "top_k", k, "must be >= 0; 0 disables top-k");
  }
  void apply(candidate_set& c) const {
    if (k_ > 0) c.keep_top(static_cast<std::size_t>(k_));
  }
  std::int32_t k() const noexcept { return k_; }

 private:
  std::int32_t k_;
};

/// Nucleus sampling (Holtzman et al. 2019): keeps the smallest prefix of the
/// sorted candidates whose probability mass, softmax over the current
/// candidates, is >= p (at least one). p == 1 disables it.
class top_p_step {
 public:
  explicit top_p_step(float p = 1.0f, std::string_view who = "top_p_step") : p_(p) {
    if (!(p > 0.0f && p <= 1.0f)) detail::throw_param(who, "top_p", p, "must be in (0, 1]; 1 disables top-p");
  }
  void apply(candidate_set& c) const {
    if (p_ >= 1.0f || c.size() <= 1) return;
    const double total = c.compute_weights();
    if (!c.sorted()) {
      // Before sorting, drop candidates that cannot be in the nucleus. If the
      // m-th sorted candidate (probability q) is in it, the m-1 before it hold
      // mass < p, so the n-m+1 from it on hold > 1-p, each <= q: q > (1-p)/n.
      // Half that bound leaves a margin for rounding. For a 128k vocabulary
      // this leaves a few hundred candidates to sort instead of 128k.
      const double cut = 0.5 * (1.0 - static_cast<double>(p_)) / static_cast<double>(c.size()) * total;
      c.keep_if([cut](const candidate& x) { return x.weight >= cut; });
      c.sort();
    }
    const double target = static_cast<double>(p_) * total;
    double cum = 0.0;
    const auto items = c.items();
    for (std::size_t i = 0; i < items.size(); ++i) {
      cum += items[i].weight;
      if (cum >= target) {
        c.truncate(i + 1);
        return;
      }
    }
    // Rounding left the kept mass just under p: keep them all.
  }
  float p() const noexcept { return p_; }

 private:
  float p_;
};

/// Min-p (llama.cpp): keeps the candidates with probability >= p * p_max,
/// i.e. logit >= max_logit + log(p); the maximum always stays. 0 disables it.
/// Keeps the current order; O(n), no sort.
class min_p_step {
 public:
  explicit min_p_step(float p = 0.0f, std::string_view who = "min_p_step") : p_(p) {
    if (!(p >= 0.0f && p <= 1.0f)) detail::throw_param(who, "min_p", p, "must be in [0, 1]; 0 disables min-p");
  }
  void apply(candidate_set& c) const {
    if (p_ <= 0.0f || c.size() <= 1) return;
    const double threshold = static_cast<double>(c.max_logit()) + std::log(static_cast<double>(p_));
    c.keep_if([threshold](const candidate& x) { return static_cast<double>(x.logit) >= threshold; });
  }
  float p() const noexcept { return p_; }

 private:
  float p_;
};

/// Divides the logits by t (> 1 flattens, < 1 sharpens), after shifting them
/// so that the largest is 0. t == 0 keeps only
/// the largest logit (lowest id on ties), which makes the draw greedy.
class temperature_step {
 public:
  explicit temperature_step(float t = 1.0f, std::string_view who = "temperature_step") : t_(t) {
    if (!(t >= 0.0f && t < std::numeric_limits<float>::infinity()))
      detail::throw_param(who, "temperature", t, "must be finite and >= 0; 0 means greedy");
  }
  void apply(candidate_set& c) const {
    if (t_ == 1.0f) return;
    if (t_ == 0.0f) {
      if (!c.sorted()) {
        const auto items = c.items();
        const auto best = std::min_element(items.begin(), items.end(), candidate_set::before);
        std::swap(*items.begin(), *best);
      }
      c.truncate(1);
      return;
    }
    // (logit - max) / t rather than logit / t: the same softmax, but a tiny t
    // can then only push logits to -inf (weight 0), never to +inf, whose
    // softmax would be NaN.
    const float m = c.max_logit();
    for (auto& x : c.items()) x.logit = (x.logit - m) / t_;
    // Rounding can merge distinct logits into equal ones, which would break
    // the id tie-break of the sorted order.
    c.mark_unsorted();
  }
  float t() const noexcept { return t_; }

 private:
  float t_;
};

/// The final draw: one `next_double()` u in [0, 1) from the generator, then
/// the first candidate (in the set's current order) whose cumulative weight
/// exceeds u * total weight, weights exp(logit - max) in double. Consumes
/// exactly one generator step per call, even with a single candidate, so the
/// generator's position equals the number of draws.
class dist_step {
 public:
  token_id draw(candidate_set& c, splitmix64& rng) const {
    const double total = c.compute_weights();
    const double target = rng.next_double() * total;
    double cum = 0.0;
    const auto items = c.items();
    for (const auto& x : items) {
      cum += x.weight;
      if (target < cum) return x.id;
    }
    // u * total rounded up to total: the last candidate with weight (the
    // maximum has weight 1, so one exists).
    for (std::size_t i = items.size(); i-- > 0;)
      if (items[i].weight > 0.0) return items[i].id;
    return items.front().id;
  }
};

}  // namespace kestrel
