// kestrel/model/llama.hpp: the llama-family decoder.
//
//   x = embed(token)
//   for each layer:
//     x += wo . attention(rope(wq . rmsnorm(x)), rope(wk . rmsnorm(x)), wv . rmsnorm(x))   (GQA, causal)
//     x += ffn_down . (silu(ffn_gate . rmsnorm(x)) * ffn_up . rmsnorm(x))                 (SwiGLU)
//   logits = output . rmsnorm(x)
//
// Prefill and decode are separate code paths, not one loop with a branch:
// prefill runs every prompt token through each layer at once, so each weight
// matrix meets a matrix of activations (Backend::matmul, compute-bound);
// decode runs one token, so each weight matrix meets one vector
// (Backend::matvec, memory-bound) and attends over the KV cache.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstring>
#include <span>
#include <string>
#include <vector>

#include "kestrel/core/buffer.hpp"
#include "kestrel/core/error.hpp"
#include "kestrel/core/token.hpp"
#include "kestrel/kv/concepts.hpp"
#include "kestrel/kv/contiguous.hpp"
#include "kestrel/model/backend.hpp"
#include "kestrel/model/concepts.hpp"
#include "kestrel/model/config.hpp"
#include "kestrel/model/weights.hpp"

namespace kestrel {

template <class Config = dynamic_llama_config, Backend B = cpu_backend, KvCache Cache = contiguous_kv_cache>
class llama_model {
 public:
  using config_type = Config;
  using backend_type = B;
  using cache_type = Cache;

  /// Prompts are processed in chunks of at most this many tokens, which
  /// bounds the prefill activations' memory (like llama.cpp's ubatch).
  static constexpr std::size_t max_prefill_chunk = 512;

  /// The context used when the caller asks for 0: the model's training
  /// context, capped (as llama.cpp's default) so a 128K-context model does
  /// not silently reserve tens of GiB of KV cache.
  static constexpr std::size_t default_max_ctx = 4096;

  /// `n_ctx` 0 means min(training context, default_max_ctx). A larger n_ctx
  /// than the training context is allowed (RoPE extrapolates, usually badly).
  llama_model(llama_weights weights, std::size_t n_ctx, B backend)
      : w_(validated(std::move(weights))),
        cfg_(Config::from(w_.hparams, w_.source)),
        hp_(w_.hparams),
        backend_(std::move(backend)),
        n_ctx_(n_ctx ? n_ctx : std::min(hp_.n_ctx_train, default_max_ctx)),
        cache_(hp_.n_layer, n_ctx_, hp_.kv_dim()) {
    const std::size_t n_embd = cfg_.n_embd(), n_ff = cfg_.n_ff(), n_head = cfg_.n_head();
    x_ = aligned_buffer<float>(n_embd);
    xb_ = aligned_buffer<float>(n_embd);
    q_ = aligned_buffer<float>(n_embd);
    att_ = aligned_buffer<float>(n_embd);
    hb_ = aligned_buffer<float>(n_ff);
    hb2_ = aligned_buffer<float>(n_ff);
    scores_ = aligned_buffer<float>(n_head * n_ctx_);
    logits_ = aligned_buffer<float>(cfg_.n_vocab());
  }

  const Config& config() const noexcept { return cfg_; }
  const llama_hparams& hparams() const noexcept { return hp_; }
  std::size_t n_ctx() const noexcept { return n_ctx_; }
  std::size_t n_vocab() const noexcept { return cfg_.n_vocab(); }
  /// Positions processed so far (the KV cache's fill).
  std::size_t n_past() const noexcept { return cache_.size(); }
  B& backend() noexcept { return backend_; }
  const Cache& cache() const noexcept { return cache_; }
  /// Forgets the sequence; the next call starts at position 0.
  void reset() noexcept { cache_.clear(); }

  /// Processes `tokens` at positions n_past() .. n_past()+n-1 and returns the
  /// logits (n_vocab) of the last one. The span is valid until the next call.
  std::span<const float> prefill(std::span<const token_id> tokens) {
    check_tokens(tokens);
    if (tokens.empty()) throw invalid_argument("prefill: no tokens");
    for (std::size_t at = 0; at < tokens.size(); at += max_prefill_chunk) {
      const auto chunk = tokens.subspan(at, std::min(max_prefill_chunk, tokens.size() - at));
      prefill_chunk(chunk, /*all_logits=*/false);
    }
    return {logits_.data(), n_vocab()};
  }

  /// As prefill(), but returns the logits of every token: (n, n_vocab),
  /// row-major. For perplexity and for tests.
  std::vector<float> prefill_all_logits(std::span<const token_id> tokens) {
    check_tokens(tokens);
    if (tokens.empty()) throw invalid_argument("prefill: no tokens");
    std::vector<float> out;
    out.reserve(tokens.size() * n_vocab());
    for (std::size_t at = 0; at < tokens.size(); at += max_prefill_chunk) {
      const auto chunk = tokens.subspan(at, std::min(max_prefill_chunk, tokens.size() - at));
      prefill_chunk(chunk, /*all_logits=*/true);
      out.insert(out.end(), all_logits_.data(), all_logits_.data() + chunk.size() * n_vocab());
    }
    return out;
  }

  /// Processes one token at position n_past() and returns its logits
  /// (n_vocab). Allocates nothing.
  std::span<const float> decode(token_id token) {
    const token_id one[1] = {token};
    check_tokens(one);
    const std::size_t pos = cache_.size();
    const std::size_t n_embd = cfg_.n_embd(), n_ff = cfg_.n_ff();
    float* x = x_.data();
    backend_.row_to_f32(w_.token_embd, static_cast<std::size_t>(token), x);
    for (std::size_t l = 0; l < cfg_.n_layer(); ++l) {
      const auto& L = w_.layers[l];
      // attention block
      backend_.rmsnorm(xb_.data(), x, L.attn_norm, n_embd, hp_.rms_eps);
      float* k = cache_.key(l, pos);
      float* v = cache_.value(l, pos);
      backend_.matvec(L.wq, xb_.data(), q_.data());
      backend_.matvec(L.wk, xb_.data(), k);
      backend_.matvec(L.wv, xb_.data(), v);
      backend_.rope(q_.data(), cfg_.n_head(), hp_.head_dim(), hp_.n_rot, pos, hp_.rope_theta);
      backend_.rope(k, cfg_.n_head_kv(), hp_.head_dim(), hp_.n_rot, pos, hp_.rope_theta);
      attend_heads(l, q_.data(), pos, att_.data(), scores_.data());
      backend_.matvec(L.wo, att_.data(), xb_.data());
      backend_.add(x, xb_.data(), n_embd);
      // feed-forward block
      backend_.rmsnorm(xb_.data(), x, L.ffn_norm, n_embd, hp_.rms_eps);
      backend_.matvec(L.ffn_gate, xb_.data(), hb_.data());
      backend_.matvec(L.ffn_up, xb_.data(), hb2_.data());
      backend_.swiglu(hb_.data(), hb_.data(), hb2_.data(), n_ff);
      backend_.matvec(L.ffn_down, hb_.data(), xb_.data());
      backend_.add(x, xb_.data(), n_embd);
    }
    cache_.resize(pos + 1);
    backend_.rmsnorm(x, x, w_.output_norm, n_embd, hp_.rms_eps);
    backend_.matvec(w_.output, x, logits_.data());
    return {logits_.data(), n_vocab()};
  }

 private:
  void check_tokens(std::span<const token_id> tokens) const {
    for (token_id t : tokens)
      if (t < 0 || static_cast<std::size_t>(t) >= n_vocab())
        throw invalid_argument("token id " + std::to_string(t) + " is outside the vocabulary of " +
                               std::to_string(n_vocab()));
    if (cache_.size() + tokens.size() > n_ctx_)
      throw invalid_argument(std::to_string(cache_.size() + tokens.size()) + " tokens (" + std::to_string(cache_.size()) +
                             " already in the cache + " + std::to_string(tokens.size()) +
                             " new) exceed the context length of " + std::to_string(n_ctx_) +
                             " (raise -c or shorten the prompt)");
  }

  /// Attention of every query head at `pos` over cache positions [0, pos]:
  /// head h reads KV head h / (n_head / n_head_kv) (grouped-query attention).
  void attend_heads(std::size_t layer, const float* q, std::size_t pos, float* out, float* scores) {
    const std::size_t head_dim = hp_.head_dim(), n_head = cfg_.n_head();
    const std::size_t group = n_head / cfg_.n_head_kv();
    const float scale = 1.0f / std::sqrt(static_cast<float>(head_dim));
    const kv_rows keys = cache_.keys(layer), values = cache_.values(layer);
    backend_.parallel_for(n_head, [&](std::size_t begin, std::size_t end) {
      for (std::size_t h = begin; h < end; ++h) {
        const std::size_t kvh = h / group;
        backend_.attend(q + h * head_dim, keys.base + kvh * head_dim, values.base + kvh * head_dim, pos + 1, head_dim,
                        keys.stride, scale, out + h * head_dim, scores + h * n_ctx_);
      }
    }, 2 * n_head * (pos + 1) * head_dim);
  }

  void prefill_chunk(std::span<const token_id> tokens, bool all_logits) {
    const std::size_t n = tokens.size(), pos0 = cache_.size();
    const std::size_t n_embd = cfg_.n_embd(), n_ff = cfg_.n_ff(), kv_dim = hp_.kv_dim();
    const std::size_t n_head = cfg_.n_head(), head_dim = hp_.head_dim(), group = n_head / cfg_.n_head_kv();
    grow(px_, n * n_embd);
    grow(pxb_, n * n_embd);
    grow(pq_, n * n_embd);
    grow(pk_, n * kv_dim);
    grow(pv_, n * kv_dim);
    grow(patt_, n * n_embd);
    grow(ph_, n * n_ff);
    grow(ph2_, n * n_ff);
    float* X = px_.data();     // (n, n_embd) residual stream
    float* XB = pxb_.data();   // (n, n_embd) normed input / block output
    float* Q = pq_.data();     // (n, n_embd)
    float* K = pk_.data();     // (n, kv_dim)
    float* V = pv_.data();     // (n, kv_dim)
    float* ATT = patt_.data(); // (n, n_embd)
    float* H = ph_.data();     // (n, n_ff)
    float* H2 = ph2_.data();   // (n, n_ff)
    for (std::size_t i = 0; i < n; ++i) backend_.row_to_f32(w_.token_embd, static_cast<std::size_t>(tokens[i]), X + i * n_embd);
    const float scale = 1.0f / std::sqrt(static_cast<float>(head_dim));

    for (std::size_t l = 0; l < cfg_.n_layer(); ++l) {
      const auto& L = w_.layers[l];
      // attention block: projections as matrix x matrix
      for (std::size_t i = 0; i < n; ++i) backend_.rmsnorm(XB + i * n_embd, X + i * n_embd, L.attn_norm, n_embd, hp_.rms_eps);
      backend_.matmul(L.wq, XB, n, Q);
      backend_.matmul(L.wk, XB, n, K);
      backend_.matmul(L.wv, XB, n, V);
      for (std::size_t i = 0; i < n; ++i) {
        backend_.rope(Q + i * n_embd, n_head, head_dim, hp_.n_rot, pos0 + i, hp_.rope_theta);
        backend_.rope(K + i * kv_dim, cfg_.n_head_kv(), head_dim, hp_.n_rot, pos0 + i, hp_.rope_theta);
        std::memcpy(cache_.key(l, pos0 + i), K + i * kv_dim, kv_dim * sizeof(float));
        std::memcpy(cache_.value(l, pos0 + i), V + i * kv_dim, kv_dim * sizeof(float));
      }
      // causal attention: token i sees cache positions [0, pos0 + i]
      const kv_rows keys = cache_.keys(l), values = cache_.values(l);
      backend_.parallel_for(n * n_head, [&](std::size_t begin, std::size_t end) {
        std::vector<float> scores(pos0 + n);  // per chunk of work, not per token
        for (std::size_t job = begin; job < end; ++job) {
          const std::size_t i = job / n_head, h = job % n_head, kvh = h / group;
          backend_.attend(Q + i * n_embd + h * head_dim, keys.base + kvh * head_dim, values.base + kvh * head_dim,
                          pos0 + i + 1, head_dim, keys.stride, scale, ATT + i * n_embd + h * head_dim, scores.data());
        }
      }, n * n_head * (pos0 + n) * head_dim);  // ~2 multiply-adds per (query, key) pair and dim, causal half
      backend_.matmul(L.wo, ATT, n, XB);
      backend_.add(X, XB, n * n_embd);
      // feed-forward block
      for (std::size_t i = 0; i < n; ++i) backend_.rmsnorm(XB + i * n_embd, X + i * n_embd, L.ffn_norm, n_embd, hp_.rms_eps);
      backend_.matmul(L.ffn_gate, XB, n, H);
      backend_.matmul(L.ffn_up, XB, n, H2);
      backend_.swiglu(H, H, H2, n * n_ff);
      backend_.matmul(L.ffn_down, H, n, XB);
      backend_.add(X, XB, n * n_embd);
    }
    cache_.resize(pos0 + n);

    if (all_logits) {
      for (std::size_t i = 0; i < n; ++i) backend_.rmsnorm(XB + i * n_embd, X + i * n_embd, w_.output_norm, n_embd, hp_.rms_eps);
      grow(all_logits_, n * n_vocab());
      backend_.matmul(w_.output, XB, n, all_logits_.data());
      std::memcpy(logits_.data(), all_logits_.data() + (n - 1) * n_vocab(), n_vocab() * sizeof(float));
    } else {
      float* last = X + (n - 1) * n_embd;
      backend_.rmsnorm(XB, last, w_.output_norm, n_embd, hp_.rms_eps);
      backend_.matvec(w_.output, XB, logits_.data());
    }
  }

  static llama_weights validated(llama_weights w) {
    w.hparams.validate(w.source);
    w.validate(w.source);
    return w;
  }

  /// Grow-only scratch: prefill allocates once for the largest chunk seen.
  static void grow(aligned_buffer<float>& b, std::size_t n) {
    if (b.size() < n) b = aligned_buffer<float>(n);
  }

  llama_weights w_;
  Config cfg_;
  llama_hparams hp_;
  B backend_;
  std::size_t n_ctx_;
  Cache cache_;
  // decode scratch, allocated once
  aligned_buffer<float> x_, xb_, q_, att_;  // (n_embd)
  aligned_buffer<float> hb_, hb2_;          // (n_ff)
  aligned_buffer<float> scores_;            // (n_head, n_ctx)
  aligned_buffer<float> logits_;            // (n_vocab)
  // prefill scratch, grown to the largest chunk
  aligned_buffer<float> px_, pxb_, pq_, pk_, pv_, patt_, ph_, ph2_, all_logits_;
};

static_assert(GenerativeModel<llama_model<>>);
static_assert(GenerativeModel<llama_model<dynamic_llama_config, cpu_ref_backend>>);

}  // namespace kestrel
