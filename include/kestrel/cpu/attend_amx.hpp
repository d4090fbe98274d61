// kestrel/cpu/attend_amx.hpp: prefill's block attention on AMX bf16 tiles
// (the task of attend_block.hpp: nq consecutive queries x the query heads of
// one KV head), where the CPU has AMX-BF16 and the head is whole 32-element
// chunks (head_dim % 32 == 0: 64 and 128 in every model we load).
//
// The scores S = Q K^T and the weighted sums O = P V run as tile products
// (tdpbf16ps: 16 x 16 f32 results, each the sum of 32 products of bf16
// pairs, accumulated in f32), every operand split into two bf16 and each
// product taken as three tile products (cpu/amx_bf16.hpp). An f16 cache's
// values are exactly their two halves, so with an f16 cache only q and the
// weights p carry the split's error. The
// tolerance this gives against the scalar twin is derived in
// tests/cpu/test_kernels.cpp ("cpu: attend_block_amx == ref::attend").
//
// Per task, the keys and values of its range are split and laid out as B
// tiles once (keys transposed into 16-key tiles, values as pairs of
// positions), the queries as A tiles once; per 16-row tile the scores of
// the key tiles it attends go to a row of scratch, each row's weights
// exp(scale s_t - scale max) (its own keys; exact 0 elsewhere) are split
// into bf16 rows that the weighted sums read as A tiles in place, and each
// output row is divided by its weights' sum at the end. The splitting and
// the layouts are the work the tiles do not do, so a task should have many
// rows (the model gives it 512: attend_amx_rows): the keys' and values'
// layout is then shared by 32 row tiles.
//
// Measured (the harness: one thread, f16 cache, 512 tokens, head_dim 64,
// every KV head's tasks of one layer, in /tmp, 2-3 runs each), time over
// attend_block's: the 110M shape (12 heads) 0.48-0.54, TinyLlama's (32
// query heads on 4 KV heads) 0.48-0.50. Steps, in order, each with the ones
// before: tiles in 128-row tasks, attend_block's softmax and the weights
// split in a pass of their own, 0.63-0.72; the weights' one pass,
// 0.57-0.65; 512-row tasks (scratch per row tile) and two score tiles side
// by side, 0.51-0.57; exp_scalef for xsimd's exp, 0.48-0.54. Of the tiles'
// time now (rdtsc per phase): the weights' pass 37-40%, the scores' tile
// products 17-22%, the weighted sums' 20%, the layouts of queries, keys
// and values 14-17%, the output 7% (bench/README.md, "a prompt's attention
// on bf16 tiles").
#pragma once

#include <algorithm>
#include <cassert>
#include <cstddef>
#include <cstdint>
#include <limits>

#include "kestrel/core/diagnostics.hpp"
#include "kestrel/cpu/amx_bf16.hpp"
#include "kestrel/cpu/attend_block.hpp"
#include "kestrel/cpu/convert.hpp"
#include "kestrel/cpu/math.hpp"
#include "kestrel/cpu/transpose.hpp"

KESTREL_INTRINSICS_BEGIN  // GCC 12 (core/diagnostics.hpp)

namespace kestrel::cpu {

/// Rows (queries x heads) per prefill task that suit attend_block_amx: 32
/// row tiles share one layout of the task's keys and values (a 512-token
/// prompt of one head per task without grouped queries; 64 of TinyLlama's
/// queries x 8 heads). The scores and weights take scratch for one row tile
/// at a time, so the rows cost only their queries' layout (256 bytes a row
/// at head_dim 64).
inline constexpr std::size_t attend_amx_rows = 512;

#if defined(KESTREL_AMX_BF16)

namespace detail::amx_attend {

using namespace detail::amx_bf16;  // tile_floats, split, pack_order, pack_pairs, load16

/// C tile `c` (a literal: GCC's tile intrinsics spell their operands into
/// the instruction) += the hi/lo products of A tiles 4 (hi), 5 (lo) and B
/// tiles 6 (hi), 7 (lo): hi*hi + hi*lo + lo*hi.
#define KESTREL_AMX_DP3(c)      \
  do {                          \
    _tile_dpbf16ps(c, 4, 6);    \
    _tile_dpbf16ps(c, 4, 7);    \
    _tile_dpbf16ps(c, 5, 6);    \
  } while (0)

/// The scratch's parts, in floats from its start (each a whole number of
/// 64-byte lines).
struct layout {
  std::size_t rows, row_tiles, n_keys, row_len, chunks32, cols16, key_tiles16, key_chunks32;
  std::size_t s, q, k, v, p, c, total;
  template <class T>
  explicit layout(const block_rows<T>& G) noexcept {
    const basic_attend_block_args<T>& a = G.a;
    rows = a.nq * a.group;
    row_tiles = (rows + 15) / 16;
    n_keys = G.n_keys;
    key_chunks32 = (n_keys + 31) / 32;
    key_tiles16 = 2 * key_chunks32;
    row_len = key_chunks32 * 32;
    chunks32 = a.head_dim / 32;
    cols16 = a.head_dim / 16;
    s = 0;                                                  // (16, row_len): one row tile's scores
    q = s + 16 * row_len;                                   // [row tile][chunk][hi, lo] A tiles
    k = q + row_tiles * chunks32 * 2 * tile_floats;         // [key tile][chunk][hi, lo] B tiles
    v = k + key_tiles16 * chunks32 * 2 * tile_floats;       // [key chunk][column tile][hi, lo] B tiles
    p = v + key_chunks32 * cols16 * 2 * tile_floats;        // (16, row_len) bf16 weights, hi then lo
    c = p + 16 * row_len;                                   // one C tile out
    total = c + tile_floats + 16;                           // + 16: room to align the start to 64 bytes
  }
};

}  // namespace detail::amx_attend

/// Whether attend_block_amx runs here and takes heads of this size.
inline bool attend_amx_available(std::size_t head_dim) noexcept {
  return head_dim > 0 && head_dim % 32 == 0 && amx_bf16_enabled();
}

/// Floats of scratch attend_block_amx(a, scratch) needs.
template <class T>
inline std::size_t attend_block_amx_scratch_size(const basic_attend_block_args<T>& a) noexcept {
  if (a.nq == 0 || a.group == 0) return 0;
  return detail::amx_attend::layout(detail::block_rows<T>(a)).total;
}

/// attend_block(a) on AMX tiles; attend_amx_available(a.head_dim) must
/// hold. Each row as attend() of its query over its own keys, within the
/// bound derived for the bf16 splits (above). scratch:
/// attend_block_amx_scratch_size(a) floats.
template <class T>
inline void attend_block_amx(const basic_attend_block_args<T>& a, float* scratch) noexcept {
  namespace D = detail::amx_attend;
  constexpr std::size_t TF = D::tile_floats;
  if (a.nq == 0 || a.group == 0) return;
  assert(a.head_dim % 32 == 0 && a.head_dim > 0);  // attend_amx_available(a.head_dim)
  const detail::block_rows<T> G(a);  // keys indexed from G.base
  const D::layout L(G);
  float* base_ptr = reinterpret_cast<float*>((reinterpret_cast<std::uintptr_t>(scratch) + 63) & ~std::uintptr_t{63});
  float* S = base_ptr + L.s;
  float *Qt = base_ptr + L.q, *Kt = base_ptr + L.k, *Vt = base_ptr + L.v, *Ct = base_ptr + L.c;
  auto* Ph = reinterpret_cast<std::uint16_t*>(base_ptr + L.p);                     // weights' hi halves
  std::uint16_t* Pl = Ph + 16 * L.row_len;                                            // and lo halves
  const std::size_t group = a.group, rows = L.rows, n_keys = L.n_keys, row_len = L.row_len;
  const T *k = G.k, *v = G.v;
  auto store_row = [](float* tile, std::size_t r, __m512i x) { _mm512_store_si512(tile + r * 16, x); };

  // Queries as A tiles: row i of tile [rt][c] = G.q_row(16 rt + i)[32 c, 32 c + 32).
  for (std::size_t rt = 0; rt < L.row_tiles; ++rt)
    for (std::size_t c = 0; c < L.chunks32; ++c) {
      float* hi = Qt + (rt * L.chunks32 + c) * 2 * TF;
      for (std::size_t i = 0; i < 16; ++i) {
        const std::size_t r = rt * 16 + i;
        __m512i h0, l0, h1, l1;
        D::split(D::load16(r < rows ? G.q_row(r) + 32 * c : a.q, r < rows), h0, l0);
        D::split(D::load16(r < rows ? G.q_row(r) + 32 * c + 16 : a.q, r < rows), h1, l1);
        store_row(hi, i, D::pack_order(h0, h1));
        store_row(hi + TF, i, D::pack_order(l0, l1));
      }
    }
  // Keys as B tiles: row j of tile [kt][c] = the pairs (k_t[32 c + 2 j],
  // k_t[32 c + 2 j + 1]) of keys t = 16 kt .. 16 kt + 15 (0 past n_keys): a
  // 16 x 16 transpose of 4-byte pairs.
  for (std::size_t kt = 0; kt < L.key_tiles16; ++kt)
    for (std::size_t c = 0; c < L.chunks32; ++c) {
      __m512 h[16], l[16];
      for (std::size_t j = 0; j < 16; ++j) {
        const std::size_t t = kt * 16 + j;
        const bool ok = t < n_keys;
        __m512i h0, l0, h1, l1;
        D::split(D::load16(ok ? k + t * a.kv_stride + 32 * c : k, ok), h0, l0);
        D::split(D::load16(ok ? k + t * a.kv_stride + 32 * c + 16 : k, ok), h1, l1);
        h[j] = _mm512_castsi512_ps(D::pack_order(h0, h1));
        l[j] = _mm512_castsi512_ps(D::pack_order(l0, l1));
      }
      detail::transpose16x16(h);
      detail::transpose16x16(l);
      float* hi = Kt + (kt * L.chunks32 + c) * 2 * TF;
      for (std::size_t j = 0; j < 16; ++j) {
        _mm512_store_ps(hi + j * 16, h[j]);
        _mm512_store_ps(hi + TF + j * 16, l[j]);
      }
    }
  // Values as B tiles: row p of tile [kc][j] = (v_t[16 j + d], v_{t+1}[16 j
  // + d]) for d < 16, t = 32 kc + 2 p (0 past n_keys).
  for (std::size_t kc = 0; kc < L.key_chunks32; ++kc)
    for (std::size_t p = 0; p < 16; ++p) {
      const std::size_t t = kc * 32 + 2 * p;
      const bool ok0 = t < n_keys, ok1 = t + 1 < n_keys;
      for (std::size_t j = 0; j < L.cols16; ++j) {
        __m512i ah, al, bh, bl;
        D::split(D::load16(ok0 ? v + t * a.kv_stride + 16 * j : v, ok0), ah, al);
        D::split(D::load16(ok1 ? v + (t + 1) * a.kv_stride + 16 * j : v, ok1), bh, bl);
        float* hi = Vt + (kc * L.cols16 + j) * 2 * TF;
        store_row(hi, p, D::pack_pairs(ah, bh));
        store_row(hi + TF, p, D::pack_pairs(al, bl));
      }
    }

  quant::detail::amx::tiles_on tiles(64, 16);  // every tile 16 rows x 64 bytes
  constexpr std::size_t stride = 64;
  for (std::size_t rt = 0; rt < L.row_tiles; ++rt) {
    const std::size_t r0 = rt * 16, r1 = std::min(rows, r0 + 16);
    // Keys [klo, khi): the union of the tile's rows' ranges (ranges grow with the query).
    const std::size_t klo = G.lo(r0 / group), khi = G.hi((r1 - 1) / group);
    // Scores of the key tiles the rows attend, two at a time (C tiles 0 and
    // 1; queries hi, lo in 2, 3; keys hi, lo in 4, 5 and 6, 7): two
    // independent chains of tile products, where one tile's chain waits on
    // each product's latency. A last odd tile alone.
    const std::size_t kt_end = (khi + 15) / 16;
    std::size_t kt = klo / 16;
    for (; kt + 2 <= kt_end; kt += 2) {
      _tile_zero(0);
      _tile_zero(1);
      for (std::size_t c = 0; c < L.chunks32; ++c) {
        const float* qt = Qt + (rt * L.chunks32 + c) * 2 * TF;
        const float* ka = Kt + (kt * L.chunks32 + c) * 2 * TF;
        const float* kb = Kt + ((kt + 1) * L.chunks32 + c) * 2 * TF;
        _tile_loadd(2, qt, stride);
        _tile_loadd(3, qt + TF, stride);
        _tile_loadd(4, ka, stride);
        _tile_loadd(5, ka + TF, stride);
        _tile_loadd(6, kb, stride);
        _tile_loadd(7, kb + TF, stride);
        _tile_dpbf16ps(0, 2, 4);
        _tile_dpbf16ps(1, 2, 6);
        _tile_dpbf16ps(0, 2, 5);
        _tile_dpbf16ps(1, 2, 7);
        _tile_dpbf16ps(0, 3, 4);
        _tile_dpbf16ps(1, 3, 6);
      }
      _tile_stored(0, S + kt * 16, row_len * sizeof(float));
      _tile_stored(1, S + (kt + 1) * 16, row_len * sizeof(float));
    }
    if (kt < kt_end) {
      _tile_zero(0);
      for (std::size_t c = 0; c < L.chunks32; ++c) {
        const float* qt = Qt + (rt * L.chunks32 + c) * 2 * TF;
        const float* ka = Kt + (kt * L.chunks32 + c) * 2 * TF;
        _tile_loadd(4, qt, stride);
        _tile_loadd(5, qt + TF, stride);
        _tile_loadd(6, ka, stride);
        _tile_loadd(7, ka + TF, stride);
        KESTREL_AMX_DP3(0);
      }
      _tile_stored(0, S + kt * 16, row_len * sizeof(float));
    }
    // Each row's weights over its own keys, e_t = exp(scale s_t - scale
    // max s), in bf16 halves (hi, lo) for the keys the tile's chunks of 32
    // cover, exact 0 outside the row's range; the division by the row's sum
    // comes at the end, on the output. One pass for the maximum, one for
    // the rest: a scale pass, attend_block's softmax and a pass that split
    // its weights into A tiles took 1.75x the cycles (rdtsc per phase, the
    // harness in the header comment).
    const std::size_t c_lo = klo / 32 * 32, c_hi = (khi + 31) / 32 * 32;
    const __m512 sc = _mm512_set1_ps(a.scale);
    alignas(64) float inv_sum[16];
    for (std::size_t r = r0; r < r0 + 16; ++r) {
      std::uint16_t* ph = Ph + (r - r0) * row_len;
      std::uint16_t* pl = Pl + (r - r0) * row_len;
      if (r >= r1) {  // a padded row: zero weights
        for (std::size_t t = c_lo; t < c_hi; t += 16) {
          _mm256_store_si256(reinterpret_cast<__m256i*>(ph + t), _mm256_setzero_si256());
          _mm256_store_si256(reinterpret_cast<__m256i*>(pl + t), _mm256_setzero_si256());
        }
        continue;
      }
      const float* s = S + (r - r0) * row_len;
      const std::size_t lo = G.lo(r / group), hi = G.hi(r / group);
      auto in_range = [&](std::size_t t) {  // lanes t .. t + 15 within [lo, hi)
        const std::size_t a0 = std::max(lo, t), a1 = std::min(hi, t + 16);
        return a0 < a1 ? static_cast<__mmask16>(((1u << (a1 - a0)) - 1u) << (a0 - t)) : __mmask16{0};
      };
      __m512 mx = _mm512_set1_ps(-std::numeric_limits<float>::infinity());
      for (std::size_t t = lo / 16 * 16; t < hi; t += 16) mx = _mm512_mask_max_ps(mx, in_range(t), mx, _mm512_load_ps(s + t));
      const __m512 shift = _mm512_set1_ps(-a.scale * _mm512_reduce_max_ps(mx));
      __m512 sum = _mm512_setzero_ps();
      for (std::size_t t = c_lo; t < c_hi; t += 16) {
        const __mmask16 m = in_range(t);
        __m512 e = _mm512_setzero_ps();
        if (m) {
          const __m512 x = _mm512_fmadd_ps(_mm512_maskz_load_ps(m, s + t), sc, shift);
          e = _mm512_maskz_mov_ps(m, exp_scalef(x));
          sum = _mm512_add_ps(sum, e);
        }
        const __m256bh eh = _mm512_cvtneps_pbh(e);
        const __m512 ehf = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(reinterpret_cast<const __m256i&>(eh)), 16));
        const __m256bh el = _mm512_cvtneps_pbh(_mm512_sub_ps(e, ehf));
        _mm256_store_si256(reinterpret_cast<__m256i*>(ph + t), reinterpret_cast<const __m256i&>(eh));
        _mm256_store_si256(reinterpret_cast<__m256i*>(pl + t), reinterpret_cast<const __m256i&>(el));
      }
      inv_sum[r - r0] = 1.0f / _mm512_reduce_add_ps(sum);
    }
    // Weighted sums, 64 dims (4 C tiles) per pass, the weights' A tiles
    // read in place (16 rows of 32 keys, row_len apart).
    const std::size_t p_stride = row_len * sizeof(std::uint16_t);
    for (std::size_t j0 = 0; j0 < L.cols16; j0 += 4) {
      const std::size_t nc = std::min<std::size_t>(4, L.cols16 - j0);  // 2 or 4: head_dim % 32 == 0
      _tile_zero(0);
      _tile_zero(1);
      _tile_zero(2);
      _tile_zero(3);
      for (std::size_t kc = c_lo / 32; kc < c_hi / 32; ++kc) {
        _tile_loadd(4, Ph + kc * 32, p_stride);
        _tile_loadd(5, Pl + kc * 32, p_stride);
        const float* vt = Vt + (kc * L.cols16 + j0) * 2 * TF;
        _tile_loadd(6, vt, stride);
        _tile_loadd(7, vt + TF, stride);
        KESTREL_AMX_DP3(0);
        _tile_loadd(6, vt + 2 * TF, stride);
        _tile_loadd(7, vt + 3 * TF, stride);
        KESTREL_AMX_DP3(1);
        if (nc == 4) {
          _tile_loadd(6, vt + 4 * TF, stride);
          _tile_loadd(7, vt + 5 * TF, stride);
          KESTREL_AMX_DP3(2);
          _tile_loadd(6, vt + 6 * TF, stride);
          _tile_loadd(7, vt + 7 * TF, stride);
          KESTREL_AMX_DP3(3);
        }
      }
      auto out_tile = [&](std::size_t j) {
        for (std::size_t r = r0; r < r1; ++r)
          _mm512_storeu_ps(G.out_row(r) + 16 * (j0 + j),
                           _mm512_mul_ps(_mm512_set1_ps(inv_sum[r - r0]), _mm512_load_ps(Ct + (r - r0) * 16)));
      };
      _tile_stored(0, Ct, stride);
      out_tile(0);
      _tile_stored(1, Ct, stride);
      out_tile(1);
      if (nc == 4) {
        _tile_stored(2, Ct, stride);
        out_tile(2);
        _tile_stored(3, Ct, stride);
        out_tile(3);
      }
    }
  }
}

#undef KESTREL_AMX_DP3

#else

inline bool attend_amx_available(std::size_t) noexcept { return false; }
template <class T>
inline std::size_t attend_block_amx_scratch_size(const basic_attend_block_args<T>&) noexcept {
  return 0;
}
template <class T>
inline void attend_block_amx(const basic_attend_block_args<T>&, float*) noexcept {
  assert(!"attend_block_amx without AMX-BF16 in the build: attend_amx_available() said false");
}

#endif

}  // namespace kestrel::cpu
KESTREL_INTRINSICS_END
