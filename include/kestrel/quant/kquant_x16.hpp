// kestrel/quant/kquant_x16.hpp: q4_K, q5_K and q6_K with 16 rows
// interleaved ("q4_K_x16", "q5_K_x16", "q6_K_x16"; dtype::q4_k_x16, ...),
// the layouts cpu_backend gives a file's matrices of those types when it
// copies them at load (model/backend.hpp; q5_K only where x16_kernel says
// this build has its kernel), and their dots against q8_K activations:
//
//   quant::pack_x16(rows, row_bytes, n_rows, nb, panel);      // 16 rows -> nb x16 blocks
//   quant::pack_x16_panels(rows, row_bytes, n_rows, cols, p0, p1, out);  // panels [p0, p1) of a matrix
//   quant::unpack_x16(panel, r, nb, row);                     // and back, bit for bit
//   quant::ref::vec_dot_x16(panel, r, a, n);                  // the scalar twin: row r of a panel
//   quant::detail::x16::x16_tokens(panel, n_rows, a, nb, n_tokens, out, out_stride);  // AVX-512 VNNI
//   quant::detail::x16::x16_pairs(panels, half, a, nb, out);  // decode on Intel: 4 (q6_K 8) panels side by side
//   quant::detail::x16::pack_kpanel(panel, nb, blocks);       // the prefill panels' blocks
//
// Why: quant/kquants.hpp's row-major kernel spends two 256-bit multiplies
// per 32 weights (vpmaddubsw, then the sub-block scale by vpdpwssd) plus a
// shuffle for the scale, about 19 cycles per 144-byte q4_K block on Zen 4:
// 17-24 GB/s a core, below the ~25 GB/s a core that decode's weights stream
// at, so Q4_K_M decode stayed at 0.74-0.81 of the bandwidth bound. With a
// row per int32 lane the scale is one multiply per 16 rows x 32 values
// (q4_K: a vpdpwssd, x16_group; q6_K: vpmulld), as in the prefill panels
// (quant/kquant_panels.hpp), and the codes stay packed: a
// 64-byte load holds 16 rows x 8 codes, its low nibbles values 4g .. 4g + 3
// of a sub-block and its high nibbles values 16 + 4g .. 16 + 4g + 3, so one
// vpandd each gives vpdpbusd its operand (q4_K: the high nibbles as 16 x
// code, shifted back exactly once the chain is summed; q6_K: the two high
// bits merged in by a shift and a vpternlogd). Measured
// (kestrel-bench-kquant, matvec x16_vs_matvec, 5632 x 2048 and 2048 x 5632,
// one and two threads): q4_K 1.51-1.84x the row-major kernel, q6_K
// 1.25-1.63x.
//
// The layout of one q4_K x16 block (16 rows, values 256 b .. 256 b + 255 of
// each; 2304 bytes, as 16 rows of q4_K; q6_K's below): qs[u][g][r] holds row
// r's codes 32u + 4g + j (low nibble of byte j) and 32u + 16 + 4g + j (high
// nibble), j < 4; scales[w][r] the w-th 32-bit word of row r's 12 packed
// scale bytes, so the kernel unpacks the 6-bit scales and mins of 16 rows
// with one set of word operations (quant/kquants.hpp's scales_k4, a row per
// lane); d and dmin per row. The scales, d and dmin come first, as the
// kernels read them, so a block is read front to back.
// A panel's rows past the matrix's are zero (d = dmin = 0). A matrix of R
// rows is ceil(R / 16) panels, each nb blocks of its 16 rows, panel after
// panel: weight_view's row_bytes() is a panel's bytes / 16, so rows_from a
// multiple of 16 still finds its panel.
//
// Arithmetic per (row, token) and block, as the prefill panels' (q6_K: no
// min term, the code offset folded into S as below): S = sum_u
// sc_u sum_{i in u} v_i a_i exactly in int32 (|S| <= 256 * 15 * 63 * 128 <
// 2^25), C = sum_u m_u (bsum_2u + bsum_2u+1) exactly, acc = fma(d d8,
// float(S), acc), accm = fma(-dmin d8, float(C), accm), result acc + accm:
// within gamma_(nb + 3) T of the exact dot (T and the derivation in
// tests/quant/test_kquants_simd.cpp). Each token's instruction sequence is
// the same for every group size, so a token's result does not depend on the
// tokens beside it.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <vector>

#include "kestrel/cpu/streaming.hpp"
#include "kestrel/core/diagnostics.hpp"
#include "kestrel/core/dtype.hpp"
#include "kestrel/quant/kquant_panels.hpp"
#include "kestrel/quant/kquants_format.hpp"
#include "kestrel/quant/ref/kquants.hpp"
#include "kestrel/quant/token_groups.hpp"

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VNNI__) && defined(__AVX512VL__)
#include <immintrin.h>
#define KESTREL_KQUANT_X16 1
#elif defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#include <immintrin.h>
#define KESTREL_KQUANT_X16_AVX2 1  // the kernels of quant/kquant_x16_avx2.hpp
#endif
#if defined(KESTREL_KQUANT_X16) || defined(KESTREL_KQUANT_X16_AVX2)
// detail::x16::x16_tokens exists: cpu_backend interleaves q4_K and q6_K at load.
#define KESTREL_X16_KERNEL 1
#endif

KESTREL_INTRINSICS_BEGIN  // GCC 12 (core/diagnostics.hpp)

namespace kestrel::quant {

inline constexpr std::size_t x16_rows = 16;

struct alignas(64) block_q4_K_x16 {
  static constexpr std::size_t values = 256;  // of each row
  std::uint32_t scales[3][16];   // [w][r]: bytes 4w .. 4w + 3 of row r's block_q4_K::scales
  f16 d[16], dmin[16];
  std::uint8_t qs[8][4][16][4];  // [sub-block u][g][row r][j]: lo nibble 32u + 4g + j, hi 32u + 16 + 4g + j
};
static_assert(sizeof(block_q4_K_x16) == 2304);
static_assert(sizeof(block_q4_K_x16) == x16_rows * block_bytes(dtype::q4_k_x16),
              "dtype.hpp's q4_k_x16 block is a sixteenth of an x16 block");

namespace detail::x16_pack {
inline std::uint32_t word(const std::uint8_t* p) noexcept {
  std::uint32_t v;
  std::memcpy(&v, p, 4);
  return v;
}
/// Bytes j < 4: nibble t (0 low, 1 high) of lo[j] | nibble t of hi[j] << 4.
/// Word arithmetic: a shift moves bits between bytes only where the mask
/// then clears them.
inline std::uint32_t nibbles(const std::uint8_t* lo, const std::uint8_t* hi, int t) noexcept {
  const std::uint32_t m = 0x0f0f0f0fu;
  return ((word(lo) >> (4 * t)) & m) | (((word(hi) >> (4 * t)) & m) << 4);
}
/// Bytes j < 4: bits s, s + 1 of p[4g + j] at bits 2g, 2g + 1, g < 4.
inline std::uint32_t crumbs(const std::uint8_t* p, int s) noexcept {
  const std::uint32_t m = 0x03030303u;
  std::uint32_t out = 0;
  for (int g = 0; g < 4; ++g) out |= ((word(p + 4 * g) >> s) & m) << (2 * g);
  return out;
}
/// One bit per value of 32 values (the fifth bits of q5_K, q5_0 and q5_1,
/// q3_K's high bits), bit u of p[k] for value k, in the x16 order: bytes j
/// < 4, at bit g (4 + g) the bit of value 4g + j (16 + 4g + j), g < 4.
inline std::uint32_t high_bits(const std::uint8_t* p, int u) noexcept {
  std::uint32_t out = 0;
  for (int j = 0; j < 4; ++j)
    for (int g = 0; g < 4; ++g)
      out |= ((p[4 * g + j] >> u) & 1u) << (8 * j + g) | ((p[16 + 4 * g + j] >> u) & 1u) << (8 * j + 4 + g);
  return out;
}
/// The inverse: each value k's bit of v (high_bits' order) set as bit u of p[k].
inline void set_high_bits(std::uint8_t* p, int u, std::uint32_t v) noexcept {
  for (int j = 0; j < 4; ++j)
    for (int g = 0; g < 4; ++g) {
      p[4 * g + j] = static_cast<std::uint8_t>(p[4 * g + j] | ((v >> (8 * j + g)) & 1u) << u);
      p[16 + 4 * g + j] = static_cast<std::uint8_t>(p[16 + 4 * g + j] | ((v >> (8 * j + 4 + g)) & 1u) << u);
    }
}
/// The loop both pack_x16 share: out[b] zeroed, then row(x, o, r) for the
/// source block x = block b of row r, r < n_rows.
template <class B, class X, class Row>
inline void pack_blocks(const std::byte* rows, std::size_t row_bytes, std::size_t n_rows, std::size_t nb, X* out,
                        Row&& row) noexcept {
  for (std::size_t b = 0; b < nb; ++b) {
    std::memset(&out[b], 0, sizeof(X));
    for (std::size_t r = 0; r < n_rows; ++r) row(reinterpret_cast<const B*>(rows + r * row_bytes)[b], out[b], r);
  }
}
}  // namespace detail::x16_pack

/// Rows [0, n_rows) of a q4_K matrix (rows row_bytes apart, nb blocks each;
/// 1 <= n_rows <= 16) as nb x16 blocks; the rows past n_rows are zero.
/// Word arithmetic, 4 codes at a time: cpu_backend packs every q4_K matrix
/// of a model at load.
inline void pack_x16(const std::byte* rows, std::size_t row_bytes, std::size_t n_rows, std::size_t nb,
                     block_q4_K_x16* out) noexcept {
  using namespace detail::x16_pack;
  pack_blocks<block_q4_K>(rows, row_bytes, n_rows, nb, out, [](const block_q4_K& x, block_q4_K_x16& o, std::size_t r) {
    for (int u = 0; u < 8; ++u) {
      // sub-block u: values 64c + 32t + k are nibble t of qs[32c + k]
      const std::uint8_t* q = x.qs + 32 * (u / 2);
      for (int g = 0; g < 4; ++g) {
        const std::uint32_t v = nibbles(q + 4 * g, q + 16 + 4 * g, u % 2);
        std::memcpy(o.qs[u][g][r], &v, 4);
      }
    }
    for (int w = 0; w < 3; ++w) o.scales[w][r] = word(x.scales + 4 * w);
    o.d[r] = x.d;
    o.dmin[r] = x.dmin;
  });
}

/// Row r (< 16) of a panel's nb x16 blocks back as nb q4_K blocks, bit for
/// bit what pack_x16 read.
inline void unpack_x16(const block_q4_K_x16* panel, std::size_t r, std::size_t nb, block_q4_K* out) noexcept {
  for (std::size_t b = 0; b < nb; ++b) {
    const block_q4_K_x16& p = panel[b];
    block_q4_K& x = out[b];
    for (int u = 0; u < 8; ++u) {
      std::uint8_t* q = x.qs + 32 * (u / 2);
      const int t = 4 * (u % 2);
      const std::uint8_t keep = u % 2 ? 0x0F : 0xF0;  // the other sub-block's nibble of the same bytes
      for (int g = 0; g < 4; ++g)
        for (int j = 0; j < 4; ++j) {
          const std::uint8_t v = p.qs[u][g][r][j];
          q[4 * g + j] = static_cast<std::uint8_t>((q[4 * g + j] & keep) | ((v & 0xF) << t));
          q[16 + 4 * g + j] = static_cast<std::uint8_t>((q[16 + 4 * g + j] & keep) | ((v >> 4) << t));
        }
    }
    for (int w = 0; w < 3; ++w) std::memcpy(x.scales + 4 * w, &p.scales[w][r], 4);
    x.d = p.d[r];
    x.dmin = p.dmin[r];
  }
}

/// q5_K interleaved by 16 rows (dtype::q5_k_x16; its kernel is AVX2's,
/// quant/kquant_x16_avx2.hpp): scales, d and dmin as q4_K's x16 block, then
/// per unit u (sub-block u, values 32u .. 32u + 31) the low 4 bits qs[g][r]
/// as q4_K's qs[u][g][r], and the fifth bits qh[r], whose byte j holds at
/// bit g the fifth bit of value 32u + 4g + j and at bit 4 + g that of value
/// 32u + 16 + 4g + j (g < 4): the bits that meet the nibbles of byte j of
/// qs[g][r]. A unit's 320 bytes are together, so the kernel reads a block
/// front to back (as q6_K's below). 2816 bytes, as 16 rows of q5_K.
struct alignas(64) block_q5_K_x16 {
  static constexpr std::size_t values = 256;  // of each row
  std::uint32_t scales[3][16];  // as block_q4_K_x16's
  f16 d[16], dmin[16];
  struct {
    std::uint8_t qs[4][16][4];  // [g][row r][j], as block_q4_K_x16's qs[u]
    std::uint8_t qh[16][4];     // [row r][j]: bit g (4 + g) the fifth bit of value 4g + j (16 + 4g + j)
  } unit[8];
};
static_assert(sizeof(block_q5_K_x16) == 2816);
static_assert(sizeof(block_q5_K_x16) == x16_rows * block_bytes(dtype::q5_k_x16),
              "dtype.hpp's q5_k_x16 block is a sixteenth of an x16 block");

/// As pack_x16 above, for q5_K: sub-block u's low bits are q4_K's (nibble
/// u % 2 of qs[32 (u / 2) + k]), its fifth bits bit u of qh[k].
inline void pack_x16(const std::byte* rows, std::size_t row_bytes, std::size_t n_rows, std::size_t nb,
                     block_q5_K_x16* out) noexcept {
  using namespace detail::x16_pack;
  pack_blocks<block_q5_K>(rows, row_bytes, n_rows, nb, out, [](const block_q5_K& x, block_q5_K_x16& o, std::size_t r) {
    for (int u = 0; u < 8; ++u) {
      const std::uint8_t* q = x.qs + 32 * (u / 2);
      for (int g = 0; g < 4; ++g) {
        const std::uint32_t v = nibbles(q + 4 * g, q + 16 + 4 * g, u % 2);
        std::memcpy(o.unit[u].qs[g][r], &v, 4);
      }
      const std::uint32_t h = high_bits(x.qh, u);
      std::memcpy(o.unit[u].qh[r], &h, 4);
    }
    for (int w = 0; w < 3; ++w) o.scales[w][r] = word(x.scales + 4 * w);
    o.d[r] = x.d;
    o.dmin[r] = x.dmin;
  });
}

/// As unpack_x16 above, for q5_K.
inline void unpack_x16(const block_q5_K_x16* panel, std::size_t r, std::size_t nb, block_q5_K* out) noexcept {
  for (std::size_t b = 0; b < nb; ++b) {
    const block_q5_K_x16& p = panel[b];
    block_q5_K& x = out[b];
    std::memset(&x, 0, sizeof x);
    for (int u = 0; u < 8; ++u) {
      std::uint8_t* q = x.qs + 32 * (u / 2);
      const int t = 4 * (u % 2);
      for (int g = 0; g < 4; ++g)
        for (int j = 0; j < 4; ++j) {
          const std::uint8_t v = p.unit[u].qs[g][r][j];
          q[4 * g + j] = static_cast<std::uint8_t>(q[4 * g + j] | (v & 0xF) << t);
          q[16 + 4 * g + j] = static_cast<std::uint8_t>(q[16 + 4 * g + j] | (v >> 4) << t);
        }
      std::uint32_t h;
      std::memcpy(&h, p.unit[u].qh[r], 4);
      detail::x16_pack::set_high_bits(x.qh, u, h);
    }
    for (int w = 0; w < 3; ++w) std::memcpy(x.scales + 4 * w, &p.scales[w][r], 4);
    x.d = p.d[r];
    x.dmin = p.dmin[r];
  }
}

/// q3_K interleaved by 16 rows (dtype::q3_k_x16; AVX2's kernel, as
/// q5_K's): scales[w][r] the w-th word of row r's 12 packed scale bytes, d
/// per row, then per unit u (values 32u .. 32u + 31, sub-blocks 2u and 2u +
/// 1) ql[h][r], whose byte j holds at bits 2g, 2g + 1 the low two bits of
/// value 32u + 16h + 4g + j, and hmask[r], whose byte j holds at bit g (4 +
/// g) the high bit of value 32u + 4g + j (32u + 16 + 4g + j) (q3_K's hmask
/// bit: set means no offset, so code = low | high << 2 is value + 4). 32
/// bytes of padding after d put the units on cache lines: 1792 bytes per 16
/// rows, against 1760 for 16 rows of q3_K.
struct alignas(64) block_q3_K_x16 {
  static constexpr std::size_t values = 256;  // of each row
  std::uint32_t scales[3][16];  // [w][r]: bytes 4w .. 4w + 3 of row r's block_q3_K::scales
  f16 d[16];
  std::uint8_t pad[32];
  struct {
    std::uint8_t ql[2][16][4];  // [h][row r][j]: bits 2g, 2g + 1 the low bits of value 16h + 4g + j
    std::uint8_t hmask[16][4];  // [row r][j]: bit g (4 + g) the high bit of value 4g + j (16 + 4g + j)
  } unit[8];
};
static_assert(sizeof(block_q3_K_x16) == 1792);
static_assert(sizeof(block_q3_K_x16) == x16_rows * block_bytes(dtype::q3_k_x16),
              "dtype.hpp's q3_k_x16 block is a sixteenth of an x16 block");

/// As pack_x16 above, for q3_K: value i's low bits at qs[byte2(i)] >>
/// shift2(i) (quant::detail's), its high bit bit i / 32 of hmask[i % 32].
inline void pack_x16(const std::byte* rows, std::size_t row_bytes, std::size_t n_rows, std::size_t nb,
                     block_q3_K_x16* out) noexcept {
  using namespace detail::x16_pack;
  pack_blocks<block_q3_K>(rows, row_bytes, n_rows, nb, out, [](const block_q3_K& x, block_q3_K_x16& o, std::size_t r) {
    for (int u = 0; u < 8; ++u) {
      const std::uint8_t* q = x.qs + 32 * (u / 4);
      const int sh = 2 * (u % 4);
      for (int h = 0; h < 2; ++h) {
        const std::uint32_t v = crumbs(q + 16 * h, sh);
        std::memcpy(o.unit[u].ql[h][r], &v, 4);
      }
      const std::uint32_t m = high_bits(x.hmask, u);
      std::memcpy(o.unit[u].hmask[r], &m, 4);
    }
    for (int w = 0; w < 3; ++w) o.scales[w][r] = word(x.scales + 4 * w);
    o.d[r] = x.d;
  });
}

/// As unpack_x16 above, for q3_K.
inline void unpack_x16(const block_q3_K_x16* panel, std::size_t r, std::size_t nb, block_q3_K* out) noexcept {
  for (std::size_t b = 0; b < nb; ++b) {
    const block_q3_K_x16& p = panel[b];
    block_q3_K& x = out[b];
    std::memset(&x, 0, sizeof x);
    for (int u = 0; u < 8; ++u) {
      for (int h = 0; h < 2; ++h)
        for (int g = 0; g < 4; ++g)
          for (int j = 0; j < 4; ++j) {
            const int i = 32 * u + 16 * h + 4 * g + j;
            const int lo = (p.unit[u].ql[h][r][j] >> (2 * g)) & 3;
            x.qs[detail::byte2(i)] = static_cast<std::uint8_t>(x.qs[detail::byte2(i)] | lo << detail::shift2(i));
          }
      std::uint32_t m;
      std::memcpy(&m, p.unit[u].hmask[r], 4);
      detail::x16_pack::set_high_bits(x.hmask, u, m);
    }
    for (int w = 0; w < 3; ++w) std::memcpy(x.scales + 4 * w, &p.scales[w][r], 4);
    x.d = p.d[r];
  }
}

/// q2_K interleaved by 16 rows (dtype::q2_k_x16; AVX2's kernel, as q3_K's):
/// scales[w][r] the w-th word of row r's 16 scale bytes (sub-block k's scale
/// in the low nibble of byte k, its min in the high one), d and dmin per
/// row, then per unit u ql[h][r] as q3_K's x16 ql (the two bits of value 32u
/// + 16h + 4g + j at bits 2g, 2g + 1 of byte j). 1344 bytes, as 16 rows of
/// q2_K.
struct alignas(64) block_q2_K_x16 {
  static constexpr std::size_t values = 256;  // of each row
  std::uint32_t scales[4][16];  // [w][r]: bytes 4w .. 4w + 3 of row r's block_q2_K::scales
  f16 d[16], dmin[16];
  struct {
    std::uint8_t ql[2][16][4];  // [h][row r][j]: bits 2g, 2g + 1 value 16h + 4g + j
  } unit[8];
};
static_assert(sizeof(block_q2_K_x16) == 1344);
static_assert(sizeof(block_q2_K_x16) == x16_rows * block_bytes(dtype::q2_k_x16),
              "dtype.hpp's q2_k_x16 block is a sixteenth of an x16 block");

/// As pack_x16 above, for q2_K (its codes where q3_K has its low bits).
inline void pack_x16(const std::byte* rows, std::size_t row_bytes, std::size_t n_rows, std::size_t nb,
                     block_q2_K_x16* out) noexcept {
  using namespace detail::x16_pack;
  pack_blocks<block_q2_K>(rows, row_bytes, n_rows, nb, out, [](const block_q2_K& x, block_q2_K_x16& o, std::size_t r) {
    for (int u = 0; u < 8; ++u)
      for (int h = 0; h < 2; ++h) {
        const std::uint32_t v = crumbs(x.qs + 32 * (u / 4) + 16 * h, 2 * (u % 4));
        std::memcpy(o.unit[u].ql[h][r], &v, 4);
      }
    for (int w = 0; w < 4; ++w) o.scales[w][r] = word(x.scales + 4 * w);
    o.d[r] = x.d;
    o.dmin[r] = x.dmin;
  });
}

/// As unpack_x16 above, for q2_K.
inline void unpack_x16(const block_q2_K_x16* panel, std::size_t r, std::size_t nb, block_q2_K* out) noexcept {
  for (std::size_t b = 0; b < nb; ++b) {
    const block_q2_K_x16& p = panel[b];
    block_q2_K& x = out[b];
    std::memset(&x, 0, sizeof x);
    for (int u = 0; u < 8; ++u)
      for (int h = 0; h < 2; ++h)
        for (int g = 0; g < 4; ++g)
          for (int j = 0; j < 4; ++j) {
            const int i = 32 * u + 16 * h + 4 * g + j;
            const int v = (p.unit[u].ql[h][r][j] >> (2 * g)) & 3;
            x.qs[detail::byte2(i)] = static_cast<std::uint8_t>(x.qs[detail::byte2(i)] | v << detail::shift2(i));
          }
    for (int w = 0; w < 4; ++w) std::memcpy(x.scales + 4 * w, &p.scales[w][r], 4);
    x.d = p.d[r];
    x.dmin = p.dmin[r];
  }
}

/// q6_K interleaved by 16 rows (dtype::q6_k_x16): unit[u] holds values 32u
/// .. 32u + 31 of the 16 rows, ql[g][r] as q4_K's qs (the low 4 bits of
/// values 32u + 4g + j and 32u + 16 + 4g + j), qh[h][r] byte j bits 2g, 2g +
/// 1 the high 2 bits of value 32u + 16h + 4g + j; scales[u][h][r] the int8
/// scale of sub-block 2u + h (values 32u + 16h .. 32u + 16h + 15), d per
/// row. The scales and d come first and each unit's bytes are together, so
/// the kernels read a block front to back, one stream through memory (on
/// Zen 2, reading ql and qh as two streams per panel halved decode's rate
/// from DRAM); 32 bytes of padding keep every block on a cache line (3392
/// bytes per 16 rows, 16 rows of q6_K take 3360).
struct alignas(64) block_q6_K_x16 {
  static constexpr std::size_t values = 256;  // of each row
  std::int8_t scales[8][2][16];
  f16 d[16];
  std::uint8_t pad[32];
  struct {
    std::uint8_t ql[4][16][4];
    std::uint8_t qh[2][16][4];
  } unit[8];
};
static_assert(sizeof(block_q6_K_x16) == 3392);
static_assert(sizeof(block_q6_K_x16) == x16_rows * block_bytes(dtype::q6_k_x16),
              "dtype.hpp's q6_k_x16 block is a sixteenth of an x16 block");

/// The row-major block each interleaved block holds 16 of.
template <class X> struct x16_source;
template <> struct x16_source<block_q4_K_x16> { using type = block_q4_K; };
template <> struct x16_source<block_q2_K_x16> { using type = block_q2_K; };
template <> struct x16_source<block_q3_K_x16> { using type = block_q3_K; };
template <> struct x16_source<block_q5_K_x16> { using type = block_q5_K; };
template <> struct x16_source<block_q6_K_x16> { using type = block_q6_K; };

/// Whether this build has X's kernels (detail::x16::x16_tokens, and with
/// AVX2 x16_pairs): q4_K and q6_K with AVX-512 VNNI or AVX2; q2_K, q3_K
/// and q5_K with AVX2 and without VNNI only (their AVX2 row-major decode
/// kernels are compute-bound: kquant_x16_avx2.hpp). cpu_backend interleaves exactly
/// these at load.
template <class X>
inline constexpr bool x16_kernel =
#if defined(KESTREL_KQUANT_X16_AVX2)
    true;
#elif defined(KESTREL_KQUANT_X16)
    std::is_same_v<X, block_q4_K_x16> || std::is_same_v<X, block_q6_K_x16>;
#else
    false;
#endif

/// As pack_x16 above, for q6_K. Unit u (values 32u .. 32u + 31) has its low
/// nibbles in ql[64 (u / 4) + 32 (u % 2) + k], nibble (u % 4) / 2, and its
/// high bits in qh[32 (u / 4) + k], bits 2 (u % 4) and up (quant::detail's
/// byte6l / byte2).
inline void pack_x16(const std::byte* rows, std::size_t row_bytes, std::size_t n_rows, std::size_t nb,
                     block_q6_K_x16* out) noexcept {
  using namespace detail::x16_pack;
  pack_blocks<block_q6_K>(rows, row_bytes, n_rows, nb, out, [](const block_q6_K& x, block_q6_K_x16& o, std::size_t r) {
    for (int u = 0; u < 8; ++u) {
      const std::uint8_t* ql = x.ql + 64 * (u / 4) + 32 * (u % 2);
      const std::uint8_t* qh = x.qh + 32 * (u / 4);
      for (int g = 0; g < 4; ++g) {
        const std::uint32_t v = nibbles(ql + 4 * g, ql + 16 + 4 * g, (u % 4) / 2);
        std::memcpy(o.unit[u].ql[g][r], &v, 4);
      }
      for (int h = 0; h < 2; ++h) {
        const std::uint32_t v = crumbs(qh + 16 * h, 2 * (u % 4));
        std::memcpy(o.unit[u].qh[h][r], &v, 4);
      }
      o.scales[u][0][r] = x.scales[2 * u];
      o.scales[u][1][r] = x.scales[2 * u + 1];
    }
    o.d[r] = x.d;
  });
}

/// As unpack_x16 above, for q6_K.
inline void unpack_x16(const block_q6_K_x16* panel, std::size_t r, std::size_t nb, block_q6_K* out) noexcept {
  for (std::size_t b = 0; b < nb; ++b) {
    const block_q6_K_x16& p = panel[b];
    block_q6_K& x = out[b];
    std::memset(&x, 0, sizeof x);
    for (int u = 0; u < 8; ++u) {
      for (int g = 0; g < 4; ++g)
        for (int j = 0; j < 4; ++j)
          for (int h = 0; h < 2; ++h) {
            const int i = 32 * u + 16 * h + 4 * g + j;
            const int lo = (p.unit[u].ql[g][r][j] >> (4 * h)) & 0xF, hi = (p.unit[u].qh[h][r][j] >> (2 * g)) & 3;
            x.ql[detail::byte6l(i)] = static_cast<std::uint8_t>(x.ql[detail::byte6l(i)] | (lo << detail::shift6l(i)));
            x.qh[detail::byte2(i)] = static_cast<std::uint8_t>(x.qh[detail::byte2(i)] | (hi << detail::shift2(i)));
          }
      x.scales[2 * u] = p.scales[u][0][r];
      x.scales[2 * u + 1] = p.scales[u][1][r];
    }
    x.d = p.d[r];
  }
}

/// Panels [p0, p1) of a matrix of n_rows rows (row_bytes apart, cols
/// values each, a multiple of X::values) into out + p0 * (cols / X::values):
/// panel p is rows 16 p .. 16 p + 15, the last one padded with zero rows.
/// The whole matrix is panels [0, ceil(n_rows / 16)).
template <class X>
inline void pack_x16_panels(const std::byte* rows, std::size_t row_bytes, std::size_t n_rows, std::size_t cols,
                            std::size_t p0, std::size_t p1, X* out) noexcept {
  const std::size_t nb = cols / X::values;
  for (std::size_t p = p0; p < p1; ++p)
    pack_x16(rows + x16_rows * p * row_bytes, row_bytes, std::min(x16_rows, n_rows - x16_rows * p), nb, out + p * nb);
}

namespace ref {
/// The scalar twin of the x16 kernels: row r of a panel against a, n
/// values: ref::vec_dot of the row unpacked, so exactly the row-major
/// row's twin.
template <class X>
inline float vec_dot_x16(const X* panel, std::size_t r, const block_q8_K* a, std::size_t n) {
  quant::detail::check_n(n, "vec_dot_x16");
  std::vector<typename x16_source<X>::type> row(n / qk_k);
  unpack_x16(panel, r, row.size(), row.data());
  return ref::vec_dot(row.data(), a, n);
}
}  // namespace ref

/// Row r of an x16 panel (nb blocks) as X::values nb floats (any x16 type
/// whose unpack_x16 and dequantize_row are declared where this is used).
template <class X>
inline void dequantize_x16_row(const X* panel, std::size_t r, std::size_t nb, float* y) {
  for (std::size_t b = 0; b < nb; ++b) {
    typename x16_source<X>::type x;
    unpack_x16(panel + b, r, 1, &x);
    dequantize_row(&x, y + b * X::values, X::values);
  }
}

namespace detail::x16 {
/// The int16 pairs (bsum_4j + bsum_4j+1, bsum_4j+2 + bsum_4j+3), j < 4, of a
/// q8_K block: sub-blocks 2j and 2j + 1's activation sums, as vpdpwssd
/// meets them with the mins (|sum| <= 32 * 128, an int16).
inline void bsum_pairs(const block_q8_K& a, std::int32_t* out) noexcept {
  for (int j = 0; j < 4; ++j) {
    const std::int16_t p[2] = {static_cast<std::int16_t>(a.bsums[4 * j] + a.bsums[4 * j + 1]),
                               static_cast<std::int16_t>(a.bsums[4 * j + 2] + a.bsums[4 * j + 3])};
    std::memcpy(out + j, p, 4);
  }
}

/// Header bytes (scales, d, dmin) and one unit's code bytes of an x16
/// block, as the decode kernels' unit-by-unit prefetches walk them.
template <class X>
inline constexpr std::size_t head_bytes =
    std::is_same_v<X, block_q6_K_x16> || std::is_same_v<X, block_q2_K_x16> ? 320 : 256;  // q3_K: with its padding
template <class X> inline constexpr std::size_t unit_bytes = (sizeof(X) - head_bytes<X>) / 8;

}  // namespace detail::x16

#if defined(KESTREL_KQUANT_X16)
namespace detail::x16 {

/// Blocks ahead of the one in use that x16_group asks into L2: a panel's
/// blocks and the next panel's follow each other in memory, so this streams
/// the matrix ahead of the kernel. Measured on Zen 4 (/tmp prototype, 65536
/// x 2048 in huge pages, two threads, alternated in one process against a
/// plain read of the same bytes): without it the kernel read at 0.63-0.79
/// of the plain read's rate (its loads come in bursts, 32 per block, between
/// stretches of arithmetic, and the hardware prefetcher did not keep up);
/// 2 blocks ahead 0.77-0.90, 8 ahead 0.92-1.0, 16 ahead 0.94-1.04; into L1
/// instead, 0.45x. (On Zen 2 the AVX2 kernel measured the opposite:
/// prefetching 1-16 blocks ahead cost it 20-45%; it walks two panels at
/// once instead, x16_pairs.)
inline constexpr std::size_t prefetch_blocks = 8;

/// Where x16_group asks for the blocks ahead: far_l2 is the above (Zen 4,
/// and every host not measured otherwise); next_l1 asks for the next block
/// into L1, row_streams::pairs_ahead's choice (Zen 5, cpu/streaming.hpp).
/// On the Zen 5 host (bench/ab_decode.sh, TinyLlama Q4_K_M, token time
/// against far_l2): next_l1 0.86-0.89; both prefetches at once 1.21; 16
/// blocks into L2 1.02; into L1 two blocks or 2 KiB ahead, level with one
/// block. Either way the same bits: only the lines asked for differ.
/// unit_l1 asks for the next block's lines into L1 spread through the block:
/// with unit u, unit u's lines (and with unit 0 the head's), so a few
/// prefetches go out between each unit's arithmetic instead of a burst of
/// 36-53 at the block's start. Intel's decode (row_streams::wide) walks two
/// panels side by side block by block with it (x16_pairs). Measured on an
/// AMX Xeon (family 6 model 167; /tmp harness, 28000 panels x 8 blocks in
/// huge pages, alternated medians, GB/s over far_l2 one panel at a time):
/// two threads, 2 panels + unit_l1 1.16-1.32, 4 panels 1.29-1.31, 2 panels
/// + next_l1 (the burst) 1.07-1.18; one thread, 2 panels + unit_l1 1.29,
/// next_l1 alone 1.00-1.08. (On Emerald Rapids two panels alone had not
/// paid, 0.98, nor next_l1 alone, 1.08 the time.) The kernel still reads at
/// ~0.7 of a plain 8-stream read there: its arithmetic alone runs at 16-30
/// GB/s a core, a plain read at 13-19, and the two only partly overlap.
enum class x16_ahead : unsigned char { far_l2, next_l1, unit_l1 };

inline constexpr x16_ahead x16_ahead_for(cpu::row_streams plan) noexcept {
  return plan == cpu::row_streams::pairs_ahead ? x16_ahead::next_l1 : x16_ahead::far_l2;
}

/// unit_l1's prefetch while unit u of block pb is read: the same unit of
/// the next block (and the head with unit 0).
template <class X>
inline void prefetch_unit(const X& pb, int u) noexcept {
  const char* const next = reinterpret_cast<const char*>(&pb + 1);
  if (u == 0)
    for (std::size_t l = 0; l < head_bytes<X>; l += 64) _mm_prefetch(next + l, _MM_HINT_T0);
  for (std::size_t l = 0; l < unit_bytes<X>; l += 64) _mm_prefetch(next + head_bytes<X> + u * unit_bytes<X> + l, _MM_HINT_T0);
}

/// Asks for block b + prefetch_blocks of p into L2 (far_l2) or block b + 1
/// into L1 (next_l1), one prefetch per line (a prefetch past the matrix's
/// end does not fault and is dropped).
template <x16_ahead A, class X>
inline void prefetch_ahead(const X* p, std::size_t b) noexcept {
  if constexpr (A == x16_ahead::unit_l1) return;  // x16_group calls prefetch_unit, unit by unit
  const std::size_t ahead = A == x16_ahead::next_l1 ? 1 : prefetch_blocks;
  const std::uintptr_t at = reinterpret_cast<std::uintptr_t>(p) + (b + ahead) * sizeof(X);
  for (std::size_t i = 0; i < sizeof(X) / 64; ++i) {
    if constexpr (A == x16_ahead::next_l1)
      _mm_prefetch(reinterpret_cast<const char*>(at + 64 * i), _MM_HINT_T0);
    else
      _mm_prefetch(reinterpret_cast<const char*>(at + 64 * i), _MM_HINT_T1);
  }
}

/// Tokens per pass over a panel's codes: per token two chains (s0, s1), tot,
/// acc and accm, beside the codes' two registers: 4 tokens take 22 of the
/// 32 zmm.
inline constexpr std::size_t token_group = 4;

/// vpshufb controls, per 32-bit lane: its byte k zero-extended to 32 bits
/// (byte_ctrl), its bytes k, k + 1 each zero-extended to 16 bits
/// (pair_ctrl), or its byte k zero-extended to 16 bits in both halves, the
/// int16 pair (byte k, byte k) that vpdpwssd meets (twin_ctrl).
inline __m512i byte_ctrl(int k) noexcept {
  auto c = [k](int d) { return static_cast<int>(0x80808000u | static_cast<unsigned>(4 * d + k)); };
  return _mm512_broadcast_i32x4(_mm_setr_epi32(c(0), c(1), c(2), c(3)));
}
inline __m512i pair_ctrl(int k) noexcept {
  auto c = [k](int d) { return static_cast<int>(0x80008000u | static_cast<unsigned>(4 * d + k) | static_cast<unsigned>(4 * d + k + 1) << 16); };
  return _mm512_broadcast_i32x4(_mm_setr_epi32(c(0), c(1), c(2), c(3)));
}
inline __m512i twin_ctrl(int k) noexcept {
  auto c = [k](int d) { return static_cast<int>(0x80008000u | static_cast<unsigned>(4 * d + k) * 0x10001u); };
  return _mm512_broadcast_i32x4(_mm_setr_epi32(c(0), c(1), c(2), c(3)));
}

/// The 6-bit scales and mins of a q4_K x16 block, lane r = row r:
/// sc[h] byte k = the scale of sub-block 4h + k, mn[h] the same for the
/// mins (scales_k4's word arithmetic in kquants.hpp, 16 rows at once).
struct k4_scales {
  __m512i sc[2], mn[2];
};
inline k4_scales unpack_scales(const block_q4_K_x16& b) noexcept {
  const __m512i a = _mm512_load_si512(b.scales[0]), bw = _mm512_load_si512(b.scales[1]), c = _mm512_load_si512(b.scales[2]);
  const __m512i m3f = _mm512_set1_epi32(0x3f3f3f3f), m0f = _mm512_set1_epi32(0x0f0f0f0f), m30 = _mm512_set1_epi32(0x30303030);
  k4_scales s;
  s.sc[0] = _mm512_and_si512(a, m3f);
  s.mn[0] = _mm512_and_si512(bw, m3f);
  // 0xEA: (a & b) | c; the top two bits of a / b to bits 4, 5 of their byte
  s.sc[1] = _mm512_ternarylogic_epi32(c, m0f, _mm512_and_si512(_mm512_srli_epi32(a, 2), m30), 0xEA);
  s.mn[1] = _mm512_ternarylogic_epi32(_mm512_srli_epi32(c, 4), m0f, _mm512_and_si512(_mm512_srli_epi32(bw, 2), m30), 0xEA);
  return s;
}

/// q6_K's codes of one 64-byte load of ql: lane r's bytes as full 6-bit
/// codes (low 4 bits | high 2 bits << 4) of values 4g + j (lo) and 16 + 4g
/// + j (hi) of the unit, from the unit's two qh loads. The high bits sit at
/// bits 2g, 2g + 1 of their byte. With GFNI one vgf2p8affineqb moves them
/// to bits 4, 5 and clears the rest of the byte (the bit matrix's rows 4
/// and 5 pick source bits 2g and 2g + 1); without, a 16-bit shift takes them
/// there (the neighbouring byte's bits it moves in land outside 0x30) and a
/// vpandd masks. vpternlogd merges them: (low & 0x0f) | high. The same bits
/// either way. Measured (/tmp harness, x16 walk of two q6_K panels in L1,
/// one thread, AMX Xeon family 6 model 167): GFNI 1.24-1.25x the shifts.
inline void q6_codes(__m512i ql, __m512i qh0, __m512i qh1, int g, __m512i& lo, __m512i& hi) noexcept {
  const __m512i m0f = _mm512_set1_epi8(0x0f);
#if defined(__GFNI__)
  // result bit i of a byte = parity(matrix byte 7 - i & source byte)
  const __m512i pick = _mm512_set1_epi64(static_cast<long long>((std::uint64_t{1} << (2 * g)) << 24 | (std::uint64_t{1} << (2 * g + 1)) << 16));
  const __m512i h0 = _mm512_gf2p8affine_epi64_epi8(qh0, pick, 0), h1 = _mm512_gf2p8affine_epi64_epi8(qh1, pick, 0);
#else
  const __m512i m30 = _mm512_set1_epi8(0x30);
  auto to_bit4 = [g](__m512i h) {
    switch (g) {
      case 0: return _mm512_slli_epi16(h, 4);
      case 1: return _mm512_slli_epi16(h, 2);
      case 2: return h;
      default: return _mm512_srli_epi16(h, 2);
    }
  };
  const __m512i h0 = _mm512_and_si512(to_bit4(qh0), m30), h1 = _mm512_and_si512(to_bit4(qh1), m30);
#endif
  // 0xEA: (a & b) | c over the bits of (a, b, c)
  lo = _mm512_ternarylogic_epi32(ql, m0f, h0, 0xEA);
  hi = _mm512_ternarylogic_epi32(_mm512_srli_epi16(ql, 4), m0f, h1, 0xEA);
}

/// acc[NT i + t] (lane r) = the dot of row r of panel p[i] with token t <
/// NT over blocks [0, nb) (the arithmetic in the header), i < NP. q6_K: each
/// 16-value chain starts at -32 times its activations' sum (the code offset,
/// exact), so S sums (v - 32) a_i directly and there is no second term. A:
/// how the blocks ahead are asked for. NP > 1 walks NP panels side by side,
/// block by block and unit by unit (x16_pairs: NP streams through memory,
/// and NP independent chains beside each other for the out-of-order core);
/// each panel's operations are the same whatever NP, so the same bits.
///
/// q4_K meets its sub-block scale with one vpdpwssd per unit: the low
/// nibbles' chain s0 and the high nibbles' s1 / 16 each sum 16 products of
/// a code (<= 15) and an activation (|a| <= 128), so |.| <= 30720 < 2^15 and
/// the two fit one lane as the int16 pair (s0, s1 / 16) (one vpternlogd:
/// s1's low 4 bits are 0, so s1 << 12 is s1 / 16 << 16), which vpdpwssd
/// multiplies by the pair (sc, sc) and adds to tot: sc (s0 + s1 / 16)
/// exactly, as the former vpsrad, vpaddd, vpmulld (two uops) and vpaddd.
/// The unit loop is unrolled so the scale shuffles' controls are constants.
/// Measured (/tmp harness, x16_pairs' walk, 16 rows x 8 blocks per panel,
/// AMX Xeon family 6 model 167, alternated medians, GB/s over the former
/// kernel): in L1, one thread, unrolled 1.26-1.34, with vpdpwssd 1.35-1.38,
/// units interleaved across the two panels 1.39; from memory (28000 panels,
/// two threads) 1.03-1.07, the plain 8-stream read 1.31-1.36.
template <class X, std::size_t NT, x16_ahead A = x16_ahead::far_l2, std::size_t NP = 1>
inline void x16_group(const X* const* p, const block_q8_K* a, std::size_t nb, std::size_t stride, __m512* acc) noexcept {
  constexpr bool q6 = std::is_same_v<X, block_q6_K_x16>;
  __m512 accm[NP * NT];
  for (std::size_t k = 0; k < NP * NT; ++k) acc[k] = accm[k] = _mm512_setzero_ps();
  const __m512i lo_mask = _mm512_set1_epi8(0x0f), hi_mask = _mm512_set1_epi8(static_cast<char>(0xf0));
  const __m512i lo16 = _mm512_set1_epi32(0xffff);
  for (std::size_t b = 0; b < nb; ++b) {
    __m512i tot[NP * NT];
    [[maybe_unused]] k4_scales ks[NP];
#pragma GCC unroll 4
    for (std::size_t i = 0; i < NP; ++i) {
      prefetch_ahead<A>(p[i], b);
      for (std::size_t t = 0; t < NT; ++t) tot[NT * i + t] = _mm512_setzero_si512();
      if constexpr (!q6) ks[i] = unpack_scales(p[i][b]);
    }
#pragma GCC unroll 8
    for (int u = 0; u < 8; ++u) {
#pragma GCC unroll 4
      for (std::size_t i = 0; i < NP; ++i) {
        const X& pb = p[i][b];
        __m512i* const ti = tot + NT * i;
        if constexpr (A == x16_ahead::unit_l1) prefetch_unit(pb, u);
        __m512i s0[NT], s1[NT];
        if constexpr (q6) {
          for (std::size_t t = 0; t < NT; ++t) {
            const block_q8_K& ab = a[t * stride + b];
            s0[t] = _mm512_set1_epi32(-32 * ab.bsums[2 * u]);
            s1[t] = _mm512_set1_epi32(-32 * ab.bsums[2 * u + 1]);
          }
          const __m512i qh0 = _mm512_load_si512(pb.unit[u].qh[0]), qh1 = _mm512_load_si512(pb.unit[u].qh[1]);
#pragma GCC unroll 4
          for (int g = 0; g < 4; ++g) {
            __m512i lo, hi;
            q6_codes(_mm512_load_si512(pb.unit[u].ql[g]), qh0, qh1, g, lo, hi);
            for (std::size_t t = 0; t < NT; ++t) {
              const std::int8_t* q = a[t * stride + b].qs + 32 * u + 4 * g;
              s0[t] = dpbusd_bcast(s0[t], lo, q);
              s1[t] = dpbusd_bcast(s1[t], hi, q + 16);
            }
          }
          const __m512i sc0 = _mm512_cvtepi8_epi32(_mm_load_si128(reinterpret_cast<const __m128i*>(pb.scales[u][0])));
          const __m512i sc1 = _mm512_cvtepi8_epi32(_mm_load_si128(reinterpret_cast<const __m128i*>(pb.scales[u][1])));
          for (std::size_t t = 0; t < NT; ++t)
            ti[t] = _mm512_add_epi32(ti[t], _mm512_add_epi32(_mm512_mullo_epi32(s0[t], sc0), _mm512_mullo_epi32(s1[t], sc1)));
        } else {
          for (std::size_t t = 0; t < NT; ++t) s0[t] = s1[t] = _mm512_setzero_si512();
#pragma GCC unroll 4
          for (int g = 0; g < 4; ++g) {
            const __m512i codes = _mm512_load_si512(pb.qs[u][g]);
            const __m512i lo = _mm512_and_si512(codes, lo_mask), hi = _mm512_and_si512(codes, hi_mask);
            for (std::size_t t = 0; t < NT; ++t) {
              const std::int8_t* q = a[t * stride + b].qs + 32 * u + 4 * g;
              s0[t] = dpbusd_bcast(s0[t], lo, q);
              s1[t] = dpbusd_bcast(s1[t], hi, q + 16);  // 16 x the high codes' sum: exact, shifted back below
            }
          }
          const __m512i sc = _mm512_shuffle_epi8(ks[i].sc[u / 4], twin_ctrl(u % 4));
          for (std::size_t t = 0; t < NT; ++t)  // 0xEA: (a & b) | c, the int16 pair (s0, s1 / 16)
            ti[t] = _mm512_dpwssd_epi32(ti[t], _mm512_ternarylogic_epi32(s0[t], lo16, _mm512_slli_epi32(s1[t], 12), 0xEA), sc);
        }
      }
    }
#pragma GCC unroll 4
    for (std::size_t i = 0; i < NP; ++i) {
      const X& pb = p[i][b];
      __m512* const ac = acc + NT * i;
      __m512* const am = accm + NT * i;
      const __m512 d = _mm512_cvtph_ps(_mm256_load_si256(reinterpret_cast<const __m256i*>(pb.d)));
      if constexpr (q6) {
        for (std::size_t t = 0; t < NT; ++t)
          ac[t] = _mm512_fmadd_ps(_mm512_mul_ps(d, _mm512_set1_ps(a[t * stride + b].d)), _mm512_cvtepi32_ps(tot[NT * i + t]), ac[t]);
      } else {
        const __m512 dmin = _mm512_cvtph_ps(_mm256_load_si256(reinterpret_cast<const __m256i*>(pb.dmin)));
        __m512i mins[4];
        for (int j = 0; j < 4; ++j) mins[j] = _mm512_shuffle_epi8(ks[i].mn[j / 2], pair_ctrl(2 * (j % 2)));  // (m_2j, m_2j+1)
        for (std::size_t t = 0; t < NT; ++t) {
          const block_q8_K& ab = a[t * stride + b];
          alignas(16) std::int32_t pairs[4];
          bsum_pairs(ab, pairs);
          __m512i corr = _mm512_setzero_si512();
          for (int j = 0; j < 4; ++j) corr = _mm512_dpwssd_epi32(corr, mins[j], _mm512_set1_epi32(pairs[j]));
          am[t] = _mm512_fmadd_ps(_mm512_mul_ps(dmin, _mm512_set1_ps(-ab.d)), _mm512_cvtepi32_ps(corr), am[t]);
          ac[t] = _mm512_fmadd_ps(_mm512_mul_ps(d, _mm512_set1_ps(ab.d)), _mm512_cvtepi32_ps(tot[NT * i + t]), ac[t]);
        }
      }
    }
  }
  if constexpr (!q6)
    for (std::size_t k = 0; k < NP * NT; ++k) acc[k] = _mm512_add_ps(acc[k], accm[k]);
}

/// A panel (nb x16 blocks, n_rows valid rows) against tokens [0, n_tokens)
/// (nb q8_K blocks each, consecutive) in groups of token_group (then 2, 1):
/// out[t * out_stride + r] for r < n_rows. plan: the host's decode plan,
/// which sets how the blocks ahead are asked for (x16_ahead_for).
template <class X>
inline void x16_tokens(const X* p, std::size_t n_rows, const block_q8_K* a, std::size_t nb,
                       std::size_t n_tokens, float* out, std::size_t out_stride,
                       cpu::row_streams plan = cpu::host_row_streams()) noexcept {
  const bool next = x16_ahead_for(plan) == x16_ahead::next_l1;
  const X* const ps[1] = {p};
  panel_token_groups<token_group>(n_tokens, panel_row_mask(n_rows), out, out_stride,
                                  [&]<std::size_t NT>(std::size_t t, __m512* acc) {
                                    if (next)
                                      x16_group<X, NT, x16_ahead::next_l1>(ps, a + t * nb, nb, nb, acc);
                                    else
                                      x16_group<X, NT>(ps, a + t * nb, nb, nb, acc);
                                  });
}

/// n whole panels from p (nb blocks each) against one token, NP at a time
/// side by side block by block and unit by unit (panels j, q + j, ..., (NP
/// - 1) q + j, q = n / NP: NP streams through memory), each block's
/// successor asked into L1 unit by unit (x16_ahead::unit_l1): out[16 k + r]
/// for panel k < NP q. Returns NP q, the panels done.
template <class X, std::size_t NP>
inline std::size_t x16_side_by_side(const X* p, std::size_t n, const block_q8_K* a, std::size_t nb, float* out) noexcept {
  const std::size_t q = n / NP;
  for (std::size_t j = 0; j < q; ++j) {
    const X* ps[NP];
    for (std::size_t i = 0; i < NP; ++i) ps[i] = p + (i * q + j) * nb;
    __m512 acc[NP];
    x16_group<X, 1, x16_ahead::unit_l1, NP>(ps, a, nb, nb, acc);
    for (std::size_t i = 0; i < NP; ++i) _mm512_storeu_ps(out + 16 * (i * q + j), acc[i]);
  }
  return NP * q;
}

/// Panels decode's walk on Intel reads side by side: q4_K four, q6_K
/// (no scales to hold in registers beside its chains) eight. Measured (/tmp
/// harness, 28000 q4_K / 20000 q6_K panels x 8 blocks in huge pages, two
/// threads, alternated medians, AMX Xeon family 6 model 167), GB/s over two
/// panels: q4_K four 1.08-1.19, eight 1.08; q6_K four 1.08-1.12, eight
/// 1.18-1.20 (and 1.18 with 3 blocks a panel, the 110M shape's rows); the
/// plain 8-stream read 1.22-1.49.
template <class X>
inline constexpr std::size_t decode_side_by_side = std::is_same_v<X, block_q6_K_x16> ? 8 : 4;

/// Decode's walk on Intel (cpu::row_streams::wide, x16_walk's pairs): the 2
/// half whole panels from p against one token, decode_side_by_side<X> at a
/// time (x16_side_by_side), then the rest four and two at a time:
/// out[16 k + r] for panel k. The same bits as x16_tokens per panel.
template <class X>
inline void x16_pairs(const X* p, std::size_t half, const block_q8_K* a, std::size_t nb, float* out) noexcept {
  const std::size_t n = 2 * half;
  std::size_t k = 0;
  if constexpr (decode_side_by_side<X> == 8) k += x16_side_by_side<X, 8>(p, n, a, nb, out);
  k += x16_side_by_side<X, 4>(p + k * nb, n - k, a, nb, out + 16 * k);
  x16_side_by_side<X, 2>(p + k * nb, n - k, a, nb, out + 16 * k);  // n - k is 0 or 2
}

#if defined(KESTREL_KQUANT_PANEL)
/// An x16 panel's nb blocks as the prefill panels' packed blocks
/// (quant/kquant_panels.hpp), equal to what pack_kpanel<block_q4_K> makes
/// of the same 16 rows lane for lane (padding rows aside: zero here, the
/// last row repeated there), so prefill gives the same bits from either
/// layout. No transposes: the x16 layout already has a row per lane.
inline void pack_kpanel(const block_q4_K_x16* p, std::size_t nb, kp::kpanel_block* dst) noexcept {
  const __m512i lo_mask = _mm512_set1_epi8(0x0f);
  for (std::size_t b = 0; b < nb; ++b) {
    const block_q4_K_x16& x = p[b];
    kp::kpanel_block& o = dst[b];
    const k4_scales ks = unpack_scales(x);
    for (int u = 0; u < 8; ++u) {
      for (int g = 0; g < 4; ++g) {
        const __m512i codes = _mm512_load_si512(x.qs[u][g]);
        o.codes[8 * u + g] = _mm512_and_si512(codes, lo_mask);
        o.codes[8 * u + 4 + g] = _mm512_and_si512(_mm512_srli_epi16(codes, 4), lo_mask);
      }
      o.scale[2 * u] = o.scale[2 * u + 1] = _mm512_shuffle_epi8(ks.sc[u / 4], byte_ctrl(u % 4));
      // coef[u] lane r: the int16 pair (m_u, m_u), the min of both 16-value halves
      o.coef[u] = _mm512_shuffle_epi8(ks.mn[u / 4], twin_ctrl(u % 4));
    }
    o.d = _mm512_cvtph_ps(_mm256_load_si256(reinterpret_cast<const __m256i*>(x.d)));
    o.dmin = _mm512_cvtph_ps(_mm256_load_si256(reinterpret_cast<const __m256i*>(x.dmin)));
  }
}

/// As above, for q6_K: the same blocks as pack_kpanel<block_q6_K>.
inline void pack_kpanel(const block_q6_K_x16* p, std::size_t nb, kp::kpanel_block* dst) noexcept {
  for (std::size_t b = 0; b < nb; ++b) {
    const block_q6_K_x16& x = p[b];
    kp::kpanel_block& o = dst[b];
    for (int u = 0; u < 8; ++u) {
      const __m512i qh0 = _mm512_load_si512(x.unit[u].qh[0]), qh1 = _mm512_load_si512(x.unit[u].qh[1]);
      for (int g = 0; g < 4; ++g) q6_codes(_mm512_load_si512(x.unit[u].ql[g]), qh0, qh1, g, o.codes[8 * u + g], o.codes[8 * u + 4 + g]);
      const __m128i s0 = _mm_load_si128(reinterpret_cast<const __m128i*>(x.scales[u][0]));
      const __m128i s1 = _mm_load_si128(reinterpret_cast<const __m128i*>(x.scales[u][1]));
      o.scale[2 * u] = _mm512_cvtepi8_epi32(s0);
      o.scale[2 * u + 1] = _mm512_cvtepi8_epi32(s1);
      // lane r: the int16 pair (sc_2u, sc_2u+1), the scales of the unit's two halves
      const __m256i pairs = _mm256_inserti128_si256(_mm256_castsi128_si256(_mm_unpacklo_epi8(s0, s1)),
                                                    _mm_unpackhi_epi8(s0, s1), 1);
      o.coef[u] = _mm512_cvtepi8_epi16(pairs);
    }
    o.d = _mm512_cvtph_ps(_mm256_load_si256(reinterpret_cast<const __m256i*>(x.d)));
    o.dmin = _mm512_setzero_ps();
  }
}
#endif

}  // namespace detail::x16
#endif

}  // namespace kestrel::quant
KESTREL_INTRINSICS_END

#include "kestrel/quant/kquant_x16_avx2.hpp"
