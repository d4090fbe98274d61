// kestrel/sampler/greedy.hpp: argmax sampling (temperature 0).
#pragma once

#include <span>

#include "kestrel/core/token.hpp"
#include "kestrel/sampler/concepts.hpp"
#include "kestrel/sampler/detail/check.hpp"

namespace kestrel {

/// The token with the largest logit; on ties the lowest index (what run.c's
/// argmax and llama.cpp's greedy sampler do, so golden greedy texts match).
/// Stateless and deterministic; does not modify the logits. Throws
/// invalid_argument on empty logits, NaN or +inf, or all -inf.
class greedy_sampler {
 public:
  token_id sample(std::span<float> logits) const { return detail::checked_argmax(logits, "greedy_sampler"); }
  void reset() noexcept {}
};

static_assert(Sampler<greedy_sampler>);
static_assert(Sampler<const greedy_sampler>);

}  // namespace kestrel
