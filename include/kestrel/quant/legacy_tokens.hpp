// kestrel/quant/legacy_tokens.hpp: the legacy-format dots (q4_0, q4_1, q5_0,
// q5_1, q8_0 weights against q8_0 / q8_1 activations) for a tile of rows x
// tokens, the kernel of quantized prefill and decode:
//
//   void dot_tile(const W* w, size_t row_blocks, size_t n_rows,
//                 const activation_of_t<W>* a, size_t n, size_t n_tokens,
//                 float* out, size_t out_stride);
//   // out[t * out_stride + r] = ref::dot_fused(w + r * row_blocks, a + t * n / 32, n)
//
// ---- the per-(row, token) arithmetic, fixed so any tiling gives the same bits ----
//
// For each block b in order, with isum_b the exact integer dot of the block's
// signed quants (q - offset for the _0 types, q for the _1 types):
//   y = fma(d_w d_a, float(isum_b), y)            (y starts at +0)
//   y = fma(m_w, s_a, y)                          (_1 types only)
// d_w d_a is exact in float (two 11-bit f16 significands, exponents within
// float's normal range), float(isum_b) is exact (|isum_b| < 2^21, below),
// and each fma rounds once. ref::dot_fused (ref/legacy.hpp) is this loop in
// scalar code; the AVX-512 kernel below runs it with one row per float lane
// and is therefore equal to it bit for bit, for any number of rows and tokens
// in a call: a token's outputs in a prefill equal its decode outputs.
// (ref::dot, the plain twin, rounds the product and the sum separately and is
// within a derived bound of both; tests/quant/test_legacy_tokens.cpp.)
//
// ---- the AVX-512 VNNI kernel ----
//
// A panel of 16 rows meets a group of up to 8 tokens. For each weight block
// the 16 rows' 32 codes are laid out as 8 zmm registers, register g holding
// the 4 codes 4g .. 4g + 3 of each row in its 32-bit lane (a 4-byte
// transpose, done with loads and in-lane shuffles straight from the blocks,
// or read from a panel packed once per call for prefill). For each token, 8 vpdpbusd with
// the token's 4 activation bytes broadcast ({1to16}) leave the 16 rows'
// complete block sums in 16 int32 lanes: 512 multiply-adds per 8 vpdpbusd,
// then one convert, one multiply and one or two FMAs for all 16 rows. No
// horizontal sums; the weight block is unpacked once per 8 tokens and the
// token's bytes are broadcast once per 16 rows.
//
// vpdpbusd multiplies unsigned bytes by signed ones, so weights are stored as
// unsigned codes u = value + o (o = 8 for q4_0, 16 for q5_0, 128 for q8_0 (u =
// q ^ 0x80), 0 for the _1 types, whose codes are already unsigned) and the
// offset comes back through the token's block sum: sum (u - o) a = sum u a -
// o sum a. The integer accumulator starts at -o sum(a), precomputed once per
// (token, block) (token_aux). Bounds, with |a| <= 128 (quantize_row gives
// |a| <= 127): each vpdpbusd adds 4 products u a with |u a| <= 255 * 128, the
// lane ends at |sum u a| <= 32 * 255 * 128 = 1044480 after 8 steps, plus
// |o sum a| <= 128 * 32 * 128 = 524288: every partial sum stays below 2^21,
// far from int32 overflow (vpdpbusd wraps, it does not saturate) and exactly
// representable in float.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <vector>

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VNNI__)
#include <immintrin.h>
#define KESTREL_LEGACY_PANEL 1
#endif

#include "kestrel/core/diagnostics.hpp"
#include "kestrel/quant/legacy_format.hpp"
#include "kestrel/quant/ref/legacy.hpp"
#include "kestrel/quant/token_groups.hpp"

KESTREL_INTRINSICS_BEGIN  // GCC 12 (core/diagnostics.hpp)

namespace kestrel::quant {

/// Code offset o: the kernel's unsigned code is value + o.
template <class W> inline constexpr int code_offset = 0;
template <> inline constexpr int code_offset<block_q4_0> = 8;
template <> inline constexpr int code_offset<block_q5_0> = 16;
template <> inline constexpr int code_offset<block_q8_0> = 128;
template <class W> inline constexpr bool has_offset_m = std::is_same_v<activation_of_t<W>, block_q8_1>;

/// What the kernel needs of one token's activation block besides its bytes:
/// d_a and s_a as floats, and the integer accumulator's start -o sum(q_a).
struct token_aux {
  float d = 0, s = 0;
  std::int32_t start = 0, unused_ = 0;
};

/// The integer accumulator's start for one activation block: -o sum(q_a),
/// which removes W's code offset o from the block's sum of u * q_a.
template <class W>
inline std::int32_t block_start(const activation_of_t<W>& ab) noexcept {
  int sum = 0;
  for (std::int8_t v : ab.qs) sum += v;
  return -code_offset<W> * sum;
}

/// aux[b] for the nb blocks of one token, for weight type W.
template <class W>
inline void make_token_aux(const activation_of_t<W>* a, token_aux* aux, std::size_t nb) noexcept {
  for (std::size_t b = 0; b < nb; ++b) {
    aux[b].d = to_f32(a[b].d);
    if constexpr (has_offset_m<W>) aux[b].s = to_f32(a[b].s);
    aux[b].start = block_start<W>(a[b]);
  }
}

#if defined(KESTREL_LEGACY_PANEL)
namespace detail::lp {

inline constexpr std::size_t panel_rows = 16;   // one row per int32 / float lane of a zmm
inline constexpr std::size_t token_group = 8;   // tokens per weight-block unpacking

/// One weight block of a 16-row panel, unpacked: codes[g] lane r = codes 4g ..
/// 4g + 3 of row r; d, m lane r = row r's scale and offset.
struct alignas(64) panel_block {
  __m512i codes[8];
  __m512 d, m;
};

/// Byte offsets of the fields inside each block type.
template <class W> struct layout;
template <> struct layout<block_q4_0> { static constexpr int qs = 2, qh = -1; };
template <> struct layout<block_q4_1> { static constexpr int qs = 4, qh = -1; };
template <> struct layout<block_q5_0> { static constexpr int qs = 6, qh = 2; };
template <> struct layout<block_q5_1> { static constexpr int qs = 8, qh = 4; };
template <> struct layout<block_q8_0> { static constexpr int qs = 2, qh = -1; };

/// Where a panel's 16 rows are: row r at base + roff[r] (rows past the
/// matrix repeat its last row, whose lanes `valid` masks off), and the same
/// offsets as int32 lanes for the gathers.
struct panel_rows_at {
  const std::byte* base;
  std::size_t roff[16];
  __m512i vidx;
  __mmask16 valid;
};

/// out[i] lane r = dword i of the 16 bytes at p + roff[r], i < 4: 16
/// unaligned 128-bit loads, 4 rows per register (128-bit lane k of z[j]
/// holds row 4k + j), then the 4 x 4 dword transpose inside every 128-bit
/// lane with unpack{lo,hi}_epi32 / _epi64 (8 in-lane shuffles for 16 rows:
/// cheaper than dword gathers, which took about 3x longer per block here).
inline void transpose_rows4(const std::byte* p, const std::size_t* roff, __m512i* out) noexcept {
  __m512i z[4];
  auto ld = [&](int r) { return _mm_loadu_si128(reinterpret_cast<const __m128i*>(p + roff[r])); };
  for (int j = 0; j < 4; ++j) {
    __m512i v = _mm512_castsi128_si512(ld(j));
    v = _mm512_inserti32x4(v, ld(4 + j), 1);
    v = _mm512_inserti32x4(v, ld(8 + j), 2);
    z[j] = _mm512_inserti32x4(v, ld(12 + j), 3);
  }
  const __m512i t0 = _mm512_unpacklo_epi32(z[0], z[1]), t1 = _mm512_unpackhi_epi32(z[0], z[1]);
  const __m512i t2 = _mm512_unpacklo_epi32(z[2], z[3]), t3 = _mm512_unpackhi_epi32(z[2], z[3]);
  out[0] = _mm512_unpacklo_epi64(t0, t2);
  out[1] = _mm512_unpackhi_epi64(t0, t2);
  out[2] = _mm512_unpacklo_epi64(t1, t3);
  out[3] = _mm512_unpackhi_epi64(t1, t3);
}

/// Unpacks block b of a panel (at byte offset boff of every row): codes by
/// loads and in-register transposes, the f16 scales (and q5's fifth bits)
/// by one 32-bit gather each; lanes outside `valid` hold scale 0.
template <class W>
inline void gather_block(const panel_rows_at& at, std::size_t boff, panel_block& pb) noexcept {
  const std::byte* p = at.base + boff;
  auto gather = [&](int off) { return _mm512_mask_i32gather_epi32(_mm512_setzero_si512(), at.valid, at.vidx, p + off, 1); };
  const __m512i head = gather(0);  // d in the low 16 bits; for the _1 types m in the high 16
  pb.d = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(head));
  pb.m = has_offset_m<W> ? _mm512_cvtph_ps(_mm512_cvtepi32_epi16(_mm512_srli_epi32(head, 16))) : _mm512_setzero_ps();
  if constexpr (std::is_same_v<W, block_q8_0>) {
    transpose_rows4(p + layout<W>::qs, at.roff, pb.codes);
    transpose_rows4(p + layout<W>::qs + 16, at.roff, pb.codes + 4);
    for (int g = 0; g < 8; ++g) pb.codes[g] = _mm512_xor_si512(pb.codes[g], _mm512_set1_epi8(char(0x80)));
  } else {
    const __m512i lo4 = _mm512_set1_epi8(0x0f);
    __m512i x[4];  // x[i]: bytes 4i .. 4i+3 of qs: values 4i.. in the low nibbles, 16+4i.. in the high
    transpose_rows4(p + layout<W>::qs, at.roff, x);
    for (int i = 0; i < 4; ++i) {
      pb.codes[i] = _mm512_and_si512(x[i], lo4);
      pb.codes[i + 4] = _mm512_and_si512(_mm512_srli_epi32(x[i], 4), lo4);
    }
    if constexpr (layout<W>::qh >= 0) {
      // Fifth bit of value j is bit j of qh. For group g, the 4 bits t =
      // (qh >> 4g) & 15 go to bit 4 of bytes 0..3: t * 0x00204081 places
      // copies of t at bits 0, 7, 14, 21 (no overlap, so no carries), whose
      // bits 0, 8, 16, 24 are t's bits 0..3.
      const __m512i qh = gather(layout<W>::qh);
      for (int g = 0; g < 8; ++g) {
        const __m512i t = _mm512_and_si512(_mm512_srli_epi32(qh, 4 * g), _mm512_set1_epi32(15));
        const __m512i spread = _mm512_and_si512(_mm512_mullo_epi32(t, _mm512_set1_epi32(0x00204081)),
                                                _mm512_set1_epi32(0x01010101));
        pb.codes[g] = _mm512_or_si512(pb.codes[g], _mm512_slli_epi32(spread, 4));
      }
    }
  }
}

/// acc[t] (lane r) = the fused loop over blocks [0, nb) for row r and token t
/// < NT; src(b) gives block b's panel_block. Each token's arithmetic is the
/// same instruction sequence whatever NT is.
template <class W, std::size_t NT, class Src>
inline void panel_tokens(Src&& src, const activation_of_t<W>* a, const token_aux* aux, std::size_t nb,
                         std::size_t stride, __m512* acc) noexcept {
  for (std::size_t t = 0; t < NT; ++t) acc[t] = _mm512_setzero_ps();
  for (std::size_t b = 0; b < nb; ++b) {
    const panel_block& pb = src(b);
    __m512i c[8];
    for (int g = 0; g < 8; ++g) c[g] = pb.codes[g];
    const __m512 dw = pb.d;
    for (std::size_t t = 0; t < NT; ++t) {
      const auto& ab = a[t * stride + b];
      const token_aux& x = aux[t * stride + b];
      __m512i s = _mm512_set1_epi32(x.start);
      for (int g = 0; g < 8; ++g)
        s = dpbusd_bcast(s, c[g], ab.qs + 4 * g);
      acc[t] = _mm512_fmadd_ps(_mm512_mul_ps(dw, _mm512_set1_ps(x.d)), _mm512_cvtepi32_ps(s), acc[t]);
      if constexpr (has_offset_m<W>) acc[t] = _mm512_fmadd_ps(pb.m, _mm512_set1_ps(x.s), acc[t]);
    }
  }
}

/// Tokens [0, n_tokens) against one panel, in groups of 8 (then 4, 2, 1):
/// out[t * out_stride + r] for the rows in `valid`.
template <class W, class Src>
inline void panel_all_tokens(Src&& src, const activation_of_t<W>* a, const token_aux* aux, std::size_t nb,
                             std::size_t n_tokens, __mmask16 valid, float* out, std::size_t out_stride) noexcept {
  panel_token_groups<token_group>(n_tokens, valid, out, out_stride, [&]<std::size_t NT>(std::size_t t, __m512* acc) {
    panel_tokens<W, NT>(src, a + t * nb, aux + t * nb, nb, nb, acc);
  });
}

inline panel_rows_at rows_at(const std::byte* rows, std::size_t row_bytes, std::size_t n_rows) noexcept {
  panel_rows_at at;
  at.base = rows;
  alignas(64) std::int32_t off[16];
  for (std::size_t r = 0; r < 16; ++r) {
    at.roff[r] = std::min(r, n_rows - 1) * row_bytes;
    off[r] = static_cast<std::int32_t>(at.roff[r]);
  }
  at.vidx = _mm512_load_si512(off);
  at.valid = panel_row_mask(n_rows);
  return at;
}

/// Rows [r0, r0 + n_rows) (1 <= n_rows <= 16) of a matrix whose rows are
/// row_bytes apart against n_tokens tokens, unpacking each weight block once
/// per token group (decode and short prompts: no packing pass).
template <class W>
inline void panel_gathered(const std::byte* rows, std::size_t row_bytes, std::size_t n_rows,
                           const activation_of_t<W>* a, const token_aux* aux, std::size_t nb, std::size_t n_tokens,
                           float* out, std::size_t out_stride) noexcept {
  const panel_rows_at at = rows_at(rows, row_bytes, n_rows);
  panel_block pb;
  auto src = [&](std::size_t b) -> const panel_block& {
    gather_block<W>(at, b * sizeof(W), pb);
    return pb;
  };
  panel_all_tokens<W>(src, a, aux, nb, n_tokens, at.valid, out, out_stride);
}

/// Packs blocks [0, nb) of a panel (1 <= n_rows <= 16 rows) into dst[0, nb).
template <class W>
inline void pack_panel(const std::byte* rows, std::size_t row_bytes, std::size_t n_rows, std::size_t nb,
                       panel_block* dst) noexcept {
  const panel_rows_at at = rows_at(rows, row_bytes, n_rows);
  for (std::size_t b = 0; b < nb; ++b) gather_block<W>(at, b * sizeof(W), dst[b]);
}

/// A packed panel against n_tokens tokens.
template <class W>
inline void panel_packed(const panel_block* p, std::size_t n_rows, const activation_of_t<W>* a, const token_aux* aux,
                         std::size_t nb, std::size_t n_tokens, float* out, std::size_t out_stride) noexcept {
  auto src = [p](std::size_t b) -> const panel_block& { return p[b]; };
  panel_all_tokens<W>(src, a, aux, nb, n_tokens, panel_row_mask(n_rows), out, out_stride);
}

/// Two packed panels of the same rows of two matrices (prefill's gate and
/// up, pa and pb) against n_tokens tokens: out[t * out_stride + r] =
/// combine(a_tr, b_tr) (as __m512), a and b each panel_packed's result bit
/// for bit, formed in registers token group by token group, so neither
/// product is written (cpu::matmul_swiglu without AMX).
template <class W, class Combine>
inline void panel_packed_pair(const panel_block* pa, const panel_block* pb, std::size_t n_rows,
                              const activation_of_t<W>* a, const token_aux* aux, std::size_t nb, std::size_t n_tokens,
                              float* out, std::size_t out_stride, Combine&& combine) noexcept {
  auto src_a = [pa](std::size_t b) -> const panel_block& { return pa[b]; };
  auto src_b = [pb](std::size_t b) -> const panel_block& { return pb[b]; };
  panel_token_groups<token_group>(n_tokens, panel_row_mask(n_rows), out, out_stride,
                                  [&]<std::size_t NT>(std::size_t t, __m512* acc) {
                                    __m512 other[NT];
                                    panel_tokens<W, NT>(src_a, a + t * nb, aux + t * nb, nb, nb, acc);
                                    panel_tokens<W, NT>(src_b, a + t * nb, aux + t * nb, nb, nb, other);
                                    for (std::size_t i = 0; i < NT; ++i) acc[i] = combine(acc[i], other[i]);
                                  });
}

}  // namespace detail::lp
#endif

/// out[t * out_stride + r] = ref::dot_fused(w + r * row_blocks, a + t * n / 32, n)
/// for r < n_rows, t < n_tokens, bit for bit (n a multiple of 32; rows
/// row_blocks blocks apart). AVX-512 VNNI: panels of 16 rows, groups of 8
/// tokens, weight blocks unpacked once per group; otherwise the scalar loop.
template <class W>
inline void dot_tile(const W* w, std::size_t row_blocks, std::size_t n_rows, const activation_of_t<W>* a,
                     std::size_t n, std::size_t n_tokens, float* out, std::size_t out_stride) {
  const std::size_t nb = detail::legacy_blocks(n, "dot_tile");
#if defined(KESTREL_LEGACY_PANEL)
  std::vector<token_aux> aux(n_tokens * nb);
  for (std::size_t t = 0; t < n_tokens; ++t) make_token_aux<W>(a + t * nb, aux.data() + t * nb, nb);
  const auto* base = reinterpret_cast<const std::byte*>(w);
  for (std::size_t r = 0; r < n_rows; r += detail::lp::panel_rows)
    detail::lp::panel_gathered<W>(base + r * row_blocks * sizeof(W), row_blocks * sizeof(W),
                                  std::min(detail::lp::panel_rows, n_rows - r), a, aux.data(), nb, n_tokens, out + r,
                                  out_stride);
#else
  for (std::size_t t = 0; t < n_tokens; ++t)
    for (std::size_t r = 0; r < n_rows; ++r)
      out[t * out_stride + r] = ref::dot_fused(w + r * row_blocks, a + t * nb, n);
#endif
}

}  // namespace kestrel::quant
KESTREL_INTRINSICS_END
