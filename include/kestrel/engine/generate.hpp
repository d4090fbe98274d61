// kestrel/engine/generate.hpp: the generation loop of one sequence, with
// its metrics (TTFT, prefill and decode tokens/s, time between tokens).
//
//   prompt --prefill--> logits --sample--> token --detokenize--> on_text
//                         ^                  |
//                         +----- decode -----+   until n_predict, EOS/BOS, or the context is full
#pragma once

#include <algorithm>
#include <chrono>
#include <concepts>
#include <cstddef>
#include <limits>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "kestrel/core/error.hpp"
#include "kestrel/core/token.hpp"
#include "kestrel/model/concepts.hpp"
#include "kestrel/sampler/concepts.hpp"
#include "kestrel/tokenizer/concepts.hpp"
#include "kestrel/tokenizer/detokenizer.hpp"

namespace kestrel {

enum class stop_reason { length, end_of_text, context_full };

struct generation_stats {
  std::size_t n_prompt = 0;      // tokens prefilled
  std::size_t n_generated = 0;   // tokens sampled and emitted
  double ttft_ms = 0;            // prefill + first sample
  double prefill_ms = 0;
  double decode_ms = 0;          // all decode steps (each: forward + sample)
  stop_reason stop = stop_reason::length;

  double prefill_tokens_per_s() const { return prefill_ms > 0 ? 1e3 * static_cast<double>(n_prompt) / prefill_ms : 0; }
  /// Decode steps are n_generated - 1: the first token comes from prefill.
  double decode_tokens_per_s() const {
    return decode_ms > 0 && n_generated > 1 ? 1e3 * static_cast<double>(n_generated - 1) / decode_ms : 0;
  }
  /// Mean time between tokens (TBT / ITL) over the decode steps.
  double tbt_ms() const { return n_generated > 1 ? decode_ms / static_cast<double>(n_generated - 1) : 0; }
};

/// How generate() ends a reply, beyond n_predict and a full context.
struct generation_options {
  std::size_t n_predict = 256;
  /// Tokens that end the text besides EOS and BOS (a chat format's EOT or
  /// end-of-turn). Not emitted, not run through the model.
  std::span<const token_id> stop_tokens = {};
  /// Run the last emitted token through the model too, so the KV cache holds
  /// everything printed (a chat turn continues from there). Without it the
  /// last token is left for the caller (see `last_token`).
  bool feed_last = false;
  /// Never sample EOS, BOS or a stop token (llama.cpp's --ignore-eos, which
  /// biases its end-of-generation tokens to -inf): the text ends only at
  /// n_predict or a full context.
  bool ignore_eos = false;
};

/// Appends `prompt` to the model's sequence and generates up to
/// `opt.n_predict` tokens, passing each piece of text (whole UTF-8
/// characters) to `on_text(std::string_view)`. Generation ends at EOS, at BOS
/// (a new document: llama2.c's rule, which its reference texts depend on), at
/// any of `opt.stop_tokens`, after n_predict tokens, or when the context is
/// full. `last_token` receives the last sampled token (no_token when
/// n_predict is 0: then the prompt is only prefilled). The sampler's
/// accept() (sampler_accept), where it has one, is given every prompt token
/// and every sampled token that is fed back to the model: the sequence the
/// KV cache holds, whose last tokens repetition penalties look at.
template <GenerativeModel M, Sampler S, Tokenizer T, class OnText>
generation_stats generate(M& model, S& sampler, const T& tok, std::span<const token_id> prompt,
                          const generation_options& opt, OnText&& on_text, token_id* last_token = nullptr) {
  using clock = std::chrono::steady_clock;
  auto ms = [](clock::duration d) { return std::chrono::duration<double, std::milli>(d).count(); };
  if (prompt.empty()) throw invalid_argument("generate: empty prompt (it needs at least BOS)");
  if constexpr (requires { { model.n_vocab() } -> std::convertible_to<std::size_t>; }) {
    if (tok.n_vocab() < model.n_vocab())  // a sampled id past the tokenizer would fail mid-text
      throw invalid_argument("generate: the tokenizer has " + std::to_string(tok.n_vocab()) +
                             " tokens, fewer than the model's vocabulary of " + std::to_string(model.n_vocab()));
  }
  generation_stats st;
  st.n_prompt = prompt.size();
  // The first generated piece loses its dummy-prefix space only when it
  // begins the text (the prompt is BOS alone, as in llama2.c).
  const bool at_start = model.n_past() == 0 && prompt.size() == 1 && prompt[0] == tok.bos();
  detokenizer<T> detok(tok, at_start);
  std::vector<float> scratch;  // the sampler may modify its logits

  // The tokens that end the text: EOS, BOS and the stop tokens. With
  // ignore_eos none of them is ever sampled.
  std::vector<token_id> enders(opt.stop_tokens.begin(), opt.stop_tokens.end());
  for (const token_id t : {tok.eos(), tok.bos()})
    if (t != no_token) enders.push_back(t);
  auto ends_text = [&](token_id t) { return std::find(enders.begin(), enders.end(), t) != enders.end(); };

  auto sample = [&](std::span<const float> logits) {
    scratch.assign(logits.begin(), logits.end());
    if (opt.ignore_eos)
      for (const token_id t : enders)
        if (t >= 0 && static_cast<std::size_t>(t) < scratch.size())
          scratch[static_cast<std::size_t>(t)] = -std::numeric_limits<float>::infinity();
    return sampler.sample(std::span<float>(scratch));
  };

  // The sampler sees the sequence as the model does (sampler_accept: its
  // penalties' history): the prompt, then each token fed back.
  for (const token_id t : prompt) sampler_accept(sampler, t);
  const auto t0 = clock::now();
  if (opt.n_predict == 0) {  // only fill the cache with the prompt
    model.prefill(prompt);
    st.prefill_ms = ms(clock::now() - t0);
    if (last_token) *last_token = no_token;
    return st;
  }
  token_id next = sample(model.prefill(prompt));
  const auto t1 = clock::now();
  st.prefill_ms = st.ttft_ms = ms(t1 - t0);
  auto t_prev = t1;
  while (true) {
    if (last_token) *last_token = next;
    if (ends_text(next)) {
      st.stop = stop_reason::end_of_text;
      break;
    }
    ++st.n_generated;
    if (auto text = detok.push(next); !text.empty()) on_text(std::string_view(text));
    if (model.n_past() >= model.n_ctx()) {
      st.stop = stop_reason::context_full;
      break;
    }
    if (st.n_generated >= opt.n_predict) {
      if (opt.feed_last) {
        sampler_accept(sampler, next);
        model.decode(next);
      }
      break;
    }
    sampler_accept(sampler, next);
    next = sample(model.decode(next));
    const auto t = clock::now();
    st.decode_ms += ms(t - t_prev);
    t_prev = t;
  }
  if (auto tail = detok.flush(); !tail.empty()) on_text(std::string_view(tail));
  return st;
}

/// generate() with default options but `n_predict`.
template <GenerativeModel M, Sampler S, Tokenizer T, class OnText>
generation_stats generate(M& model, S& sampler, const T& tok, std::span<const token_id> prompt, std::size_t n_predict,
                          OnText&& on_text, token_id* last_token = nullptr) {
  return generate(model, sampler, tok, prompt, generation_options{.n_predict = n_predict},
                  std::forward<OnText>(on_text), last_token);
}

}  // namespace kestrel
