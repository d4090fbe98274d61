// kestrel/io/random_gguf.hpp: a GGUF model file of a real architecture's
// shape with seeded random weights and a real vocabulary, the library half
// of kestrel-make-model. For benchmarks and tests at real scale where no
// real model of that size can be shipped.
//
//   io::random_model_params p{.n_embd = 2048, .n_layer = 22, .n_head = 32, .n_head_kv = 4, .n_ff = 5632};
//   io::gguf_file vocab("ggml-vocab-llama-spm.gguf");
//   io::write_random_model(p, vocab, "tinyllama-shape.gguf", &pool);
//
// Determinism: value i of a tensor is a pure function of (seed, tensor
// name, i): a counter-based splitmix64 and integer arithmetic, no
// std::*_distribution (whose output differs between standard libraries),
// so the bytes are the same on every platform and for any thread count.
//
// Scale: weights are normal-ish (a sum of four uniforms) with std
// 1/sqrt(fan_in) for projections, so every product keeps activations of
// order 1; the projections that write into the residual stream
// (attn_output, ffn_down) are scaled down by a further 1/sqrt(2 n_layer), so
// the residual's variance grows to about 2, not n_layer, through the
// layers; the classifier (and embedding) has std logit_std/sqrt(n_embd),
// giving logits of std ~logit_std after the final RMS norm. Norm weights are 1.
//
// Architectures are rows of random_arch_specs (a hyperparameter writer and a
// tensor list): llama, qwen2, phi3 and gpt2, with the tensors llama.cpp's
// loaders expect for each.
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include "kestrel/core/error.hpp"
#include "kestrel/cpu/thread_pool.hpp"
#include "kestrel/io/gguf.hpp"
#include "kestrel/io/gguf_stream.hpp"
#include "kestrel/io/gguf_write.hpp"
#include "kestrel/quant/convert.hpp"
#include "kestrel/quant/mix.hpp"

namespace kestrel::io {

struct random_model_params {
  std::string arch = "llama";
  std::size_t n_embd = 0, n_layer = 0, n_head = 0;
  std::size_t n_head_kv = 0;     // 0: n_head (no GQA)
  std::size_t n_ff = 0;
  std::size_t n_ctx = 2048;      // <arch>.context_length
  float rope_theta = 10000.0f;
  float rms_eps = 1e-5f;
  bool tied = false;             // no output.weight: the classifier is token_embd
  std::string type = "f32";      // a mix (Q4_K_M, ...) or a tensor type (f16, q4_k, ...)
  std::uint64_t seed = 1;
  std::string name;              // general.name; empty: "random <arch>"
  double logit_std = 3.0;        // std of the logits the classifier gives for a unit-RMS input

  std::size_t kv_heads() const noexcept { return n_head_kv ? n_head_kv : n_head; }
  std::size_t head_dim() const noexcept { return n_head ? n_embd / n_head : 0; }
};

/// splitmix64 (Steele, Lea, Flood 2014) as a counter-based generator: value
/// i of stream `seed` is mix(seed + (i + 1) * golden), so any range of a
/// tensor can be generated on any thread.
struct splitmix64 {
  static constexpr std::uint64_t golden = 0x9e3779b97f4a7c15ull;
  static constexpr std::uint64_t mix(std::uint64_t z) noexcept {
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  }
  static constexpr std::uint64_t at(std::uint64_t seed, std::uint64_t i) noexcept { return mix(seed + (i + 1) * golden); }
};

/// A value of mean 0 and variance 1 from 64 random bits: the sum of four
/// 16-bit uniforms (Irwin-Hall, bell-shaped, bounded by +-3.46), centred and
/// scaled in exact integer and double arithmetic.
inline double normalish(std::uint64_t bits) noexcept {
  const std::int64_t s = static_cast<std::int64_t>((bits & 0xffff) + ((bits >> 16) & 0xffff) + ((bits >> 32) & 0xffff) +
                                                   (bits >> 48)) -
                         2 * 65535;  // 4 * 65535 / 2
  // Variance of the sum: 4 * (65536^2 - 1) / 12.
  constexpr double inv_std = 1.0 / 37837.22627;  // 1 / sqrt((65536^2 - 1) / 3)
  return static_cast<double>(s) * inv_std;
}

/// One tensor of a random model: dims in ggml order; std 0 means all ones.
struct random_tensor_spec {
  std::string name;
  std::vector<std::uint64_t> dims;
  double std = 0;
};

/// One architecture: its parameter checks, hyperparameter keys and tensors.
struct random_arch_spec {
  std::string_view name;
  void (*check)(const random_model_params&);
  void (*hparams)(gguf_builder&, const random_model_params&, std::size_t n_vocab);
  std::vector<random_tensor_spec> (*tensors)(const random_model_params&, std::size_t n_vocab);
};

namespace detail {

inline void check_decoder(const random_model_params& p) {
  auto need = [](std::size_t v, const char* what) {
    if (v == 0) throw invalid_argument(std::string(what) + " must be at least 1");
  };
  need(p.n_embd, "--n-embd");
  need(p.n_layer, "--n-layer");
  need(p.n_head, "--n-head");
  need(p.n_ff, "--n-ff");
  need(p.n_ctx, "--n-ctx");
  if (p.n_embd % p.n_head)
    throw invalid_argument("--n-embd " + std::to_string(p.n_embd) + " is not a multiple of --n-head " +
                           std::to_string(p.n_head) + " (each head gets n_embd / n_head values)");
  if (p.n_head % p.kv_heads())
    throw invalid_argument("--n-head " + std::to_string(p.n_head) + " is not a multiple of --n-head-kv " +
                           std::to_string(p.kv_heads()) + " (each KV head serves n_head / n_head_kv query heads)");
  if (p.head_dim() % 2)
    throw invalid_argument("the head size n_embd / n_head = " + std::to_string(p.head_dim()) +
                           " is odd; RoPE rotates pairs of values");
  if (!(p.rope_theta > 0)) throw invalid_argument("--rope-theta must be positive");
}

/// The <arch>.* keys of a decoder; `rope` false for learned positions (gpt2).
inline void decoder_hparams(gguf_builder& b, const random_model_params& p, std::size_t n_vocab, const std::string& arch,
                            bool rope) {
  auto u32 = [](std::size_t v) { return static_cast<std::uint32_t>(v); };
  const std::string a = arch + ".";
  b.set(a + "vocab_size", u32(n_vocab));
  b.set(a + "context_length", u32(p.n_ctx));
  b.set(a + "embedding_length", u32(p.n_embd));
  b.set(a + "block_count", u32(p.n_layer));
  b.set(a + "feed_forward_length", u32(p.n_ff));
  b.set(a + "attention.head_count", u32(p.n_head));
  if (rope) {
    b.set(a + "rope.dimension_count", u32(p.head_dim()));
    b.set(a + "attention.head_count_kv", u32(p.kv_heads()));
    b.set(a + "attention.layer_norm_rms_epsilon", p.rms_eps);
    b.set(a + "rope.freq_base", p.rope_theta);
  } else {
    b.set(a + "attention.layer_norm_epsilon", p.rms_eps);
  }
}

inline void llama_hparams(gguf_builder& b, const random_model_params& p, std::size_t n_vocab) {
  decoder_hparams(b, p, n_vocab, "llama", true);
}
inline void qwen2_hparams(gguf_builder& b, const random_model_params& p, std::size_t n_vocab) {
  decoder_hparams(b, p, n_vocab, "qwen2", true);
}
inline void phi3_hparams(gguf_builder& b, const random_model_params& p, std::size_t n_vocab) {
  decoder_hparams(b, p, n_vocab, "phi3", true);
  // llama.cpp requires phi3's window; the whole context is "no window".
  b.set("phi3.attention.sliding_window", static_cast<std::uint32_t>(p.n_ctx));
}
inline void gpt2_hparams(gguf_builder& b, const random_model_params& p, std::size_t n_vocab) {
  decoder_hparams(b, p, n_vocab, "gpt2", false);
}

inline void check_gpt2(const random_model_params& p) {
  check_decoder(p);
  if (p.kv_heads() != p.n_head) throw invalid_argument("--arch gpt2 has no grouped-query attention: --n-head-kv must equal --n-head");
}

/// Which parts an architecture's tensor list has (model/config.hpp's table).
struct decoder_layout {
  bool qkv_bias = false;      // qwen2: q/k/v biases
  bool fused = false;         // phi3, gpt2: attn_qkv; phi3 also ffn_up = gate|up
  bool gelu = false;          // gpt2: up/down MLP with biases, LayerNorm with biases, learned positions
};

inline std::vector<random_tensor_spec> decoder_tensors(const random_model_params& p, std::size_t n_vocab,
                                                       decoder_layout k) {
  using u64 = std::uint64_t;
  const u64 d = p.n_embd, kv = p.kv_heads() * p.head_dim(), ff = p.n_ff, v = n_vocab;
  const double in_d = 1.0 / std::sqrt(static_cast<double>(d)), in_ff = 1.0 / std::sqrt(static_cast<double>(ff));
  const double resid = 1.0 / std::sqrt(2.0 * static_cast<double>(p.n_layer));  // writes into the residual stream
  const double cls = p.logit_std * in_d;
  const double bias = 0.02;  // biases and LayerNorm shifts: small, so they are exercised but do not dominate
  std::vector<random_tensor_spec> t;
  t.push_back({"token_embd.weight", {d, v}, cls});
  if (k.gelu) t.push_back({"position_embd.weight", {d, p.n_ctx}, 0.1});
  t.push_back({"output_norm.weight", {d}, 0});
  if (k.gelu) t.push_back({"output_norm.bias", {d}, bias});
  if (!p.tied) t.push_back({"output.weight", {d, v}, cls});
  for (std::size_t l = 0; l < p.n_layer; ++l) {
    const std::string b = "blk." + std::to_string(l) + ".";
    t.push_back({b + "attn_norm.weight", {d}, 0});
    if (k.gelu) t.push_back({b + "attn_norm.bias", {d}, bias});
    if (k.fused) {
      t.push_back({b + "attn_qkv.weight", {d, d + 2 * kv}, in_d});
      if (k.gelu) t.push_back({b + "attn_qkv.bias", {d + 2 * kv}, bias});
    } else {
      t.push_back({b + "attn_q.weight", {d, d}, in_d});
      t.push_back({b + "attn_k.weight", {d, kv}, in_d});
      t.push_back({b + "attn_v.weight", {d, kv}, in_d});
      if (k.qkv_bias) {
        t.push_back({b + "attn_q.bias", {d}, bias});
        t.push_back({b + "attn_k.bias", {kv}, bias});
        t.push_back({b + "attn_v.bias", {kv}, bias});
      }
    }
    t.push_back({b + "attn_output.weight", {d, d}, in_d * resid});
    if (k.gelu) t.push_back({b + "attn_output.bias", {d}, bias});
    t.push_back({b + "ffn_norm.weight", {d}, 0});
    if (k.gelu) {
      t.push_back({b + "ffn_norm.bias", {d}, bias});
      t.push_back({b + "ffn_up.weight", {d, ff}, in_d});
      t.push_back({b + "ffn_up.bias", {ff}, bias});
    } else if (k.fused) {
      t.push_back({b + "ffn_up.weight", {d, 2 * ff}, in_d});  // gate rows, then up rows
    } else {
      t.push_back({b + "ffn_gate.weight", {d, ff}, in_d});
      t.push_back({b + "ffn_up.weight", {d, ff}, in_d});
    }
    t.push_back({b + "ffn_down.weight", {ff, d}, in_ff * resid});
    if (k.gelu) t.push_back({b + "ffn_down.bias", {d}, bias});
  }
  return t;
}

inline std::vector<random_tensor_spec> llama_tensors(const random_model_params& p, std::size_t n_vocab) {
  return decoder_tensors(p, n_vocab, {});
}
inline std::vector<random_tensor_spec> qwen2_tensors(const random_model_params& p, std::size_t n_vocab) {
  return decoder_tensors(p, n_vocab, {.qkv_bias = true});
}
inline std::vector<random_tensor_spec> phi3_tensors(const random_model_params& p, std::size_t n_vocab) {
  return decoder_tensors(p, n_vocab, {.fused = true});
}
inline std::vector<random_tensor_spec> gpt2_tensors(const random_model_params& p, std::size_t n_vocab) {
  return decoder_tensors(p, n_vocab, {.fused = true, .gelu = true});
}

inline std::uint64_t fnv1a(std::string_view s) noexcept {
  std::uint64_t h = 0xcbf29ce484222325ull;
  for (unsigned char c : s) h = (h ^ c) * 0x100000001b3ull;
  return h;
}

}  // namespace detail

/// The architectures make-model can write. A new one is a row here: its
/// checks, its <arch>.* keys and its tensor list.
inline const random_arch_spec random_arch_specs[] = {
    {"llama", detail::check_decoder, detail::llama_hparams, detail::llama_tensors},
    {"qwen2", detail::check_decoder, detail::qwen2_hparams, detail::qwen2_tensors},
    {"phi3", detail::check_decoder, detail::phi3_hparams, detail::phi3_tensors},
    {"gpt2", detail::check_gpt2, detail::gpt2_hparams, detail::gpt2_tensors},
};

inline const random_arch_spec& random_arch(std::string_view name) {
  std::string names;
  for (const auto& a : random_arch_specs) {
    if (a.name == name) return a;
    names += (names.empty() ? "" : ", ") + std::string(a.name);
  }
  throw invalid_argument("--arch " + std::string(name) + " is not supported (yet); supported: " + names);
}

/// The mix a --type names: a mix name (Q4_K_M, q8_0, ...) with llama.cpp's
/// per-tensor rules, or a k-quant tensor type (q4_k, ...) for every matrix
/// (--pure, filed under the mix of that base type).
inline quant::mix_params random_model_mix(std::string_view type) {
  quant::mix_params m;
  if (auto mix = quant::parse_mix(type)) {
    m.type = *mix;
    return m;
  }
  if (auto t = quant::parse_ggml_type(type)) {
    for (const auto& info : quant::mix_table)
      if (info.base == *t) {  // the first mix with this base: the _S one for k-quants
        m.type = info.mix;
        m.pure = true;
        return m;
      }
  }
  throw invalid_argument("--type " + std::string(type) + " is not a known type; use one of " + quant::mix_names() +
                         ", or Q3_K, Q4_K, Q5_K for every matrix");
}

/// Fills `out` (n values) with value `first`.. of the tensor stream `stream`, times `std`.
inline void random_values(std::uint64_t stream, std::uint64_t first, double std, float* out, std::size_t n) {
  for (std::size_t i = 0; i < n; ++i)
    out[i] = std == 0 ? 1.0f : static_cast<float>(std * normalish(splitmix64::at(stream, first + i)));
}

/// Progress of write_random_model: after tensor `index` of `count`.
struct random_tensor_event {
  std::size_t index = 0, count = 0;
  const gguf_tensor_decl* tensor = nullptr;
  std::uint64_t bytes = 0;
};

/// Writes the model; `vocab`'s tokenizer.* keys are copied and give
/// n_vocab. Memory: one tensor's output at a time.
template <class OnTensor = std::nullptr_t>
void write_random_model(const random_model_params& p, const gguf_file& vocab, const std::filesystem::path& out,
                        cpu::thread_pool* pool, OnTensor&& on_tensor = nullptr) {
  const auto& arch = random_arch(p.arch);
  arch.check(p);
  quant::mix_params mix = random_model_mix(p.type);
  refuse_to_overwrite(vocab.path(), out, "vocabulary");
  if (!vocab.has("tokenizer.ggml.tokens") || vocab.type_of("tokenizer.ggml.tokens") != gguf_type::array)
    throw file_error(vocab.path(), "no tokenizer metadata (tokenizer.ggml.tokens is missing): --vocab needs a GGUF "
                                   "file with a vocabulary, such as llama.cpp's models/ggml-vocab-*.gguf");
  const std::size_t n_vocab = vocab.array_size("tokenizer.ggml.tokens");
  if (n_vocab == 0) throw file_error(vocab.path(), "tokenizer.ggml.tokens is empty");
  mix.n_layer = p.n_layer;
  mix.n_gqa = p.n_head / p.kv_heads();
  mix.has_output = !p.tied;

  gguf_builder meta;
  meta.set("general.architecture", std::string(arch.name));
  meta.set("general.name", p.name.empty() ? "random " + std::string(arch.name) : p.name);
  meta.set("general.alignment", std::uint32_t{32});
  meta.set("general.file_type", quant::llama_ftype(mix.type));
  meta.set("general.quantization_version", std::uint32_t{2});
  arch.hparams(meta, p, n_vocab);
  for (const auto& key : vocab.keys())
    if (key.rfind("tokenizer.", 0) == 0) meta.copy_kv(vocab, key);

  const auto specs = arch.tensors(p, n_vocab);
  std::vector<gguf_tensor_decl> decls;
  decls.reserve(specs.size());
  for (const auto& s : specs) decls.push_back({s.name, s.dims, quant::tensor_type(s.name, s.dims, ggml_type::f32, mix)});
  gguf_stream_writer w(out, meta, decls);

  std::vector<std::byte> buf;
  for (std::size_t i = 0; i < specs.size(); ++i) {
    const auto& s = specs[i];
    const auto& d = decls[i];
    const std::size_t n_per_row = static_cast<std::size_t>(s.dims[0]);
    std::size_t n_rows = 1;
    for (std::size_t k = 1; k < s.dims.size(); ++k) n_rows *= static_cast<std::size_t>(s.dims[k]);
    const std::size_t row = quant::row_bytes(d.type, n_per_row);
    buf.resize(row * n_rows);
    const std::uint64_t stream = splitmix64::mix(p.seed ^ detail::fnv1a(s.name));
    auto work = [&](std::size_t begin, std::size_t end) {
      std::vector<float> f(n_per_row);
      for (std::size_t r = begin; r < end; ++r) {
        random_values(stream, static_cast<std::uint64_t>(r) * n_per_row, s.std, f.data(), n_per_row);
        quant::from_f32_row(d.type, f.data(), buf.data() + r * row, n_per_row);
      }
    };
    if (pool) pool->parallel_for(n_rows, work);
    else work(0, n_rows);
    w.write_tensor(buf);
    if constexpr (!std::is_same_v<std::decay_t<OnTensor>, std::nullptr_t>)
      on_tensor(random_tensor_event{i, specs.size(), &d, buf.size()});
  }
  w.finish();
}

}  // namespace kestrel::io
