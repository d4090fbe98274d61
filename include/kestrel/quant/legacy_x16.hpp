// kestrel/quant/legacy_x16.hpp: q4_0 with 16 rows interleaved ("q4_0_x16";
// dtype::q4_0_x16), the layout cpu_backend gives a file's q4_0 matrices when
// it copies them at load on AVX2 machines without AVX-512 VNNI
// (model/backend.hpp), read by the kernels of quant/legacy_x16_avx2.hpp:
//
//   quant::pack_x16(rows, row_bytes, n_rows, nb, panel);   // 16 rows -> nb x16 blocks
//   quant::pack_x16_panels(rows, row_bytes, n_rows, cols, p0, p1, out);  // (kquant_x16.hpp's, every x16 type)
//   quant::unpack_x16(panel, r, nb, row);                  // and back, bit for bit
//   quant::ref::dot_x16(panel, r, a, n);                   // the scalar twin: row r of a panel
//
// A block holds 16 rows x 32 values: qs[g][r] is row r's q4_0 bytes 4g ..
// 4g + 3 (low nibbles values 4g + j, high nibbles 16 + 4g + j), d[r] its
// scale: 288 bytes, as 16 rows of q4_0, so packing moves 4-byte words and
// a matrix keeps its size. A panel's rows past the matrix's are zero (d =
// 0). Why the layout pays: quant/legacy_x16_avx2.hpp.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
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
static_assert(sizeof(block_q4_0_x16) == 288);
static_assert(sizeof(block_q4_0_x16) == x16_rows * block_bytes(dtype::q4_0_x16),
              "a q4_0_x16 matrix has the bytes of its 16-row panels of q4_0");
template <> struct x16_source<block_q4_0_x16> { using type = block_q4_0; };

/// Rows [0, n_rows) of a q4_0 matrix (rows row_bytes apart, nb blocks each;
/// 1 <= n_rows <= 16) as nb x16 blocks; the rows past n_rows are zero.
inline void pack_x16(const std::byte* rows, std::size_t row_bytes, std::size_t n_rows, std::size_t nb,
                     block_q4_0_x16* out) noexcept {
  detail::x16_pack::pack_blocks<block_q4_0>(rows, row_bytes, n_rows, nb, out,
                                            [](const block_q4_0& x, block_q4_0_x16& o, std::size_t r) {
                                              for (int g = 0; g < 4; ++g) std::memcpy(o.qs[g][r], x.qs + 4 * g, 4);
                                              o.d[r] = x.d;
                                            });
}

/// Row r (< 16) of a panel's nb x16 blocks back as nb q4_0 blocks, bit for
/// bit what pack_x16 read.
inline void unpack_x16(const block_q4_0_x16* panel, std::size_t r, std::size_t nb, block_q4_0* out) noexcept {
  for (std::size_t b = 0; b < nb; ++b) {
    for (int g = 0; g < 4; ++g) std::memcpy(out[b].qs + 4 * g, panel[b].qs[g][r], 4);
    out[b].d = panel[b].d[r];
  }
}

namespace ref {
/// The scalar twin of the q4_0 x16 kernels: row r of a panel against a, n
/// values: ref::dot of the row unpacked, so exactly the row-major row's twin.
inline float dot_x16(const block_q4_0_x16* panel, std::size_t r, const block_q8_0* a, std::size_t n) {
  std::vector<block_q4_0> row(n / block_q4_0_x16::values);
  unpack_x16(panel, r, row.size(), row.data());
  return ref::dot(row.data(), a, n);
}
}  // namespace ref

}  // namespace kestrel::quant
