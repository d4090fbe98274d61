// kestrel/quant/convert.hpp: converting tensor data between GGML types
// through f32 rows, the machinery of kestrel-quantize and kestrel-make-model.
//
//   any supported type --to_f32_row--> float row --from_f32_row--> any supported type
//
// Supported: F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2_K..Q6_K (both
// ways). A runtime ggml_type becomes a block type at one table
// (with_block_type); the quantizers are quant/legacy_format.hpp's and
// quant/kquants.hpp's reference ones, so the bytes are what those write.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <vector>

#include "kestrel/core/dtype.hpp"
#include "kestrel/core/error.hpp"
#include "kestrel/cpu/thread_pool.hpp"
#include "kestrel/io/gguf.hpp"
#include "kestrel/quant/kquants.hpp"
#include "kestrel/quant/legacy_format.hpp"

namespace kestrel::quant {

/// Whether to_f32_row / from_f32_row handle `t`.
inline bool is_convertible(io::ggml_type t) noexcept {
  switch (t) {
    case io::ggml_type::f32: case io::ggml_type::f16: case io::ggml_type::bf16:
    case io::ggml_type::q4_0: case io::ggml_type::q4_1: case io::ggml_type::q5_0: case io::ggml_type::q5_1:
    case io::ggml_type::q8_0: case io::ggml_type::q2_k: case io::ggml_type::q3_k: case io::ggml_type::q4_k:
    case io::ggml_type::q5_k: case io::ggml_type::q6_k:
      return true;
    default:
      return false;
  }
}

/// Bytes of a row of `n` values of type `t` (n a whole number of blocks).
inline std::size_t row_bytes(io::ggml_type t, std::size_t n) {
  const std::size_t bs = io::block_size_of(t);
  if (bs == 0 || n % bs)
    throw invalid_argument("row of " + std::to_string(n) + " values is not a whole number of " +
                           std::string(io::name_of(t)) + " blocks");
  return n / bs * io::type_size_of(t);
}

namespace detail {

template <class Block> struct block_tag { using type = Block; };

/// The one table from a block-quantized ggml_type to its block struct:
/// calls f(block_tag<B>{}).
template <class F>
decltype(auto) with_block_type(io::ggml_type t, F&& f) {
  switch (t) {
    case io::ggml_type::q4_0: return f(block_tag<block_q4_0>{});
    case io::ggml_type::q4_1: return f(block_tag<block_q4_1>{});
    case io::ggml_type::q5_0: return f(block_tag<block_q5_0>{});
    case io::ggml_type::q5_1: return f(block_tag<block_q5_1>{});
    case io::ggml_type::q8_0: return f(block_tag<block_q8_0>{});
    case io::ggml_type::q2_k: return f(block_tag<block_q2_K>{});
    case io::ggml_type::q3_k: return f(block_tag<block_q3_K>{});
    case io::ggml_type::q4_k: return f(block_tag<block_q4_K>{});
    case io::ggml_type::q5_k: return f(block_tag<block_q5_K>{});
    case io::ggml_type::q6_k: return f(block_tag<block_q6_K>{});
    default:
      throw invalid_argument("tensor type " + std::string(io::name_of(t)) +
                             " cannot be converted (supported: F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2_K..Q6_K)");
  }
}

}  // namespace detail

/// `n` values of type `t` at `src` into floats. `src` must be aligned for
/// the type (2 bytes for the f16-based blocks, as tensor data in a GGUF
/// mapping and in std::vector<std::byte> is).
inline void to_f32_row(io::ggml_type t, const std::byte* src, float* dst, std::size_t n) {
  switch (t) {
    case io::ggml_type::f32: std::memcpy(dst, src, n * sizeof(float)); return;
    case io::ggml_type::f16:
      for (std::size_t i = 0; i < n; ++i) {
        f16 h;
        std::memcpy(&h.bits, src + 2 * i, 2);
        dst[i] = to_f32(h);
      }
      return;
    case io::ggml_type::bf16:
      for (std::size_t i = 0; i < n; ++i) {
        bf16 h;
        std::memcpy(&h.bits, src + 2 * i, 2);
        dst[i] = to_f32(h);
      }
      return;
    default:
      row_bytes(t, n);  // checks n
      detail::with_block_type(t, [&](auto tag) {
        using B = typename decltype(tag)::type;
        dequantize_row(reinterpret_cast<const B*>(src), dst, n);
      });
  }
}

/// `n` floats into type `t` at `dst` (row_bytes(t, n) bytes).
inline void from_f32_row(io::ggml_type t, const float* src, std::byte* dst, std::size_t n) {
  switch (t) {
    case io::ggml_type::f32: std::memcpy(dst, src, n * sizeof(float)); return;
    case io::ggml_type::f16:
      for (std::size_t i = 0; i < n; ++i) {
        const f16 h = to_f16(src[i]);
        std::memcpy(dst + 2 * i, &h.bits, 2);
      }
      return;
    case io::ggml_type::bf16:
      for (std::size_t i = 0; i < n; ++i) {
        const bf16 h = to_bf16(src[i]);
        std::memcpy(dst + 2 * i, &h.bits, 2);
      }
      return;
    default:
      row_bytes(t, n);
      detail::with_block_type(t, [&](auto tag) {
        using B = typename decltype(tag)::type;
        quantize_row(src, reinterpret_cast<B*>(dst), n);
      });
  }
}

/// Converts `n_rows` rows of `n_per_row` values from type `from` at `src`
/// to type `to` at `dst` (n_rows * row_bytes(to, n_per_row) bytes), rows
/// split over `pool`'s threads (nullptr: this thread). Same types: a copy.
inline void convert_rows(io::ggml_type from, const std::byte* src, io::ggml_type to, std::byte* dst,
                         std::size_t n_per_row, std::size_t n_rows, cpu::thread_pool* pool) {
  const std::size_t in_row = row_bytes(from, n_per_row), out_row = row_bytes(to, n_per_row);
  if (from == to) {
    std::memcpy(dst, src, in_row * n_rows);
    return;
  }
  if (!is_convertible(from) || !is_convertible(to))
    throw invalid_argument("cannot convert " + std::string(io::name_of(from)) + " to " + std::string(io::name_of(to)) +
                           " (supported: F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2_K..Q6_K)");
  auto work = [&](std::size_t begin, std::size_t end) {
    std::vector<float> row(n_per_row);  // one scratch row per chunk of rows
    for (std::size_t r = begin; r < end; ++r) {
      to_f32_row(from, src + r * in_row, row.data(), n_per_row);
      from_f32_row(to, row.data(), dst + r * out_row, n_per_row);
    }
  };
  if (pool) pool->parallel_for(n_rows, work);
  else work(0, n_rows);
}

/// A whole tensor (rows of dims[0] values) converted into a new buffer.
inline std::vector<std::byte> convert_tensor(io::ggml_type from, std::span<const std::byte> src, io::ggml_type to,
                                             std::span<const std::uint64_t> dims, cpu::thread_pool* pool) {
  std::uint64_t n = 1;
  for (auto d : dims) n *= d;
  const auto n_per_row = static_cast<std::size_t>(dims.empty() ? 0 : dims[0]);
  const std::size_t n_rows = n_per_row ? static_cast<std::size_t>(n / n_per_row) : 0;
  if (src.size() != n_rows * row_bytes(from, n_per_row))
    throw invalid_argument("convert_tensor: " + std::to_string(src.size()) + " bytes do not hold " + std::to_string(n) +
                           " values of " + std::string(io::name_of(from)));
  std::vector<std::byte> out(n_rows * row_bytes(to, n_per_row));
  convert_rows(from, src.data(), to, out.data(), n_per_row, n_rows, pool);
  return out;
}

}  // namespace kestrel::quant
