// kestrel/model/save.hpp: llama_weights into a GGUF file, in llama.cpp's
// conventions for each architecture, so a model loaded from a Hugging Face
// directory can be written as the GGUF llama.cpp (and kestrel) load:
//
//   llama, mistral  arch "llama"; q/k rows permuted within each head from
//                   HF's rotate_half order to adjacent pairs (GGUF llama
//                   runs "normal" RoPE); mistral's window as
//                   llama.attention.sliding_window (a kestrel key: llama.cpp
//                   has none for llama and runs full attention)
//   qwen2           arch "qwen2", q/k/v biases, rows as they are (neox RoPE)
//   phi3            arch "phi3", attn_qkv = q|k|v rows, ffn_up = gate|up rows
//   gpt2            arch "gpt2", attn_qkv (+ bias), position_embd, and
//                   output.weight written as a copy of the embedding (as
//                   llama.cpp's converter does)
//
// Weights keep their element types (f32/f16/bf16 or GGUF blocks); norms and
// biases are F32. The file is assembled in memory (gguf_builder), which suits
// the models tests and conversions of small models need; the quantize and
// make-model tools stream instead.
#pragma once

#include <cstddef>
#include <cstring>
#include <filesystem>
#include <span>
#include <string>
#include <vector>

#include "kestrel/core/error.hpp"
#include "kestrel/io/gguf_write.hpp"
#include "kestrel/model/gguf_types.hpp"
#include "kestrel/model/weights.hpp"

namespace kestrel {

namespace detail {

class gguf_saver {
 public:
  explicit gguf_saver(io::gguf_builder& b) : b_(b) {}

  /// Matrices whose rows are concatenated (a fused tensor), each row taken
  /// through `row_of` (identity unless permuted). All must share type and cols.
  void matrix(const std::string& name, std::initializer_list<weight_view> parts,
              const std::vector<std::size_t>* row_of = nullptr) {
    const weight_view& first = *parts.begin();
    std::size_t rows = 0;
    for (const auto& p : parts) {
      if (p.type != first.type || p.cols != first.cols)
        throw invalid_argument("write_gguf: the parts of " + name + " differ in type or width");
      rows += p.rows;
    }
    auto& bytes = keep_.emplace_back(rows * first.row_bytes());
    std::size_t at = 0;
    for (const auto& p : parts)
      for (std::size_t r = 0; r < p.rows; ++r, ++at) {
        const std::size_t src = row_of ? (*row_of)[r] : r;
        std::memcpy(bytes.data() + at * first.row_bytes(), p.row(src), first.row_bytes());
      }
    b_.add_tensor(name, {first.cols, rows}, ggml_type_of(first.type), bytes);
  }

  void vector(const std::string& name, const float* v, std::size_t n) {
    if (!v) return;
    auto& bytes = keep_.emplace_back(n * sizeof(float));
    std::memcpy(bytes.data(), v, bytes.size());
    b_.add_tensor(name, {n}, io::ggml_type::f32, bytes);
  }

 private:
  io::gguf_builder& b_;
  std::vector<std::vector<std::byte>> keep_;  // the builder references the data until write()
};

/// GGUF row (head h, 2i + s) holds HF row (head h, s n_rot/2 + i) for the
/// rotated dims; dims past n_rot stay. The map for a (n_heads * head_dim)-row matrix.
inline std::vector<std::size_t> neox_to_normal_rows(std::size_t n_heads, std::size_t head_dim, std::size_t n_rot) {
  std::vector<std::size_t> m(n_heads * head_dim);
  for (std::size_t h = 0; h < n_heads; ++h)
    for (std::size_t r = 0; r < head_dim; ++r)
      m[h * head_dim + r] = h * head_dim + (r < n_rot ? (r % 2) * (n_rot / 2) + r / 2 : r);
  return m;
}

}  // namespace detail

/// Writes `w` as a GGUF file. `name` goes to general.name.
inline void write_gguf(const llama_weights& w, const std::filesystem::path& path, const std::string& name = "kestrel") {
  const auto& hp = w.hparams;
  const bool llama_like = hp.arch == model_arch::llama || hp.arch == model_arch::mistral;
  const std::string arch = llama_like ? "llama" : name_of(hp.arch);
  if (!llama_like && hp.positions == position_type::rope && hp.rope_mode != cpu::rope_mode::neox)
    throw invalid_argument("write_gguf: a " + arch + " GGUF runs neox RoPE, but these weights are in adjacent-pair order");
  io::gguf_builder b;
  const std::string a = arch + ".";
  b.set("general.architecture", arch);
  b.set("general.name", name);
  b.set(a + "context_length", static_cast<std::uint32_t>(hp.n_ctx_train));
  b.set(a + "embedding_length", static_cast<std::uint32_t>(hp.n_embd));
  b.set(a + "block_count", static_cast<std::uint32_t>(hp.n_layer));
  b.set(a + "feed_forward_length", static_cast<std::uint32_t>(hp.n_ff));
  b.set(a + "attention.head_count", static_cast<std::uint32_t>(hp.n_head));
  b.set(a + "attention.head_count_kv", static_cast<std::uint32_t>(hp.n_head_kv));
  if (hp.norm == norm_type::rms)
    b.set(a + "attention.layer_norm_rms_epsilon", hp.rms_eps);
  else
    b.set(a + "attention.layer_norm_epsilon", hp.rms_eps);
  if (hp.positions == position_type::rope) {
    b.set(a + "rope.freq_base", hp.rope_theta);
    b.set(a + "rope.dimension_count", static_cast<std::uint32_t>(hp.n_rot));
    if (hp.rope_freq_scale != 1.0f) {
      b.set(a + "rope.scaling.type", std::string("linear"));
      b.set(a + "rope.scaling.factor", 1.0f / hp.rope_freq_scale);
    }
  }
  if (hp.sliding_window)
    b.set(a + "attention.sliding_window", static_cast<std::uint32_t>(hp.sliding_window));
  else if (hp.arch == model_arch::phi3)  // llama.cpp requires phi3's window; the whole context is "no window"
    b.set(a + "attention.sliding_window", static_cast<std::uint32_t>(hp.n_ctx_train));

  detail::gguf_saver s(b);
  const std::size_t d = hp.n_embd, kv = hp.kv_dim(), ff = hp.n_ff;
  s.matrix("token_embd.weight", {w.token_embd});
  if (hp.positions == position_type::learned) s.matrix("position_embd.weight", {w.position_embd});
  s.vector("rope_freqs.weight", w.rope_freqs, hp.n_rot / 2);
  s.vector("output_norm.weight", w.output_norm, d);
  s.vector("output_norm.bias", w.output_norm_b, d);
  if (w.output.data != w.token_embd.data || hp.arch == model_arch::gpt2) s.matrix("output.weight", {w.output});
  // llama GGUFs hold q/k in adjacent-pair order.
  const bool permute = llama_like && hp.rope_mode == cpu::rope_mode::neox;
  const auto q_rows = detail::neox_to_normal_rows(hp.n_head, hp.head_dim(), hp.n_rot);
  const auto k_rows = detail::neox_to_normal_rows(hp.n_head_kv, hp.head_dim(), hp.n_rot);
  for (std::size_t l = 0; l < hp.n_layer; ++l) {
    const auto& L = w.layers[l];
    const std::string p = "blk." + std::to_string(l) + ".";
    s.vector(p + "attn_norm.weight", L.attn_norm, d);
    s.vector(p + "attn_norm.bias", L.attn_norm_b, d);
    if (hp.arch == model_arch::phi3 || hp.arch == model_arch::gpt2) {
      s.matrix(p + "attn_qkv.weight", {L.wq, L.wk, L.wv});
      if (L.bq) {
        std::vector<float> bias(L.bq, L.bq + d);
        bias.insert(bias.end(), L.bk, L.bk + kv);
        bias.insert(bias.end(), L.bv, L.bv + kv);
        s.vector(p + "attn_qkv.bias", bias.data(), bias.size());
      }
    } else {
      if (permute && (L.bq || L.bk))
        throw invalid_argument("write_gguf: permuting q/k biases for a llama GGUF is not implemented");
      s.matrix(p + "attn_q.weight", {L.wq}, permute ? &q_rows : nullptr);
      s.matrix(p + "attn_k.weight", {L.wk}, permute ? &k_rows : nullptr);
      s.matrix(p + "attn_v.weight", {L.wv});
      s.vector(p + "attn_q.bias", L.bq, d);
      s.vector(p + "attn_k.bias", L.bk, kv);
      s.vector(p + "attn_v.bias", L.bv, kv);
    }
    s.matrix(p + "attn_output.weight", {L.wo});
    s.vector(p + "attn_output.bias", L.bo, d);
    s.vector(p + "ffn_norm.weight", L.ffn_norm, d);
    s.vector(p + "ffn_norm.bias", L.ffn_norm_b, d);
    if (hp.arch == model_arch::phi3) {
      s.matrix(p + "ffn_up.weight", {L.ffn_gate, L.ffn_up});
    } else {
      if (hp.ffn == ffn_type::swiglu) s.matrix(p + "ffn_gate.weight", {L.ffn_gate});
      s.matrix(p + "ffn_up.weight", {L.ffn_up});
      s.vector(p + "ffn_up.bias", L.ffn_up_b, ff);
    }
    s.matrix(p + "ffn_down.weight", {L.ffn_down});
    s.vector(p + "ffn_down.bias", L.ffn_down_b, d);
  }
  b.write(path);
}

}  // namespace kestrel
