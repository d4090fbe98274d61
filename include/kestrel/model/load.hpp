// kestrel/model/load.hpp: a model file (GGUF or llama2.c checkpoint) into
// llama_weights and a vocabulary.
//
// This is where a file's run-time facts (its format, its tensors' element
// types) meet the compiled code: one table maps each GGML tensor type to a
// dtype the kernels know, and everything else is a clear error.
#pragma once

#include <cstring>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>

#include "kestrel/core/error.hpp"
#include "kestrel/core/mmap.hpp"
#include "kestrel/io/gguf.hpp"
#include "kestrel/io/llama2c.hpp"
#include "kestrel/model/config.hpp"
#include "kestrel/model/weights.hpp"
#include "kestrel/tokenizer/any.hpp"
#include "kestrel/tokenizer/llama2c_vocab.hpp"

namespace kestrel {

enum class model_format { gguf, llama2c };

/// GGUF files start with the magic "GGUF"; anything else is taken to be a
/// llama2.c checkpoint, whose reader validates the header and exact size.
inline model_format detect_format(const std::filesystem::path& path) {
  mapped_file f(path);
  if (f.size() >= 4 && std::memcmp(f.data(), "GGUF", 4) == 0) return model_format::gguf;
  return model_format::llama2c;
}

namespace detail {

/// The one table from a file's tensor type to a kernel's weight type.
inline dtype weight_dtype(const io::gguf_tensor_info& t, const std::string& path) {
  switch (t.type) {
    case io::ggml_type::f32: return dtype::f32;
    case io::ggml_type::f16: return dtype::f16;
    case io::ggml_type::bf16: return dtype::bf16;
    case io::ggml_type::q4_0: return dtype::q4_0;
    case io::ggml_type::q4_1: return dtype::q4_1;
    case io::ggml_type::q5_0: return dtype::q5_0;
    case io::ggml_type::q5_1: return dtype::q5_1;
    case io::ggml_type::q8_0: return dtype::q8_0;
    case io::ggml_type::q2_k: return dtype::q2_k;
    case io::ggml_type::q3_k: return dtype::q3_k;
    case io::ggml_type::q4_k: return dtype::q4_k;
    case io::ggml_type::q5_k: return dtype::q5_k;
    case io::ggml_type::q6_k: return dtype::q6_k;
    default:
      throw file_error(path, t.offset,
                       "tensor " + t.name + " has type " + std::string(io::name_of(t.type)) +
                           ", which this build does not support (supported: F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2_K..Q6_K)");
  }
}

inline weight_view gguf_matrix(const io::gguf_file& f, const std::string& name) {
  const auto& t = f.tensor(name);
  if (t.dims.size() != 2)
    throw file_error(f.path(), t.offset, "tensor " + name + " has " + std::to_string(t.dims.size()) + " dimensions, expected 2");
  return {weight_dtype(t, f.path()), t.data, static_cast<std::size_t>(t.dims[1]), static_cast<std::size_t>(t.dims[0])};
}

inline const float* gguf_vector(const io::gguf_file& f, const std::string& name, std::size_t n) {
  const auto& t = f.tensor(name);
  if (t.type != io::ggml_type::f32)
    throw file_error(f.path(), t.offset, "tensor " + name + " has type " + std::string(io::name_of(t.type)) + ", expected F32");
  if (t.dims.size() != 1 || t.dims[0] != n)
    throw file_error(f.path(), t.offset, "tensor " + name + " has " + std::to_string(t.n_elements()) +
                                             " elements, expected a vector of " + std::to_string(n));
  return reinterpret_cast<const float*>(t.data);
}

}  // namespace detail

/// Hyperparameters from a GGUF file's metadata (`general.architecture` must be llama).
inline llama_hparams gguf_llama_hparams(const io::gguf_file& f) {
  const auto arch = f.get<std::string>("general.architecture");
  if (arch != "llama")
    throw file_error(f.path(), "general.architecture is '" + arch + "'; this build supports 'llama'");
  llama_hparams hp;
  hp.n_embd = f.get<std::uint64_t>("llama.embedding_length");
  hp.n_layer = f.get<std::uint64_t>("llama.block_count");
  hp.n_ff = f.get<std::uint64_t>("llama.feed_forward_length");
  hp.n_head = f.get<std::uint64_t>("llama.attention.head_count");
  hp.n_head_kv = f.get_optional<std::uint64_t>("llama.attention.head_count_kv").value_or(hp.n_head);
  hp.n_ctx_train = f.get<std::uint64_t>("llama.context_length");
  hp.rms_eps = f.get_optional<float>("llama.attention.layer_norm_rms_epsilon").value_or(1e-5f);
  hp.rope_theta = f.get_optional<float>("llama.rope.freq_base").value_or(10000.0f);
  const auto& emb = f.tensor("token_embd.weight");
  if (emb.dims.size() != 2) throw file_error(f.path(), emb.offset, "token_embd.weight is not a matrix");
  hp.n_vocab = static_cast<std::size_t>(emb.dims[1]);
  hp.n_rot = f.get_optional<std::uint64_t>("llama.rope.dimension_count").value_or(hp.n_head ? hp.n_embd / hp.n_head : 0);
  hp.validate(f.path());
  return hp;
}

inline llama_weights load_gguf_weights(std::shared_ptr<const io::gguf_file> file) {
  const auto& f = *file;
  llama_weights w;
  w.hparams = gguf_llama_hparams(f);
  const auto& hp = w.hparams;
  w.token_embd = detail::gguf_matrix(f, "token_embd.weight");
  w.output_norm = detail::gguf_vector(f, "output_norm.weight", hp.n_embd);
  // No output.weight means the classifier is tied to the embedding.
  w.output = f.find_tensor("output.weight") ? detail::gguf_matrix(f, "output.weight") : w.token_embd;
  w.layers.resize(hp.n_layer);
  for (std::size_t l = 0; l < hp.n_layer; ++l) {
    const std::string b = "blk." + std::to_string(l) + ".";
    auto& L = w.layers[l];
    L.attn_norm = detail::gguf_vector(f, b + "attn_norm.weight", hp.n_embd);
    L.wq = detail::gguf_matrix(f, b + "attn_q.weight");
    L.wk = detail::gguf_matrix(f, b + "attn_k.weight");
    L.wv = detail::gguf_matrix(f, b + "attn_v.weight");
    L.wo = detail::gguf_matrix(f, b + "attn_output.weight");
    L.ffn_norm = detail::gguf_vector(f, b + "ffn_norm.weight", hp.n_embd);
    L.ffn_gate = detail::gguf_matrix(f, b + "ffn_gate.weight");
    L.ffn_up = detail::gguf_matrix(f, b + "ffn_up.weight");
    L.ffn_down = detail::gguf_matrix(f, b + "ffn_down.weight");
  }
  w.owner = std::move(file);
  w.source = f.path();
  w.validate(f.path());
  return w;
}

inline llama_weights load_llama2c_weights(std::shared_ptr<const io::llama2c_checkpoint> file) {
  const auto& c = *file;
  const auto& cfg = c.config();
  llama_weights w;
  auto& hp = w.hparams;
  hp.n_embd = static_cast<std::size_t>(cfg.dim);
  hp.n_layer = static_cast<std::size_t>(cfg.n_layers);
  hp.n_head = static_cast<std::size_t>(cfg.n_heads);
  hp.n_head_kv = static_cast<std::size_t>(cfg.n_kv_heads);
  hp.n_ff = static_cast<std::size_t>(cfg.hidden_dim);
  hp.n_vocab = static_cast<std::size_t>(cfg.vocab_size);
  hp.n_ctx_train = static_cast<std::size_t>(cfg.seq_len);
  hp.n_rot = hp.head_dim();  // llama2.c rotates the whole head
  hp.rope_theta = 10000.0f;  // fixed in llama2.c's run.c
  hp.rms_eps = 1e-5f;        // likewise
  hp.validate(c.path());
  const std::size_t d = hp.n_embd, kv = hp.kv_dim(), ff = hp.n_ff;
  auto m = [](const float* p, std::size_t rows, std::size_t cols) { return weight_view{dtype::f32, p, rows, cols}; };
  w.token_embd = m(c.token_embedding(), hp.n_vocab, d);
  w.output_norm = c.rms_final();
  w.output = m(c.wcls(), hp.n_vocab, d);
  w.layers.resize(hp.n_layer);
  for (std::size_t l = 0; l < hp.n_layer; ++l) {
    auto& L = w.layers[l];
    L.attn_norm = c.rms_att(l);
    L.wq = m(c.wq(l), d, d);
    L.wk = m(c.wk(l), kv, d);
    L.wv = m(c.wv(l), kv, d);
    L.wo = m(c.wo(l), d, d);
    L.ffn_norm = c.rms_ffn(l);
    L.ffn_gate = m(c.w1(l), ff, d);
    L.ffn_down = m(c.w2(l), d, ff);
    L.ffn_up = m(c.w3(l), ff, d);
  }
  w.owner = std::move(file);
  w.source = c.path();
  w.validate(c.path());
  return w;
}

/// A model file and its tokenizer, ready to build a model from.
struct model_file {
  std::string path;
  model_format format = model_format::gguf;
  llama_weights weights;
  any_tokenizer tokenizer;  // SentencePiece or byte-level BPE, as the file says
  std::shared_ptr<const io::gguf_file> gguf;  // the parsed GGUF (metadata such as the chat template); null for llama2.c
};

/// Loads a GGUF file (weights and tokenizer), or a llama2.c checkpoint with
/// its `tokenizer.bin` (required for llama2.c files; for a GGUF file an
/// explicit tokenizer.bin replaces the embedded vocabulary).
inline model_file load_model_file(const std::filesystem::path& path,
                                  const std::optional<std::filesystem::path>& tokenizer = std::nullopt) {
  const std::string name = path.string();
  const model_format format = detect_format(path);
  llama_weights weights;
  std::shared_ptr<const io::gguf_file> gguf;
  auto tok = [&]() -> any_tokenizer {
    if (format == model_format::gguf) {
      auto f = gguf = std::make_shared<const io::gguf_file>(path);
      weights = load_gguf_weights(f);
      if (!tokenizer) return tokenizer_from_gguf(*f);
    } else {
      weights = load_llama2c_weights(std::make_shared<const io::llama2c_checkpoint>(path));
      if (!tokenizer)
        throw invalid_argument(name + ": a llama2.c checkpoint has no vocabulary; pass its tokenizer.bin (--tokenizer FILE)");
    }
    return spm_tokenizer(load_llama2c_tokenizer(*tokenizer, weights.hparams.n_vocab));
  }();
  if (tok.n_vocab() != weights.hparams.n_vocab)
    throw invalid_argument(name + ": the vocabulary has " + std::to_string(tok.n_vocab()) +
                           " tokens but the model's embedding has " + std::to_string(weights.hparams.n_vocab));
  return {name, format, std::move(weights), std::move(tok), std::move(gguf)};
}

}  // namespace kestrel
