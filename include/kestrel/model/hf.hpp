// kestrel/model/hf.hpp: a Hugging Face model directory (config.json and
// safetensors or PyTorch weights, see io/hf_model.hpp) into llama_weights.
//
// config.json is read in both forms transformers writes: 4.x (top-level
// rope_theta / rope_scaling / torch_dtype) and 5.x (rope_parameters). HF
// names map to the model's parts per architecture:
//
//   llama, mistral, qwen2, phi3                      gpt2 ("transformer." prefix optional)
//   model.embed_tokens          token_embd           wte / wpe        token_embd / position_embd
//   layers.N.input_layernorm    attn_norm            h.N.ln_1         attn_norm (+ bias)
//   self_attn.{q,k,v}_proj      wq, wk, wv (+ bias)  h.N.attn.c_attn  fused q|k|v (+ bias)
//   self_attn.qkv_proj (phi3)   fused q|k|v
//   self_attn.o_proj            wo                   h.N.attn.c_proj  wo (+ bias)
//   post_attention_layernorm    ffn_norm             h.N.ln_2         ffn_norm (+ bias)
//   mlp.{gate,up,down}_proj     ffn_gate/up/down     h.N.mlp.c_fc     ffn_up (+ bias)
//   mlp.gate_up_proj (phi3)     fused gate|up        h.N.mlp.c_proj   ffn_down (+ bias)
//   model.norm / lm_head        output_norm / output ln_f             output_norm (+ bias), tied
//
// Matrices stay zero-copy views of the mapping (RoPE runs in the neox
// pairing HF checkpoints are written for, so q/k rows need no permutation),
// except GPT-2's Conv1D weights, stored (in, out): they are transposed once
// at load into memory the weights own. Vectors (norms, biases) are copied to
// f32 (they are small, and a bf16 file stores them as bf16).
#pragma once

#include <cmath>
#include <cstddef>
#include <cstring>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "kestrel/core/dtype.hpp"
#include "kestrel/core/error.hpp"
#include "kestrel/io/hf_model.hpp"
#include "kestrel/model/config.hpp"
#include "kestrel/model/weights.hpp"

namespace kestrel {

namespace detail {

/// What weights loaded from an HF directory keep alive: the files, and the
/// few tensors made at load (transposes, f32 vectors, RoPE factors).
struct hf_storage {
  std::shared_ptr<const io::hf_model> model;
  std::vector<std::vector<float>> vectors;
  std::vector<std::vector<std::byte>> matrices;
};

class hf_reader {
 public:
  hf_reader(std::shared_ptr<const io::hf_model> m, hf_storage& store)
      : m_(*m), store_(store), cfg_path_((m->directory() / "config.json").string()) {}

  const io::json_value& config() const { return m_.config(); }

  // ---- config.json -------------------------------------------------------
  const io::json_value* key(const std::string& k) const {
    const auto* v = config().find(k);
    return v && !v->is_null() ? v : nullptr;
  }
  [[noreturn]] void bad(const std::string& what) const { throw file_error(cfg_path_, what); }
  double number(const std::string& k) const {
    const auto* v = key(k);
    if (!v) bad("missing key \"" + k + "\"");
    if (!v->is_number()) bad("key \"" + k + "\" is not a number");
    return v->as_number();
  }
  double number_or(const std::string& k, double fallback) const { return key(k) ? number(k) : fallback; }
  std::size_t count(const std::string& k) const {
    const double v = number(k);
    if (!(v >= 0 && v <= 1e12) || v != std::floor(v)) bad("key \"" + k + "\" is not a count: " + std::to_string(v));
    return static_cast<std::size_t>(v);
  }
  std::size_t count_or(const std::string& k, std::size_t fallback) const { return key(k) ? count(k) : fallback; }
  bool flag_or(const std::string& k, bool fallback) const {
    const auto* v = key(k);
    if (!v) return fallback;
    if (!v->is_bool()) bad("key \"" + k + "\" is not true or false");
    return v->as_bool();
  }
  std::string string_or(const std::string& k, const std::string& fallback) const {
    const auto* v = key(k);
    if (!v) return fallback;
    if (!v->is_string()) bad("key \"" + k + "\" is not a string");
    return v->as_string();
  }

  // ---- tensors -----------------------------------------------------------
  bool has(const std::string& name) const { return m_.has(name); }
  const std::string& source() const { return cfg_path_; }

  io::tensor_ref tensor(const std::string& name) const {
    if (!m_.has(name)) throw file_error(m_.directory().string(), "missing tensor " + name);
    return m_.tensor(name);
  }

  weight_view matrix(const std::string& name, std::size_t rows, std::size_t cols) const {
    const auto t = tensor(name);
    check_shape(t, {rows, cols});
    return io::as_weight(t);
  }

  /// An (in, out) Conv1D weight as an (out, in) matrix, transposed into owned memory.
  weight_view transposed(const std::string& name, std::size_t rows, std::size_t cols) {
    const auto t = tensor(name);
    check_shape(t, {cols, rows});
    const std::size_t es = size_of(t.type);
    auto& buf = store_.matrices.emplace_back(rows * cols * es);
    for (std::size_t i = 0; i < cols; ++i)
      for (std::size_t j = 0; j < rows; ++j) std::memcpy(&buf[(j * cols + i) * es], t.data + (i * rows + j) * es, es);
    return weight_view{t.type, buf.data(), rows, cols};
  }

  /// A vector tensor of n elements as f32 (copied), or null when absent and optional.
  const float* vector(const std::string& name, std::size_t n, bool optional = false) {
    if (optional && !m_.has(name)) return nullptr;
    const auto t = tensor(name);
    check_shape(t, {n});
    auto& v = store_.vectors.emplace_back(n);
    for (std::size_t i = 0; i < n; ++i) {
      const std::byte* p = t.data + i * size_of(t.type);
      if (t.type == dtype::f32) {
        std::memcpy(&v[i], p, 4);
      } else {
        std::uint16_t h;
        std::memcpy(&h, p, 2);
        v[i] = t.type == dtype::f16 ? to_f32(f16{h}) : to_f32(bf16{h});
      }
    }
    return v.data();
  }

  float* owned_vector(std::size_t n) { return store_.vectors.emplace_back(n).data(); }

 private:
  void check_shape(const io::tensor_ref& t, const std::vector<std::size_t>& want) const {
    if (t.shape != want)
      throw file_error(m_.directory().string(), "tensor " + t.name + " has shape " + io::detail::shape_string(t.shape) +
                                                    ", expected " + io::detail::shape_string(want));
  }

  const io::hf_model& m_;
  hf_storage& store_;
  std::string cfg_path_;
};

/// RoPE settings from either config form: {"rope_theta", "rope_scaling"}
/// (4.x) or "rope_parameters" (5.x). Returns the scaling dict or null.
inline const io::json_value* hf_rope(const hf_reader& r, llama_hparams& hp) {
  const io::json_value* params = r.key("rope_parameters");
  const io::json_value* scaling = r.key("rope_scaling");
  hp.rope_theta = static_cast<float>(r.number_or("rope_theta", 10000.0));
  if (params && params->is_object()) {
    if (const auto* t = params->find("rope_theta"); t && t->is_number()) hp.rope_theta = static_cast<float>(t->as_number());
    if (!scaling) scaling = params;
  }
  return scaling;
}

/// Llama 3's frequency divisors (rope_freqs in GGUF terms) from its scaling keys.
inline void hf_llama3_factors(hf_reader& r, const io::json_value& s, llama_hparams& hp, llama_weights& w) {
  auto get = [&](const char* k) {
    const auto* v = s.find(k);
    if (!v || !v->is_number()) r.bad(std::string("rope scaling \"llama3\" needs a number \"") + k + "\"");
    return v->as_number();
  };
  const double factor = get("factor"), lo = get("low_freq_factor"), hi = get("high_freq_factor");
  const double old_ctx = get("original_max_position_embeddings");
  if (!(factor >= 1 && lo > 0 && hi > lo && old_ctx > 0)) r.bad("rope scaling \"llama3\" has impossible parameters");
  const double lo_wavelen = old_ctx / lo, hi_wavelen = old_ctx / hi, pi = 3.14159265358979323846;
  float* ff = r.owned_vector(hp.n_rot / 2);
  for (std::size_t i = 0; i < hp.n_rot / 2; ++i) {
    const double freq = std::pow(static_cast<double>(hp.rope_theta), -2.0 * i / static_cast<double>(hp.n_rot));
    const double wavelen = 2 * pi / freq;
    double scaled = freq;
    if (wavelen > lo_wavelen) {
      scaled = freq / factor;
    } else if (wavelen >= hi_wavelen) {
      const double smooth = (old_ctx / wavelen - lo) / (hi - lo);
      scaled = (1 - smooth) * freq / factor + smooth * freq;
    }
    ff[i] = static_cast<float>(freq / scaled);
  }
  w.rope_freqs = ff;
}

inline model_arch hf_arch(const hf_reader& r) {
  std::string type = r.string_or("model_type", "");
  if (type.empty()) {
    if (const auto* a = r.key("architectures"); a && a->is_array() && a->size() && a->as_array()[0].is_string())
      type = a->as_array()[0].as_string();
  }
  if (type == "llama" || type == "LlamaForCausalLM") return model_arch::llama;
  if (type == "mistral" || type == "MistralForCausalLM") return model_arch::mistral;
  if (type == "qwen2" || type == "Qwen2ForCausalLM") return model_arch::qwen2;
  if (type == "phi3" || type == "Phi3ForCausalLM") return model_arch::phi3;
  if (type == "gpt2" || type == "GPT2LMHeadModel") return model_arch::gpt2;
  r.bad("model_type '" + type + "' is not supported (supported: llama, mistral, qwen2, phi3, gpt2)");
}

inline void hf_llama_family(hf_reader& r, llama_weights& w) {
  auto& hp = w.hparams;
  hp.n_embd = r.count("hidden_size");
  hp.n_layer = r.count("num_hidden_layers");
  hp.n_head = r.count("num_attention_heads");
  hp.n_head_kv = r.count_or("num_key_value_heads", hp.n_head);
  hp.n_ff = r.count("intermediate_size");
  hp.n_vocab = r.count("vocab_size");
  hp.n_ctx_train = r.count("max_position_embeddings");
  hp.rms_eps = static_cast<float>(r.number_or("rms_norm_eps", 1e-6));
  if (hp.n_head && r.key("head_dim") && r.count("head_dim") != hp.n_embd / hp.n_head)
    r.bad("head_dim " + std::to_string(r.count("head_dim")) + " differs from hidden_size / num_attention_heads; not supported");
  const std::string act = r.string_or("hidden_act", "silu");
  if (act != "silu" && act != "swish") r.bad("hidden_act '" + act + "' is not supported (expected silu)");
  const double partial = r.number_or("partial_rotary_factor", 1.0);
  hp.n_rot = static_cast<std::size_t>(std::lround(partial * static_cast<double>(hp.n_head ? hp.n_embd / hp.n_head : 0)));
  // A sliding window: mistral and phi3 name it directly; qwen2 only when use_sliding_window.
  if (hp.arch == model_arch::qwen2) {
    if (r.flag_or("use_sliding_window", false)) r.bad("qwen2 with use_sliding_window true is not supported");
  } else {
    hp.sliding_window = r.count_or("sliding_window", 0);
  }
  const io::json_value* scaling = hf_rope(r, hp);
  hp.validate(r.source());

  if (scaling && scaling->is_object()) {
    std::string type = "default";
    if (const auto* t = scaling->find("rope_type"); t && t->is_string()) type = t->as_string();
    else if (const auto* t2 = scaling->find("type"); t2 && t2->is_string()) type = t2->as_string();
    if (type == "linear") {
      const auto* f = scaling->find("factor");
      if (!f || !f->is_number() || !(f->as_number() >= 1)) r.bad("rope scaling \"linear\" needs a factor >= 1");
      hp.rope_freq_scale = static_cast<float>(1.0 / f->as_number());
    } else if (type == "llama3") {
      hf_llama3_factors(r, *scaling, hp, w);
    } else if (type != "default") {
      r.bad("rope scaling type '" + type + "' is not supported (supported: default, linear, llama3)");
    }
  }

  const std::size_t d = hp.n_embd, kv = hp.kv_dim(), ff = hp.n_ff;
  w.token_embd = r.matrix("model.embed_tokens.weight", hp.n_vocab, d);
  w.output_norm = r.vector("model.norm.weight", d);
  const bool tied = r.flag_or("tie_word_embeddings", !r.has("lm_head.weight"));
  w.output = tied ? w.token_embd : r.matrix("lm_head.weight", hp.n_vocab, d);
  w.layers.resize(hp.n_layer);
  for (std::size_t l = 0; l < hp.n_layer; ++l) {
    const std::string b = "model.layers." + std::to_string(l) + ".";
    auto& L = w.layers[l];
    L.attn_norm = r.vector(b + "input_layernorm.weight", d);
    L.ffn_norm = r.vector(b + "post_attention_layernorm.weight", d);
    if (r.has(b + "self_attn.qkv_proj.weight")) {
      const weight_view qkv = r.matrix(b + "self_attn.qkv_proj.weight", d + 2 * kv, d);
      L.wq = qkv.rows_from(0, d);
      L.wk = qkv.rows_from(d, kv);
      L.wv = qkv.rows_from(d + kv, kv);
    } else {
      L.wq = r.matrix(b + "self_attn.q_proj.weight", d, d);
      L.wk = r.matrix(b + "self_attn.k_proj.weight", kv, d);
      L.wv = r.matrix(b + "self_attn.v_proj.weight", kv, d);
      L.bq = r.vector(b + "self_attn.q_proj.bias", d, true);
      L.bk = r.vector(b + "self_attn.k_proj.bias", kv, true);
      L.bv = r.vector(b + "self_attn.v_proj.bias", kv, true);
    }
    L.wo = r.matrix(b + "self_attn.o_proj.weight", d, d);
    if (r.has(b + "mlp.gate_up_proj.weight")) {
      const weight_view gu = r.matrix(b + "mlp.gate_up_proj.weight", 2 * ff, d);
      L.ffn_gate = gu.rows_from(0, ff);
      L.ffn_up = gu.rows_from(ff, ff);
    } else {
      L.ffn_gate = r.matrix(b + "mlp.gate_proj.weight", ff, d);
      L.ffn_up = r.matrix(b + "mlp.up_proj.weight", ff, d);
    }
    L.ffn_down = r.matrix(b + "mlp.down_proj.weight", d, ff);
  }
}

inline void hf_gpt2(hf_reader& r, llama_weights& w) {
  auto& hp = w.hparams;
  hp.n_embd = r.count("n_embd");
  hp.n_layer = r.count("n_layer");
  hp.n_head = r.count("n_head");
  hp.n_head_kv = hp.n_head;
  hp.n_ff = r.count_or("n_inner", 4 * hp.n_embd);
  hp.n_vocab = r.count("vocab_size");
  hp.n_ctx_train = r.count("n_positions");
  hp.n_rot = hp.n_head ? hp.n_embd / hp.n_head : 0;  // unused: learned positions
  hp.rms_eps = static_cast<float>(r.number_or("layer_norm_epsilon", 1e-5));
  const std::string act = r.string_or("activation_function", "gelu_new");
  if (act != "gelu_new" && act != "gelu_pytorch_tanh")
    r.bad("activation_function '" + act + "' is not supported (expected gelu_new, the tanh approximation)");
  if (r.flag_or("scale_attn_by_inverse_layer_idx", false) || !r.flag_or("scale_attn_weights", true))
    r.bad("GPT-2 attention scaling other than 1/sqrt(head_dim) is not supported");
  hp.validate(r.source());
  const std::string p = r.has("transformer.wte.weight") ? "transformer." : "";
  const std::size_t d = hp.n_embd, ff = hp.n_ff;
  w.token_embd = r.matrix(p + "wte.weight", hp.n_vocab, d);
  w.position_embd = r.matrix(p + "wpe.weight", hp.n_ctx_train, d);
  w.output = w.token_embd;  // GPT-2 ties its classifier to the embedding
  w.output_norm = r.vector(p + "ln_f.weight", d);
  w.output_norm_b = r.vector(p + "ln_f.bias", d);
  w.layers.resize(hp.n_layer);
  for (std::size_t l = 0; l < hp.n_layer; ++l) {
    const std::string b = p + "h." + std::to_string(l) + ".";
    auto& L = w.layers[l];
    L.attn_norm = r.vector(b + "ln_1.weight", d);
    L.attn_norm_b = r.vector(b + "ln_1.bias", d);
    const weight_view qkv = r.transposed(b + "attn.c_attn.weight", 3 * d, d);
    L.wq = qkv.rows_from(0, d);
    L.wk = qkv.rows_from(d, d);
    L.wv = qkv.rows_from(2 * d, d);
    const float* bias = r.vector(b + "attn.c_attn.bias", 3 * d);
    L.bq = bias;
    L.bk = bias + d;
    L.bv = bias + 2 * d;
    L.wo = r.transposed(b + "attn.c_proj.weight", d, d);
    L.bo = r.vector(b + "attn.c_proj.bias", d);
    L.ffn_norm = r.vector(b + "ln_2.weight", d);
    L.ffn_norm_b = r.vector(b + "ln_2.bias", d);
    L.ffn_up = r.transposed(b + "mlp.c_fc.weight", ff, d);
    L.ffn_up_b = r.vector(b + "mlp.c_fc.bias", ff);
    L.ffn_down = r.transposed(b + "mlp.c_proj.weight", d, ff);
    L.ffn_down_b = r.vector(b + "mlp.c_proj.bias", d);
  }
}

}  // namespace detail

/// The weights of a Hugging Face model directory. Throws file_error naming
/// config.json and the key, or the directory and the tensor, on anything
/// missing, mismatched or unsupported.
inline llama_weights load_hf_weights(const std::filesystem::path& dir) {
  auto model = std::make_shared<const io::hf_model>(dir);
  auto store = std::make_shared<detail::hf_storage>();
  store->model = model;
  detail::hf_reader r(model, *store);
  llama_weights w;
  w.hparams.set_parts(detail::hf_arch(r), cpu::rope_mode::neox);
  if (w.hparams.arch == model_arch::gpt2)
    detail::hf_gpt2(r, w);
  else
    detail::hf_llama_family(r, w);
  w.mapped = model->mapped_bytes();
  w.owner = std::move(store);
  w.source = dir.string();
  w.validate(w.source);
  return w;
}

}  // namespace kestrel
