// kestrel/model/llama.hpp: the decoder (llama and the other architectures of
// model/config.hpp, each a choice of parts).
//
//   x = embed(token) (+ position_embd[pos] for learned positions)
//   for each layer (pre-norm, residual):
//     x += wo . attention(rope(wq . norm(x) + bq), rope(wk . norm(x) + bk), wv . norm(x) + bv) + bo
//                                            (GQA, causal, optionally a sliding window)
//     x += ffn(norm(x))     SwiGLU: down . (silu(gate . h) * up . h)
//                           GELU:   down . gelu(up . h + b_up) + b_down
//   logits = output . norm(x)
//   norm: RMSNorm, or LayerNorm with bias; absent biases are skipped.
//
// Prefill and decode are separate specializations of the same parts (the
// `phase` template parameter): prefill runs every prompt token through each
// layer at once, so each weight matrix meets a matrix of activations
// (Backend::matmul, compute-bound) and attention runs over blocks of
// queries per KV head (Backend::attend_block where the backend has it, else
// (token, head) pairs); decode runs one token, so each weight matrix meets
// one vector (Backend::matvec, memory-bound), attention runs per KV head
// (grouped-query attention with attend_block) or per head, and nothing is
// allocated.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdio>
#include <cstring>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "kestrel/core/buffer.hpp"
#include "kestrel/core/error.hpp"
#include "kestrel/core/mmap.hpp"
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
  /// The cache's element type (float, or f16: kv/contiguous.hpp).
  using kv_element = typename decltype(std::declval<const Cache&>().keys(0))::element_type;

  /// Prompts are processed in chunks of at most this many tokens, which
  /// bounds the prefill activations' memory (like llama.cpp's ubatch).
  static constexpr std::size_t max_prefill_chunk = 512;

  /// The context used when the caller asks for 0: the model's training
  /// context, capped (as llama.cpp's default) so a 128K-context model does
  /// not silently reserve tens of GiB of KV cache.
  static constexpr std::size_t default_max_ctx = 4096;

  /// `n_ctx` 0 means min(training context, default_max_ctx). A larger n_ctx
  /// than the training context is allowed for RoPE (it extrapolates, usually
  /// badly) but not for learned positions, which have no row past it.
  llama_model(llama_weights weights, std::size_t n_ctx, B backend)
      : w_(validated(std::move(weights))),
        cfg_(Config::from(w_.hparams, w_.source)),
        hp_(w_.hparams),
        backend_(std::move(backend)),
        n_ctx_(checked_ctx(n_ctx)),
        cache_(hp_.n_layer, n_ctx_, hp_.kv_dim(), cfg_.n_head_kv()) {
    rope_ = cpu::rope_spec{hp_.n_rot, hp_.rope_theta, hp_.rope_mode, hp_.rope_freq_scale, w_.rope_freqs};
    grow_scratch(1);  // decode's scratch: decode allocates nothing
    scores_ = aligned_buffer<float>(blocks_in_decode() ? cfg_.n_head_kv() * decode_parts() * decode_block_scratch()
                                                       : cfg_.n_head() * n_ctx_);
    logits_ = aligned_buffer<float>(cfg_.n_vocab());
    if constexpr (requires { backend_.prepare_weights(w_); }) backend_.prepare_weights(w_);
  }

  const Config& config() const noexcept { return cfg_; }
  const llama_hparams& hparams() const noexcept { return hp_; }
  /// The weights the model computes with: after the backend's
  /// prepare_weights, its views point where the backend placed the matrices
  /// (a huge-page copy with cpu_backend's default placement where the copy
  /// ran fast, else the file mapping).
  const llama_weights& weights() const noexcept { return w_; }
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
      forward<phase::prefill>(chunk, /*all_logits=*/false);
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
      forward<phase::prefill>(chunk, /*all_logits=*/true);
      out.insert(out.end(), all_logits_.data(), all_logits_.data() + chunk.size() * n_vocab());
    }
    return out;
  }

  /// Processes one token at position n_past() and returns its logits
  /// (n_vocab). Allocates nothing.
  std::span<const float> decode(token_id token) {
    const token_id one[1] = {token};
    check_tokens(one);
    forward<phase::decode>(one, /*all_logits=*/false);
    return {logits_.data(), n_vocab()};
  }

 private:
  enum class phase { prefill, decode };

  /// Whether the backend offers the optional fused decode products
  /// (model/concepts.hpp); without them decode calls matvec per matrix.
  static constexpr bool fuses_matvecs =
      requires(B& b, std::span<const cpu::matvec_job> jobs, const weight_view& w, const float* x, float* y) {
        b.matvec_fused(jobs, x);
        b.matvec_swiglu(w, w, x, y, y);
      };

  /// Whether the backend offers the optional shared prefill products
  /// (model/concepts.hpp): X quantized once for q, k, v and for gate, up.
  static constexpr bool shares_matmuls = requires(B& b, std::span<const cpu::matvec_job> jobs, const float* x) {
    b.matmul_shared(jobs, x, std::size_t{1});
  };

  /// Whether the backend offers prefill's SwiGLU products with silu applied
  /// as they are made (model/concepts.hpp); without it, matmul_shared (or
  /// matmul each) and then swiglu.
  static constexpr bool fuses_swiglu_matmuls = requires(B& b, const weight_view& w, const float* x, float* y) {
    b.matmul_swiglu(w, w, x, std::size_t{1}, y, y);
  };

  /// The context `n_ctx` asks for (0: the default), checked before the KV
  /// cache is allocated: learned positions have no row past the training
  /// context, and a cache larger than the machine's memory would fail in
  /// the allocator as std::bad_alloc, or be killed by the OS as it is
  /// zeroed where memory is overcommitted.
  std::size_t checked_ctx(std::size_t n_ctx) const {
    const std::size_t n = n_ctx ? n_ctx : std::min(hp_.n_ctx_train, default_max_ctx);
    if (hp_.positions == position_type::learned && n > hp_.n_ctx_train)
      throw invalid_argument(w_.source + ": context " + std::to_string(n) + " exceeds the " +
                             std::to_string(hp_.n_ctx_train) + " learned positions of this " + name_of(hp_.arch) +
                             " model");
    const double kv_bytes = 2.0 * static_cast<double>(hp_.n_layer) * static_cast<double>(n) *
                            static_cast<double>(hp_.kv_dim()) * sizeof(kv_element);
    if (const std::size_t mem = physical_memory_bytes(); mem != 0 && kv_bytes > static_cast<double>(mem)) {
      char what[160];
      std::snprintf(what, sizeof what, ": a context of %zu tokens needs a %.1f GiB KV cache, more than the %.1f GiB of memory here",
                    n, kv_bytes / (1u << 30), static_cast<double>(mem) / (1u << 30));
      throw invalid_argument(w_.source + what);
    }
    return n;
  }

  void check_tokens(std::span<const token_id> tokens) const {
    if (logits_.data() == nullptr)  // everything moved out (the cache, the backend's pool, the buffers)
      throw invalid_argument("llama_model: used after it was moved from");
    for (token_id t : tokens)
      if (t < 0 || static_cast<std::size_t>(t) >= n_vocab())
        throw invalid_argument("token id " + std::to_string(t) + " is outside the vocabulary of " +
                               std::to_string(n_vocab()));
    if (cache_.size() + tokens.size() > n_ctx_)
      throw invalid_argument(std::to_string(cache_.size() + tokens.size()) + " tokens (" + std::to_string(cache_.size()) +
                             " already in the cache + " + std::to_string(tokens.size()) +
                             " new) exceed the context length of " + std::to_string(n_ctx_) +
                             " (a larger n_ctx for the model, -c in the programs, or a shorter prompt)");
  }

  // ---- parts -------------------------------------------------------------

  /// Y(n, w.rows) = X(n, w.cols) W^T (+ bias): matvec for decode, matmul for prefill.
  template <phase P>
  void linear(const weight_view& w, const float* bias, const float* X, std::size_t n, float* Y) {
    if constexpr (P == phase::decode)
      backend_.matvec(w, X, Y);
    else
      backend_.matmul(w, X, n, Y);
    add_bias(Y, bias, w.rows, n);
  }

  /// Y's n rows (of `rows` values) += bias, where there is one.
  void add_bias(float* Y, const float* bias, std::size_t rows, std::size_t n) {
    if (bias)
      for (std::size_t i = 0; i < n; ++i) backend_.add(Y + i * rows, bias, rows);
  }

  /// The architecture's norm over n rows of width n_embd, rows split among
  /// the threads (a prefill chunk's rows; decode's one row runs inline).
  void norm(float* Y, const float* X, const float* weight, const float* bias, std::size_t n) {
    const std::size_t d = cfg_.n_embd();
    for_rows(n, 4 * d, [&](std::size_t i) {
      if (hp_.norm == norm_type::rms)
        backend_.rmsnorm(Y + i * d, X + i * d, weight, d, hp_.rms_eps);
      else
        backend_.layernorm(Y + i * d, X + i * d, weight, bias, d, hp_.rms_eps);
    });
  }

  /// f(i) for every row i < n, split among the backend's threads; work: the
  /// multiply-adds of one row, so that small calls (decode's one row) run
  /// inline. These per-row steps were serial between the parallel matmuls
  /// of prefill: the other thread idled through them (110M shape, 512
  /// tokens: the norms, RoPE and residual adds, about 5% of a prefill).
  template <class F>
  void for_rows(std::size_t n, std::size_t work, F&& f) {
    backend_.parallel_for(n, [&](std::size_t b, std::size_t e) {
      for (std::size_t i = b; i < e; ++i) f(i);
    }, n * work);
  }

  /// X += XB over n rows of n_embd.
  void residual(float* X, const float* XB, std::size_t n) {
    const std::size_t d = cfg_.n_embd();
    for_rows(n, d, [&](std::size_t i) { backend_.add(X + i * d, XB + i * d, d); });
  }

  /// The first cache position token `pos` attends to.
  std::size_t window_start(std::size_t pos) const noexcept {
    return cpu::attend_first(pos, hp_.sliding_window);
  }

  /// Whether the backend takes RoPE angles computed by the model (optional
  /// rope_rotate, model/concepts.hpp).
  static constexpr bool rotates_with_angles = requires(B& b, float* x, const float* c, const cpu::rope_spec& r) {
    b.rope_rotate(x, std::size_t{}, std::size_t{}, c, c, r);
  };

  /// Whether the backend offers the optional block attention
  /// (model/concepts.hpp); without it prefill calls attend per (token, head).
  static constexpr bool attends_blocks = requires(B& b, const cpu::basic_attend_block_args<kv_element>& a) {
    b.attend_block(a);
  };

  /// Whether decode's attention runs per KV head through attend_block: with
  /// grouped-query attention (group > 1) one task reads each cached key and
  /// value once for the group's query heads, where attend reads them once
  /// per head. Measured (one thread, head_dim 64, one query): groups 2-8
  /// 1.7-2.2x faster than attend per head at 2000 cached tokens; at group 8
  /// (TinyLlama's shape, 22 layers) 1.0x at 16 tokens, 1.2-1.6x at 64-512,
  /// 2.2x at 2048. For group 1 it was not faster, so attend stays. End to
  /// end (TinyLlama, group 8, 2 threads, `kestrel-bench -p 0 -n 64 -d
  /// 2048`): q4_0 21.2 -> 24.9 t/s, Q4_K_M 21.4 -> 25.7 t/s.
  bool blocks_in_decode() const noexcept {
    if constexpr (attends_blocks) return cfg_.n_head() / cfg_.n_head_kv() > 1;
    return false;
  }
  /// Decode's attend_block tasks: each KV head's query heads in `parts`
  /// slices, so that a model with fewer than 4 KV heads (multi-query
  /// attention has 1) still gives every thread of a small pool work.
  std::size_t decode_parts() const noexcept {
    const std::size_t n_head_kv = cfg_.n_head_kv(), group = cfg_.n_head() / n_head_kv;
    return std::min(group, (4 + n_head_kv - 1) / n_head_kv);
  }
  /// One decode task's attend_block scratch at a full context, floats.
  std::size_t decode_block_scratch() const noexcept {
    cpu::attend_block_args a;
    a.nq = 1;
    const std::size_t group = cfg_.n_head() / cfg_.n_head_kv(), parts = decode_parts();
    a.group = (group + parts - 1) / parts;
    a.head_dim = hp_.head_dim();
    a.pos0 = n_ctx_ ? n_ctx_ - 1 : 0;  // every key of the context (a window only shortens it)
    return cpu::attend_block_scratch_size(a);
  }

  /// Attention of n tokens (queries Q, (n, n_embd)) at positions pos0.. over
  /// the cache, which already holds their keys and values; head h reads KV
  /// head h / (n_head / n_head_kv) (grouped-query attention). Decode runs
  /// over KV heads through attend_block (blocks_in_decode) or over heads
  /// through attend, with the model's scores_ scratch; prefill over (KV head,
  /// block of queries) tasks when the backend has attend_block, else over
  /// (token, head) pairs, each worker with its own scratch.
  template <phase P>
  void attention(std::size_t layer, const float* Q, std::size_t n, std::size_t pos0, float* OUT) {
    const std::size_t head_dim = hp_.head_dim(), n_head = cfg_.n_head(), n_embd = cfg_.n_embd();
    const std::size_t group = n_head / cfg_.n_head_kv();
    const float scale = 1.0f / std::sqrt(static_cast<float>(head_dim));
    const auto keys = cache_.keys(layer), values = cache_.values(layer);
    auto one = [&](std::size_t i, std::size_t h, float* scores) {
      const std::size_t pos = pos0 + i, first = window_start(pos), kvh = h / group;
      backend_.attend(Q + i * n_embd + h * head_dim, keys.at(kvh, first), values.at(kvh, first), pos + 1 - first,
                      head_dim, keys.stride, scale, OUT + i * n_embd + h * head_dim, scores);
    };
    const std::size_t span = hp_.sliding_window ? std::min(hp_.sliding_window, pos0 + n) : pos0 + n;
    // attend_block's task: queries [i0, i0 + nq) x query heads [h0, h0 +
    // heads), all of KV head h0 / group.
    auto block = [&](std::size_t i0, std::size_t nq, std::size_t h0, std::size_t heads, float* scratch) {
      const std::size_t kvh = h0 / group;
      return cpu::basic_attend_block_args<kv_element>{.q = Q + i0 * n_embd + h0 * head_dim,
                                                      .q_stride = n_embd,
                                                      .k = keys.at(kvh, 0),
                                                      .v = values.at(kvh, 0),
                                                      .kv_stride = keys.stride,
                                                      .out = OUT + i0 * n_embd + h0 * head_dim,
                                                      .out_stride = n_embd,
                                                      .nq = nq,
                                                      .group = heads,
                                                      .head_dim = head_dim,
                                                      .pos0 = pos0 + i0,
                                                      .window = hp_.sliding_window,
                                                      .scale = scale,
                                                      .scratch = scratch};
    };
    if constexpr (P == phase::decode) {
      float* scores = scores_.data();
      if constexpr (attends_blocks) {
        if (blocks_in_decode()) {
          const std::size_t per_task = decode_block_scratch(), parts = decode_parts();
          const std::size_t slice = (group + parts - 1) / parts;
          backend_.parallel_for(cfg_.n_head_kv() * parts, [&](std::size_t begin, std::size_t end) {
            for (std::size_t task = begin; task < end; ++task) {
              const std::size_t kvh = task / parts, g0 = task % parts * slice;
              if (g0 >= group) continue;
              const std::size_t heads = std::min(slice, group - g0);
              backend_.attend_block(block(0, 1, kvh * group + g0, heads, scores + task * per_task));
            }
          }, 2 * n_head * span * head_dim);
          return;
        }
      }
      backend_.parallel_for(n_head, [&](std::size_t begin, std::size_t end) {
        for (std::size_t h = begin; h < end; ++h) one(0, h, scores + h * n_ctx_);
      }, 2 * n_head * span * head_dim);
    } else if constexpr (attends_blocks) {
      // A task's key tiles serve nq x group rows: ~32 keep the transposes a
      // small part of the work (cpu/attend_block.hpp) while giving 2 threads
      // dozens of tasks for a 512-token chunk; a backend whose kernel wants
      // more says so (attend_block_rows: 512 on AMX tiles, which lay out a
      // task's keys and values once; in a one-thread harness 32-row tasks
      // took 1.2-1.4x the time of 128-row ones, and those 1.1-1.2x that of
      // 512; in the model on 2 threads, 110M prompts took 110-119 ms at 64,
      // 128, 256 and 512 rows, two runs each, no order among them beyond
      // the noise; cpu/attend_amx.hpp).
      // The latest blocks attend the most keys: they go first, so the chunks
      // taken last are the short ones.
      std::size_t task_rows = 32;
      if constexpr (requires(const B& b) { b.attend_block_rows(head_dim); }) task_rows = backend_.attend_block_rows(head_dim);
      const std::size_t n_head_kv = cfg_.n_head_kv(), nq = std::max<std::size_t>(1, task_rows / group);
      const std::size_t n_blocks = (n + nq - 1) / nq;
      backend_.parallel_for(n_blocks * n_head_kv, [&](std::size_t begin, std::size_t end) {
        for (std::size_t job = begin; job < end; ++job) {
          const std::size_t i0 = (n_blocks - 1 - job / n_head_kv) * nq, kvh = job % n_head_kv;
          backend_.attend_block(block(i0, std::min(nq, n - i0), kvh * group, group, nullptr));
        }
      }, n * n_head * span * head_dim);
    } else {
      backend_.parallel_for(n * n_head, [&](std::size_t begin, std::size_t end) {
        std::vector<float> scores(pos0 + n);  // per chunk of work, not per token
        for (std::size_t job = begin; job < end; ++job) one(job / n_head, job % n_head, scores.data());
      }, n * n_head * span * head_dim);  // ~2 multiply-adds per (query, key) pair and dim, causal half
    }
  }

  /// x += attention block (n tokens at pos0; X and the scratch hold n rows).
  /// Every row's keys and values go to the cache; rows from q0 on get the
  /// rest (queries, attention, output projection and residual), the others
  /// keep their input x (q0 > 0: the last layer of a prefill that outputs
  /// only the last token's logits, forward()).
  template <phase P>
  void attention_block(std::size_t l, std::size_t n, std::size_t pos0, std::size_t q0 = 0) {
    const auto& L = w_.layers[l];
    const std::size_t n_embd = cfg_.n_embd(), kv_dim = hp_.kv_dim(), head_dim = hp_.head_dim();
    // Q and ATT borrow the feed-forward's buffers (grow_scratch), free until ffn_block.
    float *X = px_.data(), *XB = pxb_.data(), *Q = ph_.data(), *K = pk_.data(), *V = pv_.data(), *ATT = ph2_.data();
    const std::size_t nq = n - q0, at = q0 * n_embd;  // the rows that go on, and their offset
    norm(XB, X, L.attn_norm, L.attn_norm_b, n);
    if constexpr (P == phase::decode && fuses_matvecs) {
      // One parallel region for the three products of XB (decode is
      // dominated by per-region synchronization on small models).
      const cpu::matvec_job jobs[3] = {{&L.wq, Q}, {&L.wk, K}, {&L.wv, V}};
      backend_.matvec_fused(jobs, XB);
      if (L.bq) backend_.add(Q, L.bq, L.wq.rows);
      if (L.bk) backend_.add(K, L.bk, L.wk.rows);
      if (L.bv) backend_.add(V, L.bv, L.wv.rows);
    } else {
      bool shared = false;
      if constexpr (P == phase::prefill && shares_matmuls) {
        if (q0 == 0) {  // q, k and v of the same rows: XB quantized once
          const cpu::matvec_job jobs[3] = {{&L.wq, Q}, {&L.wk, K}, {&L.wv, V}};
          backend_.matmul_shared(jobs, XB, n);
          add_bias(Q, L.bq, L.wq.rows, n);
          add_bias(K, L.bk, L.wk.rows, n);
          add_bias(V, L.bv, L.wv.rows, n);
          shared = true;
        }
      }
      if (!shared) {
        linear<P>(L.wq, L.bq, XB + at, nq, Q + at);
        linear<P>(L.wk, L.bk, XB, n, K);
        linear<P>(L.wv, L.bv, XB, n, V);
      }
    }
    for_rows(n, 4 * (n_embd + kv_dim), [&](std::size_t i) {
      if (hp_.positions == position_type::rope) {
        if constexpr (rotates_with_angles) {
          const std::size_t np = rope_.n_rot / 2;
          const float *cs = rope_cs_.data() + i * np, *sn = rope_sn_.data() + i * np;
          if (i >= q0) backend_.rope_rotate(Q + i * n_embd, cfg_.n_head(), head_dim, cs, sn, rope_);
          backend_.rope_rotate(K + i * kv_dim, cfg_.n_head_kv(), head_dim, cs, sn, rope_);
        } else {
          if (i >= q0) backend_.rope(Q + i * n_embd, cfg_.n_head(), head_dim, pos0 + i, rope_);
          backend_.rope(K + i * kv_dim, cfg_.n_head_kv(), head_dim, pos0 + i, rope_);
        }
      }
      cache_.store(l, pos0 + i, K + i * kv_dim, V + i * kv_dim);
    });
    attention<P>(l, Q + at, nq, pos0 + q0, ATT + at);  // every key of the n rows is in the cache by now
    linear<P>(L.wo, L.bo, ATT + at, nq, XB + at);
    residual(X + at, XB + at, nq);
  }

  /// x += feed-forward block over the n rows from row q0.
  template <phase P>
  void ffn_block(std::size_t l, std::size_t n, std::size_t q0 = 0) {
    const auto& L = w_.layers[l];
    const std::size_t n_ff = cfg_.n_ff();
    float *X = px_.data() + q0 * cfg_.n_embd(), *XB = pxb_.data() + q0 * cfg_.n_embd(), *H = ph_.data(), *H2 = ph2_.data();
    norm(XB, X, L.ffn_norm, L.ffn_norm_b, n);
    if constexpr (P == phase::decode && fuses_matvecs) {
      if (hp_.ffn == ffn_type::swiglu && !L.ffn_up_b) {
        backend_.matvec_swiglu(L.ffn_gate, L.ffn_up, XB, H, H2);  // one region for gate, up and silu
        linear<P>(L.ffn_down, L.ffn_down_b, H, n, XB);
        residual(X, XB, n);
        return;
      }
    }
    if (hp_.ffn == ffn_type::swiglu) {
      if constexpr (P == phase::prefill && fuses_swiglu_matmuls) {
        if (!L.ffn_up_b) {
          backend_.matmul_swiglu(L.ffn_gate, L.ffn_up, XB, n, H, H2);
          linear<P>(L.ffn_down, L.ffn_down_b, H, n, XB);
          residual(X, XB, n);
          return;
        }
      }
      if constexpr (P == phase::prefill && shares_matmuls) {
        const cpu::matvec_job jobs[2] = {{&L.ffn_gate, H}, {&L.ffn_up, H2}};
        backend_.matmul_shared(jobs, XB, n);
        add_bias(H2, L.ffn_up_b, L.ffn_up.rows, n);
      } else {
        linear<P>(L.ffn_gate, nullptr, XB, n, H);
        linear<P>(L.ffn_up, L.ffn_up_b, XB, n, H2);
      }
      backend_.swiglu(H, H, H2, n * n_ff);
    } else {
      linear<P>(L.ffn_up, L.ffn_up_b, XB, n, H);
      backend_.gelu(H, H, n * n_ff);
    }
    linear<P>(L.ffn_down, L.ffn_down_b, H, n, XB);
    residual(X, XB, n);
  }

  /// Runs n tokens at positions n_past().. through the model and leaves the
  /// last token's logits in logits_ (and every token's in all_logits_).
  template <phase P>
  void forward(std::span<const token_id> tokens, bool all_logits) {
    const std::size_t n = tokens.size(), pos0 = cache_.size(), n_embd = cfg_.n_embd();
    if constexpr (P == phase::prefill) grow_scratch(n);
    float *X = px_.data(), *XB = pxb_.data();
    for (std::size_t i = 0; i < n; ++i) {
      backend_.row_to_f32(w_.token_embd, static_cast<std::size_t>(tokens[i]), X + i * n_embd);
      if (hp_.positions == position_type::learned) {
        backend_.row_to_f32(w_.position_embd, pos0 + i, XB);
        backend_.add(X + i * n_embd, XB, n_embd);
      }
    }
    if constexpr (rotates_with_angles) {
      // Each position's RoPE angles once for every layer's q and k (the
      // fallback, b.rope, computes them per call: 2 n_layer times).
      if (hp_.positions == position_type::rope) {
        const std::size_t np = rope_.n_rot / 2;
        grow(rope_cs_, n * np);
        grow(rope_sn_, n * np);
        for (std::size_t i = 0; i < n; ++i)
          cpu::rope_angles(pos0 + i, rope_, rope_cs_.data() + i * np, rope_sn_.data() + i * np);
      }
    }
    // Without all_logits only the last token's x leaves the last layer: the
    // other tokens need only their keys and values there (llama.cpp skips
    // their feed-forward; their queries, attention and output projection
    // feed nothing either): 1/22 of the weights' work at the TinyLlama
    // shape, 1/12 at 110M. kestrel-bench pp512 on Zen 3 (2 threads, 3
    // alternated rounds, t/s without / with): TinyLlama f16 80.8-86.7 /
    // 85.0-92.3, 110M q4_0 815-843 / 960-1049.
    const std::size_t last = cfg_.n_layer() - 1, q0_last = all_logits ? 0 : n - 1;
    for (std::size_t l = 0; l < cfg_.n_layer(); ++l) {
      const std::size_t q0 = l == last ? q0_last : 0;
      attention_block<P>(l, n, pos0, q0);
      ffn_block<P>(l, n - q0, q0);
    }
    cache_.resize(pos0 + n);
    if (all_logits) {
      norm(XB, X, w_.output_norm, w_.output_norm_b, n);
      grow(all_logits_, n * n_vocab());
      linear<P>(w_.output, nullptr, XB, n, all_logits_.data());
      std::memcpy(logits_.data(), all_logits_.data() + (n - 1) * n_vocab(), n_vocab() * sizeof(float));
    } else {
      norm(XB, X + (n - 1) * n_embd, w_.output_norm, w_.output_norm_b, 1);
      backend_.matvec(w_.output, XB, logits_.data());
    }
  }

  static llama_weights validated(llama_weights w) {
    w.hparams.validate(w.source);
    w.validate(w.source);
    return w;
  }

  /// Grow-only scratch: prefill allocates once for the largest chunk seen;
  /// the constructor sizes it for one token, so decode allocates nothing.
  /// The attention's queries and output live in the feed-forward's two
  /// buffers (attention_block is done with them before ffn_block starts):
  /// 2 n n_embd floats less at the peak, 8 MiB of a 512-token TinyLlama
  /// prefill.
  void grow_scratch(std::size_t n) {
    const std::size_t n_embd = cfg_.n_embd(), kv_dim = hp_.kv_dim(), wide = std::max(cfg_.n_ff(), n_embd);
    grow(px_, n * n_embd);
    grow(pxb_, n * n_embd);
    grow(pk_, n * kv_dim);
    grow(pv_, n * kv_dim);
    grow(ph_, n * wide);
    grow(ph2_, n * wide);
  }

  static void grow(aligned_buffer<float>& b, std::size_t n) {
    if (b.size() < n) b = aligned_buffer<float>(n);
  }

  llama_weights w_;
  Config cfg_;
  llama_hparams hp_;
  B backend_;
  std::size_t n_ctx_;
  Cache cache_;
  cpu::rope_spec rope_;
  aligned_buffer<float> rope_cs_, rope_sn_;  // (n, n_rot / 2): the current call's positions' angles
  // activations of up to one prefill chunk (decode uses row 0), grown to the
  // largest chunk seen
  aligned_buffer<float> px_, pxb_, pk_, pv_;  // (n, n_embd) / (n, kv_dim)
  aligned_buffer<float> ph_, ph2_;            // (n, max(n_ff, n_embd)): the feed-forward's; the attention's q and output
  aligned_buffer<float> scores_;  // decode's attention: (n_head, n_ctx), or one decode_block_scratch() per task
  aligned_buffer<float> logits_;                          // (n_vocab)
  aligned_buffer<float> all_logits_;                      // (n, n_vocab)
};

static_assert(GenerativeModel<llama_model<>>);
static_assert(GenerativeModel<llama_model<dynamic_llama_config, cpu_ref_backend>>);

}  // namespace kestrel
