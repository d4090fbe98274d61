// kestrel/cpu/attend_block.hpp: causal attention of a block of consecutive
// queries and all the query heads of one KV head (prefill).
//
// attend() computes each score as a dot product of head_dim floats and a
// horizontal reduction, one key at a time, and reads every key once per
// (query, head). Here one task owns nq consecutive queries x `group` heads
// (the rows), so each key is read once per task: a tile of keys is
// transposed to K^T (head_dim x KT) once and serves every row, a score
// register holds W keys (broadcast q[d] times a row of K^T, no reduction),
// and a 4-row x 2-register micro-kernel loads each K^T row once for 4
// rows. The values are shared the same way: one v row is loaded once per 4
// rows. Scores are kept in full rows (scratch), so the softmax is the
// vectorized one attend() uses; a row's numbers are exactly attend()'s error
// terms (one dot, one scale, softmax, one weighted sum), only the order of
// each dot's terms differs.
//
// Measured (one thread, AVX-512, 512 tokens x 12 heads, head_dim 64, thread
// CPU time): attend per (token, head) 20.5 ms, attend_block over blocks of
// 32 queries 8.4 ms (48 GFLOP/s counting 4 flops per (query, key, dim)); with
// the shared K^T and v loads held in registers (keep_in_register) 5.7-6.5 ms
// (62-70 GFLOP/s; 32 query / 4 KV heads 50 -> 61-64 GFLOP/s), bit for bit
// the same outputs.
#pragma once

#include <algorithm>
#include <cstddef>
#include <type_traits>
#include <utility>

#include "kestrel/cpu/convert.hpp"
#include "kestrel/cpu/prefetch.hpp"
#include "kestrel/cpu/softmax.hpp"
#include "kestrel/cpu/transpose.hpp"
#include "kestrel/cpu/xsimd_compat.hpp"

namespace kestrel::cpu {

/// One attend_block call: query i (0 <= i < nq) is at position pos0 + i and
/// attends keys [first(pos0 + i), pos0 + i] (causal; first(p) = p + 1 - window
/// when window > 0 and p + 1 > window, else 0). Row (i, g), g < group, reads
/// q + i * q_stride + g * head_dim and writes out + i * out_stride + g * head_dim
/// (head_dim floats each): the query heads of one KV head are consecutive in
/// a token's row of Q. Key / value of position t: k + t * kv_stride,
/// v + t * kv_stride, first head_dim elements used (the caller points k and
/// v at one KV head of the cache), of T = f32 or f16 (an f16 cache: each
/// element converted exactly as it is loaded).
template <class T>
struct basic_attend_block_args {
  const float* q = nullptr;  // (nq, q_stride)
  std::size_t q_stride = 0;
  const T* k = nullptr;  // (pos0 + nq, kv_stride); rows before first(pos0) are not read
  const T* v = nullptr;  // (pos0 + nq, kv_stride)
  std::size_t kv_stride = 0;
  float* out = nullptr;      // (nq, out_stride)
  std::size_t out_stride = 0;
  std::size_t nq = 0, group = 1, head_dim = 0, pos0 = 0, window = 0;
  float scale = 1.0f;
  /// Optional: attend_block_scratch_size(*this) floats from the caller
  /// (decode sizes them once, for the whole context); null: the backend's
  /// own (prefill).
  float* scratch = nullptr;
};
using attend_block_args = basic_attend_block_args<float>;

/// The first key position a query at position pos attends: pos + 1 - window
/// for a sliding window that the query has outgrown, else 0 (causal). The one
/// definition of the window for the kernels, their twins and the model.
inline std::size_t attend_first(std::size_t pos, std::size_t window) noexcept {
  return window && pos + 1 > window ? pos + 1 - window : 0;
}

namespace detail {

/// Keys per tile of K^T: two registers, so the score micro-kernel runs
/// 4 rows x 2 registers = 8 independent FMA chains, enough to hide the FMA
/// latency.
inline constexpr std::size_t attend_key_tile = 2 * simd::width;
/// Rows per micro-kernel: each K^T row (and each v row) loaded serves this many.
inline constexpr std::size_t attend_rows = 4;
/// Registers of the head per weighted-sum pass: 4 rows x 4 accumulators
/// + 4 of v fit AVX-512's 32 registers; with 16 (AVX2, SSE) 4 x 4 spills, so
/// 2 (AVX2, head_dim 64, 512 tokens: 4 registers take 1.5x the time of 2).
inline constexpr std::size_t attend_value_regs = simd::width >= 16 ? 4 : 2;

/// n keys rounded up to whole tiles: a row of scores in the scratch.
inline std::size_t attend_row_len(std::size_t n) noexcept {
  return (n + attend_key_tile - 1) / attend_key_tile * attend_key_tile;
}

#if defined(__AVX512F__)
/// The elements of p under mask m as floats, zeros elsewhere.
inline __m512 masked_f32(__mmask16 m, const float* p) noexcept { return _mm512_maskz_loadu_ps(m, p); }
inline __m512 masked_f32(__mmask16 m, const f16* p) noexcept {  // m: the low n bits
  const auto n = static_cast<std::size_t>(__builtin_popcount(m));
  return static_cast<__m512>(n == simd::width ? load_f32(p) : load_f32_partial(p, n));
}
#endif

/// kt[d * KT + j] = k_j[d] for j < n_keys, 0 for n_keys <= j < KT (KT =
/// attend_key_tile); k_j = k + j * kv_stride. The padding keys score 0 and
/// lie outside every row's range, so they are never used.
template <class T>
inline void transpose_keys(const T* k, std::size_t kv_stride, std::size_t n_keys, std::size_t head_dim,
                           float* kt) noexcept {
  constexpr std::size_t KT = attend_key_tile;
#if defined(__AVX512F__)
  // 16 x 16 blocks through registers (64 shuffles per 256 floats): the
  // scalar loop below, one load and one store per float, made the whole
  // kernel ~10% slower (512 tokens, head_dim 64, one thread).
  static_assert(simd::width == 16 && KT % 16 == 0);
  for (std::size_t j0 = 0; j0 < KT; j0 += 16) {
    for (std::size_t d0 = 0; d0 < head_dim; d0 += 16) {
      const std::size_t md = std::min<std::size_t>(16, head_dim - d0);
      const __mmask16 dm = static_cast<__mmask16>((1u << md) - 1u);
      __m512 r[16];
      for (std::size_t j = 0; j < 16; ++j)
        r[j] = j0 + j < n_keys ? masked_f32(dm, k + (j0 + j) * kv_stride + d0) : _mm512_setzero_ps();
      transpose16x16(r);
      for (std::size_t d = 0; d < md; ++d) _mm512_storeu_ps(kt + (d0 + d) * KT + j0, r[d]);
    }
  }
#elif defined(__AVX2__) && defined(__F16C__)
  // 8 x 8 blocks through registers, each key's 8 elements converted by one
  // load_f32; the head's last head_dim % 8 elements one by one. The scalar
  // loop alone (one conversion, load and store per element) was most of
  // decode's attention on AVX2: TinyLlama's shape in a /tmp harness (one
  // thread, f16 cache, caches evicted, bench/README.md) took 13.6 ms per
  // token at 1024 keys, 3.4 ms at 256.
  static_assert(simd::width == 8 && KT % 8 == 0);
  const std::size_t d_main = head_dim - head_dim % 8;
  for (std::size_t j0 = 0; j0 < KT; j0 += 8) {
    for (std::size_t d0 = 0; d0 < d_main; d0 += 8) {
      __m256 r[8];
      for (std::size_t j = 0; j < 8; ++j)
        r[j] = j0 + j < n_keys ? static_cast<__m256>(load_f32(k + (j0 + j) * kv_stride + d0)) : _mm256_setzero_ps();
      transpose8x8(r);
      for (std::size_t d = 0; d < 8; ++d) _mm256_storeu_ps(kt + (d0 + d) * KT + j0, r[d]);
    }
  }
  for (std::size_t j = 0; j < KT; ++j)
    for (std::size_t d = d_main; d < head_dim; ++d) kt[d * KT + j] = j < n_keys ? to_float(k[j * kv_stride + d]) : 0.0f;
#else
  for (std::size_t j = 0; j < KT; ++j)
    for (std::size_t d = 0; d < head_dim; ++d) kt[d * KT + j] = j < n_keys ? to_float(k[j * kv_stride + d]) : 0.0f;
#endif
}

/// Makes the compiler hold v in a register from here on: a value loaded once
/// to serve several rows' FMAs is otherwise folded back into each FMA as a
/// memory operand (GCC 12 does), one load per FMA instead of one per row
/// group, which made the score and value loops bound by loads.
inline void keep_in_register(simd::fbatch& v) noexcept {
#if defined(__GNUC__) && (defined(__x86_64__) || defined(__i386__))
  auto r = static_cast<simd::fbatch::register_type>(v);
  asm("" : "+v"(r));
  v = simd::fbatch(r);
#else
  (void)v;
#endif
}

/// s_r[0..KT) = scale * (q_r . k_j) for R rows against one K^T tile. Each
/// score is one FMA chain over d in index order (a dot product, as attend's
/// but in another order of terms), then one multiply by scale.
template <std::size_t R>
inline void score_tile(const float* const* qr, const float* kt, std::size_t head_dim, float scale,
                       float* const* sr) noexcept {
  constexpr std::size_t W = simd::width, KT = attend_key_tile;
  simd::fbatch a0[R], a1[R];
  for (std::size_t r = 0; r < R; ++r) a0[r] = a1[r] = simd::fbatch(0.0f);
  for (std::size_t d = 0; d < head_dim; ++d) {
    simd::fbatch k0 = simd::fbatch::load_unaligned(kt + d * KT), k1 = simd::fbatch::load_unaligned(kt + d * KT + W);
    keep_in_register(k0);
    keep_in_register(k1);
    for (std::size_t r = 0; r < R; ++r) {
      const simd::fbatch qb(qr[r][d]);
      a0[r] = xsimd::fma(qb, k0, a0[r]);
      a1[r] = xsimd::fma(qb, k1, a1[r]);
    }
  }
  const simd::fbatch s(scale);
  for (std::size_t r = 0; r < R; ++r) {
    (s * a0[r]).store_unaligned(sr[r]);
    (s * a1[r]).store_unaligned(sr[r] + W);
  }
}

/// out_r[j .. j + NV W) = sum_{t in [lo, hi)} p_r[t] v_t[j ..] for R rows:
/// one v load serves R rows. Partial: the last register holds only
/// m < W floats (the end of the head). Terms outside a row's range have
/// p_r[t] = 0 exactly and add nothing.
template <std::size_t R, std::size_t NV, bool Partial, class T>
inline void weigh_values(const float* const* pr, const T* v, std::size_t kv_stride, std::size_t lo, std::size_t hi,
                         std::size_t j, std::size_t m, float* const* outr) noexcept {
  constexpr std::size_t W = simd::width;
  simd::fbatch acc[R][NV];
  for (std::size_t r = 0; r < R; ++r)
    for (std::size_t c = 0; c < NV; ++c) acc[r][c] = simd::fbatch(0.0f);
  for (std::size_t t = lo; t < hi; ++t) {
    const T* vt = v + t * kv_stride + j;
    simd::fbatch vb[NV];
    for (std::size_t c = 0; c < NV; ++c) {
      simd::fbatch x = Partial && c == NV - 1 ? load_f32_partial(vt + c * W, m) : load_f32(vt + c * W);
      keep_in_register(x);
      vb[c] = x;
    }
    for (std::size_t r = 0; r < R; ++r) {
      const simd::fbatch p(pr[r][t]);
      for (std::size_t c = 0; c < NV; ++c) acc[r][c] = xsimd::fma(p, vb[c], acc[r][c]);
    }
  }
  for (std::size_t r = 0; r < R; ++r) {
    for (std::size_t c = 0; c < NV; ++c) {
      if (Partial && c == NV - 1) {
        alignas(64) float tmp[W];
        acc[r][c].store_aligned(tmp);
        for (std::size_t i = 0; i < m; ++i) outr[r][j + c * W + i] = tmp[i];
      } else {
        acc[r][c].store_unaligned(outr[r] + j + c * W);
      }
    }
  }
}

#if defined(__AVX512VL__)
/// Decode's scores when one query's heads share a KV head (nq == 1, group
/// <= 8): S[g * row_len + t] = scale * (q_g . k_t) for t < n_keys, the
/// same bits as score_tile (each score one FMA chain over d in index
/// order, then one multiply by scale) without transposing the keys: q is
/// transposed instead, once (qt: (head_dim, 8), head g in lane g, lanes
/// past the group 0), and each key's floats are broadcast against a row of
/// qt, 8 keys at a time (8 ymm chains), so the keys are read in order, row
/// after row. Measured (one thread, TinyLlama's shape: 4 KV heads of 64,
/// groups of 8, 22 layers, 2048 cached positions in head-major runs, caches
/// evicted before each token, medians of 15, bench/README.md): 9.0-14.7 ms
/// per token against 12.1-17.0 ms with the transposed tiles. Entries
/// [n_keys, round up to 8) of each row are written too (with row 0's
/// scores), inside the row's whole tiles.
/// qt: (head_dim, 8) floats of scratch; with an f16 cache 8 head_dim more
/// after it, where each block's 8 keys are converted first.
template <class T>
inline void score_query_heads(const float* q, std::size_t group, const T* k, std::size_t kv_stride,
                              std::size_t n_keys, std::size_t head_dim, float scale, float* S, std::size_t row_len,
                              float* qt) noexcept {
  for (std::size_t d = 0; d < head_dim; ++d)
    for (std::size_t g = 0; g < 8; ++g) qt[d * 8 + g] = g < group ? q[g * head_dim + d] : 0.0f;
  constexpr std::size_t DC = 16;  // rows of qt held in registers per pass over a block's keys
  const std::size_t d_main = head_dim - head_dim % DC;
  const __m256 sc = _mm256_set1_ps(scale);
  for (std::size_t t = 0; t < n_keys; t += 8) {
    const float* kr[8];
    if constexpr (std::is_same_v<T, float>) {
      for (std::size_t j = 0; j < 8; ++j) kr[j] = k + (t + j < n_keys ? t + j : 0) * kv_stride;
    } else {
      float* kf = qt + head_dim * 8;  // (8, head_dim)
      for (std::size_t j = 0; j < 8; ++j) {
        kr[j] = kf + j * head_dim;
        convert_to_f32(k + (t + j < n_keys ? t + j : 0) * kv_stride, kf + j * head_dim, head_dim);
      }
    }
    __m256 acc[8];
    for (auto& a : acc) a = _mm256_setzero_ps();
    for (std::size_t d0 = 0; d0 < d_main; d0 += DC) {
      __m256 qd[DC];
      for (std::size_t i = 0; i < DC; ++i) {
        qd[i] = _mm256_loadu_ps(qt + (d0 + i) * 8);
        asm("" : "+v"(qd[i]));  // held in a register for the 8 keys (see keep_in_register)
      }
      for (std::size_t j = 0; j < 8; ++j)
        for (std::size_t i = 0; i < DC; ++i) acc[j] = _mm256_fmadd_ps(qd[i], _mm256_set1_ps(kr[j][d0 + i]), acc[j]);
    }
    for (std::size_t d = d_main; d < head_dim; ++d) {
      const __m256 qd = _mm256_loadu_ps(qt + d * 8);
      for (std::size_t j = 0; j < 8; ++j) acc[j] = _mm256_fmadd_ps(qd, _mm256_set1_ps(kr[j][d]), acc[j]);
    }
    // acc[j] lane g -> S[g][t + j]: an 8 x 8 transpose.
    __m256 r[8], u[8];
    for (std::size_t j = 0; j < 8; ++j) r[j] = _mm256_mul_ps(sc, acc[j]);
    for (std::size_t j = 0; j < 8; j += 2) {
      u[j] = _mm256_unpacklo_ps(r[j], r[j + 1]);
      u[j + 1] = _mm256_unpackhi_ps(r[j], r[j + 1]);
    }
    for (std::size_t j = 0; j < 8; j += 4) {
      r[j] = _mm256_shuffle_ps(u[j], u[j + 2], 0x44);
      r[j + 1] = _mm256_shuffle_ps(u[j], u[j + 2], 0xEE);
      r[j + 2] = _mm256_shuffle_ps(u[j + 1], u[j + 3], 0x44);
      r[j + 3] = _mm256_shuffle_ps(u[j + 1], u[j + 3], 0xEE);
    }
    for (std::size_t g = 0; g < group; ++g) {
      const __m256 o = (g & 4) ? _mm256_permute2f128_ps(r[g & 3], r[4 + (g & 3)], 0x31)
                               : _mm256_permute2f128_ps(r[g & 3], r[4 + (g & 3)], 0x20);
      _mm256_storeu_ps(S + g * row_len + t, o);
    }
  }
}
#endif

/// f(std::integral_constant<std::size_t, R>{}) for the run-time R in 1..attend_rows.
template <class F>
inline void with_rows(std::size_t R, F&& f) {
  static_assert(attend_rows == 4);
  switch (R) {
    case 1: f(std::integral_constant<std::size_t, 1>{}); break;
    case 2: f(std::integral_constant<std::size_t, 2>{}); break;
    case 3: f(std::integral_constant<std::size_t, 3>{}); break;
    default: f(std::integral_constant<std::size_t, 4>{}); break;
  }
}

/// One attend_block call's rows and keys, for its kernels (attend_block,
/// attend_block_amx): keys [base, base + n_keys) are the union of the rows'
/// ranges and are indexed from base (k, v point at key base); row r is
/// query r / group, head r % group.
template <class T>
struct block_rows {
  const basic_attend_block_args<T>& a;
  std::size_t base, n_keys;
  const T* k;
  const T* v;
  explicit block_rows(const basic_attend_block_args<T>& args) noexcept
      : a(args), base(attend_first(args.pos0, args.window)), n_keys(args.pos0 + args.nq - base),
        k(args.k + base * args.kv_stride), v(args.v + base * args.kv_stride) {}
  /// Query i's first key and its end (exclusive), from base.
  std::size_t lo(std::size_t i) const noexcept { return attend_first(a.pos0 + i, a.window) - base; }
  std::size_t hi(std::size_t i) const noexcept { return a.pos0 + i + 1 - base; }
  const float* q_row(std::size_t r) const noexcept {
    return a.q + (r / a.group) * a.q_stride + (r % a.group) * a.head_dim;
  }
  float* out_row(std::size_t r) const noexcept { return a.out + (r / a.group) * a.out_stride + (r % a.group) * a.head_dim; }
};

}  // namespace detail

/// Floats of scratch attend_block(a, scratch) needs: one K^T tile and a
/// row of scores per (query, head), rounded up to whole tiles.
template <class T>
inline std::size_t attend_block_scratch_size(const basic_attend_block_args<T>& a) noexcept {
  constexpr std::size_t KT = detail::attend_key_tile;
  if (a.nq == 0) return 0;
  return a.head_dim * KT + a.nq * a.group * detail::attend_row_len(detail::block_rows<T>(a).n_keys);
}

/// The attention outputs of every (query, head) row of `a` (see
/// attend_block_args): each row as attend() of that query over its keys,
/// masked keys contributing exactly 0. scratch: attend_block_scratch_size(a)
/// floats. nq == 0 does nothing.
template <class T>
inline void attend_block(const basic_attend_block_args<T>& a, float* scratch) noexcept {
  constexpr std::size_t KT = detail::attend_key_tile, RB = detail::attend_rows, PV = detail::attend_value_regs;
  constexpr std::size_t W = simd::width;
  if (a.nq == 0 || a.group == 0) return;
  const std::size_t head_dim = a.head_dim, group = a.group, rows = a.nq * group;
  // Keys from G.base (the union of the rows' ranges), indexed from there.
  const detail::block_rows<T> G(a);
  const std::size_t n_keys = G.n_keys;
  const std::size_t row_len = detail::attend_row_len(n_keys);
  float* kt = scratch;                   // (head_dim, KT)
  float* S = scratch + head_dim * KT;    // (rows, row_len): scores, then weights
  const T *k = G.k, *v = G.v;

  // Scores, tile by tile: a tile no row of a 4-row group attends to is
  // skipped (the causal upper triangle, the keys before a window); its
  // entries are zeroed below. One query's group of up to 8 heads (decode)
  // takes score_query_heads instead, the same bits.
#if defined(__AVX512VL__)
  const bool query_heads = a.nq == 1 && group <= 8;
  if (query_heads) detail::score_query_heads(a.q, group, k, a.kv_stride, n_keys, head_dim, a.scale, S, row_len, kt);
#else
  constexpr bool query_heads = false;
#endif
  for (std::size_t t0 = 0; t0 < (query_heads ? 0 : n_keys); t0 += KT) {
    if (a.nq == 1)  // decode: the tile's values, read after the softmax, come from memory (cpu/attend.hpp)
      for (std::size_t t = t0; t < std::min(n_keys, t0 + KT); ++t)
        detail::prefetch_elements(v + t * a.kv_stride, head_dim);
    detail::transpose_keys(k + t0 * a.kv_stride, a.kv_stride, std::min(KT, n_keys - t0), head_dim, kt);
    for (std::size_t r0 = 0; r0 < rows; r0 += RB) {
      const std::size_t R = std::min(RB, rows - r0);
      // Ranges grow with the query, so the group's first row starts first and its last row ends last.
      if (G.hi((r0 + R - 1) / group) <= t0 || G.lo(r0 / group) >= t0 + KT) continue;
      const float* qr[RB];
      float* sr[RB];
      for (std::size_t r = 0; r < R; ++r) {
        qr[r] = G.q_row(r0 + r);
        sr[r] = S + (r0 + r) * row_len + t0;
      }
      detail::with_rows(R, [&](auto n) { detail::score_tile<decltype(n)::value>(qr, kt, head_dim, a.scale, sr); });
    }
  }

  // Softmax over each row's own keys; the other entries of its 4-row
  // group's union of ranges (which the weighted sums below run over) become
  // exact 0s. Entries outside that union are never read, so they are left
  // as they are (zeroing whole rows was a memset of half of each row in a
  // causal prefill).
  for (std::size_t r = 0; r < rows; ++r) {
    float* s = S + r * row_len;
    const std::size_t g0 = r / RB * RB, g1 = std::min(rows, g0 + RB) - 1;  // the row's group
    const std::size_t lo = G.lo(r / group), hi = G.hi(r / group);
    softmax(s + lo, hi - lo);
    std::fill(s + G.lo(g0 / group), s + lo, 0.0f);
    std::fill(s + hi, s + G.hi(g1 / group), 0.0f);
  }

  // out_r = sum_t p_rt v_t: PV registers of the head per pass while they
  // fit (4 rows x 4 = 16 accumulators with AVX-512), then one register at a time.
  for (std::size_t r0 = 0; r0 < rows; r0 += RB) {
    const std::size_t R = std::min(RB, rows - r0);
    const std::size_t lo = G.lo(r0 / group), hi = G.hi((r0 + R - 1) / group);
    const float* pr[RB];
    float* outr[RB];
    for (std::size_t r = 0; r < R; ++r) {
      pr[r] = S + (r0 + r) * row_len;
      outr[r] = G.out_row(r0 + r);
    }
    detail::with_rows(R, [&](auto n) {
      constexpr std::size_t NR = decltype(n)::value;
      std::size_t j = 0;
      for (; j + PV * W <= head_dim; j += PV * W) detail::weigh_values<NR, PV, false>(pr, v, a.kv_stride, lo, hi, j, W, outr);
      for (; j + W <= head_dim; j += W) detail::weigh_values<NR, 1, false>(pr, v, a.kv_stride, lo, hi, j, W, outr);
      if (j < head_dim) detail::weigh_values<NR, 1, true>(pr, v, a.kv_stride, lo, hi, j, head_dim - j, outr);
    });
  }
}

}  // namespace kestrel::cpu
