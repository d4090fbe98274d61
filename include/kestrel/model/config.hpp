// kestrel/model/config.hpp: decoder hyperparameters, at run time and as a
// static-or-dynamic compile-time configuration.
//
// One decoder serves every architecture kestrel runs; an architecture is a
// choice of parts (see model/llama.hpp):
//
//   arch     norm       positions        attention            FFN
//   llama    RMSNorm    RoPE             GQA                  SwiGLU
//   mistral  = llama, plus a sliding attention window
//   qwen2    RMSNorm    RoPE (neox)      GQA, q/k/v biases    SwiGLU
//   phi3     RMSNorm    RoPE (neox)      fused qkv            SwiGLU, fused gate|up
//   gpt2     LayerNorm  learned          fused qkv, biases    GELU MLP, biases
//
//   llama_hparams            -- what a file says (always run-time values)
//   llama_config<64, 5, ...> -- dimensions fixed at compile time; loading a
//                               file whose dimensions differ is an error
//   llama_config<>           -- every dimension dynamic: serves any file
#pragma once

#include <cstddef>
#include <string>

#include "kestrel/core/error.hpp"
#include "kestrel/core/extents.hpp"
#include "kestrel/cpu/rope.hpp"

namespace kestrel {

enum class model_arch { llama, mistral, qwen2, phi3, gpt2 };
enum class norm_type { rms, layer };                // RMSNorm, or LayerNorm with bias
enum class ffn_type { swiglu, gelu };               // down(silu(gate x) * up x), or down(gelu(up x + b) + b)
enum class position_type { rope, learned };         // rotary, or an added position embedding

inline const char* name_of(model_arch a) noexcept {
  switch (a) {
    case model_arch::llama: return "llama";
    case model_arch::mistral: return "mistral";
    case model_arch::qwen2: return "qwen2";
    case model_arch::phi3: return "phi3";
    case model_arch::gpt2: return "gpt2";
  }
  return "?";
}

struct llama_hparams {
  std::size_t n_embd = 0;       // width of the residual stream
  std::size_t n_layer = 0;
  std::size_t n_head = 0;       // query heads
  std::size_t n_head_kv = 0;    // key/value heads (GQA: n_head % n_head_kv == 0)
  std::size_t n_ff = 0;         // FFN hidden width
  std::size_t n_vocab = 0;
  std::size_t n_ctx_train = 0;  // context length the model was trained for
  std::size_t n_rot = 0;        // rotated dims per head (RoPE); == head_dim for llama
  float rope_theta = 10000.0f;
  float rms_eps = 1e-5f;        // the norm's epsilon (RMSNorm or LayerNorm)

  // The architecture's parts (the defaults are llama's).
  model_arch arch = model_arch::llama;
  norm_type norm = norm_type::rms;
  ffn_type ffn = ffn_type::swiglu;
  position_type positions = position_type::rope;
  cpu::rope_mode rope_mode = cpu::rope_mode::normal;  // normal: GGUF llama; neox: HF checkpoints, qwen2, phi3
  float rope_freq_scale = 1.0f;   // linear RoPE scaling: positions are multiplied by this
  std::size_t sliding_window = 0; // > 0: a token attends to itself and the window - 1 before it

  /// The hyperparameters' parts for `arch`, with the given RoPE pairing.
  void set_parts(model_arch a, cpu::rope_mode mode) {
    arch = a;
    rope_mode = mode;
    norm = a == model_arch::gpt2 ? norm_type::layer : norm_type::rms;
    ffn = a == model_arch::gpt2 ? ffn_type::gelu : ffn_type::swiglu;
    positions = a == model_arch::gpt2 ? position_type::learned : position_type::rope;
  }

  std::size_t head_dim() const noexcept { return n_head ? n_embd / n_head : 0; }
  std::size_t kv_dim() const noexcept { return head_dim() * n_head_kv; }

  /// Throws invalid_argument naming `source` (a file) and the bad value.
  void validate(const std::string& source) const {
    auto bad = [&](const std::string& what) { throw invalid_argument(source + ": invalid hyperparameters: " + what); };
    auto n = [](std::size_t v) { return std::to_string(v); };
    // Limits well past any real model; they stop absurd values from corrupt headers before allocation.
    constexpr std::size_t big = std::size_t{1} << 20, max_vocab = std::size_t{1} << 24;
    if (n_embd == 0 || n_embd > big) bad("n_embd = " + n(n_embd));
    if (n_layer == 0 || n_layer > 4096) bad("n_layer = " + n(n_layer));
    if (n_head == 0 || n_head > n_embd) bad("n_head = " + n(n_head));
    if (n_embd % n_head) bad("n_embd " + n(n_embd) + " is not a multiple of n_head " + n(n_head));
    if (n_head_kv == 0 || n_head % n_head_kv) bad("n_head " + n(n_head) + " is not a multiple of n_head_kv " + n(n_head_kv));
    if (n_ff == 0 || n_ff > 16 * big) bad("n_ff = " + n(n_ff));
    if (n_vocab == 0 || n_vocab > max_vocab) bad("n_vocab = " + n(n_vocab));
    if (n_ctx_train == 0 || n_ctx_train > 16 * big) bad("context length = " + n(n_ctx_train));
    if (n_rot == 0 || n_rot > head_dim() || n_rot % 2) bad("rope dimension count " + n(n_rot) + " for head_dim " + n(head_dim()));
    if (!(rope_theta > 0.0f)) bad("rope theta " + std::to_string(rope_theta));
    if (!(rms_eps > 0.0f && rms_eps < 1.0f)) bad("norm epsilon " + std::to_string(rms_eps));
    if (!(rope_freq_scale > 0.0f && rope_freq_scale <= 1.0f)) bad("rope frequency scale " + std::to_string(rope_freq_scale));
  }
};

/// Model dimensions, each static (a number) or `dynamic`.
template <std::size_t NEmbd = dynamic, std::size_t NLayer = dynamic, std::size_t NHead = dynamic,
          std::size_t NHeadKv = dynamic, std::size_t NFf = dynamic, std::size_t NVocab = dynamic>
struct llama_config {
  extent<NEmbd> n_embd;
  extent<NLayer> n_layer;
  extent<NHead> n_head;
  extent<NHeadKv> n_head_kv;
  extent<NFf> n_ff;
  extent<NVocab> n_vocab;

  static constexpr bool fully_static = NEmbd != dynamic && NLayer != dynamic && NHead != dynamic &&
                                       NHeadKv != dynamic && NFf != dynamic && NVocab != dynamic;

  /// Checks a file's hyperparameters against the static dimensions; the
  /// message names the file and the dimension.
  static llama_config from(const llama_hparams& hp, const std::string& source) {
    try {
      return {extent<NEmbd>(hp.n_embd, "n_embd"),       extent<NLayer>(hp.n_layer, "n_layer"),
              extent<NHead>(hp.n_head, "n_head"),       extent<NHeadKv>(hp.n_head_kv, "n_head_kv"),
              extent<NFf>(hp.n_ff, "n_ff"),             extent<NVocab>(hp.n_vocab, "n_vocab")};
    } catch (const invalid_argument& e) {
      throw invalid_argument(source + ": does not fit the compile-time model config: " + e.what());
    }
  }
};

using dynamic_llama_config = llama_config<>;

}  // namespace kestrel
