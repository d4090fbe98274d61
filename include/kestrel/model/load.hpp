// kestrel/model/load.hpp: a model file (GGUF or llama2.c checkpoint) or a
// Hugging Face directory into llama_weights and a vocabulary.
//
// This is where a file's run-time facts (its format, its tensors' element
// types) meet the compiled code: one table (model/gguf_types.hpp) maps each
// GGML tensor type to a dtype the kernels know, and everything else is a
// clear error.
#pragma once

#include <cstring>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>

#include "kestrel/core/error.hpp"
#include "kestrel/core/mmap.hpp"
#include "kestrel/core/separate.hpp"
#include "kestrel/io/gguf.hpp"
#include "kestrel/io/llama2c.hpp"
#include "kestrel/model/config.hpp"
#include "kestrel/model/gguf_types.hpp"
#include "kestrel/model/hf.hpp"
#include "kestrel/model/weights.hpp"
#include "kestrel/tokenizer/any.hpp"
#include "kestrel/tokenizer/llama2c_vocab.hpp"
#include "kestrel/tokenizer/sentencepiece_model.hpp"

namespace kestrel {

enum class model_format { gguf, llama2c, hf };

/// A directory is a Hugging Face model; GGUF files start with the magic
/// "GGUF"; anything else is taken to be a llama2.c checkpoint, whose reader
/// validates the header and exact size.
inline model_format detect_format(const std::filesystem::path& path) {
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec)) return model_format::hf;
  mapped_file f(path);
  if (f.size() >= 4 && std::memcmp(f.data(), "GGUF", 4) == 0) return model_format::gguf;
  return model_format::llama2c;
}

namespace detail {

/// A file's tensor type as a kernel's weight type (model/gguf_types.hpp's
/// table); anything else is an error naming the tensor and its type.
inline dtype weight_dtype(const io::gguf_tensor_info& t, const std::string& path) {
  if (const auto d = weight_dtype_of(t.type)) return *d;
  throw file_error(path, t.offset,
                   "tensor " + t.name + " has type " + std::string(io::name_of(t.type)) +
                       ", which this build does not support (supported: F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2_K..Q6_K)");
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

/// The architectures a GGUF file may name in `general.architecture`, with
/// the RoPE pairing its converter leaves the q/k rows in (llama.cpp's
/// converter permutes llama's to adjacent pairs; qwen2's and phi3's stay in
/// Hugging Face's rotate_half order).
inline model_arch gguf_arch(const io::gguf_file& f, cpu::rope_mode& mode) {
  const auto arch = f.get<std::string>("general.architecture");
  mode = cpu::rope_mode::neox;
  if (arch == "llama") {
    mode = cpu::rope_mode::normal;
    return model_arch::llama;
  }
  if (arch == "qwen2") return model_arch::qwen2;
  if (arch == "phi3") return model_arch::phi3;
  if (arch == "gpt2") return model_arch::gpt2;
  throw file_error(f.path(), "general.architecture is '" + arch + "'; this build supports llama, qwen2, phi3 and gpt2");
}

/// Hyperparameters from a GGUF file's metadata (keys under the
/// architecture's name, as llama.cpp writes them).
inline llama_hparams gguf_llama_hparams(const io::gguf_file& f) {
  llama_hparams hp;
  cpu::rope_mode mode = cpu::rope_mode::normal;
  const model_arch arch = gguf_arch(f, mode);  // sets mode: not in the same call (argument order is unspecified)
  hp.set_parts(arch, mode);
  const std::string a = f.get<std::string>("general.architecture") + ".";
  hp.n_embd = f.get<std::uint64_t>(a + "embedding_length");
  hp.n_layer = f.get<std::uint64_t>(a + "block_count");
  hp.n_ff = f.get<std::uint64_t>(a + "feed_forward_length");
  hp.n_head = f.get<std::uint64_t>(a + "attention.head_count");
  hp.n_head_kv = f.get_optional<std::uint64_t>(a + "attention.head_count_kv").value_or(hp.n_head);
  hp.n_ctx_train = f.get<std::uint64_t>(a + "context_length");
  if (hp.norm == norm_type::rms)
    hp.rms_eps = f.get_optional<float>(a + "attention.layer_norm_rms_epsilon").value_or(1e-5f);
  else
    hp.rms_eps = f.get_optional<float>(a + "attention.layer_norm_epsilon").value_or(1e-5f);
  hp.rope_theta = f.get_optional<float>(a + "rope.freq_base").value_or(10000.0f);
  hp.sliding_window = f.get_optional<std::uint64_t>(a + "attention.sliding_window").value_or(0);
  const auto& emb = f.tensor("token_embd.weight");
  if (emb.dims.size() != 2) throw file_error(f.path(), emb.offset, "token_embd.weight is not a matrix");
  hp.n_vocab = static_cast<std::size_t>(emb.dims[1]);
  // llama.cpp's converter writes gpt2's feed_forward_length as 4 n_embd
  // whatever the model has; the tensor is the truth there.
  if (hp.arch == model_arch::gpt2)
    if (const auto* up = f.find_tensor("blk.0.ffn_up.weight"); up && up->dims.size() == 2)
      hp.n_ff = static_cast<std::size_t>(up->dims[1]);
  hp.n_rot = f.get_optional<std::uint64_t>(a + "rope.dimension_count").value_or(hp.n_head ? hp.n_embd / hp.n_head : 0);
  // RoPE scaling: linear interpolation divides positions by the factor;
  // Llama 3's scaling arrives as the rope_freqs.weight tensor instead.
  const auto scaling = f.get_optional<std::string>(a + "rope.scaling.type").value_or("none");
  if (scaling == "linear") {
    const float factor = f.get_optional<float>(a + "rope.scaling.factor").value_or(1.0f);
    if (!(factor >= 1.0f)) throw file_error(f.path(), a + "rope.scaling.factor is " + std::to_string(factor) + ", expected >= 1");
    hp.rope_freq_scale = 1.0f / factor;
  } else if (scaling != "none") {
    throw file_error(f.path(), a + "rope.scaling.type is '" + scaling + "'; this build supports none and linear (and Llama 3's rope_freqs)");
  }
  hp.validate(f.path());
  return hp;
}

namespace detail {

/// A vector tensor if the file has it (biases, LayerNorm shifts), else null.
inline const float* gguf_optional_vector(const io::gguf_file& f, const std::string& name, std::size_t n) {
  return f.find_tensor(name) ? gguf_vector(f, name, n) : nullptr;
}

/// Rows [first, first + n) of a fused matrix (attn_qkv, phi3's gate|up);
/// the matrix must have `total` rows.
inline weight_view gguf_rows(const io::gguf_file& f, const std::string& name, std::size_t total, std::size_t first,
                             std::size_t n) {
  const weight_view w = gguf_matrix(f, name);
  if (w.rows != total)
    throw file_error(f.path(), f.tensor(name).offset, "tensor " + name + " has " + std::to_string(w.rows) +
                                                          " rows, expected " + std::to_string(total));
  return w.rows_from(first, n);
}

}  // namespace detail

inline llama_weights load_gguf_weights(std::shared_ptr<const io::gguf_file> file) {
  const auto& f = *file;
  llama_weights w;
  w.hparams = gguf_llama_hparams(f);
  const auto& hp = w.hparams;
  const std::size_t d = hp.n_embd, kv = hp.kv_dim(), ff = hp.n_ff;
  w.token_embd = detail::gguf_matrix(f, "token_embd.weight");
  if (hp.positions == position_type::learned) w.position_embd = detail::gguf_matrix(f, "position_embd.weight");
  if (f.find_tensor("rope_freqs.weight")) w.rope_freqs = detail::gguf_vector(f, "rope_freqs.weight", hp.n_rot / 2);
  for (const char* name : {"rope_factors_long.weight", "rope_factors_short.weight"})
    if (f.find_tensor(name))
      throw file_error(f.path(), std::string("tensor ") + name + ": LongRoPE scaling is not supported by this build");
  w.output_norm = detail::gguf_vector(f, "output_norm.weight", d);
  w.output_norm_b = detail::gguf_optional_vector(f, "output_norm.bias", d);
  // No output.weight means the classifier is tied to the embedding.
  w.output = f.find_tensor("output.weight") ? detail::gguf_matrix(f, "output.weight") : w.token_embd;
  w.layers.resize(hp.n_layer);
  for (std::size_t l = 0; l < hp.n_layer; ++l) {
    const std::string b = "blk." + std::to_string(l) + ".";
    auto& L = w.layers[l];
    auto opt = [&](const std::string& name, std::size_t n) { return detail::gguf_optional_vector(f, b + name, n); };
    L.attn_norm = detail::gguf_vector(f, b + "attn_norm.weight", d);
    L.attn_norm_b = opt("attn_norm.bias", d);
    if (f.find_tensor(b + "attn_qkv.weight")) {  // fused q|k|v rows (phi3, gpt2)
      const std::string qkv = b + "attn_qkv.weight";
      L.wq = detail::gguf_rows(f, qkv, d + 2 * kv, 0, d);
      L.wk = detail::gguf_rows(f, qkv, d + 2 * kv, d, kv);
      L.wv = detail::gguf_rows(f, qkv, d + 2 * kv, d + kv, kv);
      if (const float* bias = opt("attn_qkv.bias", d + 2 * kv)) {
        L.bq = bias;
        L.bk = bias + d;
        L.bv = bias + d + kv;
      }
    } else {
      L.wq = detail::gguf_matrix(f, b + "attn_q.weight");
      L.wk = detail::gguf_matrix(f, b + "attn_k.weight");
      L.wv = detail::gguf_matrix(f, b + "attn_v.weight");
      L.bq = opt("attn_q.bias", d);
      L.bk = opt("attn_k.bias", kv);
      L.bv = opt("attn_v.bias", kv);
    }
    L.wo = detail::gguf_matrix(f, b + "attn_output.weight");
    L.bo = opt("attn_output.bias", d);
    L.ffn_norm = detail::gguf_vector(f, b + "ffn_norm.weight", d);
    L.ffn_norm_b = opt("ffn_norm.bias", d);
    if (hp.ffn == ffn_type::swiglu && !f.find_tensor(b + "ffn_gate.weight")) {  // phi3: ffn_up holds gate|up
      L.ffn_gate = detail::gguf_rows(f, b + "ffn_up.weight", 2 * ff, 0, ff);
      L.ffn_up = detail::gguf_rows(f, b + "ffn_up.weight", 2 * ff, ff, ff);
    } else {
      if (hp.ffn == ffn_type::swiglu) L.ffn_gate = detail::gguf_matrix(f, b + "ffn_gate.weight");
      L.ffn_up = detail::gguf_matrix(f, b + "ffn_up.weight");
      L.ffn_up_b = opt("ffn_up.bias", ff);
    }
    L.ffn_down = detail::gguf_matrix(f, b + "ffn_down.weight");
    L.ffn_down_b = opt("ffn_down.bias", d);
  }
  w.mapped = {f.file().bytes()};
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
  w.mapped = {c.file().bytes()};
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

/// Loads a GGUF file (weights and tokenizer), a Hugging Face directory (its
/// tokenizer.model: SentencePiece, else tokenizer.json: byte-level BPE), or a llama2.c checkpoint with its
/// `tokenizer.bin` (required for llama2.c files; for the others an explicit
/// tokenizer.bin replaces the model's own vocabulary).
KESTREL_SEPARATE_INLINE model_file load_model_file(const std::filesystem::path& path,
                                                   const std::optional<std::filesystem::path>& tokenizer = std::nullopt);

#if KESTREL_SEPARATE_DEFINE
KESTREL_SEPARATE_INLINE model_file load_model_file(const std::filesystem::path& path,
                                                   const std::optional<std::filesystem::path>& tokenizer) {
  const std::string name = path.string();
  const model_format format = detect_format(path);
  llama_weights weights;
  std::shared_ptr<const io::gguf_file> gguf;
  auto tok = [&]() -> any_tokenizer {
    if (format == model_format::gguf) {
      auto f = gguf = std::make_shared<const io::gguf_file>(path);
      weights = load_gguf_weights(f);
      if (!tokenizer) return tokenizer_from_gguf(*f);
    } else if (format == model_format::hf) {
      weights = load_hf_weights(path);
      if (!tokenizer) {
        // SentencePiece models (llama, mistral) ship tokenizer.model, whose
        // scores our encoder uses; byte-level BPE ones (qwen2, gpt2) only
        // tokenizer.json.
        if (std::filesystem::exists(path / "tokenizer.model"))
          return spm_tokenizer(load_sentencepiece_model(path / "tokenizer.model"));
        if (!std::filesystem::exists(path / "tokenizer.json"))
          throw invalid_argument(name + ": the directory has no tokenizer.model or tokenizer.json; pass a tokenizer (--tokenizer FILE)");
        return bpe_tokenizer(load_bpe_hf_json(path / "tokenizer.json"));
      }
    } else {
      // Anything that is neither a directory nor GGUF lands here: say both,
      // so that a damaged GGUF or a stray config.json is not reported only
      // as a llama2.c header of absurd dimensions.
      std::shared_ptr<const io::llama2c_checkpoint> checkpoint;
      try {
        checkpoint = std::make_shared<const io::llama2c_checkpoint>(path);
      } catch (const file_error& e) {
        std::string why = e.what();
        for (const std::string& prefix : {e.path() + ": offset " + std::to_string(e.offset()) + ": ", e.path() + ": "})
          if (why.rfind(prefix, 0) == 0) {
            why.erase(0, prefix.size());
            break;
          }
        throw file_error(e.path(), e.offset(),
                         "not a GGUF file (it does not start with 'GGUF') and not a llama2.c checkpoint (" + why + ")");
      }
      weights = load_llama2c_weights(std::move(checkpoint));
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
#endif  // KESTREL_SEPARATE_DEFINE

}  // namespace kestrel
