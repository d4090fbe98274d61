// kestrel/engine/perplexity.hpp: perplexity of a model over a tokenized
// text, with llama.cpp's llama-perplexity conventions so the numbers compare:
//
//   - the text is tokenized once (with BOS if the vocabulary adds one);
//   - it is cut into n_chunks = n_tokens / n_ctx chunks of n_ctx tokens
//     (the tail that does not fill a chunk is dropped);
//   - each chunk is evaluated from an empty KV cache, its first token
//     replaced by BOS (when the vocabulary adds BOS);
//   - only the second half of each chunk is scored: the logits at positions
//     first = n_ctx/2 .. n_ctx-2 predict the tokens at first+1 .. n_ctx-1,
//     so every scored token has at least n_ctx/2 tokens of context;
//   - PPL = exp(mean NLL), NLL = -log softmax(logits)[next token], in double;
//   - the +/- is the standard error of the mean NLL carried through exp:
//     ppl * sqrt((mean(NLL^2) - mean(NLL)^2) / (count - 1)).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <span>
#include <string>
#include <vector>

#include "kestrel/core/error.hpp"
#include "kestrel/core/token.hpp"

namespace kestrel {

/// log softmax(logits)[tok], computed in double (the sum over a 32K-150K
/// vocabulary loses digits in float).
inline double log_softmax_at(std::span<const float> logits, token_id tok) {
  float max = logits[0];
  for (float v : logits) max = std::max(max, v);
  double sum = 0;
  for (float v : logits) sum += std::exp(static_cast<double>(v) - max);
  return static_cast<double>(logits[static_cast<std::size_t>(tok)]) - max - std::log(sum);
}

struct perplexity_options {
  std::size_t n_ctx = 512;       // tokens per chunk (-c)
  std::size_t n_batch = 0;       // tokens per forward call (-b); 0: the whole chunk
  std::size_t max_chunks = 0;    // --chunks; 0: all
  bool add_bos = true;           // replace each chunk's first token by bos
  token_id bos = 1;
};

struct perplexity_result {
  double ppl = 0;        // exp(mean NLL)
  double ppl_error = 0;  // standard error of ppl (0 when fewer than 2 tokens were scored)
  double mean_nll = 0;
  std::size_t n_tokens = 0;   // of the text
  std::size_t n_chunks = 0;   // evaluated
  std::size_t n_scored = 0;   // tokens scored over all chunks
  std::vector<double> running_ppl;  // after each chunk
};

/// Tokens per chunk that are scored: positions n_ctx/2+1 .. n_ctx-1.
constexpr std::size_t scored_per_chunk(std::size_t n_ctx) noexcept { return n_ctx - 1 - n_ctx / 2; }

/// Perplexity of `model` over `tokens` (see the top of this file).
/// `on_chunk(i, running_ppl)` is called after chunk i (0-based). Throws
/// invalid_argument, naming the numbers, when the text holds less than one
/// chunk or the model's context is smaller than a chunk.
template <class Model, class OnChunk>
perplexity_result perplexity(Model& model, std::span<const token_id> tokens, const perplexity_options& o,
                             OnChunk&& on_chunk) {
  const std::size_t n_ctx = o.n_ctx;
  if (n_ctx < 4)
    throw invalid_argument("perplexity: a context of " + std::to_string(n_ctx) +
                           " tokens is too small (at least 4: the second half of each chunk is scored)");
  if (tokens.size() < n_ctx)
    throw invalid_argument("perplexity: the text has " + std::to_string(tokens.size()) +
                           " tokens, fewer than one chunk of " + std::to_string(n_ctx) +
                           " (-c); give a longer text or a smaller -c (llama-perplexity needs at least " +
                           std::to_string(2 * n_ctx) + ")");
  if (model.n_ctx() < n_ctx)
    throw invalid_argument("perplexity: the model's context is " + std::to_string(model.n_ctx()) +
                           " tokens, smaller than a chunk of " + std::to_string(n_ctx));
  const std::size_t n_vocab = model.n_vocab();
  std::size_t n_chunks = tokens.size() / n_ctx;
  if (o.max_chunks) n_chunks = std::min(n_chunks, o.max_chunks);
  const std::size_t first = n_ctx / 2;
  const std::size_t batch = o.n_batch ? o.n_batch : n_ctx;

  perplexity_result r;
  r.n_tokens = tokens.size();
  double nll = 0, nll2 = 0;
  std::vector<token_id> chunk(n_ctx);
  for (std::size_t c = 0; c < n_chunks; ++c) {
    std::copy_n(tokens.begin() + static_cast<std::ptrdiff_t>(c * n_ctx), n_ctx, chunk.begin());
    if (o.add_bos) chunk[0] = o.bos;
    model.reset();
    for (std::size_t at = 0; at < n_ctx; at += batch) {
      const std::size_t n = std::min(batch, n_ctx - at);
      const std::span<const token_id> part(chunk.data() + at, n);
      if (at + n <= first) {  // no scored logits in this part: only the KV cache matters
        model.prefill(part);
        continue;
      }
      const std::vector<float> logits = model.prefill_all_logits(part);  // (n, n_vocab)
      for (std::size_t j = std::max(at, first); j < at + n && j + 1 < n_ctx; ++j) {
        const std::span<const float> row(logits.data() + (j - at) * n_vocab, n_vocab);
        const double v = -log_softmax_at(row, chunk[j + 1]);
        nll += v;
        nll2 += v * v;
        ++r.n_scored;
      }
    }
    ++r.n_chunks;
    r.running_ppl.push_back(std::exp(nll / static_cast<double>(r.n_scored)));
    on_chunk(c, r.running_ppl.back());
  }
  const double count = static_cast<double>(r.n_scored);
  r.mean_nll = nll / count;
  r.ppl = std::exp(r.mean_nll);
  const double var = nll2 / count - r.mean_nll * r.mean_nll;
  if (var > 0 && r.n_scored > 1) r.ppl_error = std::sqrt(var / (count - 1)) * r.ppl;
  return r;
}

template <class Model>
perplexity_result perplexity(Model& model, std::span<const token_id> tokens, const perplexity_options& o) {
  return perplexity(model, tokens, o, [](std::size_t, double) {});
}

}  // namespace kestrel
