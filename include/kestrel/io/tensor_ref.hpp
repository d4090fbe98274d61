// kestrel/io/tensor_ref.hpp: what the Hugging Face weight readers
// (safetensors.hpp, pytorch.hpp, hf_model.hpp) hand out.
//
// A file may store any element type (I64 position ids, BOOL masks, F64
// buffers); `stored_tensor` lists a tensor as the file describes it, whatever
// its type. `tensor_ref` is what a consumer takes: a zero-copy view whose type
// is a kernel dtype (f32, f16, bf16), checked when it is made, and which keeps
// the mapping it points into alive. Shapes are outermost first, as PyTorch and
// safetensors write them: a Linear weight is (out_features, in_features),
// row-major, in_features contiguous, i.e. a weight_view with rows = shape[0].
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "kestrel/core/dtype.hpp"
#include "kestrel/core/error.hpp"
#include "kestrel/core/tensor.hpp"

namespace kestrel::io {

/// Element types the readers recognise in a file. Only f32, f16 and bf16 map
/// to a kernel dtype; the rest are listed so that a file holding them opens
/// and a consumer asking for one gets a clear error.
enum class element_type : std::uint8_t {
  bool_, u8, i8, f8_e4m3, f8_e5m2, i16, u16, f16, bf16, i32, u32, f32, i64, u64, f64
};

/// Bytes per element.
constexpr std::size_t size_of(element_type t) noexcept {
  switch (t) {
    case element_type::bool_: case element_type::u8: case element_type::i8:
    case element_type::f8_e4m3: case element_type::f8_e5m2: return 1;
    case element_type::i16: case element_type::u16: case element_type::f16: case element_type::bf16: return 2;
    case element_type::i32: case element_type::u32: case element_type::f32: return 4;
    case element_type::i64: case element_type::u64: case element_type::f64: return 8;
  }
  return 0;
}

/// The safetensors spelling: "F32", "BF16", "I64", "BOOL", ...
constexpr std::string_view name_of(element_type t) noexcept {
  switch (t) {
    case element_type::bool_: return "BOOL";
    case element_type::u8: return "U8";
    case element_type::i8: return "I8";
    case element_type::f8_e4m3: return "F8_E4M3";
    case element_type::f8_e5m2: return "F8_E5M2";
    case element_type::i16: return "I16";
    case element_type::u16: return "U16";
    case element_type::f16: return "F16";
    case element_type::bf16: return "BF16";
    case element_type::i32: return "I32";
    case element_type::u32: return "U32";
    case element_type::f32: return "F32";
    case element_type::i64: return "I64";
    case element_type::u64: return "U64";
    case element_type::f64: return "F64";
  }
  return "?";
}

/// The kernel dtype of an element type, or nullopt when kernels have none.
constexpr std::optional<dtype> kernel_dtype(element_type t) noexcept {
  switch (t) {
    case element_type::f32: return dtype::f32;
    case element_type::f16: return dtype::f16;
    case element_type::bf16: return dtype::bf16;
    default: return std::nullopt;
  }
}

/// One tensor as a file lists it (any element type). `data` points into the
/// reader's mapping and is valid while the reader lives; take a tensor_ref to
/// hold on to it longer.
struct stored_tensor {
  std::string name;
  element_type element = element_type::f32;
  std::vector<std::size_t> shape;  // outermost first; empty for a scalar
  const std::byte* data = nullptr;
  std::size_t nbytes = 0;          // == n_elements() * size_of(element), checked by the reader
  std::uint64_t file_offset = 0;   // where the file describes it (header / pickle offset), for messages

  std::size_t n_elements() const noexcept {
    std::size_t n = 1;
    for (auto d : shape) n *= d;  // checked against overflow by the reader
    return n;
  }
};

/// A zero-copy view of a tensor with a kernel dtype. Shape outermost first;
/// the data are contiguous and row-major (the readers reject anything else).
/// `keep_alive` owns the mapping `data` points into, so the view stays valid
/// after the reader that made it is gone.
struct tensor_ref {
  std::string name;
  dtype type = dtype::f32;
  std::vector<std::size_t> shape;  // outermost first, e.g. (n_vocab, n_embd) for an embedding
  const std::byte* data = nullptr;
  std::size_t nbytes = 0;
  std::shared_ptr<const void> keep_alive;

  std::size_t rank() const noexcept { return shape.size(); }
  std::size_t n_elements() const noexcept {
    std::size_t n = 1;
    for (auto d : shape) n *= d;
    return n;
  }
  std::span<const std::byte> bytes() const noexcept { return {data, nbytes}; }

  /// The elements as T (float, kestrel::f16 or kestrel::bf16). Throws
  /// kestrel::invalid_argument if T is not this tensor's type or the data are
  /// not aligned for T (a safetensors file may place a tensor at any byte).
  template <class T>
  std::span<const T> values() const {
    if (dtype_of_v<T> != type)
      throw invalid_argument("tensor '" + name + "' holds " + std::string(name_of(type)) + ", read as " +
                             std::string(name_of(dtype_of_v<T>)));
    if (reinterpret_cast<std::uintptr_t>(data) % alignof(T) != 0)
      throw invalid_argument("tensor '" + name + "' data are not aligned to " + std::to_string(alignof(T)) +
                             " bytes; copy them before reading as " + std::string(name_of(type)));
    return {reinterpret_cast<const T*>(data), nbytes / sizeof(T)};
  }
};

/// A rank-2 tensor (out_features, in_features) as a weight matrix: rows =
/// shape[0], cols = shape[1]. Throws kestrel::invalid_argument for another
/// rank or data not aligned to the element size (kernels read them directly).
inline weight_view as_weight(const tensor_ref& t) {
  if (t.shape.size() != 2)
    throw invalid_argument("tensor '" + t.name + "' has rank " + std::to_string(t.shape.size()) +
                           ", expected a matrix (out_features, in_features)");
  if (reinterpret_cast<std::uintptr_t>(t.data) % size_of(t.type) != 0)
    throw invalid_argument("tensor '" + t.name + "' data are not aligned to " + std::to_string(size_of(t.type)) +
                           " bytes");
  return weight_view{t.type, t.data, t.shape[0], t.shape[1]};
}

namespace detail {

/// "(2, 3, 4)"; "()" for a scalar.
inline std::string shape_string(const std::vector<std::size_t>& shape) {
  std::string s = "(";
  for (std::size_t i = 0; i < shape.size(); ++i) {
    if (i) s += ", ";
    s += std::to_string(shape[i]);
  }
  return s + ")";
}

/// The view of `t`, or a file_error naming `path`, the tensor and its type
/// when kernels have no dtype for it.
inline tensor_ref make_tensor_ref(const stored_tensor& t, std::shared_ptr<const void> keep_alive,
                                  const std::string& path) {
  const auto k = kernel_dtype(t.element);
  if (!k)
    throw file_error(path, t.file_offset,
                     "tensor '" + t.name + "' has element type " + std::string(name_of(t.element)) +
                         ", which no kernel takes (expected F32, F16 or BF16)");
  return tensor_ref{t.name, *k, t.shape, t.data, t.nbytes, std::move(keep_alive)};
}

}  // namespace detail

}  // namespace kestrel::io
