// kestrel/core/tensor.hpp: non-owning views of tensors.
//
// `tensor_view<T, Rank>` is a row-major view with a shape; the last dimension
// is contiguous (ggml's ne0). `weight_view` is a matrix whose element type is
// a run-time fact of the file (GGUF mixes types per tensor); kernels are
// selected from its `type` at exactly one table (cpu/matvec.hpp).
#pragma once

#include <array>
#include <cstddef>
#include <span>
#include <string>

#include "kestrel/core/dtype.hpp"
#include "kestrel/core/error.hpp"

namespace kestrel {

template <class T, std::size_t Rank>
class tensor_view {
  static_assert(Rank >= 1);

 public:
  using element_type = T;
  static constexpr std::size_t rank = Rank;

  constexpr tensor_view() = default;
  constexpr tensor_view(T* data, std::array<std::size_t, Rank> shape) : data_(data), shape_(shape) {}

  constexpr T* data() const noexcept { return data_; }
  constexpr const std::array<std::size_t, Rank>& shape() const noexcept { return shape_; }
  constexpr std::size_t extent(std::size_t i) const noexcept { return shape_[i]; }
  constexpr std::size_t size() const noexcept {
    std::size_t n = 1;
    for (auto s : shape_) n *= s;
    return n;
  }
  constexpr std::span<T> span() const noexcept { return {data_, size()}; }

  /// Row `i` of the outermost dimension, as a view of rank Rank-1.
  constexpr auto operator[](std::size_t i) const noexcept requires(Rank > 1) {
    std::array<std::size_t, Rank - 1> inner{};
    for (std::size_t d = 1; d < Rank; ++d) inner[d - 1] = shape_[d];
    return tensor_view<T, Rank - 1>(data_ + i * (size() / shape_[0]), inner);
  }
  constexpr T& operator[](std::size_t i) const noexcept requires(Rank == 1) { return data_[i]; }

 private:
  T* data_ = nullptr;
  std::array<std::size_t, Rank> shape_{};
};

template <class T> using vector_view = tensor_view<T, 1>;
template <class T> using matrix_view = tensor_view<T, 2>;

/// A weight matrix of shape (rows, cols), row-major, `cols` contiguous, whose
/// element type is known only at run time. Rows are the output features,
/// cols the input features: y = W x has y.size() == rows.
struct weight_view {
  dtype type = dtype::f32;
  const void* data = nullptr;
  std::size_t rows = 0;  // output features (ggml ne1)
  std::size_t cols = 0;  // input features, contiguous (ggml ne0)
  /// The rows lie in memory asked for as 2 MiB pages (cpu_backend's copy of
  /// the weights): decode's float kernels may then walk them otherwise
  /// (cpu/streaming.hpp, float_row_streams). A hint; never changes a result.
  bool huge_pages = false;
  /// The model's weights exceed the last-level cache, so decode reads these
  /// rows from memory every token (cpu_backend::prepare_weights): the
  /// legacy blocks' decode walk may then ask for them further ahead
  /// (cpu/streaming.hpp, block_row_streams). A hint; never changes a result.
  bool from_memory = false;

  std::size_t row_bytes() const noexcept { return cols / block_size(type) * block_bytes(type); }
  /// With an interleaved type (panel_rows > 1) the last panel's padding rows count.
  std::size_t bytes() const noexcept {
    const std::size_t pr = panel_rows(type);
    return (rows + pr - 1) / pr * pr * row_bytes();
  }
  const std::byte* row(std::size_t r) const noexcept { return static_cast<const std::byte*>(data) + r * row_bytes(); }
  /// Rows [first, first + n) as a matrix of their own (no copy): how a fused
  /// qkv or gate|up tensor is seen as its parts. The caller checks the range.
  weight_view rows_from(std::size_t first, std::size_t n) const noexcept {
    return {type, row(first), n, cols, huge_pages, from_memory};
  }
};

}  // namespace kestrel
