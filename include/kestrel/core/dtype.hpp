// kestrel/core/dtype.hpp: the element types of tensors (f32, f16, bf16) and
// scalar conversions between them.
//
// f16 and bf16 are stored as their 16 raw bits in strong types so that they
// never convert silently. Conversions to f32 are exact; conversions from f32
// round to nearest, ties to even, as IEEE 754 and ggml's F16C path do.
#pragma once

#include <bit>
#include <cstddef>
#include <cstdint>
#include <string_view>

namespace kestrel {

/// Element types of weights. The float types hold one value per element;
/// the GGUF block types (quant/) hold block_size(t) values in
/// block_bytes(t) bytes. The _x16 types (q4_k_x16 and after) are no
/// file's types: the k-quants and q4_0, q4_1, q5_0, q5_1, q8_0 with 16 rows interleaved
/// (quant/kquant_x16.hpp, quant/legacy_x16.hpp), what cpu_backend makes of
/// a file's matrices of those types at load; their blocks hold 16 rows' 256
/// (the legacy types: 32) values in 16 * block_bytes bytes, so a matrix is whole panels
/// of panel_rows(t) rows.
enum class dtype : std::uint8_t {
  f32, f16, bf16, q4_0, q4_1, q5_0, q5_1, q8_0, q2_k, q3_k, q4_k, q5_k, q6_k, q4_k_x16, q6_k_x16, q4_0_x16, q5_k_x16, q3_k_x16, q2_k_x16, q4_1_x16, q5_0_x16, q5_1_x16, q8_0_x16
};

constexpr bool is_quantized(dtype t) noexcept { return t >= dtype::q4_0; }
/// Values per block (1 for the float types).
constexpr std::size_t block_size(dtype t) noexcept {
  if (t <= dtype::bf16) return 1;
  return t <= dtype::q8_0 || t == dtype::q4_0_x16 || t >= dtype::q4_1_x16 ? 32 : 256;  // the legacy types: 32
}
/// Bytes per block (GGUF's type sizes).
constexpr std::size_t block_bytes(dtype t) noexcept {
  switch (t) {
    case dtype::f32: return 4;
    case dtype::f16: case dtype::bf16: return 2;
    case dtype::q4_0: return 18;
    case dtype::q4_1: return 20;
    case dtype::q5_0: return 22;
    case dtype::q5_1: return 24;
    case dtype::q8_0: return 34;
    case dtype::q2_k: return 84;
    case dtype::q3_k: return 110;
    case dtype::q4_k: return 144;
    case dtype::q5_k: return 176;
    case dtype::q6_k: return 210;
    case dtype::q4_k_x16: return 144;  // 2304 bytes per 16 rows' block, as q4_K
    case dtype::q6_k_x16: return 212;  // 3392 bytes per 16 rows' block
    case dtype::q4_0_x16: return 18;   // 288 bytes per 16 rows' block, as q4_0
    case dtype::q5_k_x16: return 176;  // 2816 bytes per 16 rows' block, as q5_K
    case dtype::q3_k_x16: return 112;  // 1792 bytes per 16 rows' block (q3_K: 1760)
    case dtype::q2_k_x16: return 84;   // 1344 bytes per 16 rows' block, as q2_K
    case dtype::q4_1_x16: return 20;   // as q4_1 (and below, as theirs)
    case dtype::q5_0_x16: return 22;
    case dtype::q5_1_x16: return 24;
    case dtype::q8_0_x16: return 34;
  }
  return 0;
}
/// Rows a matrix of this type is stored in groups of (its last group padded
/// with zero rows): 16 for the interleaved types, else 1.
constexpr std::size_t panel_rows(dtype t) noexcept {
  return t >= dtype::q4_k_x16 ? 16 : 1;  // q4_k_x16 and the types after it
}
/// Bytes per element of a float type (the block types have no such size).
constexpr std::size_t size_of(dtype t) noexcept { return block_size(t) == 1 ? block_bytes(t) : 0; }
constexpr std::string_view name_of(dtype t) noexcept {
  switch (t) {
    case dtype::f32: return "f32";
    case dtype::f16: return "f16";
    case dtype::bf16: return "bf16";
    case dtype::q4_0: return "q4_0";
    case dtype::q4_1: return "q4_1";
    case dtype::q5_0: return "q5_0";
    case dtype::q5_1: return "q5_1";
    case dtype::q8_0: return "q8_0";
    case dtype::q2_k: return "q2_K";
    case dtype::q3_k: return "q3_K";
    case dtype::q4_k: return "q4_K";
    case dtype::q5_k: return "q5_K";
    case dtype::q6_k: return "q6_K";
    case dtype::q4_k_x16: return "q4_K_x16";
    case dtype::q6_k_x16: return "q6_K_x16";
    case dtype::q4_0_x16: return "q4_0_x16";
    case dtype::q5_k_x16: return "q5_K_x16";
    case dtype::q3_k_x16: return "q3_K_x16";
    case dtype::q2_k_x16: return "q2_K_x16";
    case dtype::q4_1_x16: return "q4_1_x16";
    case dtype::q5_0_x16: return "q5_0_x16";
    case dtype::q5_1_x16: return "q5_1_x16";
    case dtype::q8_0_x16: return "q8_0_x16";
  }
  return "?";
}

/// IEEE 754 binary16, held as raw bits.
struct f16 {
  std::uint16_t bits;
  friend constexpr bool operator==(f16, f16) = default;
};
/// bfloat16 (the upper half of a binary32), held as raw bits.
struct bf16 {
  std::uint16_t bits;
  friend constexpr bool operator==(bf16, bf16) = default;
};

/// Exact: every binary16 value, subnormals, infinities and NaNs included.
constexpr float to_f32(f16 h) noexcept {
  const std::uint32_t sign = std::uint32_t(h.bits & 0x8000u) << 16;
  const std::uint32_t exp = (h.bits >> 10) & 0x1fu;
  std::uint32_t mant = h.bits & 0x3ffu;
  std::uint32_t out;
  if (exp == 0x1f) {                      // inf or NaN: keep the payload
    out = sign | 0x7f800000u | (mant << 13);
  } else if (exp != 0) {                  // normal
    out = sign | ((exp + 112u) << 23) | (mant << 13);
  } else if (mant == 0) {                 // signed zero
    out = sign;
  } else {                                // subnormal: normalise
    std::uint32_t e = 113;                // 127 - 15 + 1
    while ((mant & 0x400u) == 0) { mant <<= 1; --e; }
    out = sign | (e << 23) | ((mant & 0x3ffu) << 13);
  }
  return std::bit_cast<float>(out);
}

/// Round to nearest even; overflow gives infinity; NaN stays a (quiet) NaN.
constexpr f16 to_f16(float f) noexcept {
  const std::uint32_t x = std::bit_cast<std::uint32_t>(f);
  const std::uint16_t sign = static_cast<std::uint16_t>((x >> 16) & 0x8000u);
  const std::uint32_t absx = x & 0x7fffffffu;
  if (absx >= 0x7f800000u) {              // inf or NaN
    const std::uint16_t nan = absx > 0x7f800000u ? static_cast<std::uint16_t>(0x200u | ((absx >> 13) & 0x3ffu)) : 0;
    return {static_cast<std::uint16_t>(sign | 0x7c00u | nan)};
  }
  if (absx >= 0x477ff000u) return {static_cast<std::uint16_t>(sign | 0x7c00u)};  // rounds past 65504
  const int e = static_cast<int>(absx >> 23) - 127;
  if (e >= -14) {                         // normal range of binary16
    std::uint32_t m = absx & 0x7fffffu;
    std::uint32_t h = (static_cast<std::uint32_t>(e + 15) << 10) | (m >> 13);
    const std::uint32_t rest = m & 0x1fffu;
    if (rest > 0x1000u || (rest == 0x1000u && (h & 1u))) ++h;  // may carry into the exponent: correct
    return {static_cast<std::uint16_t>(sign | h)};
  }
  if (e < -25) return {sign};             // below half the smallest subnormal: zero
  // subnormal: value = m * 2^-24 with the implicit bit made explicit
  const std::uint32_t m = (absx & 0x7fffffu) | 0x800000u;
  const int drop = -1 - e;                // 14..24 bits fall below the last subnormal bit
  std::uint32_t h = m >> drop;
  const std::uint32_t rest = m & ((1u << drop) - 1u);
  const std::uint32_t half = 1u << (drop - 1);
  if (rest > half || (rest == half && (h & 1u))) ++h;
  return {static_cast<std::uint16_t>(sign | h)};
}

/// Exact.
constexpr float to_f32(bf16 b) noexcept { return std::bit_cast<float>(std::uint32_t(b.bits) << 16); }

/// Round to nearest even; NaN stays a quiet NaN of the same sign.
constexpr bf16 to_bf16(float f) noexcept {
  const std::uint32_t x = std::bit_cast<std::uint32_t>(f);
  if ((x & 0x7fffffffu) > 0x7f800000u) return {static_cast<std::uint16_t>((x >> 16) | 0x40u)};
  const std::uint32_t rounded = x + 0x7fffu + ((x >> 16) & 1u);
  return {static_cast<std::uint16_t>(rounded >> 16)};
}

template <class T> struct dtype_of;
template <> struct dtype_of<float> { static constexpr dtype value = dtype::f32; };
template <> struct dtype_of<f16> { static constexpr dtype value = dtype::f16; };
template <> struct dtype_of<bf16> { static constexpr dtype value = dtype::bf16; };
template <class T> inline constexpr dtype dtype_of_v = dtype_of<T>::value;

}  // namespace kestrel
