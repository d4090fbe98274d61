// kestrel/sampler/chain.hpp: the configurable sampler, llama.cpp style:
// top-k -> top-p -> min-p -> temperature -> draw.
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
};

/// Throws invalid_argument naming the first bad parameter and its value.
inline void validate(const sampler_params& p) {
  constexpr std::string_view who = "sampler_params";
  (void)temperature_step(p.temperature, who);
  (void)top_k_step(p.top_k, who);
  (void)top_p_step(p.top_p, who);
  (void)min_p_step(p.min_p, who);
}

/// Top-k, top-p, min-p, temperature, then a draw with a seeded splitmix64:
/// llama.cpp's default chain order (common/sampling.cpp) without its
/// penalties, DRY, typical-p and XTC stages. The filters see the untempered
/// logits, as in llama.cpp; temperature only reshapes the survivors.
///
/// - temperature == 0: the lowest-index argmax of the raw logits, no random
///   draw (every filter keeps the argmax, so this equals running them).
/// - Otherwise exactly one splitmix64 step per call (see dist_step).
/// - Does not modify `logits`; -inf logits are never drawn.
/// - Scratch (the candidate vector) is kept: no allocation after the first
///   call for a given n_vocab.
/// - reset() rewinds the generator to the seed.
class sampler_chain {
 public:
  explicit sampler_chain(const sampler_params& p = {})
      : params_(p),
        temperature_(p.temperature, "sampler_params"),
        top_k_(p.top_k, "sampler_params"),
        top_p_(p.top_p, "sampler_params"),
        min_p_(p.min_p, "sampler_params"),
        rng_(p.seed) {}

  token_id sample(std::span<float> logits) {
    const token_id best = detail::checked_argmax(logits, "sampler_chain");
    if (params_.temperature == 0.0f) return best;
    candidates_.assign(logits);
    top_k_.apply(candidates_);
    top_p_.apply(candidates_);
    min_p_.apply(candidates_);
    temperature_.apply(candidates_);
    return dist_step{}.draw(candidates_, rng_);
  }

  void reset() noexcept { rng_ = splitmix64(params_.seed); }

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
  splitmix64 rng_;
  candidate_set candidates_;  // (<= n_vocab) scratch
};

static_assert(Sampler<sampler_chain>);
static_assert(ResettableSampler<sampler_chain>);

}  // namespace kestrel
