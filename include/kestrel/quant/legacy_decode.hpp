// kestrel/quant/legacy_decode.hpp: the legacy-format dots (q4_0, q4_1, q5_0,
// q5_1, q8_0 weights against q8_0 / q8_1 activations) for decode: one to
// decode_kernel_tokens tokens against a run of rows, one row at a time,
// streaming each row once (memory-bound: no 16-row transpose, which costs
// more than the row's bytes take to arrive when there is one token).
//
//   decode_acts<W> acts;  acts.prepare(a, nb);        // once per token per call (up to decode_kernel_tokens)
//   dot_rows_decode<W>(rows, row_bytes, n_rows, acts_ptrs, n_tokens, out, out_stride);
//   // out[t * out_stride + r] ~ ref::dot(row r, token t), within gamma_(nb + 8) T of exact
//
// ---- the AVX-512 VNNI kernel ----
//
// q8_0: two weight blocks per zmm, [qs_b | qs_b+1] (codes u = q ^ 0x80 =
// q + 128). The nibble types: four blocks per unit of two zmm, the low
// nibbles (values 0..15) of blocks b .. b+3 in the 4 128-bit lanes of one,
// the high nibbles (16..31) in the other; for q5 the fifth bits are added as
// 16 under byte masks (block k's qh broadcast to 128-bit lane k, each byte
// picking its bit by vpshufb + vptestmb). The token's bytes
// are laid out once per call in the same order (decode_acts), so one
// vpdpbusd per zmm leaves each block's sum over 8 (q8_0) or 4 int32 lanes;
// the accumulator starts at -o sum(q_a) in one lane per block, which removes
// the code offset o (8 q4_0, 16 q5_0, 128 q8_0, 0 the _1 types) exactly:
// lane sums stay below 2^21 (as in legacy_tokens.hpp), exact in int32 and
// float. Per 16 blocks, one 32-bit gather fetches every block's f16 d (and
// m) and the scales d_w d_a (exact: two 11-bit significands) are formed for
// all 16; each unit's lanes take theirs by one vpermps. Per lane:
//   acc = fma(float(lane sum), d_w d_a, acc)        (two alternating accumulators)
// and for the _1 types, per lane (block) of a 16-block chunk,
//   accm = fma(m_w, s_a, accm).
// At the end the accumulators are added and the 16 lanes summed.
//
// ---- rounding (tests/quant/test_legacy_tokens.cpp) ----
//
// Every lane partial p of a block satisfies |d_w d_a p| <= d_w d_a sum |q_w
// q_a| over the block, so with T = sum_b (|d_w d_a| sum_j |(q_w - o) q_a| +
// |m_w s_a|): each accumulator lane adds at most ceil(nb / 4) terms (one
// rounding each), the accm lanes ceil(nb / 16), then 1 addition of the two
// accumulators, 1 of accm and 4 levels of the 16-lane sum: every term passes
// at most nb + 6 roundings, |result - exact| <= gamma_(nb + 6) T, inside the
// gamma_(nb + 8) T that quant::dot and ref::dot are held to.
//
// Not bit-identical to quant::dot_tile (prefill's kernel, = ref::dot_fused):
// both are within the bounds above of the exact sum, so of each other.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <vector>

#include "kestrel/quant/legacy.hpp"
#include "kestrel/quant/legacy_format.hpp"
#include "kestrel/quant/legacy_tokens.hpp"
#include "kestrel/quant/ref/legacy.hpp"

#if defined(KESTREL_LEGACY_PANEL)
#define KESTREL_LEGACY_DECODE 1
#endif

namespace kestrel::quant {

/// The most tokens dot_rows_decode takes in one call (each weight pair
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

inline constexpr std::size_t chunk_blocks = 16;  // blocks per scale gather

template <class W> inline constexpr bool nibbles = !std::is_same_v<W, block_q8_0>;
/// Blocks per unit (one int32 accumulator register): 2 for q8_0 (one zmm of
/// codes), 4 for the nibble types (two zmm: low nibbles, then high ones).
template <class W> inline constexpr std::size_t unit_blocks = nibbles<W> ? 4 : 2;
template <class W> inline constexpr std::size_t unit_vecs = nibbles<W> ? 2 : 1;
/// int32 lanes per block in a unit's accumulator.
template <class W> inline constexpr std::size_t block_lanes = 16 / unit_blocks<W>;

/// A unit's activation bytes in the weights' byte order, and the integer
/// accumulator's start (-o sum q_a of each block, placed in one of its lanes).
template <class W>
struct alignas(64) act_unit {
  std::int8_t q[unit_vecs<W>][64];
  std::int32_t init[unit_blocks<W>];  // -o sum q_a of each block, broadcast to its first lane by init_lanes
};
/// vpbroadcasti32x{2,4} of init[] repeats it over the lanes; this mask keeps
/// lane k * block_lanes + k, which holds init[k] and lies in block k's lanes.
template <class W>
inline constexpr __mmask16 init_lanes = nibbles<W> ? __mmask16(0x8421) : __mmask16(0x0201);
/// 16 blocks of one token: its units, d_a and s_a per block (0 past the row).
template <class W>
struct alignas(64) act_chunk {
  act_unit<W> units[chunk_blocks / unit_blocks<W>];
  float d[chunk_blocks];
  float s[chunk_blocks];
};

}  // namespace detail::ld
#endif

/// One token's activations laid out for dot_rows_decode<W>.
template <class W>
struct decode_acts {
#if defined(KESTREL_LEGACY_DECODE)
  std::vector<detail::ld::act_chunk<W>> chunks;
#else
  const activation_of_t<W>* a = nullptr;
#endif
  std::size_t nb = 0;

  void prepare(const activation_of_t<W>* act, std::size_t n_blocks) {
    nb = n_blocks;
#if defined(KESTREL_LEGACY_DECODE)
    namespace ld = detail::ld;
    constexpr std::size_t G = ld::unit_blocks<W>;
    const std::size_t nch = (nb + ld::chunk_blocks - 1) / ld::chunk_blocks;
    if (chunks.size() < nch) chunks.resize(nch);
    for (std::size_t c = 0; c < nch; ++c) {
      ld::act_chunk<W>& ch = chunks[c];
      std::memset(&ch, 0, sizeof ch);
      for (std::size_t k = 0; k < ld::chunk_blocks && c * ld::chunk_blocks + k < nb; ++k) {
        const auto& ab = act[c * ld::chunk_blocks + k];
        ld::act_unit<W>& u = ch.units[k / G];
        const std::size_t h = k % G;
        if constexpr (ld::nibbles<W>) {
          std::memcpy(u.q[0] + 16 * h, ab.qs, 16);
          std::memcpy(u.q[1] + 16 * h, ab.qs + 16, 16);
        } else {
          std::memcpy(u.q[0] + 32 * h, ab.qs, 32);
        }
        int sum = 0;
        for (std::int8_t v : ab.qs) sum += v;
        u.init[h] = -code_offset<W> * sum;
        ch.d[k] = to_f32(ab.d);
        if constexpr (has_offset_m<W>) ch.s[k] = to_f32(ab.s);
      }
    }
#else
    a = act;
#endif
  }
};

#if defined(KESTREL_LEGACY_DECODE)
namespace detail::ld {

/// The codes of the n (1 <= n <= unit_blocks) blocks at p as unsigned bytes
/// in the unit's order; missing blocks read as zeros.
template <class W>
inline void unit_codes(const std::byte* p, std::size_t n, const __m512i* fifth, __m512i* codes) noexcept {
  using L = lp::layout<W>;
  if constexpr (!nibbles<W>) {
    const __m256i lo = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + L::qs));
    const __m256i hi = n > 1 ? _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + sizeof(W) + L::qs))
                             : _mm256_set1_epi8(char(0x80));
    codes[0] = _mm512_xor_si512(_mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1), _mm512_set1_epi8(char(0x80)));
  } else {
    auto ld = [&](std::size_t k) {
      return k < n ? _mm_loadu_si128(reinterpret_cast<const __m128i*>(p + k * sizeof(W) + L::qs)) : _mm_setzero_si128();
    };
    __m512i z = _mm512_castsi128_si512(ld(0));
    z = _mm512_inserti32x4(z, ld(1), 1);
    z = _mm512_inserti32x4(z, ld(2), 2);
    z = _mm512_inserti32x4(z, ld(3), 3);
    const __m512i m4 = _mm512_set1_epi8(0x0f);
    codes[0] = _mm512_and_si512(z, m4);
    codes[1] = _mm512_and_si512(_mm512_srli_epi16(z, 4), m4);
    if constexpr (L::qh >= 0) {
      // qhv: 128-bit lane k holds block k's qh in every dword. Byte j of the
      // lane (value j, low nibbles; value 16 + j, high) takes byte j / 8 (2 +
      // j / 8) of it and tests bit j % 8: a byte mask, where 16 is added.
      const __m512i lo_sel = _mm512_set4_epi32(0x01010101, 0x01010101, 0, 0);
      const __m512i hi_sel = _mm512_set4_epi32(0x03030303, 0x03030303, 0x02020202, 0x02020202);
      const __m512i bit = _mm512_set1_epi64(static_cast<long long>(0x8040201008040201ull));
      const __m512i b4 = _mm512_set1_epi8(0x10);
      const __m512i qhv = *fifth;
      codes[0] = _mm512_mask_add_epi8(codes[0], _mm512_test_epi8_mask(_mm512_shuffle_epi8(qhv, lo_sel), bit), codes[0], b4);
      codes[1] = _mm512_mask_add_epi8(codes[1], _mm512_test_epi8_mask(_mm512_shuffle_epi8(qhv, hi_sel), bit), codes[1], b4);
    }
  }
}

/// vpermps index giving unit j's lanes their block's scale out of 16.
template <class W>
inline __m512i unit_index(std::size_t j) noexcept {
  alignas(64) std::int32_t idx[16];
  for (std::size_t i = 0; i < 16; ++i) idx[i] = static_cast<std::int32_t>(unit_blocks<W> * j + i / block_lanes<W>);
  return _mm512_load_si512(idx);
}

/// out[t * out_stride] for one row against NT tokens.
template <class W, std::size_t NT>
inline void row_decode(const std::byte* row, std::size_t nb, const act_chunk<W>* const* tok, float* out,
                       std::size_t out_stride) noexcept {
  __m512 acc[NT][2], accm[NT];
  for (std::size_t t = 0; t < NT; ++t) acc[t][0] = acc[t][1] = accm[t] = _mm512_setzero_ps();
  const __m512i boff = _mm512_mullo_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
                                          _mm512_set1_epi32(static_cast<int>(sizeof(W))));
  constexpr std::size_t G = unit_blocks<W>, n_units = chunk_blocks / G;
  __m512i pidx[n_units];
  for (std::size_t j = 0; j < n_units; ++j) pidx[j] = unit_index<W>(j);
  for (std::size_t c = 0, b0 = 0; b0 < nb; ++c, b0 += chunk_blocks) {
    const std::size_t nbc = std::min(chunk_blocks, nb - b0);
    const __mmask16 valid = nbc == 16 ? __mmask16(0xffff) : __mmask16((1u << nbc) - 1);
    const std::byte* p = row + b0 * sizeof(W);
    const __m512i head = _mm512_mask_i32gather_epi32(_mm512_setzero_si512(), valid, boff, p, 1);
    const __m512 dw = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(head));
    __m512 sc[NT];
    for (std::size_t t = 0; t < NT; ++t) {
      sc[t] = _mm512_mul_ps(dw, _mm512_load_ps(tok[t][c].d));
      if constexpr (has_offset_m<W>)
        accm[t] = _mm512_fmadd_ps(_mm512_cvtph_ps(_mm512_cvtepi32_epi16(_mm512_srli_epi32(head, 16))),
                                  _mm512_load_ps(tok[t][c].s), accm[t]);
    }
    auto unit = [&](std::size_t j, std::size_t n) {
      __m512i codes[unit_vecs<W>];
      __m512i f = _mm512_setzero_si512();  // q5: 128-bit lane k: block 4j + k's qh in every dword
      if constexpr (lp::layout<W>::qh >= 0)
        for (std::size_t k = 0; k < n; ++k)
          f = _mm512_mask_set1_epi32(f, __mmask16(0xf << (4 * k)),
                                     static_cast<int>(lp::load_u32(p + (G * j + k) * sizeof(W) + lp::layout<W>::qh)));
      unit_codes<W>(p + G * j * sizeof(W), n, &f, codes);
      for (std::size_t t = 0; t < NT; ++t) {
        const act_unit<W>& au = tok[t][c].units[j];
        __m512i s = _mm512_setzero_si512();
        if constexpr (code_offset<W> != 0) {
          if constexpr (nibbles<W>)
            s = _mm512_maskz_broadcast_i32x4(init_lanes<W>, _mm_load_si128(reinterpret_cast<const __m128i*>(au.init)));
          else
            s = _mm512_maskz_broadcast_i32x2(init_lanes<W>, _mm_loadl_epi64(reinterpret_cast<const __m128i*>(au.init)));
        }
        for (std::size_t v = 0; v < unit_vecs<W>; ++v) s = _mm512_dpbusd_epi32(s, codes[v], _mm512_load_si512(au.q[v]));
        acc[t][j & 1] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s), _mm512_permutexvar_ps(pidx[j], sc[t]), acc[t][j & 1]);
      }
    };
    if (nbc == chunk_blocks) {
      for (std::size_t j = 0; j < n_units; ++j) unit(j, G);
    } else {
      for (std::size_t j = 0; G * j < nbc; ++j) unit(j, std::min(G, nbc - G * j));
    }
  }
  for (std::size_t t = 0; t < NT; ++t) {
    __m512 v = _mm512_add_ps(acc[t][0], acc[t][1]);
    if constexpr (has_offset_m<W>) v = _mm512_add_ps(v, accm[t]);
    out[t * out_stride] = _mm512_reduce_add_ps(v);
  }
}

}  // namespace detail::ld
#endif

/// out[t * out_stride + r] for rows r < n_rows (row_bytes apart from rows)
/// against tokens t < n_tokens (1 <= n_tokens <= decode_kernel_tokens), each
/// within gamma_(nb + 6) T of the exact dot (header); without AVX-512 VNNI,
/// quant::dot per (row, token).
template <class W>
inline void dot_rows_decode(const std::byte* rows, std::size_t row_bytes, std::size_t n_rows,
                            const decode_acts<W>* const* acts, std::size_t n_tokens, float* out,
                            std::size_t out_stride) {
  if (n_tokens == 0 || n_rows == 0) return;
  const std::size_t nb = acts[0]->nb;
#if defined(KESTREL_LEGACY_DECODE)
  const detail::ld::act_chunk<W>* tok[decode_kernel_tokens];
  for (std::size_t t = 0; t < n_tokens; ++t) tok[t] = acts[t]->chunks.data();
  auto run = [&]<std::size_t NT>() {
    for (std::size_t r = 0; r < n_rows; ++r)
      detail::ld::row_decode<W, NT>(rows + r * row_bytes, nb, tok, out + r, out_stride);
  };
  switch (n_tokens) {
    case 1: run.template operator()<1>(); break;
    case 2: run.template operator()<2>(); break;
    case 3: run.template operator()<3>(); break;
    default: run.template operator()<4>(); break;
  }
#else
  for (std::size_t r = 0; r < n_rows; ++r)
    for (std::size_t t = 0; t < n_tokens; ++t)
      out[t * out_stride + r] = dot(reinterpret_cast<const W*>(rows + r * row_bytes), acts[t]->a, nb * 32);
#endif
}

}  // namespace kestrel::quant
