// tests/model/random_model.hpp: a llama model with seeded random weights,
// built in memory, large enough that the kernels split work across threads
// (the fixture models are below the pool's min_parallel_work).
#pragma once

#include <cmath>
#include <cstdint>
#include <memory>
#include <vector>

#include "kestrel/core/dtype.hpp"
#include "kestrel/model/weights.hpp"

namespace kestrel::test {

inline llama_weights random_llama(const llama_hparams& hp, dtype type, std::uint64_t seed) {
  struct storage {
    std::vector<std::vector<std::uint16_t>> half;
    std::vector<std::vector<float>> full;
  };
  auto st = std::make_shared<storage>();
  std::uint64_t s = seed;
  auto uniform = [&] {  // in [-1, 1)
    s = s * 6364136223846793005ull + 1442695040888963407ull;
    return static_cast<float>(static_cast<double>(s >> 11) * 0x1.0p-52 - 1.0);
  };
  // Uniform(-a, a) with a = sqrt(3 / cols) has variance 1/cols, so each
  // product keeps activations of order 1 through the layers.
  auto matrix = [&](std::size_t rows, std::size_t cols) {
    const float a = std::sqrt(3.0f / static_cast<float>(cols));
    weight_view w{type, nullptr, rows, cols};
    if (type == dtype::f32) {
      auto& v = st->full.emplace_back(rows * cols);
      for (auto& x : v) x = a * uniform();
      w.data = v.data();
    } else {
      auto& v = st->half.emplace_back(rows * cols);
      for (auto& x : v) x = type == dtype::f16 ? to_f16(a * uniform()).bits : to_bf16(a * uniform()).bits;
      w.data = v.data();
    }
    return w;
  };
  auto norm = [&](std::size_t n) {
    auto& v = st->full.emplace_back(n);
    for (auto& x : v) x = 1.0f + 0.1f * uniform();
    return static_cast<const float*>(v.data());
  };
  st->full.reserve(4 * hp.n_layer + 8);  // stable addresses: no reallocation of the outer vectors
  st->half.reserve(8 * hp.n_layer + 8);
  llama_weights w;
  w.hparams = hp;
  w.source = "random llama (seed " + std::to_string(seed) + ")";
  w.token_embd = matrix(hp.n_vocab, hp.n_embd);
  w.output = matrix(hp.n_vocab, hp.n_embd);
  w.output_norm = norm(hp.n_embd);
  for (std::size_t l = 0; l < hp.n_layer; ++l) {
    llama_layer_weights L;
    L.attn_norm = norm(hp.n_embd);
    L.wq = matrix(hp.n_embd, hp.n_embd);
    L.wk = matrix(hp.kv_dim(), hp.n_embd);
    L.wv = matrix(hp.kv_dim(), hp.n_embd);
    L.wo = matrix(hp.n_embd, hp.n_embd);
    L.ffn_norm = norm(hp.n_embd);
    L.ffn_gate = matrix(hp.n_ff, hp.n_embd);
    L.ffn_up = matrix(hp.n_ff, hp.n_embd);
    L.ffn_down = matrix(hp.n_embd, hp.n_ff);
    w.layers.push_back(L);
  }
  w.owner = std::move(st);
  return w;
}

/// 256-wide, 2 layers, GQA 8 query heads over 2 KV heads: every matrix has
/// more than 32K elements, so matvec and matmul run on all threads.
inline llama_hparams random_llama_shape() {
  llama_hparams hp;
  hp.n_embd = 256;
  hp.n_layer = 2;
  hp.n_head = 8;
  hp.n_head_kv = 2;
  hp.n_ff = 512;
  hp.n_vocab = 1000;
  hp.n_ctx_train = 256;
  hp.n_rot = 32;
  return hp;
}

}  // namespace kestrel::test

#include "kestrel/cpu/quantized.hpp"

namespace kestrel::test {

/// A copy of f32 weights with every matrix whose rows are whole blocks
/// quantized to `type` (the others stay f32, as llama.cpp's quantizer falls
/// back for such tensors); norms stay f32.
inline llama_weights quantized_copy(const llama_weights& src, dtype type) {
  auto store = std::make_shared<std::vector<std::vector<std::byte>>>();
  store->reserve(8 * src.layers.size() + 4);
  auto q = [&](const weight_view& w) -> weight_view {
    if (w.type != dtype::f32 || w.cols % block_size(type) != 0) return w;
    weight_view out{type, nullptr, w.rows, w.cols};
    auto& bytes = store->emplace_back(out.bytes());
    out.data = bytes.data();
    cpu::detail::visit_quantized(out, [&](const auto* blocks) {
      using B = std::remove_cv_t<std::remove_pointer_t<decltype(blocks)>>;
      for (std::size_t r = 0; r < w.rows; ++r)
        quant::quantize_row(static_cast<const float*>(w.data) + r * w.cols,
                            reinterpret_cast<B*>(bytes.data() + r * out.row_bytes()), w.cols);
    });
    return out;
  };
  llama_weights w = src;
  w.token_embd = q(src.token_embd);
  w.output = q(src.output);
  for (auto& L : w.layers) {
    L.wq = q(L.wq), L.wk = q(L.wk), L.wv = q(L.wv), L.wo = q(L.wo);
    L.ffn_gate = q(L.ffn_gate), L.ffn_up = q(L.ffn_up), L.ffn_down = q(L.ffn_down);
  }
  w.owner = std::make_shared<std::pair<std::shared_ptr<const void>, decltype(store)>>(src.owner, store);
  w.source = src.source + " quantized to " + std::string(name_of(type));
  return w;
}

}  // namespace kestrel::test
