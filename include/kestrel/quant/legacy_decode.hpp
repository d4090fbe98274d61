// kestrel/quant/legacy_decode.hpp: the legacy-format dots (q4_0, q4_1, q5_0,
// q5_1, q8_0 weights against q8_0 / q8_1 activations) for decode: one to
// decode_kernel_tokens tokens against a run of rows, streaming each row once
// (memory-bound: no 16-row transpose, which costs more than the row's bytes
// take to arrive when there is one token).
//
//   decode_acts<W> acts;  acts.prepare(a, nb);        // once per token per call (up to decode_kernel_tokens)
//   dot_rows_decode<W>(rows, row_bytes, n_rows, acts_ptrs, n_tokens, out, out_stride);
//   // out[t * out_stride + r] ~ ref::dot(row r, token t), within gamma_(nb + 8) T of exact
//
// ---- the AVX-512 VNNI kernel (also needs AVX512VL) ----
//
// A unit is 4 blocks (72 to 136 bytes of the row) and one int32 accumulator
// register: two zmm of codes, values 0-15 of block k in 128-bit lane k of the
// first, values 16-31 in the second. The unit's bytes are read as whole zmm
// "tables" (the nibble types: [0, 64) and the 8 to 32 bytes after; q8_0:
// [0, 64), [64, 128), [8, 72), [72, 136)), never past the unit, and the
// last, partial unit of a row by masked loads (zeros past the row: nothing
// is read past it). Everything is picked out of the tables by two-table
// permutes (vpermt2b with AVX512-VBMI, else vpermt2w: every field starts at
// an even offset): the qs bytes (q8_0: codes u = q ^ 0x80 = q + 128; the
// nibble types: low nibbles by an and, high ones by a GF2P8AFFINE shift with
// GFNI, else shift and and), the four f16 d (and m) spread over the lanes,
// and q5's qh, whose bits are added as 16 under byte masks (vpshufbitqmb with
// AVX512-BITALG, else vpshufb + vptestmb). No gathers, no inserts. The
// token's bytes are laid out once per call in the same order (decode_acts),
// so two vpdpbusd leave each block's sum over 4 int32 lanes; the accumulator
// starts at -o sum(q_a) in one lane per block, which removes the code offset
// o (8 q4_0, 16 q5_0, 128 q8_0, 0 the _1 types) exactly: lane sums stay below
// 2^20 (8 products of at most 255 * 128, and the start), exact in int32 and
// float. The scales d_w d_a are exact (two 11-bit significands). Per unit:
//   acc  = fma(float(lane sums), d_w d_a, acc)      (one accumulator per row and token)
//   accm = fma(m_w, s_a, accm)                      (the _1 types; m_w in lane 4 k, else 0)
// and at the end v = acc + accm, summed over its 16 lanes by a fixed tree
// (pairs i, i + 8; i, i + 4; i, i + 2; i, i + 1). q4_0 with one token and
// rows in fours (the wide plan) takes the four rows' 16 scales in one
// permute pair, one convert and one multiply by d_a, then one permute per
// row spreads them to its lanes: 9.5 vector operations a row and unit
// instead of 11 (the same products, so the same bits).
//
// Rows go in pairs, j beside half + j of the call's rows (two long
// sequential streams, each prefetched 256 bytes ahead; adjacent rows side by
// side read half as fast from DRAM), sharing the activation loads and the
// final sums; up to 2 tokens (registers), an odd last row and 3-4 tokens one
// row at a time. On Intel (row_streams::wide, cpu/streaming.hpp) one token
// takes rows in eights instead, j, q + j, .., 7q + j, each stream
// prefetched 1 KiB ahead (row_streams::far, for a model larger than the
// last-level cache in 2 MiB pages: also 3 KiB ahead into L2, the rows in
// turn). Every row runs the same operations, alone or paired, so its
// result does not depend on how the rows are split among threads.
//
// ---- rounding (tests/quant/test_legacy_tokens.cpp) ----
//
// Every lane partial p of a block satisfies |d_w d_a p| <= d_w d_a sum |q_w
// q_a| over the block, so with T = sum_b (|d_w d_a| sum_j |(q_w - o) q_a| +
// |m_w s_a|): each acc and accm lane adds at most ceil(nb / 4) terms, exact
// products each rounded once in its fma, then 1 addition of acc and accm and
// 4 levels of the 16-lane sum: every term passes at most ceil(nb / 4) + 5 <=
// nb + 5 roundings, |result - exact| <= gamma_(nb + 6) T, inside the
// gamma_(nb + 8) T that quant::dot and ref::dot are held to.
//
// Not bit-identical to quant::dot_tile (prefill's kernel, = ref::dot_fused):
// both are within the bounds above of the exact sum, so of each other.
#pragma once

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <cmath>
#include <cstring>
#include <type_traits>
#include <vector>

#include "kestrel/core/diagnostics.hpp"
#include "kestrel/cpu/streaming.hpp"
#include "kestrel/quant/legacy.hpp"
#include "kestrel/quant/legacy_format.hpp"
#include "kestrel/quant/legacy_tokens.hpp"
#include "kestrel/quant/ref/legacy.hpp"

#if defined(KESTREL_LEGACY_PANEL) && defined(__AVX512VL__)
#define KESTREL_LEGACY_DECODE 1
#elif defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#include <immintrin.h>
#define KESTREL_LEGACY_DECODE_AVX2 1
#endif

KESTREL_INTRINSICS_BEGIN  // GCC 12 (core/diagnostics.hpp)

namespace kestrel::quant {

/// The most tokens dot_rows_decode takes in one call (each weight unit
/// unpacked once for all of them).
inline constexpr std::size_t decode_kernel_tokens = 4;
/// Up to this many tokens cpu::quantized_linear takes the decode kernel; more
/// go to the tile kernel (legacy_tokens.hpp). Measured (kestrel-bench-kquant,
/// one thread, 2048 x 5632 and 5632 x 2048, GB/s of weights, a loaded
/// machine): at 1 token the decode kernel is 1.2-2.7x the tiles (q8_0
/// 1.2-2.1x); at 2 tokens it is faster in 8 of 10 (type, shape) pairs (0.8-2x);
/// at 4 tokens mixed (0.2-2.3x: the tiles' token groups reuse each unpacked
/// block, the decode kernel repeats per token 5 of its ops per unit).
inline constexpr std::size_t decode_max_tokens = 2;

#if defined(KESTREL_LEGACY_DECODE)
namespace detail::ld {

/// Blocks per unit (one int32 accumulator register, two zmm of codes: values
/// 0-15 of block k in 128-bit lane k of the first, values 16-31 in the second).
inline constexpr std::size_t unit_blocks = 4;
/// A unit's bytes in the row: 72 (q4_0), 80, 88, 96, 136 (q8_0).
template <class W> inline constexpr std::size_t unit_bytes = unit_blocks * sizeof(W);
template <class W> inline constexpr bool nibbles = !std::is_same_v<W, block_q8_0>;

struct act_none {};
struct alignas(64) act_offsets {
  float s[16];  // s_a of block k in lane 4 k, 0 elsewhere (the _1 types)
};
/// A unit's activation bytes in the weights' byte order, the integer
/// accumulator's start and the scales, one 64-byte vector each.
template <class W>
struct alignas(64) act_unit : std::conditional_t<has_offset_m<W>, act_offsets, act_none> {
  std::int8_t q[2][64];   // q_a: values 0-15 of block k at q[0] + 16 k, 16-31 at q[1] + 16 k
  std::int32_t init[16];  // -o sum q_a of block k in lane 4 k, 0 elsewhere
  float d[16];            // d_a of the lane's block
  float d4[16];           // d_a of block (lane % 4): four rows' scales side by side (q4_0, unit's rows4)
};

}  // namespace detail::ld
#endif

#if defined(KESTREL_LEGACY_DECODE_AVX2)
namespace detail::ld2 {

/// One activation block as the AVX2 kernel reads it: the 32 codes, d_a and
/// s_a as floats, and the integer sum's start -o sum(q_a) for the nibble
/// _0 types (their codes go in unsigned, offset o = 8 or 16), else 0.
/// d_a and the start are stored as whole vectors (8 copies of d_a; the
/// start in lane 0, zeros elsewhere) so that the kernel takes them as memory
/// operands of its multiply and add, one instruction each.
struct alignas(32) act_block {
  std::int8_t q[32];
  float d[8];
  std::int32_t init[8];
  float s;
};

}  // namespace detail::ld2

/// The _0 types (q4_0, q5_0, q8_0) take blocks two at a time: values 0-15
/// of blocks k and k + 1 side by side in one register (lanes 0 and 1),
/// values 16-31 in another, so one convert, one scale multiply and one FMA
/// serve two blocks (their int32 sums sit in lanes 0-3 and 4-7). One thread,
/// data in L2, q4_0 2 x 4 prefill tiles: 62 -> 80 GOP/s. The _1 types keep one
/// block per step (their m_w s_a chain). Two threads, the 110M shape's
/// layer matrices x 512 tokens, GOP/s: q4_0 105 -> 144, q8_0 106 -> 130,
/// q5_0 93 -> 108; kestrel-bench 110M pp512 (2 alternated rounds): q4_0
/// 595-596 -> 723, q8_0 595-596 -> 658-660 t/s.
template <class W>
inline constexpr bool pairs_avx2 =
    std::is_same_v<W, block_q4_0> || std::is_same_v<W, block_q5_0> || std::is_same_v<W, block_q8_0>;

/// Whether the AVX2 kernels' integer sum takes a start -o sum(q_a): the
/// nibble _0 types, whose codes go in unsigned (q8_0 moves signs instead,
/// the _1 types have no offset).
template <class W>
inline constexpr bool start_avx2 = std::is_same_v<W, block_q4_0> || std::is_same_v<W, block_q5_0>;

/// One token's activation blocks k and k + 1 laid out for the pair step:
/// lo = values 0-15 of k, then of k + 1; hi = values 16-31 likewise; d =
/// d_a of k in lanes 0-3, of k + 1 in 4-7; start = the integer start
/// (-o sum q_a for q4_0 / q5_0, else 0) of k in lane 0, of k + 1 in lane 4.
struct alignas(32) act_pair {
  std::int8_t lo[32], hi[32];
  float d[8];
  std::int32_t start[8];
};

/// The nb / 2 pairs of one token's nb activation blocks (an odd last block
/// is left to the one-block step).
template <class W>
inline void make_act_pairs(const activation_of_t<W>* a, act_pair* out, std::size_t nb) noexcept {
  for (std::size_t k = 0; k + 1 < nb; k += 2) {
    act_pair& p = out[k / 2];
    const auto &a0 = a[k], &a1 = a[k + 1];
    std::memcpy(p.lo, a0.qs, 16);
    std::memcpy(p.lo + 16, a1.qs, 16);
    std::memcpy(p.hi, a0.qs + 16, 16);
    std::memcpy(p.hi + 16, a1.qs + 16, 16);
    std::fill(p.d, p.d + 4, to_f32(a0.d));
    std::fill(p.d + 4, p.d + 8, to_f32(a1.d));
    std::fill(p.start, p.start + 8, 0);
    if constexpr (start_avx2<W>) {
      p.start[0] = block_start<W>(a0);
      p.start[4] = block_start<W>(a1);
    }
  }
}

#endif

/// One token's activations laid out for dot_rows_decode<W>.
template <class W>
struct decode_acts {
#if defined(KESTREL_LEGACY_DECODE)
  std::vector<detail::ld::act_unit<W>> units;
#elif defined(KESTREL_LEGACY_DECODE_AVX2)
  std::vector<detail::ld2::act_block> blocks;
  std::vector<act_pair> pairs;  // pairs_avx2<W>: blocks two at a time
#else
  const activation_of_t<W>* a = nullptr;
#endif
  std::size_t nb = 0;

  void prepare(const activation_of_t<W>* act, std::size_t n_blocks) {
    nb = n_blocks;
#if defined(KESTREL_LEGACY_DECODE)
    namespace ld = detail::ld;
    constexpr std::size_t G = ld::unit_blocks;
    const std::size_t nu = (nb + G - 1) / G;
    if (units.size() < nu) units.resize(nu);
    for (std::size_t j = 0; j < nu; ++j) {
      ld::act_unit<W>& u = units[j];
      std::memset(&u, 0, sizeof u);
      for (std::size_t k = 0; k < G && j * G + k < nb; ++k) {
        const auto& ab = act[j * G + k];
        std::memcpy(u.q[0] + 16 * k, ab.qs, 16);
        std::memcpy(u.q[1] + 16 * k, ab.qs + 16, 16);
        u.init[4 * k] = block_start<W>(ab);
        const float da = to_f32(ab.d);
        for (std::size_t l = 0; l < 4; ++l) u.d[4 * k + l] = u.d4[4 * l + k] = da;
        if constexpr (has_offset_m<W>) u.s[4 * k] = to_f32(ab.s);
      }
    }
#elif defined(KESTREL_LEGACY_DECODE_AVX2)
    if (blocks.size() < nb) blocks.resize(nb);
    // The one-block step reads blocks[k] for every k, or with pairs only
    // an odd last block.
    std::size_t first = 0;
    if constexpr (pairs_avx2<W>) {
      if (pairs.size() < nb / 2) pairs.resize(nb / 2);
      make_act_pairs<W>(act, pairs.data(), nb);
      first = nb / 2 * 2;
    }
    for (std::size_t b = first; b < nb; ++b) {
      detail::ld2::act_block& u = blocks[b];
      std::memset(&u, 0, sizeof u);
      std::memcpy(u.q, act[b].qs, 32);
      std::fill(u.d, u.d + 8, to_f32(act[b].d));
      if constexpr (has_offset_m<W>) u.s = to_f32(act[b].s);
      if constexpr (start_avx2<W>) u.init[0] = block_start<W>(act[b]);
    }
#else
    a = act;
#endif
  }
};

#if defined(KESTREL_LEGACY_DECODE)
namespace detail::ld {

/// The unit's bytes are read as zmm "tables" at fixed offsets: the nibble
/// types [0, 64) and the rest [64, unit_bytes) (8 to 32 bytes, zero-extended);
/// q8_0 [0, 64), [64, 128) (values 0-15 of each block, the scales) and
/// [8, 72), [72, 136) (values 16-31). Never past the unit.
template <class W> inline constexpr std::size_t n_tables = nibbles<W> ? 2 : 4;
inline constexpr std::size_t table_offset[4] = {0, 64, 8, 72};

/// Byte permutes (vpermt2b, AVX512-VBMI) where available, else the same
/// selections by words (vpermt2w): every field starts at an even offset.
#if defined(__AVX512VBMI__)
inline constexpr bool byte_permutes = true;
inline __m512i perm2(__m512i x, __m512i idx, __m512i y) noexcept { return _mm512_permutex2var_epi8(x, idx, y); }
/// perm2 with the words other than 0-15 and 16 + 4 k zeroed (dm of the _1 types).
inline __m512i perm2_dm(__m512i x, __m512i idx, __m512i y) noexcept {
  return _mm512_maskz_permutex2var_epi8(0x03030303ffffffffull, x, idx, y);
}
#else
inline constexpr bool byte_permutes = false;
inline __m512i perm2(__m512i x, __m512i idx, __m512i y) noexcept { return _mm512_permutex2var_epi16(x, idx, y); }
inline __m512i perm2_dm(__m512i x, __m512i idx, __m512i y) noexcept {
  return _mm512_maskz_permutex2var_epi16(0x1111ffffu, x, idx, y);
}
#endif
#if defined(__AVX512BITALG__)
inline constexpr bool bit_shuffles = true;  // q5's fifth-bit masks by vpshufbitqmb
#else
inline constexpr bool bit_shuffles = false;
#endif

/// A zmm constant.
struct alignas(64) vec_bytes {
  std::uint8_t b[64];
};
/// Permute indices into a table pair (bytes or words, as perm2 takes them)
/// and q5's selectors, as zmm constants (built at compile time):
///   0: nibbles: the qs of block k to 128-bit lane k; q8_0: values 0-15 of
///      block k to lane k (from the pair at 0);
///   1: q8_0: values 16-31 of block k to lane k (from the pair at 8);
///   2: f16 words 0-15: lane l's block's d; 16-31 (the _1 types): block k's
///      m at word 16 + 4 k;
///   3: q5: 128-bit lane k: block k's qh in every dword;
///   4, 5: q5: per byte of the low (high) nibbles' lane, the qh bit (bit
///      shuffles: 16 v + j) or the byte of qhv (vpshufb: 2 v + j / 8) it takes.
template <class W>
constexpr std::array<vec_bytes, 6> make_consts() noexcept {
  using L = lp::layout<W>;
  constexpr std::size_t S = sizeof(W), qh = L::qh >= 0 ? static_cast<std::size_t>(L::qh) : 0;
  std::array<vec_bytes, 6> c{};
  for (std::size_t i = 0; i < 64; ++i) {
    const std::size_t k = i / 16, w = i / 2;
    std::size_t off[4] = {k * S + L::qs + i % 16, nibbles<W> ? 0 : k * S + L::qs + 16 + i % 16 - 8,
                          (w < 16 ? (w / 4) * S : has_offset_m<W> ? (w - 16) / 4 * S + 2 : 0) + i % 2,
                          k * S + qh + i % 4};
    for (std::size_t v = 0; v < 4; ++v)
      if constexpr (byte_permutes) c[v].b[i] = static_cast<std::uint8_t>(off[v]);
      else c[v].b[i] = i % 2 == 0 ? static_cast<std::uint8_t>(off[v] / 2) : 0;  // little-endian words
    for (std::size_t v = 0; v < 2; ++v)
      c[4 + v].b[i] = static_cast<std::uint8_t>(bit_shuffles ? 16 * v + i % 16 : 2 * v + (i % 16) / 8);
  }
  return c;
}
template <class W> inline constexpr std::array<vec_bytes, 6> const_bytes = make_consts<W>();

/// q4_0's four-row scales (unit's rows4): word indices into two rows' first
/// tables (d of block k at byte 18 k, word 9 k), rows a and b to words 0-7
/// ([0]) or 8-15 ([1]) of a pair's permute; and, per row r of four, the
/// float lanes of its blocks' products (lane 4 k + i <- 4 r + k, i < 4).
struct alignas(64) rows4_consts {
  std::uint16_t pair[2][32];
  std::int32_t spread[4][16];
};
constexpr rows4_consts make_rows4() noexcept {
  rows4_consts c{};
  for (std::size_t h = 0; h < 2; ++h)
    for (std::size_t k = 0; k < 4; ++k) {
      c.pair[h][8 * h + k] = static_cast<std::uint16_t>(9 * k);           // row a (first source)
      c.pair[h][8 * h + 4 + k] = static_cast<std::uint16_t>(32 + 9 * k);  // row b (second source)
    }
  for (std::size_t r = 0; r < 4; ++r)
    for (std::size_t l = 0; l < 16; ++l) c.spread[r][l] = static_cast<std::int32_t>(4 * r + l / 4);
  return c;
}
inline constexpr rows4_consts rows4_bytes = make_rows4();
static_assert(sizeof(block_q4_0) == 18 && offsetof(block_q4_0, d) == 0,
              "rows4_bytes: q4_0's d at byte 18 k of a unit (word 9 k)");

template <class W>
struct consts {
  __m512i qs[2], dm, qh, sel[2];  // const_bytes<W> 0-5
  __m512i d4_pair[2], spread4[4];  // rows4_bytes (q4_0's four-row scales)
  static consts make() noexcept {
    auto ld = [](std::size_t v) { return _mm512_load_si512(const_bytes<W>[v].b); };
    consts c{{ld(0), ld(1)}, ld(2), ld(3), {ld(4), ld(5)}, {}, {}};
    for (std::size_t h = 0; h < 2; ++h) c.d4_pair[h] = _mm512_load_si512(rows4_bytes.pair[h]);
    for (std::size_t r = 0; r < 4; ++r) c.spread4[r] = _mm512_load_si512(rows4_bytes.spread[r]);
    return c;
  }
};

/// The tables of the unit at p (a whole one).
template <class W>
inline void load_tables(const std::byte* p, __m512i* t) noexcept {
  if constexpr (nibbles<W>) {
    t[0] = _mm512_loadu_si512(p);
    constexpr std::size_t n = unit_bytes<W> - 64;
    p += 64;
    if constexpr (n == 8) t[1] = _mm512_castsi128_si512(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p)));
    else if constexpr (n == 16) t[1] = _mm512_castsi128_si512(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
    else if constexpr (n == 32) t[1] = _mm512_castsi256_si512(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
    else t[1] = _mm512_castsi256_si512(_mm256_maskz_loadu_epi8((1u << n) - 1, p));
  } else {
    for (std::size_t i = 0; i < 4; ++i) t[i] = _mm512_loadu_si512(p + table_offset[i]);
  }
}
/// The same of a partial unit, the first n bytes at p: zeros after them
/// (masked loads: nothing past them is read).
template <class W>
inline void load_tables(const std::byte* p, std::size_t n, __m512i* t) noexcept {
  for (std::size_t i = 0; i < n_tables<W>; ++i) {
    const std::size_t o = table_offset[i], m = n > o ? std::min<std::size_t>(n - o, 64) : 0;
    t[i] = _mm512_maskz_loadu_epi8(m == 64 ? ~__mmask64(0) : (__mmask64(1) << m) - 1, p + o);
  }
}

/// One unit of R rows (tables t[r]) against NT tokens' units au[t].
template <class W, std::size_t NT, std::size_t R>
inline void unit(const __m512i (*tb)[n_tables<W>], const act_unit<W>* const* au, const consts<W>& c,
                 __m512 (*acc)[NT], __m512 (*accm)[NT]) noexcept {
  __m512i ai[NT], aq[NT][2];
  __m512 ad[NT];
  for (std::size_t t = 0; t < NT; ++t) {
    ai[t] = _mm512_load_si512(au[t]->init);
    aq[t][0] = _mm512_load_si512(au[t]->q[0]);
    aq[t][1] = _mm512_load_si512(au[t]->q[1]);
    ad[t] = _mm512_load_ps(au[t]->d);
  }
  // q4_0, one token, rows in fours (the wide plan's eights): the four rows'
  // scales times d_a, 16 products in one register, then spread to each
  // row's lanes, instead of a permute, a convert and a multiply per row.
  // The same products (exact either way: two 11-bit significands), so the
  // same bits.
  constexpr bool rows4 = std::is_same_v<W, block_q4_0> && NT == 1 && R % 4 == 0;
  __m512 dwad4[rows4 ? R / 4 : 1];
  if constexpr (rows4) {
    const __m512 ad4 = _mm512_load_ps(au[0]->d4);
    for (std::size_t g = 0; g < R / 4; ++g) {
      const __m256i lo =
          _mm512_castsi512_si256(_mm512_permutex2var_epi16(tb[4 * g][0], c.d4_pair[0], tb[4 * g + 1][0]));
      const __m256i hi =
          _mm512_castsi512_si256(_mm512_permutex2var_epi16(tb[4 * g + 2][0], c.d4_pair[1], tb[4 * g + 3][0]));
      dwad4[g] = _mm512_mul_ps(_mm512_cvtph_ps(_mm256_blend_epi32(lo, hi, 0xf0)), ad4);
    }
  }
  for (std::size_t r = 0; r < R; ++r) {
    const __m512i* x = tb[r];
    __m512i codes[2];
    if constexpr (!nibbles<W>) {
      const __m512i o = _mm512_set1_epi8(char(0x80));  // codes u = q ^ 0x80 = q + 128
      codes[0] = _mm512_xor_si512(perm2(x[0], c.qs[0], x[1]), o);
      codes[1] = _mm512_xor_si512(perm2(x[2], c.qs[1], x[3]), o);
    } else {
      const __m512i z = perm2(x[0], c.qs[0], x[1]);
      const __m512i m4 = _mm512_set1_epi8(0x0f);
      codes[0] = _mm512_and_si512(z, m4);
#if defined(__GFNI__)
      // z >> 4 per byte: result bit i (< 4) = bit i + 4 (matrix row byte 7 - i).
      codes[1] = _mm512_gf2p8affine_epi64_epi8(z, _mm512_set1_epi64(0x1020408000000000ll), 0);
#else
      codes[1] = _mm512_and_si512(_mm512_srli_epi16(z, 4), m4);
#endif
      if constexpr (lp::layout<W>::qh >= 0) {
        // qhv: 128-bit lane k holds block k's qh in every dword. Byte j of the
        // lane (value j, low nibbles; value 16 + j, high) needs bit j (16 +
        // j) of it: a byte mask, where 16 is added. By bit shuffles: that bit
        // of its qword; else byte j / 8 (2 + j / 8) by vpshufb, tested
        // against bit j % 8.
        const __m512i qhv = perm2(x[0], c.qh, x[1]);
        const __m512i b4 = _mm512_set1_epi8(0x10);
        for (std::size_t v = 0; v < 2; ++v) {
          __mmask64 k;
          if constexpr (bit_shuffles)
            k = _mm512_bitshuffle_epi64_mask(qhv, c.sel[v]);
          else
            k = _mm512_test_epi8_mask(_mm512_shuffle_epi8(qhv, c.sel[v]),
                                      _mm512_set1_epi64(static_cast<long long>(0x8040201008040201ull)));
          codes[v] = _mm512_mask_add_epi8(codes[v], k, codes[v], b4);
        }
      }
    }
    __m512 dw, mw;  // the row's d_w (and m_w) per lane; rows4 has its d_w d_a already
    if constexpr (!rows4) {
      __m512i dm;
      if constexpr (has_offset_m<W>)
        dm = perm2_dm(x[0], c.dm, x[1]);
      else
        dm = perm2(x[0], c.dm, x[1]);
      dw = _mm512_cvtph_ps(_mm512_castsi512_si256(dm));
      if constexpr (has_offset_m<W>) mw = _mm512_cvtph_ps(_mm512_extracti64x4_epi64(dm, 1));
    }
    for (std::size_t t = 0; t < NT; ++t) {
      __m512i s = _mm512_dpbusd_epi32(ai[t], codes[0], aq[t][0]);
      s = _mm512_dpbusd_epi32(s, codes[1], aq[t][1]);
      __m512 dwad;  // d_w d_a per lane
      if constexpr (rows4)
        dwad = _mm512_permutexvar_ps(c.spread4[r % 4], dwad4[r / 4]);
      else
        dwad = _mm512_mul_ps(dw, ad[t]);
      acc[r][t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s), dwad, acc[r][t]);
      if constexpr (has_offset_m<W>) accm[r][t] = _mm512_fmadd_ps(mw, _mm512_load_ps(au[t]->s), accm[r][t]);
    }
  }
}

/// The 16-lane sum of v, summed as pairs (i, i + 8), (i, i + 4), (i, i + 2),
/// (i, i + 1): the same tree as sum2, so a row's sum does not depend on
/// whether it is summed alone or beside another.
inline float sum1(__m512 v) noexcept {
  __m256 h = _mm256_add_ps(_mm512_castps512_ps256(v), _mm512_extractf32x8_ps(v, 1));
  __m128 q = _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
  q = _mm_add_ps(q, _mm_permute_ps(q, _MM_SHUFFLE(1, 0, 3, 2)));
  q = _mm_add_ps(q, _mm_permute_ps(q, _MM_SHUFFLE(2, 3, 0, 1)));
  return _mm_cvtss_f32(q);
}
/// The 16-lane sums of u and v, by sum1's tree.
inline void sum2(__m512 u, __m512 v, float* su, float* sv) noexcept {
  __m512 z = _mm512_add_ps(_mm512_shuffle_f32x4(u, v, _MM_SHUFFLE(1, 0, 1, 0)),
                           _mm512_shuffle_f32x4(u, v, _MM_SHUFFLE(3, 2, 3, 2)));  // [u_i + u_i+8 | v_i + v_i+8]
  z = _mm512_add_ps(z, _mm512_shuffle_f32x4(z, z, _MM_SHUFFLE(2, 3, 0, 1)));    // 128-bit lanes 0 and 2: i + (i + 4)
  z = _mm512_add_ps(z, _mm512_permute_ps(z, _MM_SHUFFLE(1, 0, 3, 2)));
  z = _mm512_add_ps(z, _mm512_permute_ps(z, _MM_SHUFFLE(2, 3, 0, 1)));
  *su = _mm512_cvtss_f32(z);
  *sv = _mm_cvtss_f32(_mm512_extractf32x4_ps(z, 2));
}

/// Software prefetch distance of the row streams. Measured on Zen 4 (one
/// thread, 2048 x 768 matrices, 56 MB of them cycled, medians of 12 runs):
/// 256 bytes +9-19% over the hardware prefetchers alone, 1024 less; 110M
/// q4_0 decode on 2 threads: +3-24% (3 runs). That is row_streams::pairs';
/// row_streams::wide (Intel, eight streams for one token) takes 1024: on the
/// Emerald Rapids host (bench/ab_decode.sh, TinyLlama q8_0, token time)
/// four streams 256 bytes ahead took 0.82x the time of two, and against
/// 1024 bytes ahead 512 took 1.08x, 768 1.02x, 512 plus a second prefetch
/// into L2 2 KiB ahead 1.04x (one run each, 8-9 alternated rounds).
/// row_streams::pairs_ahead (Zen 5) takes 2048: on the Zen 5 host
/// (bench/ab_decode.sh, token time against 256 bytes, median [quartiles]
/// over 33-839 rounds), 512 / 1024 / 2048 bytes: TinyLlama q8_0 0.88 /
/// 0.86 / 0.83 [0.77, 0.90], q4_0 1.10 / 1.02 / 0.95 [0.86, 1.04], 110M
/// q4_0 1.07 / 0.97 / 0.90 [0.83, 0.97]; a second run, 2048 / 4096 bytes:
/// TinyLlama q8_0 0.85 [0.81, 0.87] / 0.87, 110M q4_0 0.93 / 0.90.
/// What made 16-bit float rows in 2 MiB pages faster on the AMX Xeon
/// (row_streams::far, cpu/matvec.hpp) did not carry over: TinyLlama q8_0
/// read in place from a tmpfs in 2 MiB pages, token time against wide's
/// eight streams 1 KiB into L1, median of 52-53 rounds: one stream 3 / 6
/// KiB into L2 1.11 / 1.10, two streams 3 KiB into L2 1.09, four 1.04,
/// eight 1.03, eight 2 KiB into L1 1.01. far (the rows in 2 MiB pages of
/// a model larger than the last-level cache: cpu::block_row_streams) keeps
/// wide's eight streams 1 KiB into L1 but also asks for each line
/// l2_prefetch_ahead bytes ahead into L2, a row's tables loaded just before
/// its arithmetic (rows_decode). bench/ab_decode.sh on the family 6 model
/// 207 host (the same build with KESTREL_ROW_STREAMS=far against without;
/// token time, median [quartiles], the control listed twice): TinyLlama
/// q8_0 0.928 [0.917, 0.937] (58 rounds, control 1.001), q4_0 0.979 [0.961,
/// 0.991] (120 rounds, control 1.000), 110M q8_0 1.114 [1.102, 1.128] (547
/// rounds; its 120 MB stay partly in the L3, where the L2 prefetch only
/// adds traffic). A /tmp harness of the same products read TinyLlama
/// q8_0's kernel as wide 0.90 of a plain read of eight streams with that
/// prefetch (bench/README.md, kestrel-bench-walk); the kernel as wide with
/// the L2 prefetch but all eight rows' tables loaded first gained 1.00-1.04.
/// Two tokens walk rows in pairs (registers) and take the L2 prefetch too:
/// without it a 2-token call of TinyLlama q8_0 took 1.142 [1.122, 1.161]
/// of the time (bench/ab_decode.sh --prefill 2, 1496 rounds). One token in
/// pairs with it instead of eight streams: 1.015; one prefetch per line
/// (2.125 a q8_0 unit instead of 3): 0.999 (neither kept).
inline constexpr std::size_t l2_prefetch_ahead = 3072;
inline constexpr std::size_t prefetch_ahead(cpu::row_streams plan) noexcept {
  switch (plan) {
    case cpu::row_streams::wide:
    case cpu::row_streams::far: return 1024;
    case cpu::row_streams::pairs_ahead: return 2048;
    case cpu::row_streams::pairs: break;
  }
  return 256;
}

/// out[r][t * out_stride] for R rows row[r] against NT tokens, each row's
/// lines asked for `ahead` bytes before they are read into L1 and, with
/// L2, l2_prefetch_ahead bytes before into L2 (the far plan).
template <class W, std::size_t NT, std::size_t R, bool L2 = false>
inline void rows_decode(const std::byte* const* row, std::size_t nb, const act_unit<W>* const* tok, const consts<W>& c,
                        float* const* out, std::size_t out_stride, std::size_t ahead) noexcept {
  constexpr std::size_t G = unit_blocks, UB = unit_bytes<W>;
  __m512 acc[R][NT], accm[R][NT];
  for (std::size_t r = 0; r < R; ++r)
    for (std::size_t t = 0; t < NT; ++t) acc[r][t] = accm[r][t] = _mm512_setzero_ps();
  const std::size_t full = nb / G, rest = nb % G;
  const act_unit<W>* au[NT];
  __m512i tb[R][n_tables<W>];
  // Rows in groups of RG: each group's tables and prefetches, then its
  // unit. Without L2 one group of all R rows (every table loaded before any
  // arithmetic); with L2 the rows in turn (RG = 4 where unit shares four
  // rows' scales: q4_0, one token; else 1), each stream's lines also asked
  // for l2_prefetch_ahead bytes on into L2. A row's operations are unit's
  // either way, so the same bits.
  constexpr std::size_t RG = !L2 ? R : std::is_same_v<W, block_q4_0> && NT == 1 && R % 4 == 0 ? 4 : 1;
  for (std::size_t j = 0; j < full; ++j) {
    for (std::size_t t = 0; t < NT; ++t) au[t] = tok[t] + j;
    for (std::size_t g = 0; g < R; g += RG) {
      for (std::size_t r = g; r < g + RG; ++r) {
        load_tables<W>(row[r] + j * UB, tb[r]);
        // Each stream's lines `ahead` bytes on (never faults).
        for (std::size_t o = 0; o < UB; o += 64) {
          _mm_prefetch(reinterpret_cast<const char*>(row[r] + j * UB + ahead + o), _MM_HINT_T0);
          if constexpr (L2)
            _mm_prefetch(reinterpret_cast<const char*>(row[r] + j * UB + l2_prefetch_ahead + o), _MM_HINT_T1);
        }
      }
      unit<W, NT, RG>(tb + g, au, c, acc + g, accm + g);
    }
  }
  if (rest != 0) {
    // The last rest blocks; the bytes past them read as zeros (nothing is
    // read past the row), so the missing blocks' scales are 0, as are their
    // activations.
    for (std::size_t r = 0; r < R; ++r) load_tables<W>(row[r] + full * UB, rest * sizeof(W), tb[r]);
    for (std::size_t t = 0; t < NT; ++t) au[t] = tok[t] + full;
    unit<W, NT, R>(tb, au, c, acc, accm);
  }
  for (std::size_t t = 0; t < NT; ++t) {
    __m512 v[R];
    for (std::size_t r = 0; r < R; ++r) {
      v[r] = acc[r][t];
      if constexpr (has_offset_m<W>) v[r] = _mm512_add_ps(v[r], accm[r][t]);
    }
    if constexpr (R % 2 == 0) {
      for (std::size_t r = 0; r < R; r += 2) sum2(v[r], v[r + 1], out[r] + t * out_stride, out[r + 1] + t * out_stride);
    } else {
      static_assert(R == 1);
      out[0][t * out_stride] = sum1(v[0]);
    }
  }
}

}  // namespace detail::ld
#endif

#if defined(KESTREL_LEGACY_DECODE_AVX2)
namespace detail::ld2 {

// ---- the AVX2 kernel (no AVX-512 VNNI) ----
//
// One block of one row at a time, against one to four tokens: the codes
// (unsigned for the nibble types, signed q8_0 with its signs moved onto the
// activations, as quant::dot does), vpmaddubsw + vpmaddwd into 8 int32
// lanes, plus the start -o sum(q_a) in lane 0 for q4_0 / q5_0 (exact: the
// offset never enters the bytes, so no subtract and no sign moves), then
// one convert and one FMA by d_w d_a (exact: two 11-bit significands) into
// the float accumulator of the block's parity: even and odd blocks go to
// two registers so consecutive FMAs do not wait on each other (quant::dot's
// single chain waits 4-5 cycles per block, about half of what the block's
// bytes take to arrive). The _1 types add m_w s_a into two scalar chains
// the same way. Rows go in pairs, j beside half + j (two long streams,
// as the AVX-512 kernel), sharing each activation load; every (row, token)
// runs the same operations alone or paired, so its result does not depend
// on the split. At the end v = hsum(acc_even + acc_odd) + (m_even + m_odd).
// The _0 types (pairs_avx2) take two blocks per step instead, in the
// layout of act_pair (one convert, scale multiply and FMA for both), pairs
// alternating between the two chains, an odd last block alone. Harness
// (the 110M shape's layer matrices, 2 threads, GB/s q4_0 / q8_0): from DRAM
// 18.8 / 26 -> 22.3 / 27.8, from L3 21.6 / 42 -> 27 / 47.6.
//
// Rounding: each lane of an accumulator adds at most ceil(nb / 2) terms,
// each an exact product rounded once in its FMA; then the parity sum, the
// 3 levels of hsum and the m terms: at most ceil(nb / 2) + 5 <= nb + 5
// roundings per term, within the gamma_(nb + 6) T of the header.

/// Codes of blocks b0 and b1 in the pair layout: lo = values 0-15 of b0,
/// then of b1; hi = values 16-31 likewise (unsigned for the nibble types,
/// signed for q8_0).
template <class W>
inline void pair_codes(const W& b0, const W& b1, __m256i& lo, __m256i& hi) noexcept {
  auto load2 = [](const void* p0, const void* p1) {
    return _mm256_inserti128_si256(_mm256_castsi128_si256(_mm_loadu_si128(static_cast<const __m128i*>(p0))),
                                   _mm_loadu_si128(static_cast<const __m128i*>(p1)), 1);
  };
  if constexpr (std::is_same_v<W, block_q8_0>) {
    lo = load2(b0.qs, b1.qs);
    hi = load2(b0.qs + 16, b1.qs + 16);
  } else {
    const __m256i q = load2(b0.qs, b1.qs), m4 = _mm256_set1_epi8(0x0f);
    lo = _mm256_and_si256(q, m4);
    hi = _mm256_and_si256(_mm256_srli_epi16(q, 4), m4);
    if constexpr (std::is_same_v<W, block_q5_0>) {
      const __m256i f0 = detail::avx2::fifth_bits(b0.qh), f1 = detail::avx2::fifth_bits(b1.qh);
      lo = _mm256_or_si256(lo, _mm256_permute2x128_si256(f0, f1, 0x20));
      hi = _mm256_or_si256(hi, _mm256_permute2x128_si256(f0, f1, 0x31));
    }
  }
}

/// The int32 sums of a pair step: blocks k and k + 1 of one row (codes wl,
/// wh from pair_codes) against one token's pair x (values al, ah loaded
/// from x.lo, x.hi), block k's in lanes 0-3 and k + 1's in lanes 4-7,
/// starts included (exact).
template <class W>
inline __m256i pair_sum(__m256i wl, __m256i wh, __m256i al, __m256i ah, const act_pair& x) noexcept {
  __m256i pl, ph;
  if constexpr (std::is_same_v<W, block_q8_0>) {
    pl = _mm256_maddubs_epi16(_mm256_sign_epi8(wl, wl), _mm256_sign_epi8(al, wl));
    ph = _mm256_maddubs_epi16(_mm256_sign_epi8(wh, wh), _mm256_sign_epi8(ah, wh));
  } else {
    pl = _mm256_maddubs_epi16(wl, al);
    ph = _mm256_maddubs_epi16(wh, ah);
  }
  const __m256i ones = _mm256_set1_epi16(1);
  __m256i s;
  if constexpr (std::is_same_v<W, block_q8_0>)
    s = _mm256_add_epi32(_mm256_madd_epi16(pl, ones), _mm256_madd_epi16(ph, ones));
  else  // codes <= 31, |q_a| <= 127: |pl + ph| <= 4 * 31 * 127 = 15748, an int16
    s = _mm256_madd_epi16(_mm256_add_epi16(pl, ph), ones);
  if constexpr (start_avx2<W>)
    return _mm256_add_epi32(s, _mm256_load_si256(reinterpret_cast<const __m256i*>(x.start)));
  else
    return s;
}

/// d_w of b0 in lanes 0-3, of b1 in lanes 4-7 (exact).
template <class W>
inline __m256 pair_scales(const W& b0, const W& b1) noexcept {
  const __m128 d0 = _mm_cvtph_ps(_mm_set1_epi16(static_cast<short>(b0.d.bits)));
  const __m128 d1 = _mm_cvtph_ps(_mm_set1_epi16(static_cast<short>(b1.d.bits)));
  return _mm256_insertf128_ps(_mm256_castps128_ps256(d0), d1, 1);
}

/// A block's codes: quant::dot's weight bytes (detail::avx2::weights), but
/// for q4_0 / q5_0 without the offset subtract (start_avx2 removes it).
template <class W>
inline __m256i codes(const W& b) noexcept {
  namespace a2 = detail::avx2;
  if constexpr (std::is_same_v<W, block_q4_0>)
    return a2::nibbles(b.qs);
  else if constexpr (std::is_same_v<W, block_q5_0>)
    return _mm256_or_si256(a2::nibbles(b.qs), a2::fifth_bits(b.qh));
  else
    return a2::weights(b);
}

/// An f16 in all 8 lanes as float (vpbroadcastw + vcvtph2ps; exact).
inline __m256 broadcast_f16(f16 h) noexcept { return _mm256_cvtph_ps(_mm_set1_epi16(static_cast<short>(h.bits))); }

/// The block's integer sum of code x q_a (q8_0: of value x q_a) in 8 int32
/// lanes, plus start (the start in lane 0, zeros elsewhere) where
/// start_avx2<W>; start is not read otherwise.
template <class W>
inline __m256i block_sum(__m256i w, __m256i qa, __m256i start) noexcept {
  if constexpr (std::is_same_v<W, block_q8_0>) {
    return detail::avx2::dot_s8s8(w, qa);
  } else {
    const __m256i s = detail::avx2::dot_u8s8(w, qa);
    if constexpr (start_avx2<W>)
      return _mm256_add_epi32(s, start);
    else
      return s;
  }
}

/// Software prefetch distance of the row streams, bytes, non-temporal.
/// Measured on Zen 2 with the T0 hint (2 threads, the 110M shape's layer
/// matrices, 48 MB of q4_0 / 83 MB of q8_0 streamed from DRAM, GB/s of
/// weights): none 15.0 / 18.0, 1 KiB 17.8 / 22.9, 2 KiB 17.2 / 22.8, 4 KiB
/// 17.3 / 22.6; quant::dot per row 10.9 / 14.8. Then (kestrel-bench tg64,
/// q8_0, 2 threads, 2 alternated rounds, t/s) T0 1 KiB / NTA 1 KiB / NTA
/// 576 bytes: TinyLlama 25.4-25.5 / 26.4-26.7 / 26.8, 110M 220-227 /
/// 229-234 / 229-244, as the x16 kernels found (kquant_x16_avx2.hpp).
inline constexpr std::size_t prefetch_bytes = 576;

/// R rows (1 or 2) against NT tokens; out[r][t * out_stride].
template <class W, std::size_t NT, std::size_t R>
inline void rows_decode(const std::byte* const* rp, std::size_t nb, const act_block* const* tok,
                        const act_pair* const* tp, float* const* out, std::size_t out_stride) noexcept {
  using detail::avx2::h2f;
  constexpr bool has_m = has_offset_m<W>;
  __m256 acc[R][NT][2];
  float om[R][NT][2];
  for (std::size_t r = 0; r < R; ++r)
    for (std::size_t t = 0; t < NT; ++t)
      for (std::size_t p = 0; p < 2; ++p) {
        acc[r][t][p] = _mm256_setzero_ps();
        om[r][t][p] = 0.0f;
      }
  auto step = [&](std::size_t k, std::size_t p) {
    __m256i wv[R];
    __m256 dw[R];
    float mw[R];
    for (std::size_t r = 0; r < R; ++r) {
      const W& b = reinterpret_cast<const W*>(rp[r])[k];
      wv[r] = codes(b);
      dw[r] = broadcast_f16(b.d);
      if constexpr (has_m) mw[r] = h2f(b.m);
    }
    for (std::size_t t = 0; t < NT; ++t) {
      const act_block& a = tok[t][k];
      const __m256i qa = _mm256_load_si256(reinterpret_cast<const __m256i*>(a.q));
      for (std::size_t r = 0; r < R; ++r) {
        const __m256 f =
            _mm256_cvtepi32_ps(block_sum<W>(wv[r], qa, _mm256_load_si256(reinterpret_cast<const __m256i*>(a.init))));
        acc[r][t][p] = _mm256_fmadd_ps(_mm256_mul_ps(dw[r], _mm256_load_ps(a.d)), f, acc[r][t][p]);
        if constexpr (has_m) om[r][t][p] = std::fma(mw[r], a.s, om[r][t][p]);
      }
    }
  };
  std::size_t k = 0;
  if constexpr (pairs_avx2<W>) {
    // Two blocks per step (act_pair), pairs alternating between the chains.
    for (std::size_t j = 0; k + 2 <= nb; k += 2, ++j) {
      const W* b[R];
      __m256i wl[R], wh[R];
      __m256 dw[R];
      for (std::size_t r = 0; r < R; ++r) {
        _mm_prefetch(reinterpret_cast<const char*>(rp[r] + k * sizeof(W) + prefetch_bytes), _MM_HINT_NTA);
        b[r] = reinterpret_cast<const W*>(rp[r]) + k;
        pair_codes(b[r][0], b[r][1], wl[r], wh[r]);
        dw[r] = pair_scales(b[r][0], b[r][1]);
      }
      for (std::size_t t = 0; t < NT; ++t) {
        const act_pair& x = tp[t][j];
        const __m256i al = _mm256_load_si256(reinterpret_cast<const __m256i*>(x.lo));
        const __m256i ah = _mm256_load_si256(reinterpret_cast<const __m256i*>(x.hi));
        for (std::size_t r = 0; r < R; ++r) {
          const __m256i sum = pair_sum<W>(wl[r], wh[r], al, ah, x);
          acc[r][t][j & 1] =
              _mm256_fmadd_ps(_mm256_mul_ps(dw[r], _mm256_load_ps(x.d)), _mm256_cvtepi32_ps(sum), acc[r][t][j & 1]);
        }
      }
    }
  } else {
    for (; k + 2 <= nb; k += 2) {
      for (std::size_t r = 0; r < R; ++r)
        _mm_prefetch(reinterpret_cast<const char*>(rp[r] + k * sizeof(W) + prefetch_bytes), _MM_HINT_NTA);
      step(k, 0);
      step(k + 1, 1);
    }
  }
  if (k < nb) step(k, 0);
  for (std::size_t r = 0; r < R; ++r)
    for (std::size_t t = 0; t < NT; ++t)
      out[r][t * out_stride] =
          detail::avx2::hsum(_mm256_add_ps(acc[r][t][0], acc[r][t][1])) + (om[r][t][0] + om[r][t][1]);
}

}  // namespace detail::ld2
#endif

#if defined(KESTREL_LEGACY_DECODE) || defined(KESTREL_LEGACY_DECODE_AVX2)
namespace detail {

/// The decode kernels' walk over rows: kern.template operator()<NT, R>(rp,
/// op) for R = 1, 2, 4 or 8 rows at rp[0..R) writing op[0..R), NT =
/// n_tokens (1..4). Up to 2 tokens (registers allow it), rows j and half + j
/// side by side: two long sequential streams, which the hardware prefetchers
/// follow (adjacent rows side by side make streams one row long: half the
/// speed from DRAM, measured); with `wide` and one token, rows j, q + j, ..,
/// (MaxR - 1) q + j instead (row_streams::wide, Intel, cpu/streaming.hpp:
/// eight streams with MaxR = 8; on the AMX Xeon, family 6 model 167,
/// bench/ab_decode.sh token time against four: TinyLlama q8_0 0.94 / 0.94,
/// q4_0 0.96, 110M q4_0 0.98, q8_0 0.97); the rows left over, and 3-4 tokens,
/// one row at a time. Kernels that take fewer rows (the AVX2 one) pass MaxR = 2.
template <std::size_t MaxR, class K>
inline void decode_row_pairs(const std::byte* rows, std::size_t row_bytes, std::size_t n_rows, std::size_t n_tokens,
                             float* out, bool wide, K&& kern) {
  // Rows j, q + j, .., (R - 1) q + j side by side for j < q = n_rows / R;
  // returns the rows done (R q).
  auto streams = [&]<std::size_t NT, std::size_t R>() {
    const std::size_t q = n_rows / R;
    for (std::size_t j = 0; j < q; ++j) {
      const std::byte* rp[R];
      float* op[R];
      for (std::size_t i = 0; i < R; ++i) {
        rp[i] = rows + (i * q + j) * row_bytes;
        op[i] = out + i * q + j;
      }
      kern.template operator()<NT, R>(rp, op);
    }
    return R * q;
  };
  auto run = [&]<std::size_t NT>() {
    std::size_t r = 0;
    if constexpr (NT == 1 && MaxR >= 4) {
      if (wide) r = streams.template operator()<NT, MaxR>();
    }
    if constexpr (NT <= 2) {
      if (r == 0) r = streams.template operator()<NT, 2>();
    }
    for (; r < n_rows; ++r) {
      const std::byte* const rp[1] = {rows + r * row_bytes};
      float* const op[1] = {out + r};
      kern.template operator()<NT, 1>(rp, op);
    }
  };
  switch (n_tokens) {
    case 1: run.template operator()<1>(); break;
    case 2: run.template operator()<2>(); break;
    case 3: run.template operator()<3>(); break;
    default: run.template operator()<4>(); break;
  }
}

}  // namespace detail
#endif

/// out[t * out_stride + r] for rows r < n_rows (row_bytes apart from rows)
/// against tokens t < n_tokens (1 <= n_tokens <= decode_kernel_tokens), each
/// within gamma_(nb + 6) T of the exact dot (header), the same bits whichever
/// rows are in the call and whatever the plan (AVX-512: rows walked as
/// `plan`, cpu/streaming.hpp); with AVX2 but not AVX-512 VNNI the AVX2
/// kernel (detail::ld2), without AVX2 quant::dot per (row, token).
template <class W>
inline void dot_rows_decode(const std::byte* rows, std::size_t row_bytes, std::size_t n_rows,
                            const decode_acts<W>* const* acts, std::size_t n_tokens, float* out,
                            std::size_t out_stride, cpu::row_streams plan = cpu::host_row_streams()) {
  if (n_tokens == 0 || n_rows == 0) return;
  const std::size_t nb = acts[0]->nb;
#if defined(KESTREL_LEGACY_DECODE)
  namespace ld = detail::ld;
  const ld::act_unit<W>* tok[decode_kernel_tokens];
  for (std::size_t t = 0; t < n_tokens; ++t) tok[t] = acts[t]->units.data();
  const ld::consts<W> c = ld::consts<W>::make();
  const std::size_t ahead = ld::prefetch_ahead(plan);
  auto walk = [&]<bool L2>() {
    detail::decode_row_pairs<8>(rows, row_bytes, n_rows, n_tokens, out, cpu::walks_wide(plan),
                                [&]<std::size_t NT, std::size_t R>(const std::byte* const* rp, float* const* op) {
                                  ld::rows_decode<W, NT, R, L2>(rp, nb, tok, c, op, out_stride, ahead);
                                });
  };
  if (plan == cpu::row_streams::far)
    walk.template operator()<true>();
  else
    walk.template operator()<false>();
#elif defined(KESTREL_LEGACY_DECODE_AVX2)
  namespace ld2 = detail::ld2;
  const ld2::act_block* tok[decode_kernel_tokens];
  const act_pair* tp[decode_kernel_tokens];
  for (std::size_t t = 0; t < n_tokens; ++t) {
    tok[t] = acts[t]->blocks.data();
    tp[t] = acts[t]->pairs.data();
  }
  (void)plan;  // two streams: measured on AMD only (Zen 2, Zen 3)
  detail::decode_row_pairs<2>(rows, row_bytes, n_rows, n_tokens, out, false,
                              [&]<std::size_t NT, std::size_t R>(const std::byte* const* rp, float* const* op) {
                                ld2::rows_decode<W, NT, R>(rp, nb, tok, tp, op, out_stride);
                              });
#else
  (void)plan;
  for (std::size_t r = 0; r < n_rows; ++r)
    for (std::size_t t = 0; t < n_tokens; ++t)
      out[t * out_stride + r] = dot(reinterpret_cast<const W*>(rows + r * row_bytes), acts[t]->a, nb * 32);
#endif
}

}  // namespace kestrel::quant
KESTREL_INTRINSICS_END
