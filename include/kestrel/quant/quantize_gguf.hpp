// kestrel/quant/quantize_gguf.hpp: a GGUF model file quantized to a mix,
// the library half of kestrel-quantize.
//
//   io::gguf_file in("model-f32.gguf");
//   quant::quantize_options o{.type = quant::quant_mix::q4_k_m};
//   cpu::thread_pool pool(4);
//   auto r = quant::quantize_gguf(in, "model-q4_k_m.gguf", o, &pool);
//
// Every metadata pair is copied as it is, in its order; general.file_type
// is set to the mix's LLAMA_FTYPE number and general.quantization_version
// to 2 (both as llama-quantize writes them; a key the input lacks is added
// at the end). Tensor
// order and names are kept; each tensor's type comes from quant/mix.hpp.
// All checks (unsupported types, requantizing without permission) run
// before the output file is created; tensors are converted one at a time,
// so memory stays at one tensor's output besides the mapped input.
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <optional>
#include <span>
#include <string>
#include <system_error>
#include <type_traits>
#include <vector>

#include "kestrel/core/error.hpp"
#include "kestrel/cpu/thread_pool.hpp"
#include "kestrel/io/gguf.hpp"
#include "kestrel/io/gguf_stream.hpp"
#include "kestrel/io/gguf_write.hpp"
#include "kestrel/quant/convert.hpp"
#include "kestrel/quant/mix.hpp"

namespace kestrel::quant {

/// GGML's quantization format version (the block layouts of the legacy
/// types changed twice; 2 is the current one), general.quantization_version.
inline constexpr std::uint32_t quantization_version = 2;

struct quantize_options {
  quant_mix type = quant_mix::q8_0;
  bool allow_requantize = false;                 // --allow-requantize
  bool pure = false;                             // --pure
  std::optional<io::ggml_type> output_type = std::nullopt;      // --output-tensor-type
  std::optional<io::ggml_type> token_embd_type = std::nullopt;  // --token-embedding-type
};

/// One tensor as it goes through quantize_gguf, for progress lines.
struct quantize_tensor_event {
  std::size_t index = 0, count = 0;  // 0-based index of count tensors
  const io::gguf_tensor_info* tensor = nullptr;
  io::ggml_type to = io::ggml_type::f32;
  std::uint64_t bytes_out = 0;
  bool fallback = false;  // the mix's type did not fit the row length
};

struct quantize_report {
  std::uint64_t bytes_in = 0, bytes_out = 0;  // tensor data only
  std::size_t n_tensors = 0, n_converted = 0, n_fallback = 0;
};

namespace detail {
inline std::optional<std::uint64_t> scalar_u64(const io::gguf_file& f, const std::string& key) {
  if (!f.has(key) || f.type_of(key) == io::gguf_type::array) return std::nullopt;
  return f.get<std::uint64_t>(key);
}
}  // namespace detail

/// The model facts the mix rules need, from the file's metadata.
inline mix_params mix_params_of(const io::gguf_file& f, const quantize_options& o) {
  mix_params p;
  p.type = o.type;
  p.pure = o.pure;
  p.output_type = o.output_type;
  p.token_embd_type = o.token_embd_type;
  const std::string arch = f.get_optional<std::string>("general.architecture").value_or("llama");
  p.n_layer = static_cast<std::size_t>(detail::scalar_u64(f, arch + ".block_count").value_or(0));
  const auto n_head = detail::scalar_u64(f, arch + ".attention.head_count");
  const auto n_head_kv = detail::scalar_u64(f, arch + ".attention.head_count_kv");
  if (n_head && n_head_kv && *n_head_kv > 0) p.n_gqa = static_cast<std::size_t>(*n_head / *n_head_kv);
  p.has_output = f.find_tensor("output.weight") != nullptr;
  return p;
}

/// Each tensor's type in the output, in file order. Throws (before anything
/// is written) for a tensor that needs a conversion kestrel cannot do, or
/// that is already quantized when !o.allow_requantize.
inline std::vector<io::ggml_type> plan_types(const io::gguf_file& f, const quantize_options& o) {
  const mix_params p = mix_params_of(f, o);
  std::vector<io::ggml_type> out;
  out.reserve(f.tensors().size());
  for (const auto& t : f.tensors()) {
    const io::ggml_type to = tensor_type(t.name, t.dims, t.type, p);
    if (to != t.type) {
      if (!is_convertible(t.type))
        throw file_error(f.path(), "tensor " + t.name + " has type " + std::string(io::name_of(t.type)) +
                                       ", which kestrel-quantize cannot read (supported: " + writable_type_names() + ")");
      if (is_block_quantized(t.type) && !o.allow_requantize)
        throw file_error(f.path(), "tensor " + t.name + " is already quantized (" + std::string(io::name_of(t.type)) +
                                       "); requantizing adds the new type's error to the old one's. "
                                       "Quantize from an F32/F16/BF16 file, or pass --allow-requantize");
    }
    out.push_back(to);
  }
  return out;
}

/// Writes `in` quantized with `o` to `out`; `on_tensor` (if given) is called
/// after each tensor is written.
template <class OnTensor = void (*)(const quantize_tensor_event&)>
quantize_report quantize_gguf(const io::gguf_file& in, const std::filesystem::path& out, const quantize_options& o,
                              cpu::thread_pool* pool, OnTensor&& on_tensor = nullptr) {
  io::refuse_to_overwrite(in.path(), out, "input");
  const auto types = plan_types(in, o);
  const mix_params p = mix_params_of(in, o);

  io::gguf_builder meta;
  for (const auto& key : in.keys()) meta.copy_kv(in, key);
  meta.set("general.file_type", llama_ftype(o.type));
  meta.set("general.quantization_version", quantization_version);  // llama-quantize writes it for every type

  std::vector<io::gguf_tensor_decl> decls;
  decls.reserve(types.size());
  for (std::size_t i = 0; i < types.size(); ++i) {
    const auto& t = in.tensors()[i];
    decls.push_back({t.name, t.dims, types[i]});
  }
  io::gguf_stream_writer w(out, meta, std::move(decls));

  quantize_report r;
  r.n_tensors = types.size();
  for (std::size_t i = 0; i < types.size(); ++i) {
    const auto& t = in.tensors()[i];
    const io::ggml_type to = types[i];
    r.bytes_in += t.size_bytes;
    if (to == t.type) {
      w.write_tensor(t.bytes());
    } else {
      const auto bytes = convert_tensor(t.type, t.bytes(), to, t.dims, pool);
      w.write_tensor(bytes);
      ++r.n_converted;
    }
    r.bytes_out += w.size_of(i);
    quantize_tensor_event ev{i, types.size(), &t, to, w.size_of(i), false};
    ev.fallback = !t.dims.empty() && to != preferred_type(t.name, t.dims, t.type, p);
    if (ev.fallback) ++r.n_fallback;
    if constexpr (!std::is_same_v<std::decay_t<OnTensor>, std::nullptr_t>) {
      if (on_tensor) on_tensor(ev);
    }
  }
  w.finish();
  return r;
}

}  // namespace kestrel::quant
