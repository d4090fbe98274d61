// kestrel/quant/legacy_x16.hpp: q4_0, q4_1, q5_0, q5_1 and q8_0 with 16
// rows interleaved ("q4_0_x16", ...; dtype::q4_0_x16, ...), the layouts
// cpu_backend gives a file's matrices of those types when it copies them at
// load on AVX2 machines without AVX-512 VNNI (model/backend.hpp), read by
// the kernels of quant/legacy_x16_avx2.hpp:
//
//   quant::pack_x16(rows, row_bytes, n_rows, nb, panel);   // 16 rows -> nb x16 blocks
//   quant::pack_x16_panels(rows, row_bytes, n_rows, cols, p0, p1, out);  // (kquant_x16.hpp's, every x16 type)
//   quant::unpack_x16(panel, r, nb, row);                  // and back, bit for bit
//   quant::ref::dot_x16(panel, r, a, n);                   // the scalar twin: row r of a panel
//
// A block holds 16 rows x 32 values: qs[g][r] is row r's q4_0 bytes 4g ..
// 4g + 3 (low nibbles values 4g + j, high nibbles 16 + 4g + j), d[r] its
// scale: 288 bytes, as 16 rows of q4_0, so packing moves 4-byte words and
// a matrix keeps its size (the other types below). A panel's rows past the
// matrix's are zero (d = 0). Why the layout pays: quant/legacy_x16_avx2.hpp.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <vector>

#include "kestrel/core/dtype.hpp"
#include "kestrel/quant/kquant_x16.hpp"
#include "kestrel/quant/legacy_format.hpp"
#include "kestrel/quant/ref/legacy.hpp"

namespace kestrel::quant {

struct alignas(32) block_q4_0_x16 {
  static constexpr std::size_t values = 32;  // of each row
  std::uint8_t qs[4][16][4];  // [g][row r][j]: row r's q4_0 byte 4g + j
  f16 d[16];
};
/// q4_1, q5_0 and q5_1 likewise: qs as q4_0's; q5's fifth bits qh[r], whose
/// byte j holds at bit g (4 + g) the fifth bit of value 4g + j (16 + 4g +
/// j), the bits that meet the nibbles of byte j of qs[g][r] (as q5_K's x16
/// unit, quant/kquant_x16.hpp); d and the _1 types' m per row. Each as
/// large as its 16 rows.
struct alignas(32) block_q4_1_x16 {
  static constexpr std::size_t values = 32;
  std::uint8_t qs[4][16][4];
  f16 d[16], m[16];
};
struct alignas(32) block_q5_0_x16 {
  static constexpr std::size_t values = 32;
  std::uint8_t qs[4][16][4];
  std::uint8_t qh[16][4];
  f16 d[16];
};
struct alignas(32) block_q5_1_x16 {
  static constexpr std::size_t values = 32;
  std::uint8_t qs[4][16][4];
  std::uint8_t qh[16][4];
  f16 d[16], m[16];
};
/// q8_0: qs[g][r] row r's values 4g .. 4g + 3 (signed bytes), d per row.
struct alignas(32) block_q8_0_x16 {
  static constexpr std::size_t values = 32;
  std::int8_t qs[8][16][4];
  f16 d[16];
};
static_assert(sizeof(block_q4_0_x16) == 288 && sizeof(block_q4_1_x16) == 320 && sizeof(block_q5_0_x16) == 352 &&
              sizeof(block_q5_1_x16) == 384 && sizeof(block_q8_0_x16) == 544);
static_assert(sizeof(block_q4_0_x16) == x16_rows * block_bytes(dtype::q4_0_x16) &&
                  sizeof(block_q4_1_x16) == x16_rows * block_bytes(dtype::q4_1_x16) &&
                  sizeof(block_q5_0_x16) == x16_rows * block_bytes(dtype::q5_0_x16) &&
                  sizeof(block_q5_1_x16) == x16_rows * block_bytes(dtype::q5_1_x16) &&
                  sizeof(block_q8_0_x16) == x16_rows * block_bytes(dtype::q8_0_x16),
              "a legacy x16 matrix has the bytes of its 16-row panels");
template <> struct x16_source<block_q4_0_x16> { using type = block_q4_0; };
template <> struct x16_source<block_q4_1_x16> { using type = block_q4_1; };
template <> struct x16_source<block_q5_0_x16> { using type = block_q5_0; };
template <> struct x16_source<block_q5_1_x16> { using type = block_q5_1; };
template <> struct x16_source<block_q8_0_x16> { using type = block_q8_0; };

template <class X>
concept legacy_x16_block = std::is_same_v<X, block_q4_0_x16> || std::is_same_v<X, block_q4_1_x16> ||
                           std::is_same_v<X, block_q5_0_x16> || std::is_same_v<X, block_q5_1_x16> ||
                           std::is_same_v<X, block_q8_0_x16>;

namespace detail {
/// Groups of 4 bytes in a legacy x16 block's qs: 4 of nibbles, 8 of q8_0's bytes.
template <class X> inline constexpr int x16_groups = static_cast<int>(sizeof(X::qs) / (16 * 4));
}  // namespace detail

/// Rows [0, n_rows) of a q4_0 / q4_1 / q5_0 / q5_1 matrix (rows row_bytes
/// apart, nb blocks each; 1 <= n_rows <= 16) as nb x16 blocks; the rows
/// past n_rows are zero.
template <legacy_x16_block X>
inline void pack_x16(const std::byte* rows, std::size_t row_bytes, std::size_t n_rows, std::size_t nb,
                     X* out) noexcept {
  using B = typename x16_source<X>::type;
  detail::x16_pack::pack_blocks<B>(rows, row_bytes, n_rows, nb, out, [](const B& x, X& o, std::size_t r) {
    for (int g = 0; g < detail::x16_groups<X>; ++g) std::memcpy(o.qs[g][r], x.qs + 4 * g, 4);
    o.d[r] = x.d;
    if constexpr (requires { x.m; }) o.m[r] = x.m;
    if constexpr (requires { x.qh; }) {
      std::uint32_t h;
      std::memcpy(&h, x.qh, 4);  // bit i: value i's fifth bit
      std::uint8_t bits[32];     // bits[i]: the same at bit 0
      for (int i = 0; i < 32; ++i) bits[i] = static_cast<std::uint8_t>((h >> i) & 1u);
      const std::uint32_t v = detail::x16_pack::high_bits(bits, 0);
      std::memcpy(o.qh[r], &v, 4);
    }
  });
}

/// Row r (< 16) of a panel's nb x16 blocks back as nb row-major blocks, bit
/// for bit what pack_x16 read.
template <legacy_x16_block X>
inline void unpack_x16(const X* panel, std::size_t r, std::size_t nb, typename x16_source<X>::type* out) noexcept {
  for (std::size_t b = 0; b < nb; ++b) {
    for (int g = 0; g < detail::x16_groups<X>; ++g) std::memcpy(out[b].qs + 4 * g, panel[b].qs[g][r], 4);
    out[b].d = panel[b].d[r];
    if constexpr (requires { out[b].m; }) out[b].m = panel[b].m[r];
    if constexpr (requires { out[b].qh; }) {
      std::uint32_t v, h = 0;
      std::memcpy(&v, panel[b].qh[r], 4);
      std::uint8_t bits[32] = {};
      detail::x16_pack::set_high_bits(bits, 0, v);
      for (int i = 0; i < 32; ++i) h |= static_cast<std::uint32_t>(bits[i]) << i;
      std::memcpy(out[b].qh, &h, 4);
    }
  }
}

namespace ref {
/// The scalar twin of the legacy x16 kernels: row r of a panel against a, n
/// values: ref::dot of the row unpacked, so exactly the row-major row's twin.
template <legacy_x16_block X>
inline float dot_x16(const X* panel, std::size_t r, const activation_of_t<typename x16_source<X>::type>* a,
                     std::size_t n) {
  std::vector<typename x16_source<X>::type> row(n / X::values);
  unpack_x16(panel, r, row.size(), row.data());
  return ref::dot(row.data(), a, n);
}
}  // namespace ref

}  // namespace kestrel::quant
