// kestrel/sampler/llama2c.hpp: the sampler of llama2.c run.c, reproduced
// operation for operation so that a kestrel model replays run.c's sampled
// texts for the same -t, -p and -s (e.g. doc/stories260K.md's
// "-t 1.0 -p 0.9 -s 133742" story).
//
// Written from run.c's documented behaviour, not copied. Everything is float
// with run.c's evaluation order, because a changed rounding moves a coin
// across a cumulative boundary now and then and the text diverges from there:
//   temperature == 0: argmax of the raw logits (lowest index on ties), no draw
//   else: logits[i] /= temperature            (float division, in place)
//         softmax in place: max, expf(x - max), float running sum, x /= sum
//         coin = llama2c_rng::next_float()    (exactly one draw per call)
//         topp <= 0 or topp >= 1: first i with coin < running float cdf, else n-1
//         else (nucleus): cutoff = (1.0f - topp) / float(n - 1);
//           keep i with prob >= cutoff; sort by prob descending;
//           last = first position where the float cumulative prob > topp
//                  (all kept when never exceeded);
//           r = coin * cumulative (float); first kept with r < float cdf,
//           else the last kept.
//
// Ties. run.c sorts with qsort and a comparator that returns 0 for equal
// probabilities, so the order of ties is the C library's. glibc's qsort is a
// merge sort (stable: ties stay in index order), and we use std::sort with
// (prob descending, index ascending), a strict total order that gives that
// same result with no allocation. Exact float ties in a softmax of real
// logits are rare; where a C library orders them otherwise, the texts can
// differ only at such a tie.
//
// Where run.c has undefined behaviour we define it:
//   - n_vocab == 1: token 0 (run.c's cutoff divides by zero and reads
//     probindex[-1]); the coin is still drawn.
//   - no probability reaches the cutoff (topp < 1/n_vocab with a flat
//     distribution; run.c reads probindex[-1]): the nucleus runs on all tokens.
//   - logits / temperature overflows (a tiny temperature): run.c's softmax
//     is NaN; we return the argmax, the limit as temperature -> 0 (coin drawn).
//   - NaN / +inf / all -inf / empty logits: invalid_argument (Sampler contract).
// Compile without -ffast-math: it reorders the float sums.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <span>
#include <vector>

#include "kestrel/core/token.hpp"
#include "kestrel/sampler/concepts.hpp"
#include "kestrel/sampler/detail/check.hpp"
#include "kestrel/sampler/rng.hpp"

namespace kestrel {

class llama2c_sampler {
 public:
  /// run.c's -t, -p and -s. temperature: finite, >= 0 (0 = greedy).
  /// topp: in [0, 1] (0 and 1 = plain multinomial). seed: != 0 (run.c maps
  /// 0 to time(NULL); xorshift would emit only zeros). `n_vocab_hint`
  /// reserves the scratch up front.
  llama2c_sampler(float temperature, float topp, std::uint64_t seed, std::size_t n_vocab_hint = 0)
      : temperature_(temperature), topp_(topp), seed_(seed), rng_(seed) {
    constexpr std::string_view who = "llama2c_sampler";
    if (!(temperature >= 0.0f && temperature < std::numeric_limits<float>::infinity()))
      detail::throw_param(who, "temperature", temperature, "must be finite and >= 0; 0 means greedy");
    if (!(topp >= 0.0f && topp <= 1.0f))
      detail::throw_param(who, "topp", topp, "must be in [0, 1]; 0 or 1 disables top-p");
    if (seed == 0)
      detail::throw_param(who, "seed", 0.0, "must be != 0: 0 is the xorshift fixed point, run.c replaces it with time(NULL)");
    probindex_.reserve(n_vocab_hint);
  }

  /// Overwrites `logits` with the probabilities (as run.c does), except at
  /// temperature 0.
  token_id sample(std::span<float> logits) {
    const token_id best = detail::checked_argmax(logits, "llama2c_sampler");
    if (temperature_ == 0.0f) return best;
    const std::size_t n = logits.size();
    for (float& x : logits) x /= temperature_;
    float max_val = logits[0];
    for (std::size_t i = 1; i < n; ++i)
      if (logits[i] > max_val) max_val = logits[i];
    if (!(max_val < std::numeric_limits<float>::infinity())) {
      rng_.next_float();
      return best;
    }
    float sum = 0.0f;
    for (float& x : logits) {
      x = std::exp(x - max_val);  // the float overload: expf, like run.c
      sum += x;
    }
    for (float& x : logits) x /= sum;

    const float coin = rng_.next_float();
    if (n == 1) return 0;
    if (topp_ <= 0.0f || topp_ >= 1.0f) return sample_mult(logits, coin);
    return sample_topp(logits, coin);
  }

  /// Rewinds the generator to the seed.
  void reset() noexcept { rng_ = llama2c_rng(seed_); }

  float temperature() const noexcept { return temperature_; }
  float topp() const noexcept { return topp_; }
  const llama2c_rng& rng() const noexcept { return rng_; }

 private:
  struct prob_index {
    float prob;
    token_id index;
  };

  static token_id sample_mult(std::span<const float> probs, float coin) {
    float cdf = 0.0f;
    for (std::size_t i = 0; i < probs.size(); ++i) {
      cdf += probs[i];
      if (coin < cdf) return static_cast<token_id>(i);
    }
    return static_cast<token_id>(probs.size() - 1);  // rounding left the cdf below the coin
  }

  token_id sample_topp(std::span<const float> probs, float coin) {
    const std::size_t n = probs.size();
    // Tokens below (1 - topp) / (n - 1) cannot be in the nucleus; dropping
    // them first is run.c's speed-up, and part of its exact semantics.
    const float cutoff = (1.0f - topp_) / static_cast<float>(n - 1);
    probindex_.clear();
    for (std::size_t i = 0; i < n; ++i)
      if (probs[i] >= cutoff) probindex_.push_back({probs[i], static_cast<token_id>(i)});
    if (probindex_.empty())
      for (std::size_t i = 0; i < n; ++i) probindex_.push_back({probs[i], static_cast<token_id>(i)});
    std::sort(probindex_.begin(), probindex_.end(), [](const prob_index& a, const prob_index& b) {
      return a.prob > b.prob || (a.prob == b.prob && a.index < b.index);
    });

    float cumulative = 0.0f;
    std::size_t last = probindex_.size() - 1;
    for (std::size_t i = 0; i < probindex_.size(); ++i) {
      cumulative += probindex_[i].prob;
      if (cumulative > topp_) {
        last = i;
        break;
      }
    }
    const float r = coin * cumulative;
    float cdf = 0.0f;
    for (std::size_t i = 0; i <= last; ++i) {
      cdf += probindex_[i].prob;
      if (r < cdf) return probindex_[i].index;
    }
    return probindex_[last].index;
  }

  float temperature_;
  float topp_;
  std::uint64_t seed_;
  llama2c_rng rng_;
  std::vector<prob_index> probindex_;  // (<= n_vocab) nucleus candidates, capacity reused
};

static_assert(Sampler<llama2c_sampler>);
static_assert(ResettableSampler<llama2c_sampler>);

}  // namespace kestrel
