// kestrel/quant/legacy_format.hpp: GGUF's "legacy" block formats q4_0, q4_1, q5_0,
// q5_1, q8_0 and the activation format q8_1, byte-compatible with ggml.
//
// Every format packs 32 values into one block: an f16 scale d (and, for the
// _1 types, an f16 offset m) followed by the quants. The layouts and the
// rounding follow ggml's reference quantizer (ggml-quants.c, "_ref"), checked
// byte for byte against gguf-py's independent numpy implementation
// (tests/quant/test_legacy.cpp, data from tools/gen_quant_reference.py).
//
//   type  bytes  value                     quants
//   q4_0  18     d * (q - 8)               q in 0..15, 4 bits
//   q4_1  20     d * q + m                 q in 0..15, 4 bits
//   q5_0  22     d * (q - 16)              q in 0..31, 4 low bits + 1 high bit
//   q5_1  24     d * q + m                 q in 0..31, 4 low bits + 1 high bit
//   q8_0  34     d * q                     q in -127..127, int8
//   q8_1  36     d * q, s = d * sum(q)     activations for the _1 weight types
//
// Nibble order (4- and 5-bit types): byte j of qs holds value j in its low
// nibble and value j + 16 in its high nibble. The fifth bit of value j is
// bit j of qh (a little-endian uint32, stored as 4 bytes so the block has no
// alignment padding).
//
// The dot products are in kestrel/quant/legacy.hpp (scalar twins in
// kestrel/quant/ref/legacy.hpp). They pair weights with activations quantized once per step, as
// ggml does: q4_0 / q5_0 / q8_0 with q8_0, q4_1 / q5_1 with q8_1 (whose s
// term carries the weights' offset m through the sum without a second pass).
//
// Rounding: ggml's reference quantizer computes in float with separate
// roundings, except that q4_0 / q5_0 round x * id + 8.5 (16.5) as if fused,
// the result depending on whether the compiler contracts it into an FMA;
// gguf-py pins it to "exact product, + 8.5 in double, rounded to float".
// Here every step that must round like float is written as a double
// operation rounded to float: for + - * / of floats the double result
// rounded to float equals the float operation (double has >= 2p + 2 bits,
// so double rounding is innocuous), and no compiler may contract across
// the explicit narrowing. The results do not depend on -ffp-contract.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>

#include "kestrel/core/dtype.hpp"
#include "kestrel/core/error.hpp"

namespace kestrel::quant {

/// Values per block in every legacy format.
inline constexpr std::size_t legacy_block_size = 32;

struct block_q4_0 {
  f16 d;                   // scale
  std::uint8_t qs[16];     // (32,) nibbles, value j low / value j+16 high
};
struct block_q4_1 {
  f16 d;                   // scale
  f16 m;                   // offset (the block's minimum)
  std::uint8_t qs[16];     // (32,) nibbles
};
struct block_q5_0 {
  f16 d;                   // scale
  std::uint8_t qh[4];      // (32,) fifth bits, little-endian uint32
  std::uint8_t qs[16];     // (32,) low nibbles
};
struct block_q5_1 {
  f16 d;                   // scale
  f16 m;                   // offset (the block's minimum)
  std::uint8_t qh[4];      // (32,) fifth bits, little-endian uint32
  std::uint8_t qs[16];     // (32,) low nibbles
};
struct block_q8_0 {
  f16 d;                   // scale
  std::int8_t qs[32];      // (32,)
};
struct block_q8_1 {
  f16 d;                   // scale
  f16 s;                   // d * sum(qs), d the float scale before rounding to f16
  std::int8_t qs[32];      // (32,)
};

static_assert(sizeof(block_q4_0) == 18 && alignof(block_q4_0) == 2);
static_assert(sizeof(block_q4_1) == 20);
static_assert(sizeof(block_q5_0) == 22);
static_assert(sizeof(block_q5_1) == 24);
static_assert(sizeof(block_q8_0) == 34);
static_assert(sizeof(block_q8_1) == 36);

/// The activation block a weight block is multiplied with.
template <class Block> struct activation_of;
template <> struct activation_of<block_q4_0> { using type = block_q8_0; };
template <> struct activation_of<block_q5_0> { using type = block_q8_0; };
template <> struct activation_of<block_q8_0> { using type = block_q8_0; };
template <> struct activation_of<block_q4_1> { using type = block_q8_1; };
template <> struct activation_of<block_q5_1> { using type = block_q8_1; };
template <class Block> using activation_of_t = typename activation_of<Block>::type;

namespace detail {

inline std::size_t legacy_blocks(std::size_t n, const char* what) {
  if (n % legacy_block_size != 0)
    throw invalid_argument(std::string(what) + ": row length " + std::to_string(n) + " is not a multiple of " +
                           std::to_string(legacy_block_size));
  return n / legacy_block_size;
}

// Float operations with exactly one rounding each (see the header comment).
inline float fmul(float a, float b) noexcept { return static_cast<float>(static_cast<double>(a) * b); }
inline float fadd(float a, float b) noexcept { return static_cast<float>(static_cast<double>(a) + b); }
inline float fsub(float a, float b) noexcept { return static_cast<float>(static_cast<double>(a) - b); }
inline float fdiv(float a, float b) noexcept { return static_cast<float>(static_cast<double>(a) / b); }

// ggml's "cursed" q4_0 / q5_0 rounding, as gguf-py fixes it: the exact
// product x * id plus the offset in double, rounded to float, truncated.
inline int trunc_offset(float x, float id, double offset) noexcept {
  const float v = static_cast<float>(static_cast<double>(x) * id + offset);
  return static_cast<int>(v);  // v >= 0 (|x * id| <= offset - 0.5), so truncation toward zero
}

// roundf: to nearest, ties away from zero (ggml's q8 rounding).
inline std::int8_t round_q8(float v) noexcept { return static_cast<std::int8_t>(std::round(v)); }

// The block's value of largest magnitude, keeping its sign (first one wins).
inline float signed_absmax(const float* x) noexcept {
  float amax = 0, max = 0;
  for (std::size_t j = 0; j < legacy_block_size; ++j) {
    if (amax < std::fabs(x[j])) {
      amax = std::fabs(x[j]);
      max = x[j];
    }
  }
  return max;
}

inline void min_max(const float* x, float& lo, float& hi) noexcept {
  lo = x[0];
  hi = x[0];
  for (std::size_t j = 1; j < legacy_block_size; ++j) {
    lo = std::min(lo, x[j]);
    hi = std::max(hi, x[j]);
  }
}

inline std::uint32_t load_qh(const std::uint8_t* p) noexcept {
  return std::uint32_t(p[0]) | std::uint32_t(p[1]) << 8 | std::uint32_t(p[2]) << 16 | std::uint32_t(p[3]) << 24;
}
inline void store_qh(std::uint8_t* p, std::uint32_t v) noexcept {
  for (int i = 0; i < 4; ++i) p[i] = static_cast<std::uint8_t>(v >> (8 * i));
}

// 32 small unsigned quants into nibbles (+ fifth bits when Bits == 5).
template <int Bits, class Block>
inline void pack(Block& b, const int* q) noexcept {
  std::uint32_t qh = 0;
  for (std::size_t j = 0; j < 16; ++j) {
    b.qs[j] = static_cast<std::uint8_t>((q[j] & 0xf) | (q[j + 16] & 0xf) << 4);
    if constexpr (Bits == 5) qh |= std::uint32_t((q[j] >> 4) & 1) << j | std::uint32_t((q[j + 16] >> 4) & 1) << (j + 16);
  }
  if constexpr (Bits == 5) store_qh(b.qh, qh);
}

// The 32 unsigned quants of a 4- or 5-bit block.
template <int Bits, class Block>
inline void unpack(const Block& b, int* q) noexcept {
  std::uint32_t qh = 0;
  if constexpr (Bits == 5) qh = load_qh(b.qh);
  for (std::size_t j = 0; j < 16; ++j) {
    q[j] = b.qs[j] & 0xf;
    q[j + 16] = b.qs[j] >> 4;
    if constexpr (Bits == 5) {
      q[j] |= static_cast<int>((qh >> j) & 1) << 4;
      q[j + 16] |= static_cast<int>((qh >> (j + 16)) & 1) << 4;
    }
  }
}

// Symmetric 4/5-bit: d = max / -(2^(Bits-1)), q = trunc(x / d + 2^(Bits-1) + 0.5).
template <int Bits, class Block>
inline void quantize_symmetric(const float* x, Block* y, std::size_t n, const char* what) {
  constexpr int half = 1 << (Bits - 1), top = (1 << Bits) - 1;
  const std::size_t nb = legacy_blocks(n, what);
  for (std::size_t i = 0; i < nb; ++i, x += legacy_block_size) {
    const float d = fdiv(signed_absmax(x), -static_cast<float>(half));
    const float id = d != 0 ? fdiv(1.0f, d) : 0.0f;
    int q[legacy_block_size];
    for (std::size_t j = 0; j < legacy_block_size; ++j) q[j] = std::min(top, trunc_offset(x[j], id, half + 0.5));
    y[i].d = to_f16(d);
    pack<Bits>(y[i], q);
  }
}

// Asymmetric 4/5-bit: m = min, d = (max - min) / (2^Bits - 1), q = trunc((x - m) / d + 0.5).
template <int Bits, class Block>
inline void quantize_offset(const float* x, Block* y, std::size_t n, const char* what) {
  constexpr int top = (1 << Bits) - 1;
  const std::size_t nb = legacy_blocks(n, what);
  for (std::size_t i = 0; i < nb; ++i, x += legacy_block_size) {
    float lo, hi;
    min_max(x, lo, hi);
    const float d = fdiv(fsub(hi, lo), static_cast<float>(top));
    const float id = d != 0 ? fdiv(1.0f, d) : 0.0f;
    int q[legacy_block_size];
    for (std::size_t j = 0; j < legacy_block_size; ++j)
      q[j] = std::min(top, static_cast<int>(fadd(fmul(fsub(x[j], lo), id), 0.5f)));
    y[i].d = to_f16(d);
    y[i].m = to_f16(lo);
    pack<Bits>(y[i], q);
  }
}

// q8: d = amax / 127, q = roundf(x / d); returns sum(q) and the float d.
template <class Block>
inline int quantize_q8_block(const float* x, Block& y, float& d) noexcept {
  float amax = 0;
  for (std::size_t j = 0; j < legacy_block_size; ++j) amax = std::max(amax, std::fabs(x[j]));
  d = fdiv(amax, 127.0f);
  const float id = d != 0 ? fdiv(1.0f, d) : 0.0f;
  int sum = 0;
  for (std::size_t j = 0; j < legacy_block_size; ++j) {
    y.qs[j] = round_q8(fmul(x[j], id));
    sum += y.qs[j];
  }
  y.d = to_f16(d);
  return sum;
}

}  // namespace detail

// ---- quantize: n must be a multiple of 32 (invalid_argument otherwise) ----

inline void quantize_row(const float* x, block_q4_0* y, std::size_t n) { detail::quantize_symmetric<4>(x, y, n, "quantize q4_0"); }
inline void quantize_row(const float* x, block_q5_0* y, std::size_t n) { detail::quantize_symmetric<5>(x, y, n, "quantize q5_0"); }
inline void quantize_row(const float* x, block_q4_1* y, std::size_t n) { detail::quantize_offset<4>(x, y, n, "quantize q4_1"); }
inline void quantize_row(const float* x, block_q5_1* y, std::size_t n) { detail::quantize_offset<5>(x, y, n, "quantize q5_1"); }
inline void quantize_row(const float* x, block_q8_0* y, std::size_t n) {
  const std::size_t nb = detail::legacy_blocks(n, "quantize q8_0");
  float d;
  for (std::size_t i = 0; i < nb; ++i) detail::quantize_q8_block(x + i * legacy_block_size, y[i], d);
}
inline void quantize_row(const float* x, block_q8_1* y, std::size_t n) {
  const std::size_t nb = detail::legacy_blocks(n, "quantize q8_1");
  float d;
  for (std::size_t i = 0; i < nb; ++i) {
    const int sum = detail::quantize_q8_block(x + i * legacy_block_size, y[i], d);
    y[i].s = to_f16(detail::fmul(static_cast<float>(sum), d));
  }
}

// ---- dequantize: out has n floats ----

namespace detail {
template <int Bits, class Block>
inline void dequantize_symmetric(const Block* x, float* out, std::size_t n, const char* what) {
  const std::size_t nb = legacy_blocks(n, what);
  for (std::size_t i = 0; i < nb; ++i, out += legacy_block_size) {
    const float d = to_f32(x[i].d);
    int q[legacy_block_size];
    unpack<Bits>(x[i], q);
    // d has 11 significant bits, q - 2^(Bits-1) at most 5: the product is exact.
    for (std::size_t j = 0; j < legacy_block_size; ++j) out[j] = d * static_cast<float>(q[j] - (1 << (Bits - 1)));
  }
}
template <int Bits, class Block>
inline void dequantize_offset(const Block* x, float* out, std::size_t n, const char* what) {
  const std::size_t nb = legacy_blocks(n, what);
  for (std::size_t i = 0; i < nb; ++i, out += legacy_block_size) {
    const float d = to_f32(x[i].d), m = to_f32(x[i].m);
    int q[legacy_block_size];
    unpack<Bits>(x[i], q);
    // d * q is exact (11 + 5 bits), so the one rounding is the addition.
    for (std::size_t j = 0; j < legacy_block_size; ++j) out[j] = fadd(d * static_cast<float>(q[j]), m);
  }
}
template <class Block>
inline void dequantize_q8(const Block* x, float* out, std::size_t n, const char* what) {
  const std::size_t nb = legacy_blocks(n, what);
  for (std::size_t i = 0; i < nb; ++i, out += legacy_block_size) {
    const float d = to_f32(x[i].d);
    for (std::size_t j = 0; j < legacy_block_size; ++j) out[j] = d * static_cast<float>(x[i].qs[j]);  // exact
  }
}
}  // namespace detail

inline void dequantize_row(const block_q4_0* x, float* out, std::size_t n) { detail::dequantize_symmetric<4>(x, out, n, "dequantize q4_0"); }
inline void dequantize_row(const block_q5_0* x, float* out, std::size_t n) { detail::dequantize_symmetric<5>(x, out, n, "dequantize q5_0"); }
inline void dequantize_row(const block_q4_1* x, float* out, std::size_t n) { detail::dequantize_offset<4>(x, out, n, "dequantize q4_1"); }
inline void dequantize_row(const block_q5_1* x, float* out, std::size_t n) { detail::dequantize_offset<5>(x, out, n, "dequantize q5_1"); }
inline void dequantize_row(const block_q8_0* x, float* out, std::size_t n) { detail::dequantize_q8(x, out, n, "dequantize q8_0"); }
inline void dequantize_row(const block_q8_1* x, float* out, std::size_t n) { detail::dequantize_q8(x, out, n, "dequantize q8_1"); }

}  // namespace kestrel::quant
