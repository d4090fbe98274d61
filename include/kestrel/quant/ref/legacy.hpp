// kestrel/quant/ref/legacy.hpp: the scalar twins of the legacy-format dot
// products in kestrel/quant/legacy.hpp, namespace kestrel::quant::ref, same
// signatures. Plain loops in index order, one float accumulator: the
// reference the tests compare the fast dots against.
#pragma once

#include <cmath>
#include <cstddef>
#include <type_traits>

#include "kestrel/quant/legacy_format.hpp"

namespace kestrel::quant::ref {

// ---- dot: a weight row (n values) with an activation row quantized once ----
//
// Per block, the integer dot sum(q_w * q_a) is exact; it is scaled once by
// d_w * d_a (exact in float: two 11-bit significands) and, for the _1 types,
// the offset adds m_w * s_a, since sum((d_w q_w + m_w) d_a q_a) =
// d_w d_a sum(q_w q_a) + m_w (d_a sum(q_a)).

namespace detail {
template <int Bits, int Offset, class Block>
inline float dot_nibbles(const Block* w, const block_q8_0* a, std::size_t n, const char* what) {
  const std::size_t nb = quant::detail::legacy_blocks(n, what);
  float sum = 0;
  for (std::size_t i = 0; i < nb; ++i) {
    int q[legacy_block_size];
    quant::detail::unpack<Bits>(w[i], q);
    int isum = 0;
    for (std::size_t j = 0; j < legacy_block_size; ++j) isum += (q[j] - Offset) * a[i].qs[j];
    sum += to_f32(w[i].d) * to_f32(a[i].d) * static_cast<float>(isum);
  }
  return sum;
}
template <int Bits, class Block>
inline float dot_nibbles_offset(const Block* w, const block_q8_1* a, std::size_t n, const char* what) {
  const std::size_t nb = quant::detail::legacy_blocks(n, what);
  float sum = 0;
  for (std::size_t i = 0; i < nb; ++i) {
    int q[legacy_block_size];
    quant::detail::unpack<Bits>(w[i], q);
    int isum = 0;
    for (std::size_t j = 0; j < legacy_block_size; ++j) isum += q[j] * a[i].qs[j];
    sum += to_f32(w[i].d) * to_f32(a[i].d) * static_cast<float>(isum) + to_f32(w[i].m) * to_f32(a[i].s);
  }
  return sum;
}
}  // namespace detail

inline float dot(const block_q4_0* w, const block_q8_0* a, std::size_t n) { return detail::dot_nibbles<4, 8>(w, a, n, "dot q4_0 x q8_0"); }
inline float dot(const block_q5_0* w, const block_q8_0* a, std::size_t n) { return detail::dot_nibbles<5, 16>(w, a, n, "dot q5_0 x q8_0"); }
inline float dot(const block_q4_1* w, const block_q8_1* a, std::size_t n) { return detail::dot_nibbles_offset<4>(w, a, n, "dot q4_1 x q8_1"); }
inline float dot(const block_q5_1* w, const block_q8_1* a, std::size_t n) { return detail::dot_nibbles_offset<5>(w, a, n, "dot q5_1 x q8_1"); }
inline float dot(const block_q8_0* w, const block_q8_0* a, std::size_t n) {
  const std::size_t nb = quant::detail::legacy_blocks(n, "dot q8_0 x q8_0");
  float sum = 0;
  for (std::size_t i = 0; i < nb; ++i) {
    int isum = 0;
    for (std::size_t j = 0; j < legacy_block_size; ++j) isum += w[i].qs[j] * a[i].qs[j];
    sum += to_f32(w[i].d) * to_f32(a[i].d) * static_cast<float>(isum);
  }
  return sum;
}

// ---- dot_fused: the exact per-block order of the tile kernel ----
//
// The same integer sums, with one fused multiply-add per block (and one more
// for the _1 types' offset): y = fma(d_w d_a, isum, y); y = fma(m_w, s_a, y).
// quant::dot_tile (legacy_tokens.hpp) computes this bit for bit for any tile
// of rows and tokens, so it is the twin the tile kernel is tested against
// exactly, and within a rounding bound of dot above.

namespace detail {
template <class W> struct fused_traits;
template <> struct fused_traits<block_q4_0> { static constexpr int bits = 4, offset = 8; };
template <> struct fused_traits<block_q5_0> { static constexpr int bits = 5, offset = 16; };
template <> struct fused_traits<block_q4_1> { static constexpr int bits = 4, offset = 0; };
template <> struct fused_traits<block_q5_1> { static constexpr int bits = 5, offset = 0; };
template <> struct fused_traits<block_q8_0> { static constexpr int bits = 8, offset = 0; };
}  // namespace detail

template <class W>
inline float dot_fused(const W* w, const activation_of_t<W>* a, std::size_t n) {
  const std::size_t nb = quant::detail::legacy_blocks(n, "dot_fused");
  using tr = detail::fused_traits<W>;
  float y = 0;
  for (std::size_t i = 0; i < nb; ++i) {
    int q[legacy_block_size];
    if constexpr (tr::bits == 8) {
      for (std::size_t j = 0; j < legacy_block_size; ++j) q[j] = w[i].qs[j];
    } else {
      quant::detail::unpack<tr::bits>(w[i], q);
    }
    int isum = 0;
    for (std::size_t j = 0; j < legacy_block_size; ++j) isum += (q[j] - tr::offset) * a[i].qs[j];
    y = std::fma(to_f32(w[i].d) * to_f32(a[i].d), static_cast<float>(isum), y);  // the product is exact
    if constexpr (std::is_same_v<activation_of_t<W>, block_q8_1>) y = std::fma(to_f32(w[i].m), to_f32(a[i].s), y);
  }
  return y;
}

}  // namespace kestrel::quant::ref
