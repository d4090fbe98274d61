// kestrel/quant/mix.hpp: which GGML type each tensor of a model gets when the
// model is quantized to a named "mix" (Q4_K_M, Q8_0, ...), following the rules
// of llama.cpp's llama-quantize so that files from both tools have the same
// per-tensor types and sizes.
//
//   quant::mix_params p{.type = quant::quant_mix::q4_k_m, .n_layer = 22, .n_gqa = 8};
//   io::ggml_type t = quant::tensor_type("blk.0.attn_v.weight", dims, io::ggml_type::f32, p);  // Q6_K
//
// A mix names a base type (Q4_K for Q4_K_S / Q4_K_M) and promotes the tensors
// that matter most to quantization error to more bits: the classifier
// (output.weight), and attn_v / ffn_down in some layers. The rules below
// cover the dense llama-family mixes kestrel can quantize to; llama.cpp's
// rules for MoE models, Falcon, 70B-class attn_v and the IQ types are not
// reproduced (kestrel has no IQ formats).
#pragma once

#include <cctype>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>

#include "kestrel/io/gguf.hpp"

namespace kestrel::quant {

/// The quantization mixes of llama-quantize that kestrel can write.
enum class quant_mix : std::uint8_t {
  f32, f16, bf16, q8_0, q4_0, q4_1, q5_0, q5_1,
  q2_k, q3_k_s, q3_k_m, q3_k_l, q4_k_s, q4_k_m, q5_k_s, q5_k_m, q6_k
};

struct mix_info {
  quant_mix mix;
  std::string_view name;   // as llama-quantize spells it
  std::uint32_t ftype;     // llama.cpp's LLAMA_FTYPE number, stored as general.file_type
  io::ggml_type base;      // the type of every matrix no rule promotes
};

// LLAMA_FTYPE numbers are part of the file format (general.file_type):
// 0 ALL_F32, 1 MOSTLY_F16, 2 Q4_0, 3 Q4_1, 7 Q8_0, 8 Q5_0, 9 Q5_1, 10 Q2_K,
// 11..13 Q3_K_S/M/L, 14..15 Q4_K_S/M, 16..17 Q5_K_S/M, 18 Q6_K, 32 BF16.
inline constexpr mix_info mix_table[] = {
    {quant_mix::f32, "F32", 0, io::ggml_type::f32},
    {quant_mix::f16, "F16", 1, io::ggml_type::f16},
    {quant_mix::bf16, "BF16", 32, io::ggml_type::bf16},
    {quant_mix::q8_0, "Q8_0", 7, io::ggml_type::q8_0},
    {quant_mix::q4_0, "Q4_0", 2, io::ggml_type::q4_0},
    {quant_mix::q4_1, "Q4_1", 3, io::ggml_type::q4_1},
    {quant_mix::q5_0, "Q5_0", 8, io::ggml_type::q5_0},
    {quant_mix::q5_1, "Q5_1", 9, io::ggml_type::q5_1},
    {quant_mix::q2_k, "Q2_K", 10, io::ggml_type::q2_k},
    {quant_mix::q3_k_s, "Q3_K_S", 11, io::ggml_type::q3_k},
    {quant_mix::q3_k_m, "Q3_K_M", 12, io::ggml_type::q3_k},
    {quant_mix::q3_k_l, "Q3_K_L", 13, io::ggml_type::q3_k},
    {quant_mix::q4_k_s, "Q4_K_S", 14, io::ggml_type::q4_k},
    {quant_mix::q4_k_m, "Q4_K_M", 15, io::ggml_type::q4_k},
    {quant_mix::q5_k_s, "Q5_K_S", 16, io::ggml_type::q5_k},
    {quant_mix::q5_k_m, "Q5_K_M", 17, io::ggml_type::q5_k},
    {quant_mix::q6_k, "Q6_K", 18, io::ggml_type::q6_k},
};

constexpr const mix_info& info_of(quant_mix m) noexcept { return mix_table[static_cast<std::size_t>(m)]; }
static_assert(info_of(quant_mix::q6_k).mix == quant_mix::q6_k, "mix_table follows the enum's order");

constexpr std::string_view name_of(quant_mix m) noexcept { return info_of(m).name; }
constexpr std::uint32_t llama_ftype(quant_mix m) noexcept { return info_of(m).ftype; }
constexpr io::ggml_type base_type(quant_mix m) noexcept { return info_of(m).base; }

namespace detail {
inline bool iequals(std::string_view a, std::string_view b) noexcept {
  if (a.size() != b.size()) return false;
  for (std::size_t i = 0; i < a.size(); ++i)
    if (std::toupper(static_cast<unsigned char>(a[i])) != std::toupper(static_cast<unsigned char>(b[i]))) return false;
  return true;
}
}  // namespace detail

/// "q4_k_m", "Q4_K_M", ... (case-insensitive); nullopt for anything else.
inline std::optional<quant_mix> parse_mix(std::string_view s) {
  for (const auto& m : mix_table)
    if (detail::iequals(s, m.name)) return m.mix;
  return std::nullopt;
}

/// "F32, F16, ..., Q6_K": for messages.
inline std::string mix_names() {
  std::string out;
  for (const auto& m : mix_table) out += (out.empty() ? "" : ", ") + std::string(m.name);
  return out;
}

/// The tensor types kestrel can write (and read): F32, F16, BF16, the legacy
/// quants and Q2_K..Q6_K.
inline constexpr io::ggml_type writable_types[] = {
    io::ggml_type::f32, io::ggml_type::f16, io::ggml_type::bf16, io::ggml_type::q8_0, io::ggml_type::q4_0,
    io::ggml_type::q4_1, io::ggml_type::q5_0, io::ggml_type::q5_1, io::ggml_type::q2_k, io::ggml_type::q3_k,
    io::ggml_type::q4_k, io::ggml_type::q5_k, io::ggml_type::q6_k};

inline bool is_writable(io::ggml_type t) noexcept {
  for (auto w : writable_types)
    if (w == t) return true;
  return false;
}

/// A writable tensor type by name ("q8_0", "Q6_K", "f16"; case-insensitive).
inline std::optional<io::ggml_type> parse_ggml_type(std::string_view s) {
  for (auto t : writable_types)
    if (detail::iequals(s, io::name_of(t))) return t;
  return std::nullopt;
}

inline std::string writable_type_names() {
  std::string out;
  for (auto t : writable_types) out += (out.empty() ? "" : ", ") + std::string(io::name_of(t));
  return out;
}

/// Block-quantized (not F32/F16/BF16 or another plain type).
inline bool is_block_quantized(io::ggml_type t) noexcept { return io::block_size_of(t) > 1; }

/// What the rules need to know about the model beyond one tensor.
struct mix_params {
  quant_mix type = quant_mix::q8_0;
  std::size_t n_layer = 0;   // <arch>.block_count
  std::size_t n_gqa = 1;     // query heads per KV head (head_count / head_count_kv)
  bool has_output = true;    // false: no output.weight, token_embd is also the classifier
  bool pure = false;         // --pure: the base type for every matrix, no promotions
  std::optional<io::ggml_type> output_type = std::nullopt;      // --output-tensor-type
  std::optional<io::ggml_type> token_embd_type = std::nullopt;  // --token-embedding-type
};

/// Whether a tensor is a weight matrix that a mix changes. Vectors (norms,
/// biases) stay F32: they are tiny, and the kernels read them as floats.
/// Like llama-quantize: names ending in "weight", 2-D or more, no norms.
inline bool is_quantizable(std::string_view name, std::span<const std::uint64_t> dims) {
  if (dims.size() < 2) return false;
  if (name.size() < 6 || name.substr(name.size() - 6) != "weight") return false;
  return name.find("_norm.weight") == std::string_view::npos;
}

/// The layer of "blk.N.<...>", or nullopt for tensors outside the blocks.
inline std::optional<std::size_t> layer_of(std::string_view name) {
  if (name.substr(0, 4) != "blk.") return std::nullopt;
  std::size_t i = 4, n = 0;
  if (i >= name.size() || !std::isdigit(static_cast<unsigned char>(name[i]))) return std::nullopt;
  while (i < name.size() && std::isdigit(static_cast<unsigned char>(name[i]))) n = 10 * n + static_cast<std::size_t>(name[i++] - '0');
  return n;
}

/// llama.cpp's "use more bits" layers: the first and last eighth of the
/// layers and every third layer in between (about half of them). These are
/// where quantization error costs the most perplexity.
constexpr bool use_more_bits(std::size_t layer, std::size_t n_layer) noexcept {
  const std::size_t eighth = n_layer / 8;
  return layer < eighth || layer >= 7 * n_layer / 8 || (layer - eighth) % 3 == 2;
}

/// The type to use when `t`'s blocks do not divide a row of `ne0` values:
/// k-quants need rows of 256, the legacy types rows of 32. A k-quant falls
/// back to the legacy type of about the same bits per weight (llama.cpp's
/// choice; for Q2_K/Q3_K llama.cpp uses IQ4_NL, which kestrel lacks, and
/// Q4_0 has the same 4.5 bits per weight); a row that not even 32 divides
/// is kept as F16.
inline io::ggml_type fallback_type(io::ggml_type t, std::uint64_t ne0) {
  if (ne0 % io::block_size_of(t) == 0) return t;
  io::ggml_type f = io::ggml_type::f16;
  switch (t) {
    case io::ggml_type::q2_k: case io::ggml_type::q3_k: f = io::ggml_type::q4_0; break;
    case io::ggml_type::q4_k: f = io::ggml_type::q5_0; break;
    case io::ggml_type::q5_k: f = io::ggml_type::q5_1; break;
    case io::ggml_type::q6_k: f = io::ggml_type::q8_0; break;
    default: break;
  }
  return ne0 % io::block_size_of(f) == 0 ? f : io::ggml_type::f16;
}

/// The type the mix asks for, before fallback_type() fits it to the row
/// length; tensor_type() is what a file gets.
inline io::ggml_type preferred_type(std::string_view name, std::span<const std::uint64_t> dims, io::ggml_type source,
                                 const mix_params& p) {
  using T = io::ggml_type;
  using M = quant_mix;
  if (dims.size() < 2) return T::f32;                 // norms and biases: F32 whatever they were
  if (!is_quantizable(name, dims)) return source;     // other 2-D data: as it is
  const M m = p.type;
  const T base = base_type(m);
  T t = base;
  auto has = [&](std::string_view part) { return name.find(part) != std::string_view::npos; };
  const std::size_t layer = layer_of(name).value_or(0);
  const std::size_t n_layer = p.n_layer ? p.n_layer : 1;

  // The promotions apply to the quantized mixes only; F32/F16/BF16 mixes
  // and --pure give every matrix the base type.
  const bool classifier = name == "output.weight" || (!p.has_output && name == "token_embd.weight");
  if (is_block_quantized(base) && !p.pure) {
    if (classifier) {
      // The classifier's errors reach every logit directly: Q6_K for every
      // mix below Q8_0. A row Q6_K cannot hold (n_embd not a multiple of 256)
      // gets Q8_0 rather than a low-bit fallback.
      if (dims[0] % io::block_size_of(base) != 0) t = T::q8_0;
      else if (base != T::q8_0) t = T::q6_k;
    } else if (has("attn_v.weight")) {
      // V carries the attention output itself, and with GQA it is n_gqa
      // times smaller than Q: more bits here cost little size.
      if (m == M::q2_k) t = p.n_gqa >= 4 ? T::q4_k : T::q3_k;                 // Q2_K: 1 - 2 steps up
      else if (m == M::q3_k_m) t = layer < 2 ? T::q5_k : T::q4_k;            // Q3_K_M: first two layers Q5_K
      else if (m == M::q3_k_l) t = T::q5_k;                                  // Q3_K_L: all Q5_K
      else if ((m == M::q4_k_m || m == M::q5_k_m) && use_more_bits(layer, n_layer)) t = T::q6_k;  // *_M: half the layers Q6_K
      else if (m == M::q4_k_s && layer < 4) t = T::q5_k;                      // Q4_K_S: first four layers Q5_K
    } else if (has("ffn_down")) {
      // ffn_down's inputs (after SwiGLU) have the heaviest outliers.
      if (m == M::q2_k) t = T::q3_k;                                          // Q2_K: all Q3_K
      else if (m == M::q3_k_m) t = layer < n_layer / 16 ? T::q5_k : T::q4_k;  // Q3_K_M: Q4_K, first 16th Q5_K
      else if (m == M::q3_k_l) t = T::q5_k;                                   // Q3_K_L: all Q5_K
      else if ((m == M::q4_k_m || m == M::q5_k_m) && use_more_bits(layer, n_layer)) t = T::q6_k;  // *_M: half the layers Q6_K
      else if (m == M::q4_k_s && layer < n_layer / 8) t = T::q5_k;            // Q4_K_S: first eighth Q5_K
    } else if (has("attn_output.weight")) {
      if (m == M::q2_k) t = T::q3_k;                                          // Q2_K: Q3_K
      else if (m == M::q3_k_m) t = T::q4_k;                                   // Q3_K_M: Q4_K
      else if (m == M::q3_k_l) t = T::q5_k;                                   // Q3_K_L: Q5_K
    }
    // token_embd (with a separate output) keeps the base type: a lookup
    // table's error does not accumulate over a dot product.
  }

  // Explicit overrides win over the mix (and over --pure), as in
  // llama-quantize; a tied embedding is the classifier, so --output-tensor-type
  // applies to it unless --token-embedding-type names it.
  if (p.output_type && classifier) t = *p.output_type;
  if (p.token_embd_type && name == "token_embd.weight") t = *p.token_embd_type;
  return t;
}

/// The type of tensor `name` (dims in ggml order, stored now as `source`)
/// in a file quantized with `p`.
inline io::ggml_type tensor_type(std::string_view name, std::span<const std::uint64_t> dims, io::ggml_type source,
                                 const mix_params& p) {
  if (dims.empty()) return io::ggml_type::f32;
  return fallback_type(preferred_type(name, dims, source, p), dims[0]);
}

}  // namespace kestrel::quant
