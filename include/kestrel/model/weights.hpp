// kestrel/model/weights.hpp: views of a decoder's weights (every
// architecture of model/config.hpp; a part an architecture lacks is null).
//
// The views point into a file mapping (zero copy); `owner` keeps that
// mapping alive for as long as any copy of the weights exists. A backend may
// move the matrices when a model is built (prepare_weights in
// model/concepts.hpp: cpu_backend copies them into huge pages); `copy` then
// owns where they went, and copied_bytes says how much moved.
#pragma once

#include <array>
#include <cstddef>
#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "kestrel/core/error.hpp"
#include "kestrel/core/tensor.hpp"
#include "kestrel/model/config.hpp"

namespace kestrel {

struct llama_layer_weights {
  const float* attn_norm = nullptr;  // (n_embd)
  const float* attn_norm_b = nullptr;  // (n_embd) LayerNorm bias
  weight_view wq;                    // (n_embd, n_embd)   a fused qkv tensor is viewed as three
  weight_view wk;                    // (kv_dim, n_embd)
  weight_view wv;                    // (kv_dim, n_embd)
  weight_view wo;                    // (n_embd, n_embd)
  const float* bq = nullptr;         // (n_embd)  projection biases (qwen2: q, k, v; gpt2: all four)
  const float* bk = nullptr;         // (kv_dim)
  const float* bv = nullptr;         // (kv_dim)
  const float* bo = nullptr;         // (n_embd)
  const float* ffn_norm = nullptr;   // (n_embd)
  const float* ffn_norm_b = nullptr; // (n_embd)
  weight_view ffn_gate;              // (n_ff, n_embd)   w1 in llama2.c; absent for a GELU MLP
  weight_view ffn_up;                // (n_ff, n_embd)   w3
  weight_view ffn_down;              // (n_embd, n_ff)   w2
  const float* ffn_up_b = nullptr;   // (n_ff)
  const float* ffn_down_b = nullptr; // (n_embd)

  /// The layer's norm weights and biases with their lengths in floats (a
  /// part the architecture lacks is null).
  std::array<std::pair<const float**, std::size_t>, 10> vectors(const llama_hparams& hp) noexcept {
    const std::size_t d = hp.n_embd, kv = hp.kv_dim();
    return {{{&attn_norm, d}, {&attn_norm_b, d}, {&bq, d}, {&bk, kv}, {&bv, kv}, {&bo, d}, {&ffn_norm, d},
             {&ffn_norm_b, d}, {&ffn_up_b, hp.n_ff}, {&ffn_down_b, d}}};
  }

  /// The layer's seven matrices, in the order decode reads them (a part the
  /// architecture lacks has null data).
  std::array<weight_view*, 7> matrices() noexcept { return {&wq, &wk, &wv, &wo, &ffn_gate, &ffn_up, &ffn_down}; }
  std::array<const weight_view*, 7> matrices() const noexcept {
    return {&wq, &wk, &wv, &wo, &ffn_gate, &ffn_up, &ffn_down};
  }
};

struct llama_weights {
  llama_hparams hparams;
  weight_view token_embd;            // (n_vocab, n_embd)
  weight_view position_embd;         // (n_ctx_train, n_embd), learned positions only
  const float* rope_freqs = nullptr; // (n_rot / 2) frequency divisors (Llama 3 rope scaling), or none
  std::vector<llama_layer_weights> layers;
  const float* output_norm = nullptr;  // (n_embd)
  const float* output_norm_b = nullptr;  // (n_embd) LayerNorm bias
  weight_view output;                // (n_vocab, n_embd); the same memory as token_embd when tied
  std::shared_ptr<const void> owner;  // keeps the file mapping alive
  std::shared_ptr<const void> copy;   // owns the matrices' copy when a backend moved them (prepare_weights)
  std::size_t copied_bytes = 0;       // how many of the matrices' bytes (as in the file) prepare_weights copied
  /// The read-only private file mappings the views may point into (set by
  /// the loaders; empty for weights in memory). Pages inside them may be
  /// released (release_pages, core/mmap.hpp) and are then read back from the
  /// file on the next access; a view elsewhere (a tensor transposed or
  /// converted at load) must never be released.
  std::vector<std::span<const std::byte>> mapped;

  /// Whether the n bytes at p lie inside one of `mapped`.
  bool in_mapping(const void* p, std::size_t n) const noexcept {
    const auto* b = static_cast<const std::byte*>(p);
    for (const auto& m : mapped)
      if (b >= m.data() && n <= m.size() && b - m.data() <= static_cast<std::ptrdiff_t>(m.size() - n)) return true;
    return false;
  }
  std::string source = "<memory>";    // the file the weights came from, for error messages

  /// Checks every matrix's shape against the hyperparameters.
  void validate(const std::string& source) const {
    const auto& hp = hparams;
    auto check = [&](const weight_view& w, std::size_t rows, std::size_t cols, const std::string& name) {
      if (!w.data) throw invalid_argument(source + ": missing tensor " + name);
      if (w.rows != rows || w.cols != cols)
        throw invalid_argument(source + ": tensor " + name + " has shape (" + std::to_string(w.rows) + ", " +
                               std::to_string(w.cols) + "), expected (" + std::to_string(rows) + ", " +
                               std::to_string(cols) + ")");
    };
    auto need = [&](const float* p, const std::string& name) {
      if (!p) throw invalid_argument(source + ": missing tensor " + name);
    };
    check(token_embd, hp.n_vocab, hp.n_embd, "token_embd");
    check(output, hp.n_vocab, hp.n_embd, "output");
    need(output_norm, "output_norm");
    if (hp.positions == position_type::learned) check(position_embd, hp.n_ctx_train, hp.n_embd, "position_embd");
    if (layers.size() != hp.n_layer)
      throw invalid_argument(source + ": " + std::to_string(layers.size()) + " layers, expected " + std::to_string(hp.n_layer));
    for (std::size_t l = 0; l < layers.size(); ++l) {
      const auto& L = layers[l];
      const std::string b = "blk." + std::to_string(l) + ".";
      need(L.attn_norm, b + "attn_norm");
      need(L.ffn_norm, b + "ffn_norm");
      check(L.wq, hp.n_embd, hp.n_embd, b + "attn_q");
      check(L.wk, hp.kv_dim(), hp.n_embd, b + "attn_k");
      check(L.wv, hp.kv_dim(), hp.n_embd, b + "attn_v");
      check(L.wo, hp.n_embd, hp.n_embd, b + "attn_output");
      if (hp.ffn == ffn_type::swiglu) check(L.ffn_gate, hp.n_ff, hp.n_embd, b + "ffn_gate");
      check(L.ffn_up, hp.n_ff, hp.n_embd, b + "ffn_up");
      check(L.ffn_down, hp.n_embd, hp.n_ff, b + "ffn_down");
    }
  }
};

}  // namespace kestrel
