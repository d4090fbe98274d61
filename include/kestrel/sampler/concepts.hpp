// kestrel/sampler/concepts.hpp: what the model and the engine need from a
// sampler, the policy that turns one row of logits into the next token.
#pragma once

#include <concepts>
#include <span>

#include "kestrel/core/token.hpp"

namespace kestrel {

/// @concept Sampler
/// A policy that picks the next token from the logits of one decode step.
///
/// **Models it**: a type `S` such that, for an lvalue `s` of type `S` and a
/// `std::span<float> logits`:
///
/// | expression          | type       | semantics |
/// |---|---|---|
/// | `s.sample(logits)`  | `token_id` | returns an index in `[0, logits.size())` |
///
/// **Semantics**
/// - `logits.size()` is `n_vocab`. The sampler may overwrite `logits` as
///   scratch (temperature scaling, softmax in place): a caller that still
///   needs the raw logits passes a copy. This avoids a copy per token for the
///   common case, where the logits are dead after sampling.
/// - Empty logits, NaN or +inf logits are a `kestrel::invalid_argument`, never
///   undefined behaviour. `-inf` is a valid logit (a masked token) and such a
///   token is never returned unless every token is masked, which is an error.
/// - Determinism: a sampler is a state machine over its random generator.
///   Two samplers built from the same parameters (and seed) and fed the same
///   sequence of logits return the same sequence of tokens, on every thread
///   count. The random generators in rng.hpp are bit-exact across compilers
///   and platforms; the probabilities come from `std::exp`, whose last bit is
///   the C library's, so across different libm's two builds can only differ
///   when a draw falls within an ulp of a cumulative-probability boundary.
/// - Complexity: `sample` is O(n_vocab) (greedy, min-p, top-k) or
///   O(n_vocab + m log m) with m the candidates left to sort (top-p), and
///   does not allocate after the first call for a given n_vocab.
///
/// **Optional expressions**, detected with `requires` (see `sampler_reset`
/// and `sampler_accept` below); a sampler without them behaves as if they
/// were no-ops:
///
/// | expression      | semantics |
/// |---|---|
/// | `s.reset()`     | return to the state right after construction (same seed: the same tokens again) |
/// | `s.accept(t)`   | observe token `t` appended to the sequence (prompt or generated), for samplers with history such as repetition penalties |
///
/// **Models in this folder**: `greedy_sampler` (greedy.hpp), `sampler_chain`
/// (chain.hpp), `llama2c_sampler` (llama2c.hpp).
template <class S>
concept Sampler = requires(S& s, std::span<float> logits) {
  { s.sample(logits) } -> std::same_as<token_id>;
};

/// A Sampler whose state can be rewound to its construction state.
template <class S>
concept ResettableSampler = Sampler<S> && requires(S& s) { s.reset(); };

/// A Sampler that observes the tokens of the sequence (penalties need history).
template <class S>
concept AcceptingSampler = Sampler<S> && requires(S& s, token_id t) { s.accept(t); };

/// Calls `s.reset()` where the sampler has it; otherwise does nothing.
template <Sampler S>
constexpr void sampler_reset(S& s) {
  if constexpr (ResettableSampler<S>) s.reset();
}

/// Calls `s.accept(t)` where the sampler has it; otherwise does nothing.
template <Sampler S>
constexpr void sampler_accept(S& s, token_id t) {
  if constexpr (AcceptingSampler<S>) s.accept(t);
}

}  // namespace kestrel
