// kestrel/sampler/chain.hpp: the configurable sampler, llama.cpp style:
// penalties -> top-k -> top-p -> min-p -> temperature -> draw.
#pragma once

#include <cstdint>
#include <span>

#include "kestrel/core/token.hpp"
#include "kestrel/sampler/candidates.hpp"
#include "kestrel/sampler/concepts.hpp"
#include "kestrel/sampler/detail/check.hpp"
#include "kestrel/sampler/rng.hpp"

namespace kestrel {

/// Sampling parameters with llama.cpp's defaults and meanings (common_params_sampling).
struct sampler_params {
  float temperature = 0.8f;  // >= 0, finite; 0 => greedy (argmax, no random draw)
  std::int32_t top_k = 40;   // >= 0; 0 => disabled
  float top_p = 0.95f;       // in (0, 1]; 1 => disabled
  float min_p = 0.05f;       // in [0, 1]; 0 => disabled
  /// Seed of the splitmix64 generator. Unlike llama.cpp (whose default means
  /// "random"), the default is a fixed 0: kestrel never seeds from the clock,
  /// so runs are reproducible unless the caller passes entropy.
  std::uint64_t seed = 0;
  /// Repetition penalties over the last penalty_last_n tokens of the sequence
  /// (the tokens given to accept(): generate() passes the prompt and every
  /// token it feeds back). llama.cpp's --repeat-last-n, --repeat-penalty,
  /// --frequency-penalty, --presence-penalty; its -1 ("the context size")
  /// is the caller's to resolve. (After the seed, which they followed, so
  /// that positional initializers of the fields above keep their meaning.)
  std::int32_t penalty_last_n = 64;  // >= 0; 0 => disabled
  float penalty_repeat = 1.0f;       // finite, > 0; 1 => disabled
  float penalty_freq = 0.0f;         // finite; 0 => disabled
  float penalty_present = 0.0f;      // finite; 0 => disabled
};

/// Throws invalid_argument naming the first bad parameter and its value.
inline void validate(const sampler_params& p) {
  constexpr std::string_view who = "sampler_params";
  (void)temperature_step(p.temperature, who);
  (void)top_k_step(p.top_k, who);
  (void)top_p_step(p.top_p, who);
  (void)min_p_step(p.min_p, who);
  (void)penalties_step(p.penalty_last_n, p.penalty_repeat, p.penalty_freq, p.penalty_present, who);
}

/// Penalties, top-k, top-p, min-p, temperature, then a draw with a seeded
/// splitmix64: llama.cpp's default chain order (common/sampling.cpp)
/// without its DRY, typical-p and XTC stages. The filters see the
/// untempered (penalized) logits, as in llama.cpp; temperature only
/// reshapes the survivors.
///
/// - temperature == 0: the lowest-index argmax of the penalized logits, no
///   random draw (every filter keeps the argmax, so this equals running
///   them).
/// - Otherwise exactly one splitmix64 step per call (see dist_step).
/// - Does not modify `logits`; -inf logits are never drawn.
/// - Scratch (the candidate vector) is kept: no allocation after the first
///   call for a given n_vocab.
/// - accept(t) adds t to the penalties' history; reset() rewinds the
///   generator to the seed and empties that history.
class sampler_chain {
 public:
  explicit sampler_chain(const sampler_params& p = {})
      : params_(p),
        temperature_(p.temperature, "sampler_params"),
        top_k_(p.top_k, "sampler_params"),
        top_p_(p.top_p, "sampler_params"),
        min_p_(p.min_p, "sampler_params"),
        penalties_(p.penalty_last_n, p.penalty_repeat, p.penalty_freq, p.penalty_present, "sampler_params"),
        rng_(p.seed) {}

  token_id sample(std::span<float> logits) {
    const token_id best = detail::checked_argmax(logits, "sampler_chain");
    const bool penalize = penalties_.active();
    if (params_.temperature == 0.0f && !penalize) return best;
    candidates_.assign(logits);
    penalties_.apply(candidates_);
    if (params_.temperature == 0.0f) {
      temperature_.apply(candidates_);  // keeps the largest penalized logit alone (lowest id on ties)
      return candidates_.items().front().id;
    }
    top_k_.apply(candidates_);
    top_p_.apply(candidates_);
    min_p_.apply(candidates_);
    temperature_.apply(candidates_);
    return dist_step{}.draw(candidates_, rng_);
  }

  void accept(token_id t) { penalties_.accept(t); }

  void reset() noexcept {
    rng_ = splitmix64(params_.seed);
    penalties_.reset();
  }

  const sampler_params& params() const noexcept { return params_; }
  /// The generator, e.g. to checkpoint its state().
  const splitmix64& rng() const noexcept { return rng_; }
  /// The candidates left before the last draw (for tests and diagnostics).
  const candidate_set& last_candidates() const noexcept { return candidates_; }

 private:
  sampler_params params_;
  temperature_step temperature_;
  top_k_step top_k_;
  top_p_step top_p_;
  min_p_step min_p_;
  penalties_step penalties_;
  splitmix64 rng_;
  candidate_set candidates_;  // (<= n_vocab) scratch
};

static_assert(Sampler<sampler_chain>);
static_assert(ResettableSampler<sampler_chain>);
static_assert(AcceptingSampler<sampler_chain>);

}  // namespace kestrel
