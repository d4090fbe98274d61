// kestrel/sampler/detail/check.hpp: argument checks shared by the samplers
// (private: not part of the API).
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdio>
#include <limits>
#include <span>
#include <string>
#include <string_view>

#include "kestrel/core/error.hpp"
#include "kestrel/core/token.hpp"

namespace kestrel::detail {

/// "%g" of a float: std::to_string prints 6 fixed decimals (0.000000 for
/// 1e-9) and g++ 12 has no <format>.
inline std::string format_number(double v) {
  if (std::isnan(v)) return "nan";
  char buf[32];
  // Whole numbers (a count such as top_k) in full, not as 2e+09.
  if (v == std::trunc(v) && std::fabs(v) < 1e15) std::snprintf(buf, sizeof buf, "%.0f", v);
  else std::snprintf(buf, sizeof buf, "%.9g", v);
  return buf;
}

[[noreturn]] inline void throw_param(std::string_view who, std::string_view name, double value,
                                     std::string_view must) {
  throw invalid_argument(std::string(who) + ": " + std::string(name) + " = " + format_number(value) + " is invalid (" +
                         std::string(must) + ")");
}

/// Index of the first maximum of `logits` (lowest index on ties), after
/// checking the contract of Sampler::sample: not empty, no NaN, no +inf,
/// at least one finite logit, and n_vocab representable as a token_id.
/// -inf logits are allowed (masked tokens). One pass, so greedy sampling pays
/// for the checks only with a few compares per element.
inline token_id checked_argmax(std::span<const float> logits, std::string_view who) {
  if (logits.empty()) throw invalid_argument(std::string(who) + ": empty logits (n_vocab = 0)");
  if (logits.size() > static_cast<std::size_t>(std::numeric_limits<token_id>::max()))
    throw invalid_argument(std::string(who) + ": n_vocab = " + std::to_string(logits.size()) +
                           " does not fit in token_id");
  std::size_t best = 0;
  float best_v = -std::numeric_limits<float>::infinity();
  for (std::size_t i = 0; i < logits.size(); ++i) {
    const float v = logits[i];
    // NaN fails every ordered compare, so test it first; +inf would make the
    // softmax NaN (inf - inf), so it is rejected as well.
    if (!(v < std::numeric_limits<float>::infinity())) {
      throw invalid_argument(std::string(who) + ": logits[" + std::to_string(i) + "] is " +
                             (std::isnan(v) ? "NaN" : "+inf") + " (n_vocab = " + std::to_string(logits.size()) + ")");
    }
    if (v > best_v) {  // strict: the first of equal maxima wins
      best = i;
      best_v = v;
    }
  }
  if (best_v == -std::numeric_limits<float>::infinity())
    throw invalid_argument(std::string(who) + ": every logit is -inf (n_vocab = " + std::to_string(logits.size()) +
                           "): nothing can be sampled");
  return static_cast<token_id>(best);
}

}  // namespace kestrel::detail
