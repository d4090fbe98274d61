// kestrel/cpu/quantized.hpp: matrix x vector and matrix x matrix with GGUF
// block-quantized weights (quant/), for the CPU backend and its scalar twin.
//
// The activations are quantized once per call to the format the weight type
// pairs with (q8_0 / q8_1 for the legacy types, q8_K for the k-quants, as
// ggml does), then each weight row meets them in an integer dot product.
// For the legacy types with AVX-512 VNNI or AVX2, decode (n_tokens <=
// quant::decode_max_tokens, 2) takes the row-streaming decode kernel
// (quant/legacy_decode.hpp: units of four blocks with VNNI, paired rows
// with two accumulator chains on AVX2), and with AVX-512 VNNI more
// tokens take 16-row panels against 8-token groups (legacy_panels below,
// quant/legacy_tokens.hpp), bit-identical to quant::ref::dot_fused; the two
// agree within derived rounding bounds, not bit for bit
// (tests/cpu/test_linear.cpp); with AVX2 alone more tokens take, for q4_0,
// 16-row panels packed per call (q4_0_packed_linear below,
// quant/legacy_x16_avx2.hpp), for the other legacy types register tiles of
// 2 rows x 4 tokens (quant/legacy_tiles_avx2.hpp). cpu_backend gives q4_0,
// q4_1, q5_0, q5_1 and q8_0 matrices that 16-row layout at load with AVX2 alone
// (dtype::q4_0_x16, ...), whose every call takes that kernel
// (legacy_x16_linear), as the k-quants' x16 layouts do (x16_linear). Without AVX2,
// quant::dot per (row, token). (With AVX2 alone, cpu::matmul hands calls of
// at least dequant_gemm_min_tokens tokens, of every block type but q4_0
// and the x16 layouts, to the float GEMM over dequantized panels instead:
// cpu/matmul.hpp, dequant_gemm.)
// Where the CPU has AMX-INT8 and Linux grants it (quant::amx_enabled(),
// KESTREL_AMX=0 to refuse), prefill's legacy-type calls of more than 8
// tokens take a tile kernel instead of those panels (legacy_panels_amx,
// quant/legacy_amx.hpp), with the same bits.
// For the k-quants with AVX-512 VNNI, calls of at least
// quant::kpanel_min_tokens<B> tokens (prefill) take 16-row panels packed
// once per call against 8-token groups (kquant_panels below,
// quant/kquant_panels.hpp), and where AMX is usable q2_K, q4_K and q5_K
// take a tile kernel instead (kquant_tiles, quant/kquant_amx.hpp), with the
// same bits; shorter calls, and every call without VNNI,
// block tokens and rows for the caches and take tokens in groups of
// quant::vec_dot_group that share each weight block's unpacking,
// bit-identical to quant::vec_dot alone. A token's outputs depend on how
// many tokens share its call (which path), never on their values or on the
// thread count. The fast and reference paths differ only in the dot: the
// SIMD kernels against their scalar twins (quant::ref::dot,
// quant::ref::vec_dot), which agree to within the float rounding bounds
// their tests derive.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstring>
#include <string>
#include <type_traits>
#include <vector>

#include "kestrel/core/error.hpp"
#include "kestrel/core/tensor.hpp"
#include "kestrel/cpu/activation.hpp"
#include "kestrel/cpu/prefetch.hpp"
#include "kestrel/cpu/thread_pool.hpp"
#include "kestrel/quant/kquant_amx.hpp"
#include "kestrel/quant/kquant_panels.hpp"
#include "kestrel/quant/kquant_x16.hpp"
#include "kestrel/quant/legacy_x16.hpp"
#include "kestrel/quant/legacy_x16_avx2.hpp"
#include "kestrel/quant/kquants.hpp"
#include "kestrel/quant/legacy.hpp"
#include "kestrel/quant/legacy_amx.hpp"
#include "kestrel/quant/legacy_decode.hpp"
#include "kestrel/quant/legacy_tiles_avx2.hpp"
#include "kestrel/quant/legacy_tokens.hpp"
#include "kestrel/quant/quantize_acts.hpp"
#include "kestrel/quant/ref/kquants.hpp"
#include "kestrel/quant/ref/legacy.hpp"

namespace kestrel::cpu {

namespace detail {

/// The one table from a quantized dtype to its block type.
template <class F>
decltype(auto) visit_quantized(const weight_view& w, F&& f) {
  switch (w.type) {
    case dtype::q4_0: return f(static_cast<const quant::block_q4_0*>(w.data));
    case dtype::q4_1: return f(static_cast<const quant::block_q4_1*>(w.data));
    case dtype::q5_0: return f(static_cast<const quant::block_q5_0*>(w.data));
    case dtype::q5_1: return f(static_cast<const quant::block_q5_1*>(w.data));
    case dtype::q8_0: return f(static_cast<const quant::block_q8_0*>(w.data));
    case dtype::q2_k: return f(static_cast<const quant::block_q2_K*>(w.data));
    case dtype::q3_k: return f(static_cast<const quant::block_q3_K*>(w.data));
    case dtype::q4_k: return f(static_cast<const quant::block_q4_K*>(w.data));
    case dtype::q5_k: return f(static_cast<const quant::block_q5_K*>(w.data));
    case dtype::q6_k: return f(static_cast<const quant::block_q6_K*>(w.data));
    default: throw invalid_argument("cpu: weight type " + std::string(name_of(w.type)) + " is not a block type");
  }
}

/// The same for the interleaved layouts (panel_rows(t) == 16): calls
/// f(static_cast<const X*>(w.data)) with X their x16 block type.
template <class F>
decltype(auto) visit_x16(const weight_view& w, F&& f) {
  switch (w.type) {
    case dtype::q4_k_x16: return f(static_cast<const quant::block_q4_K_x16*>(w.data));
    case dtype::q2_k_x16: return f(static_cast<const quant::block_q2_K_x16*>(w.data));
    case dtype::q3_k_x16: return f(static_cast<const quant::block_q3_K_x16*>(w.data));
    case dtype::q5_k_x16: return f(static_cast<const quant::block_q5_K_x16*>(w.data));
    case dtype::q6_k_x16: return f(static_cast<const quant::block_q6_K_x16*>(w.data));
    case dtype::q4_0_x16: return f(static_cast<const quant::block_q4_0_x16*>(w.data));
    case dtype::q4_1_x16: return f(static_cast<const quant::block_q4_1_x16*>(w.data));
    case dtype::q5_0_x16: return f(static_cast<const quant::block_q5_0_x16*>(w.data));
    case dtype::q5_1_x16: return f(static_cast<const quant::block_q5_1_x16*>(w.data));
    case dtype::q8_0_x16: return f(static_cast<const quant::block_q8_0_x16*>(w.data));
    default: throw invalid_argument("cpu: weight type " + std::string(name_of(w.type)) + " is not an x16 layout");
  }
}

template <class B> struct activation_block { using type = quant::block_q8_K; };  // the k-quants
template <> struct activation_block<quant::block_q4_0> { using type = quant::block_q8_0; };
template <> struct activation_block<quant::block_q4_1> { using type = quant::block_q8_1; };
template <> struct activation_block<quant::block_q5_0> { using type = quant::block_q8_0; };
template <> struct activation_block<quant::block_q5_1> { using type = quant::block_q8_1; };
template <> struct activation_block<quant::block_q8_0> { using type = quant::block_q8_0; };

template <class B, class A>
float block_dot(const B* w, const A* a, std::size_t n, bool reference) {
  if constexpr (std::is_same_v<A, quant::block_q8_K>) {
    return reference ? quant::ref::vec_dot(w, a, n) : quant::vec_dot(w, a, n);
  } else {
    return reference ? quant::ref::dot(w, a, n) : quant::dot(w, a, n);
  }
}

/// Prefill's blocking for the 16-row panel kernels (legacy and k-quant):
/// threads split the panels; a tile of panels (about 256 KiB packed, in L2)
/// is packed once, then meets every tile of tokens (about 256 KiB of
/// activations, in L2) a group at a time, so packing is 1 / n_tokens of the
/// integer work. pack(p, dst) packs panel p's nb blocks into dst; run(src,
/// p, t0, nt) runs packed panel p against tokens [t0, t0 + nt).
/// per_thread(), when given, runs at the start of each thread's share and
/// its result lives until the share ends (the AMX tiles' configuration).
struct no_thread_state {
  int operator()() const noexcept { return 0; }
};

template <class Packed, class Pack, class Run, class PerThread = no_thread_state>
inline void packed_panel_tiles(std::size_t n_panels, std::size_t nb, std::size_t token_bytes, std::size_t group,
                               std::size_t n_tokens, std::size_t work, thread_pool* pool, Pack&& pack, Run&& run,
                               PerThread&& per_thread = {}) {
  const std::size_t r_tile = std::max<std::size_t>(1, 256 * 1024 / (nb * sizeof(Packed)));
  const std::size_t t_tile = std::max(group, (256 * 1024 / (nb * token_bytes)) / group * group);
  parallel_for(pool, n_panels, [&](std::size_t p0, std::size_t p1) {
    [[maybe_unused]] const auto state = per_thread();
    thread_local std::vector<Packed> packed;  // (r_tile, nb); grown, never shrunk
    if (packed.size() < r_tile * nb) packed.resize(r_tile * nb);
    for (std::size_t rp = p0; rp < p1; rp += r_tile) {
      const std::size_t re = std::min(p1, rp + r_tile);
      for (std::size_t p = rp; p < re; ++p) pack(p, packed.data() + (p - rp) * nb);
      for (std::size_t t0 = 0; t0 < n_tokens; t0 += t_tile) {
        const std::size_t nt = std::min(t_tile, n_tokens - t0);
        for (std::size_t p = rp; p < re; ++p) run(packed.data() + (p - rp) * nb, p, t0, nt);
      }
    }
  }, work);
}

#if defined(__AVX512F__)
/// silu(g) * u for 16 lanes, as swiglu computes it (swiglu_batch): the
/// epilogue of prefill's fused gate and up products (quantized_swiglu). A
/// function object, so that the kernels inline it (passed as a function,
/// GCC left calls to it in the pair kernels).
struct swiglu_lanes_fn {
  __m512 operator()(__m512 g, __m512 u) const noexcept {
    return static_cast<__m512>(swiglu_batch(simd::fbatch(g), simd::fbatch(u)));
  }
};
inline constexpr swiglu_lanes_fn swiglu_lanes{};
#endif

#if defined(KESTREL_AMX)
/// The walk of both AMX prefill kernels (legacy_panels_amx,
/// kquant_tiles): the call's tokens packed once into tiles of 16, Act
/// blocks, nb per tile (pack_tokens(k, dst): tile k; the threads split
/// them), then packed_panel_tiles over n_panels panels packed as Packed
/// blocks (pack_panel(p, dst)), each thread with the tiles configured for
/// its share (tiles_on()), run(src, p, acts, k0, k1) taking panel p against
/// token tiles [k0, k1). work: multiply-adds of the call. panel_blocks:
/// Packed blocks per packed panel, nb unless a panel packs several
/// matrices' rows (0: nb).
template <class Act, class Packed, class PackTokens, class PackPanel, class Run, class TilesOn>
inline void amx_prefill(std::size_t n_panels, std::size_t nb, std::size_t n_tokens, std::size_t work, thread_pool* pool,
                        PackTokens&& pack_tokens, PackPanel&& pack_panel, Run&& run, TilesOn&& tiles_on,
                        std::size_t panel_blocks = 0) {
  namespace am = quant::detail::amx;
  const std::size_t n_tiles = (n_tokens + am::token_tile - 1) / am::token_tile;
  thread_local std::vector<Act> acts;  // (n_tiles, nb); grown, never shrunk
  if (acts.size() < n_tiles * nb) acts.resize(n_tiles * nb);
  Act* const x = acts.data();
  parallel_for(pool, n_tiles, [&](std::size_t k0, std::size_t k1) {
    for (std::size_t k = k0; k < k1; ++k) pack_tokens(k, x + k * nb);
  }, work / (16 * n_panels));  // about the tokens' values: one operation each
  packed_panel_tiles<Packed>(
      n_panels, panel_blocks ? panel_blocks : nb, sizeof(Act) / am::token_tile, am::token_tile, n_tokens, work, pool,
      pack_panel,
      [&](const Packed* src, std::size_t p, std::size_t t0, std::size_t nt) {
        run(src, p, static_cast<const Act*>(x), t0 / am::token_tile, (t0 + nt + am::token_tile - 1) / am::token_tile);
      },
      tiles_on);
}
#endif

#if defined(KESTREL_LEGACY_AMX)
/// The legacy types' prefill on AMX tiles (quant/legacy_amx.hpp), more
/// than lp::token_group tokens where amx_enabled(), through amx_prefill.
/// Every output equals the VNNI panels' and ref::dot_fused's bit for bit.
template <class B, class A>
inline void legacy_panels_amx(const std::byte* base, std::size_t row_bytes, std::size_t rows, const A* a,
                              std::size_t nb, std::size_t n_tokens, float* y, thread_pool* pool) {
  namespace am = quant::detail::amx;
  const std::size_t n_panels = (rows + am::panel_rows - 1) / am::panel_rows;
  auto panel_rows = [&](std::size_t p) { return std::min(am::panel_rows, rows - p * am::panel_rows); };
  amx_prefill<am::act_block, am::amx_block>(
      n_panels, nb, n_tokens, n_tokens * rows * nb * 32, pool,
      [&](std::size_t k, am::act_block* dst) { am::pack_acts(a, n_tokens, nb, k, dst); },
      [&](std::size_t p, am::amx_block* dst) {
        am::pack_panel<B>(base + p * am::panel_rows * row_bytes, row_bytes, panel_rows(p), nb, dst);
      },
      [&](const am::amx_block* src, std::size_t p, const am::act_block* x, std::size_t k0, std::size_t k1) {
        am::panel_tiles<B>(src, panel_rows(p), x, nb, k0, k1, n_tokens, y + p * am::panel_rows, rows);
      },
      [] { return am::tiles_on(32, 8); });
}

/// h = silu(X gate^T) * (X up^T) (n_tokens, rows) for two matrices of the
/// same legacy type and shape on AMX tiles: a panel packs gate's 16 rows
/// then up's, and each token tile's two results meet in registers
/// (amx::panel_tiles_pair, swiglu_lanes), so neither product is written out
/// and read back. Every output equals legacy_panels_amx of each matrix and
/// then swiglu, bit for bit.
template <class B, class A>
inline void legacy_swiglu_amx(const std::byte* gate, const std::byte* up, std::size_t row_bytes, std::size_t rows,
                              const A* a, std::size_t nb, std::size_t n_tokens, float* h, thread_pool* pool) {
  namespace am = quant::detail::amx;
  const std::size_t n_panels = (rows + am::panel_rows - 1) / am::panel_rows;
  auto panel_rows = [&](std::size_t p) { return std::min(am::panel_rows, rows - p * am::panel_rows); };
  amx_prefill<am::act_block, am::amx_block>(
      n_panels, nb, n_tokens, 2 * n_tokens * rows * nb * 32, pool,
      [&](std::size_t k, am::act_block* dst) { am::pack_acts(a, n_tokens, nb, k, dst); },
      [&](std::size_t p, am::amx_block* dst) {
        const std::size_t at = p * am::panel_rows * row_bytes;
        am::pack_panel<B>(gate + at, row_bytes, panel_rows(p), nb, dst);
        am::pack_panel<B>(up + at, row_bytes, panel_rows(p), nb, dst + nb);
      },
      [&](const am::amx_block* src, std::size_t p, const am::act_block* x, std::size_t k0, std::size_t k1) {
        am::panel_tiles_pair<B>(src, src + nb, panel_rows(p), x, nb, k0, k1, n_tokens, h + p * am::panel_rows, rows,
                                swiglu_lanes);
      },
      [] { return am::tiles_on(32, 8); }, 2 * nb);
}
#endif

#if defined(KESTREL_LEGACY_PANEL)
/// The VNNI panels' per-token block terms (quant::make_token_aux) of
/// n_tokens tokens' activations, nb blocks each, in the calling thread's
/// buffer (grown, never shrunk; valid until its next call). The threads
/// split the tokens: serial, it held one core for about 3% of a 110M q8_0
/// prefill while the others waited (perf, 2 threads). On 2 threads the
/// split measured level: prefill time 0.995 [0.969, 1.022] (110M q8_0),
/// 0.993 [0.979, 1.003] (TinyLlama q4_0), bench/ab_decode.sh --prefill 512;
/// the serial share grows with the thread count. Decode's single token
/// stays inline (the work hint).
template <class B, class A>
inline const quant::token_aux* legacy_token_aux(const A* a, std::size_t n_tokens, std::size_t nb, thread_pool* pool) {
  thread_local std::vector<quant::token_aux> aux;
  if (aux.size() < n_tokens * nb) aux.resize(n_tokens * nb);
  quant::token_aux* const out = aux.data();
  parallel_for(pool, n_tokens, [&](std::size_t t0, std::size_t t1) {
    for (std::size_t t = t0; t < t1; ++t) quant::make_token_aux<B>(a + t * nb, out + t * nb, nb);
  }, 2 * n_tokens * nb * 32);
  return out;
}

/// The legacy types' fast path (AVX-512 VNNI): panels of 16 rows against
/// groups of 8 tokens (quant/legacy_tokens.hpp), every output equal bit for
/// bit to quant::ref::dot_fused of its row and token, so to what any other
/// tiling, token count or thread count gives. Threads split the panels.
/// - Up to 8 tokens: each weight block is gathered straight from the rows
///   once per call, no packing pass.
/// - More tokens (prefill): packed_panel_tiles.
template <class B, class A>
inline void legacy_panels(const std::byte* base, std::size_t row_bytes, std::size_t rows, const A* a, std::size_t nb,
                          std::size_t n_tokens, float* y, thread_pool* pool) {
  namespace lp = quant::detail::lp;
#if defined(KESTREL_LEGACY_AMX)
  if (n_tokens > lp::token_group && quant::amx_enabled())
    return legacy_panels_amx<B>(base, row_bytes, rows, a, nb, n_tokens, y, pool);
#endif
  const quant::token_aux* ax = legacy_token_aux<B>(a, n_tokens, nb, pool);
  const std::size_t n_panels = (rows + lp::panel_rows - 1) / lp::panel_rows;
  auto panel_rows = [&](std::size_t p) { return std::min(lp::panel_rows, rows - p * lp::panel_rows); };
  auto panel_base = [&](std::size_t p) { return base + p * lp::panel_rows * row_bytes; };
  const std::size_t work = n_tokens * rows * nb * 32;
  if (n_tokens <= lp::token_group) {
    parallel_for(pool, n_panels, [&](std::size_t p0, std::size_t p1) {
      for (std::size_t p = p0; p < p1; ++p)
        lp::panel_gathered<B>(panel_base(p), row_bytes, panel_rows(p), a, ax, nb, n_tokens, y + p * lp::panel_rows,
                              rows);
    }, work);
    return;
  }
  packed_panel_tiles<lp::panel_block>(
      n_panels, nb, sizeof(A) + sizeof(quant::token_aux), lp::token_group, n_tokens, work, pool,
      [&](std::size_t p, lp::panel_block* dst) { lp::pack_panel<B>(panel_base(p), row_bytes, panel_rows(p), nb, dst); },
      [&](const lp::panel_block* src, std::size_t p, std::size_t t0, std::size_t nt) {
        lp::panel_packed<B>(src, panel_rows(p), a + t0 * nb, ax + t0 * nb, nb, nt, y + t0 * rows + p * lp::panel_rows,
                            rows);
      });
}

/// h = silu(X gate^T) * (X up^T) (n_tokens > lp::token_group, rows x nb
/// blocks each): on AMX tiles where usable (legacy_swiglu_amx), else
/// legacy_panels' packed walk with a panel packing gate's 16 rows then up's
/// and each token group's two results combined in registers
/// (lp::panel_packed_pair). The same bits as legacy_panels of each, then
/// swiglu.
template <class B, class A>
inline void legacy_swiglu_panels(const std::byte* gate, const std::byte* up, std::size_t row_bytes, std::size_t rows,
                                 const A* a, std::size_t nb, std::size_t n_tokens, float* h, thread_pool* pool) {
  namespace lp = quant::detail::lp;
#if defined(KESTREL_LEGACY_AMX)
  if (quant::amx_enabled()) return legacy_swiglu_amx<B>(gate, up, row_bytes, rows, a, nb, n_tokens, h, pool);
#endif
  const quant::token_aux* ax = legacy_token_aux<B>(a, n_tokens, nb, pool);
  const std::size_t n_panels = (rows + lp::panel_rows - 1) / lp::panel_rows;
  auto panel_rows = [&](std::size_t p) { return std::min(lp::panel_rows, rows - p * lp::panel_rows); };
  packed_panel_tiles<lp::panel_block>(
      n_panels, 2 * nb, sizeof(A) + sizeof(quant::token_aux), lp::token_group, n_tokens, 2 * n_tokens * rows * nb * 32,
      pool,
      [&](std::size_t p, lp::panel_block* dst) {
        const std::size_t at = p * lp::panel_rows * row_bytes;
        lp::pack_panel<B>(gate + at, row_bytes, panel_rows(p), nb, dst);
        lp::pack_panel<B>(up + at, row_bytes, panel_rows(p), nb, dst + nb);
      },
      [&](const lp::panel_block* src, std::size_t p, std::size_t t0, std::size_t nt) {
        lp::panel_packed_pair<B>(src, src + nb, panel_rows(p), a + t0 * nb, ax + t0 * nb, nb, nt,
                                 h + t0 * rows + p * lp::panel_rows, rows, swiglu_lanes);
      });
}
#endif

#if defined(KESTREL_LEGACY_TILES_AVX2)
/// The legacy types' prefill without AVX-512 VNNI (AVX2): register tiles of
/// tile_rows_avx2 rows x tile_tokens_avx2 tokens (quant/legacy_tiles_avx2.hpp),
/// each output independent of the tiling. Threads split row pairs; a thread
/// takes a tile of tokens at a time (about 192 KiB of activation blocks and
/// aux, in L2) and passes its rows over it, each row pair (in L1) against
/// every tile_tokens_avx2 tokens of it.
template <class B, class A>
inline void legacy_tiles_avx2(const std::byte* base, std::size_t row_bytes, std::size_t rows, const A* a,
                              std::size_t nb, std::size_t n_tokens, float* y, thread_pool* pool) {
  thread_local std::vector<quant::token_aux> aux;  // (n_tokens, nb); grown, never shrunk
  thread_local std::vector<quant::act_pair> pairs;  // (n_tokens, nb / 2), the _0 types
  const std::size_t np = quant::pairs_avx2<B> ? nb / 2 : 0;
  if (aux.size() < n_tokens * nb) aux.resize(n_tokens * nb);
  if (pairs.size() < n_tokens * np) pairs.resize(n_tokens * np);
  // The one-block step reads aux for every block, or with pairs only for
  // an odd last block.
  const std::size_t first = 2 * np;
  for (std::size_t t = 0; t < n_tokens; ++t) {
    quant::make_token_aux<B>(a + t * nb + first, aux.data() + t * nb + first, nb - first);
    if (np) quant::make_act_pairs<B>(a + t * nb, pairs.data() + t * np, nb);
  }
  const quant::token_aux* ax = aux.data();
  const quant::act_pair* ap = pairs.data();
  constexpr std::size_t R = quant::tile_rows_avx2, T = quant::tile_tokens_avx2;
  const std::size_t token_bytes = nb * (sizeof(A) + sizeof(quant::token_aux)) + np * sizeof(quant::act_pair);
  const std::size_t t_tile = std::max(T, 192 * 1024 / token_bytes / T * T);
  parallel_for(pool, (rows + R - 1) / R, [&](std::size_t p0, std::size_t p1) {
    for (std::size_t t0 = 0; t0 < n_tokens; t0 += t_tile) {
      const std::size_t t1 = std::min(n_tokens, t0 + t_tile);
      for (std::size_t p = p0; p < p1; ++p) {
        const std::size_t r = p * R, nr = std::min(R, rows - r);
        for (std::size_t t = t0; t < t1; t += T)
          quant::dot_tile_avx2<B>(base + r * row_bytes, row_bytes, nr, a + t * nb, ax + t * nb, ap + t * np, nb,
                                  std::min(T, t1 - t), y + t * rows + r, rows);
      }
    }
  }, n_tokens * rows * nb * 32);
}
#endif

/// The k-quants' decode (one token, row-major blocks): each thread's rows
/// as two streams, rows j and half + j side by side (as the legacy decode
/// kernels pair them), each row software-prefetched whole about 1 KiB ahead
/// of its stream; each row is quant::vec_dot, the bits vec_dot_tokens gives
/// a token alone. Measured on Zen 2 (kestrel-bench, 110M Q4_K_M tg128, 2
/// threads, 3 alternated rounds): 223-226 t/s through the blocked loop below
/// (one stream per thread, no prefetch), 250-253 here.
template <class B>
inline void kquant_decode_rows(const std::byte* base, std::size_t row_bytes, std::size_t rows,
                               const quant::block_q8_K* a, std::size_t cols, float* y, thread_pool* pool) {
  constexpr std::size_t prefetch_bytes = 1024;
  const std::size_t ahead = (prefetch_bytes + row_bytes - 1) / row_bytes;  // rows
  parallel_for(pool, rows, [&](std::size_t r0, std::size_t r1) {
    auto row = [&](std::size_t r) { return reinterpret_cast<const B*>(base + r * row_bytes); };
    auto prefetch = [&](std::size_t r) {
      if (r < r1) prefetch_elements(base + r * row_bytes, row_bytes);
    };
    const std::size_t half = (r1 - r0) / 2;
    for (std::size_t j = 0; j < half; ++j) {
      prefetch(r0 + j + ahead);
      prefetch(r0 + half + j + ahead);
      y[r0 + j] = quant::vec_dot(row(r0 + j), a, cols);
      y[r0 + half + j] = quant::vec_dot(row(r0 + half + j), a, cols);
    }
    if ((r1 - r0) % 2) y[r1 - 1] = quant::vec_dot(row(r1 - 1), a, cols);
  }, rows * cols);
}

#if defined(KESTREL_KQUANT_AMX)
/// Panel p of a k-quant matrix as B tiles, nb blocks at dst: packed as the
/// VNNI panels (pack(p, blocks)) into the calling thread's scratch, then
/// each block turned into its tiles' layout (amx::pack_kamx).
template <class B, class Pack>
inline void pack_kamx_panel(Pack&& pack, std::size_t p, std::size_t nb, quant::detail::amx::kamx_block* dst) {
  thread_local std::vector<quant::detail::kp::kpanel_block> blocks;  // (nb); grown, never shrunk
  if (blocks.size() < nb) blocks.resize(nb);
  pack(p, blocks.data());
  for (std::size_t b = 0; b < nb; ++b) quant::detail::amx::pack_kamx<B>(blocks[b], dst[b]);
}

/// kpanel_prefill on AMX tiles (quant/kquant_amx.hpp) for q2_K, q4_K and
/// q5_K: the tokens packed once per call into tiles of 16 (the threads
/// split them), then packed_panel_tiles over panels packed as the VNNI
/// blocks (pack) and turned into B tiles, each thread with the tiles
/// configured for its share. Every output equals the VNNI panels' bit for bit.
template <class B, class Pack>
inline void kquant_tiles(std::size_t rows, const quant::block_q8_K* a, std::size_t nb, std::size_t n_tokens, float* y,
                         thread_pool* pool, Pack&& pack) {
  namespace am = quant::detail::amx;
  namespace kp = quant::detail::kp;
  const std::size_t n_panels = (rows + kp::panel_rows - 1) / kp::panel_rows;
  auto panel_rows = [&](std::size_t p) { return std::min(kp::panel_rows, rows - p * kp::panel_rows); };
  amx_prefill<am::kact_block, am::kamx_block>(
      n_panels, nb, n_tokens, n_tokens * rows * nb * quant::qk_k, pool,
      [&](std::size_t k, am::kact_block* dst) { am::pack_kacts<B>(a, n_tokens, nb, k, dst); },
      [&](std::size_t p, am::kamx_block* dst) { pack_kamx_panel<B>(pack, p, nb, dst); },
      [&](const am::kamx_block* src, std::size_t p, const am::kact_block* x, std::size_t k0, std::size_t k1) {
        am::kpanel_tiles<B>(src, panel_rows(p), x, nb, k0, k1, n_tokens, y + p * kp::panel_rows, rows);
      },
      [] { return am::tiles_on(am::k_tile_bytes, am::k_tile_rows); });
}

/// h = silu(X gate^T) * (X up^T) for two matrices of the same k-quant type
/// and shape on AMX tiles (legacy_swiglu_amx's k-quant twin): a panel packs
/// gate's 16 rows (pack_gate(p, blocks)) then up's (pack_up), and each token
/// tile's two results meet in registers (amx::kpanel_tiles_pair). Every
/// output equals kquant_tiles of each matrix and then swiglu, bit for bit.
template <class B, class PackGate, class PackUp>
inline void kquant_swiglu_tiles(std::size_t rows, const quant::block_q8_K* a, std::size_t nb, std::size_t n_tokens,
                                float* h, thread_pool* pool, PackGate&& pack_gate, PackUp&& pack_up) {
  namespace am = quant::detail::amx;
  namespace kp = quant::detail::kp;
  const std::size_t n_panels = (rows + kp::panel_rows - 1) / kp::panel_rows;
  auto panel_rows = [&](std::size_t p) { return std::min(kp::panel_rows, rows - p * kp::panel_rows); };
  amx_prefill<am::kact_block, am::kamx_block>(
      n_panels, nb, n_tokens, 2 * n_tokens * rows * nb * quant::qk_k, pool,
      [&](std::size_t k, am::kact_block* dst) { am::pack_kacts<B>(a, n_tokens, nb, k, dst); },
      [&](std::size_t p, am::kamx_block* dst) {
        pack_kamx_panel<B>(pack_gate, p, nb, dst);
        pack_kamx_panel<B>(pack_up, p, nb, dst + nb);
      },
      [&](const am::kamx_block* src, std::size_t p, const am::kact_block* x, std::size_t k0, std::size_t k1) {
        am::kpanel_tiles_pair<B>(src, src + nb, panel_rows(p), x, nb, k0, k1, n_tokens, h + p * kp::panel_rows, rows,
                                 swiglu_lanes);
      },
      [] { return am::tiles_on(am::k_tile_bytes, am::k_tile_rows); }, 2 * nb);
}
#endif

#if defined(KESTREL_KQUANT_PANEL)
/// The k-quants' prefill (AVX-512 VNNI, at least quant::kpanel_min_tokens<B>
/// tokens): 16-row panels packed once per call (quant/kquant_panels.hpp;
/// pack(p, dst) packs panel p, from a row-major or an x16 matrix) blocked
/// by packed_panel_tiles, against groups of 4 tokens. A token's outputs do
/// not depend on the other tokens of the call. Where AMX is usable, q2_K,
/// q4_K and q5_K go to kquant_tiles instead (the same bits).
template <class B, class Pack>
inline void kpanel_prefill(std::size_t rows, const quant::block_q8_K* a, std::size_t nb, std::size_t n_tokens,
                           float* y, thread_pool* pool, Pack&& pack) {
  namespace kp = quant::detail::kp;
#if defined(KESTREL_KQUANT_AMX)
  if constexpr (quant::kquant_on_tiles<B>)
    if (quant::amx_enabled()) return kquant_tiles<B>(rows, a, nb, n_tokens, y, pool, pack);
#endif
  const std::size_t n_panels = (rows + kp::panel_rows - 1) / kp::panel_rows;
  auto panel_rows = [&](std::size_t p) { return std::min(kp::panel_rows, rows - p * kp::panel_rows); };
  const std::size_t work = n_tokens * rows * nb * quant::qk_k;
  packed_panel_tiles<kp::kpanel_block>(
      n_panels, nb, sizeof(quant::block_q8_K), kp::token_group, n_tokens, work, pool, pack,
      [&](const kp::kpanel_block* src, std::size_t p, std::size_t t0, std::size_t nt) {
        kp::kpanel_tokens<B>(src, panel_rows(p), a + t0 * nb, nb, nt, y + t0 * rows + p * kp::panel_rows, rows);
      });
}

/// kpanel_prefill of a row-major matrix.
template <class B>
inline void kquant_panels(const std::byte* base, std::size_t row_bytes, std::size_t rows, const quant::block_q8_K* a,
                          std::size_t nb, std::size_t n_tokens, float* y, thread_pool* pool) {
  namespace kp = quant::detail::kp;
  kpanel_prefill<B>(rows, a, nb, n_tokens, y, pool, [&](std::size_t p, kp::kpanel_block* dst) {
    kp::pack_kpanel<B>(base + p * kp::panel_rows * row_bytes, row_bytes,
                       std::min(kp::panel_rows, rows - p * kp::panel_rows), nb, dst);
  });
}
#endif

/// The n_tokens rows of x (cols values each) quantized to A blocks, once
/// per call, into a per-thread buffer that is grown, never shrunk (decode
/// reuses it every step); valid until the thread's next call.
template <class A>
inline const A* quantize_activations(const float* x, std::size_t n_tokens, std::size_t cols, thread_pool* pool,
                                     bool reference) {
  constexpr std::size_t qk = sizeof(A) == sizeof(quant::block_q8_K) ? 256 : 32;
  const std::size_t nb = cols / qk;
  thread_local std::vector<A> act;
  if (act.size() < n_tokens * nb) act.resize(n_tokens * nb);
  A* const acts = act.data();
  if (reference) {
    for (std::size_t t = 0; t < n_tokens; ++t) quant::quantize_row(x + t * cols, acts + t * nb, cols);
  } else {
    // Bit-identical to quantize_row (quant/quantize_acts.hpp); prefill's
    // tokens are split across threads (the work hint: ~4 operations per
    // value).
    parallel_for(pool, n_tokens, [&](std::size_t t0, std::size_t t1) {
      for (std::size_t t = t0; t < t1; ++t) quant::quantize_acts(x + t * cols, acts + t * nb, cols);
    }, 4 * n_tokens * cols);
  }
  return acts;
}

/// Panels per unit of decode's split of an interleaved matrix between
/// threads (x16_walk; matvec_fused and matvec_swiglu's row blocks,
/// cpu/matvec.hpp): a pair, so that no chunk is left an odd panel to read
/// alone. With single panels the guided chunks (thread_pool::chunk_begin)
/// of a 768-row matrix were 12 12 6 6 3 3 1 2 1 2 panels, and the odd
/// panels went through the one-stream path: 8.6% of the samples of a 110M
/// q4_K decode harness (perf, Zen 3).
inline constexpr std::size_t decode_panels = 2;

/// The x16 layouts' walk over a matrix of rows rows (panels of 16): threads
/// split the panels; tokens(p, n_rows, out) computes panel p's n_rows rows
/// for every token into out = y + 16 p (token t's at t * rows). With pairs
/// and one token, threads split the whole panels in pairs (decode_panels),
/// and each chunk's panels go two halves side by side: pairs(p, half, out)
/// computes panels p + j and p + half + j, j < half, into out[16 j + r] and
/// out[16 (half + j) + r] (two streams through memory for decode; AVX-512's
/// x16_pairs walks a chunk's panels four or eight at a time instead, into
/// the same places); a last odd or partial panel goes to tokens.
template <class Tokens, class Pairs = std::nullptr_t>
inline void x16_walk(std::size_t rows, std::size_t n_tokens, thread_pool* pool, std::size_t work, float* y,
                     Tokens&& tokens, Pairs&& pairs = nullptr) {
  const std::size_t n_panels = (rows + 15) / 16;
  if constexpr (!std::is_same_v<std::remove_cvref_t<Pairs>, std::nullptr_t>) {
    if (n_tokens == 1) {
      // Units: the whole pairs of panels, then each panel left over.
      static_assert(decode_panels == 2);
      const std::size_t n_pairs = rows / 16 / 2;
      parallel_for(pool, n_pairs + (n_panels - 2 * n_pairs), [&](std::size_t u0, std::size_t u1) {
        const std::size_t pu1 = std::min(u1, n_pairs);
        if (u0 < pu1) pairs(2 * u0, pu1 - u0, y + 32 * u0);
        for (std::size_t u = std::max(u0, n_pairs); u < u1; ++u) {
          const std::size_t p = n_pairs + u;  // = 2 n_pairs + (u - n_pairs)
          tokens(p, std::min<std::size_t>(16, rows - 16 * p), y + 16 * p);
        }
      }, work);
      return;
    }
  }
  parallel_for(pool, n_panels, [&](std::size_t p0, std::size_t p1) {
    for (std::size_t p = p0; p < p1; ++p) tokens(p, std::min<std::size_t>(16, rows - 16 * p), y + 16 * p);
  }, work);
}

/// The scalar twins' walk over an x16 layout: y[t * rows + 16 p + r] =
/// dot(p, r, t) for row r of panel p and token t.
template <class Dot>
inline void x16_twin(std::size_t rows, std::size_t n_tokens, thread_pool* pool, std::size_t work, float* y, Dot&& dot) {
  x16_walk(rows, n_tokens, pool, work, y, [&](std::size_t p, std::size_t n_rows, float* out) {
    for (std::size_t r = 0; r < n_rows; ++r)
      for (std::size_t t = 0; t < n_tokens; ++t) out[t * rows + r] = dot(p, r, t);
  });
}

#if defined(KESTREL_LEGACY_X16_AVX2)
/// The starts the legacy x16 kernel adds for layout X (-o times the codes'
/// sum, o = quant::detail::q40x16::x16_offset<X>) of the n activation
/// blocks at a, into a per-thread buffer grown, never shrunk; valid until
/// the thread's next call. nullptr where o = 0 (the _1 types, q8_0), whose
/// kernel reads none.
template <class X, class B = typename quant::x16_source<X>::type>
inline const std::int32_t* legacy_block_starts(const quant::activation_of_t<B>* a, std::size_t n) {
  if constexpr (quant::detail::q40x16::x16_offset<X> == 0) {
    return nullptr;
  } else {
    static_assert(quant::detail::q40x16::x16_offset<X> == quant::code_offset<B>);  // block_start's offset
    thread_local std::vector<std::int32_t> start;
    if (start.size() < n) start.resize(n);
    for (std::size_t i = 0; i < n; ++i) start[i] = quant::block_start<B>(a[i]);
    return start.data();
  }
}

/// Y = X W^T for row-major q4_0 W (a matrix read in place from the file,
/// weight_placement::file) past decode_max_tokens tokens, through the
/// q4_0_x16 kernel over panels packed per call (quant/legacy_x16_avx2.hpp):
/// threads split the panels, each packs its panel (nb x 288 bytes, in L1 /
/// L2) and runs every token against it.
inline void q4_0_packed_linear(const std::byte* base, std::size_t row_bytes, std::size_t rows,
                               const quant::block_q8_0* a, std::size_t nb, std::size_t n_tokens, float* y,
                               thread_pool* pool) {
  namespace qx = quant::detail::q40x16;
  const std::int32_t* bs = legacy_block_starts<quant::block_q4_0_x16>(a, n_tokens * nb);
  x16_walk(rows, n_tokens, pool, n_tokens * rows * nb * 32, y, [&](std::size_t p, std::size_t n_rows, float* out) {
    thread_local std::vector<quant::block_q4_0_x16> panel;  // grown, never shrunk
    if (panel.size() < nb) panel.resize(nb);
    quant::pack_x16(base + 16 * p * row_bytes, row_bytes, n_rows, nb, panel.data());
    qx::tokens(panel.data(), n_rows, a, bs, nb, n_tokens, out, rows);
  });
}
#endif

/// Y(n_tokens, rows) = X W^T with W in q4_0_x16, q4_1_x16, q5_0_x16,
/// q5_1_x16 or q8_0_x16 (X, quant/legacy_x16.hpp), the layouts cpu_backend gives those
/// types' matrices with AVX2 and without AVX-512 VNNI: threads split the
/// panels; the kernel of quant/legacy_x16_avx2.hpp
/// takes every call, decode two panels at a time, more tokens in groups of
/// 4, the same instructions per (row, token) either way, so a token's
/// outputs do not depend on the tokens beside it. Without it, and for the
/// reference, the scalar twin per (row, token).
template <class X>
inline void legacy_x16_linear(const weight_view& w, const float* x, std::size_t n_tokens, float* y,
                              thread_pool* pool, bool reference, const void* acts = nullptr) {
  using B = typename quant::x16_source<X>::type;
  using A = quant::activation_of_t<B>;
  static_assert(std::is_same_v<A, typename activation_block<B>::type>);  // what quantize_for gives (visit_activation)
  const std::size_t cols = w.cols, rows = w.rows, nb = cols / 32;
  if (nb == 0) {
    std::fill(y, y + n_tokens * rows, 0.0f);
    return;
  }
  const A* const a = acts ? static_cast<const A*>(acts) : quantize_activations<A>(x, n_tokens, cols, pool, reference);
  const auto* const panels = static_cast<const X*>(w.data);
  const std::size_t work = n_tokens * rows * cols;
#if defined(KESTREL_LEGACY_X16_AVX2)
  if (!reference) {
    namespace qx = quant::detail::q40x16;
    const std::int32_t* bs = legacy_block_starts<X>(a, n_tokens * nb);
    x16_walk(
        rows, n_tokens, pool, work, y,
        [&](std::size_t p, std::size_t n_rows, float* out) {
          qx::tokens(panels + p * nb, n_rows, a, bs, nb, n_tokens, out, rows);
        },
        [&](std::size_t p, std::size_t half, float* out) { qx::pairs(panels + p * nb, half, a, bs, nb, out); });
    return;
  }
#endif
  x16_twin(rows, n_tokens, pool, work, y, [&](std::size_t p, std::size_t r, std::size_t t) {
    return quant::ref::dot_x16(panels + p * nb, r, a + t * nb, cols);
  });
}

/// Y(n_tokens, rows) = X W^T with W in a k-quant x16 layout (X,
/// quant/kquant_x16.hpp; q2_K, q3_K and q5_K have their kernel with AVX2
/// alone, x16_kernel):
/// threads split the panels. With AVX-512 VNNI, calls of at least
/// quant::kpanel_min_tokens tokens (prefill) take the prefill panels of the
/// row-major type (quant/kquant_panels.hpp), packed from the x16 panels: the
/// same bits as the row-major type's prefill, and 4-8% faster than the x16
/// kernel on 512 tokens (kestrel-bench pp512, Q4_K_M, 110M and TinyLlama
/// shapes). Shorter calls (decode and short prompts, at most 31 tokens: no
/// cache tiling, which only pays for prefill's hundreds) take the x16
/// kernel, each panel against all the tokens, 4 at a time. With AVX2 and no
/// VNNI the AVX2 x16 kernel takes every call (quant/kquant_x16_avx2.hpp):
/// decode two panels at a time, prefill in token groups of 4. Without
/// either, and for the reference, the scalar twin per (row, token).
template <class X>
inline void x16_linear(const weight_view& w, const float* x, std::size_t n_tokens, float* y, thread_pool* pool,
                       bool reference, const void* acts = nullptr) {
  const std::size_t cols = w.cols, rows = w.rows, nb = cols / quant::qk_k;
  if (nb == 0) {
    std::fill(y, y + n_tokens * rows, 0.0f);
    return;
  }
  const auto* const a = acts ? static_cast<const quant::block_q8_K*>(acts)
                             : quantize_activations<quant::block_q8_K>(x, n_tokens, cols, pool, reference);
  const auto* const panels = static_cast<const X*>(w.data);
  const std::size_t work = n_tokens * rows * cols;
  if constexpr (quant::x16_kernel<X>) {
#if defined(KESTREL_KQUANT_X16)
    using B = typename quant::x16_source<X>::type;
    if (!reference && n_tokens >= quant::kpanel_min_tokens<B>) {
      // Prefill: the row-major type's panels, packed from the x16 panels (the
      // same packed blocks, so the same bits as from the file's layout).
      kpanel_prefill<B>(rows, a, nb, n_tokens, y, pool, [&](std::size_t p, quant::detail::kp::kpanel_block* dst) {
        quant::detail::x16::pack_kpanel(panels + p * nb, nb, dst);
      });
      return;
    }
#endif
#if defined(KESTREL_X16_KERNEL)
    if (!reference) {
      auto tokens = [&](std::size_t p, std::size_t n_rows, float* out) {
        quant::detail::x16::x16_tokens(panels + p * nb, n_rows, a, nb, n_tokens, out, rows);
      };
#if defined(KESTREL_KQUANT_X16_AVX2)
      // Decode two panels at a time (quant/kquant_x16_avx2.hpp, x16_pairs), the same bits.
      x16_walk(rows, n_tokens, pool, work, y, tokens, [&](std::size_t p, std::size_t half, float* out) {
        quant::detail::x16::x16_pairs(panels + p * nb, half, a, nb, out);
      });
#else
      // Intel (row_streams::wide): decode walks four panels at a time (q6_K
      // eight; the rest four and two), each block's successor asked into L1
      // unit by unit (x16_pairs); elsewhere one panel at a time, as
      // x16_ahead_for chooses. The same bits either way.
      if (cpu::walks_wide(cpu::host_row_streams()))
        x16_walk(rows, n_tokens, pool, work, y, tokens, [&](std::size_t p, std::size_t half, float* out) {
          quant::detail::x16::x16_pairs(panels + p * nb, half, a, nb, out);
        });
      else
        x16_walk(rows, n_tokens, pool, work, y, tokens);
#endif
      return;
    }
#endif
  }
  x16_twin(rows, n_tokens, pool, work, y, [&](std::size_t p, std::size_t r, std::size_t t) {
    return quant::ref::vec_dot_x16(panels + p * nb, r, a + t * nb, cols);
  });
}

/// Calls f(std::type_identity<A>{}) with A the activation block type
/// (q8_0, q8_1 or q8_K) that quantized weight type t's kernels take.
template <class F>
decltype(auto) visit_activation(dtype t, F&& f) {
  const weight_view v{t, nullptr, 0, 0};
  if (panel_rows(t) > 1)
    return visit_x16(v, [&](const auto* panels) {
      using X = std::remove_cv_t<std::remove_pointer_t<decltype(panels)>>;
      return f(std::type_identity<typename activation_block<typename quant::x16_source<X>::type>::type>{});
    });
  return visit_quantized(v, [&](const auto* blocks) {
    using B = std::remove_cv_t<std::remove_pointer_t<decltype(blocks)>>;
    return f(std::type_identity<typename activation_block<B>::type>{});
  });
}

/// Whether quantized weight types a and b take the same activation blocks,
/// so one quantization of x serves both (quantize_for).
inline bool same_activations(dtype a, dtype b) {
  return visit_activation(a, [&]<class A>(std::type_identity<A>) {
    return visit_activation(b, [&]<class A2>(std::type_identity<A2>) { return std::is_same_v<A, A2>; });
  });
}

/// The n_tokens rows of x (w.cols values each) quantized as
/// quantized_linear(w, x, n_tokens, ...) would, into the calling thread's
/// buffer (quantize_activations; prefill's tokens split over pool): the
/// acts that quantized_linear then takes instead of quantizing x itself.
/// A parallel region of several products of one x (matvec_fused,
/// matvec_swiglu) quantizes it once on the calling thread, where each of
/// its chunks quantized it again (8-10 chunks a region on 2 threads);
/// prefill's products of one X (matmul_shared) once for all of them.
/// Valid until this thread's next quantization of the same block type.
inline const void* quantize_for(const weight_view& w, const float* x, std::size_t n_tokens = 1,
                                thread_pool* pool = nullptr) {
  if (w.cols % block_size(w.type) != 0) return nullptr;  // quantized_linear names the error
  return visit_activation(w.type, [&]<class A>(std::type_identity<A>) -> const void* {
    return quantize_activations<A>(x, n_tokens, w.cols, pool, /*reference=*/false);
  });
}

/// Y(n_tokens, rows) = X(n_tokens, cols) W^T with W block-quantized. acts:
/// null, or x already quantized by quantize_for(w, x, n_tokens).
inline void quantized_linear(const weight_view& w, const float* x, std::size_t n_tokens, float* y, thread_pool* pool,
                             bool reference, const void* acts = nullptr) {
  if (w.cols % block_size(w.type) != 0)
    throw invalid_argument("cpu: a " + std::string(name_of(w.type)) + " row of " + std::to_string(w.cols) +
                           " values is not a whole number of blocks");
  if (panel_rows(w.type) > 1)
    return visit_x16(w, [&](const auto* panels) {
      using X = std::remove_cv_t<std::remove_pointer_t<decltype(panels)>>;
      if constexpr (quant::legacy_x16_block<X>)
        legacy_x16_linear<X>(w, x, n_tokens, y, pool, reference, acts);
      else
        x16_linear<X>(w, x, n_tokens, y, pool, reference, acts);
    });
  visit_quantized(w, [&](const auto* blocks) {
    using B = std::remove_cv_t<std::remove_pointer_t<decltype(blocks)>>;
    using A = typename activation_block<B>::type;
    constexpr std::size_t qk = sizeof(A) == sizeof(quant::block_q8_K) ? 256 : 32;
    const std::size_t cols = w.cols, nb = cols / qk, row_bytes = w.row_bytes();
    if (nb == 0) {  // empty rows: every dot is 0 (and the tilings below divide by nb)
      std::fill(y, y + n_tokens * w.rows, 0.0f);
      return;
    }
    const A* a = acts ? static_cast<const A*>(acts) : quantize_activations<A>(x, n_tokens, cols, pool, reference);
    const auto* base = static_cast<const std::byte*>(w.data);
    if constexpr (std::is_same_v<A, quant::block_q8_K>) {
#if defined(KESTREL_KQUANT_PANEL)
      if (!reference && n_tokens >= quant::kpanel_min_tokens<B>) {
        kquant_panels<B>(base, row_bytes, w.rows, a, nb, n_tokens, y, pool);
        return;
      }
#endif
      if (!reference && n_tokens == 1) {
        kquant_decode_rows<B>(base, row_bytes, w.rows, a, cols, y, pool);
        return;
      }
      if (!reference) {
        // Blocked for the caches: a tile of tokens (about 256 KiB of q8_K
        // activations, in L2) meets a tile of rows (about 128 KiB of
        // weights, in L2) one group of vec_dot_group tokens at a time, so the
        // group's activations stay in L1 while the tile's rows stream past
        // and each weight block is unpacked once per group. Measured on Zen 4
        // (kestrel-bench-kquant, one thread, a loaded machine): token groups
        // are 1.3-2x faster than one dot per (row, token); the blocking adds
        // 0-24% (median 6%) over taking each row against every token, at 512
        // tokens x 5632 columns, where a row's sweep over all activations
        // (3.3 MB) no longer fits L2. (Measured before the panels above took
        // such calls on AVX-512 VNNI; this path now serves shorter calls and
        // builds without VNNI, not re-measured.)
        const std::size_t g = quant::vec_dot_group;
        const std::size_t t_tile = std::max(g, (256 * 1024 / (nb * sizeof(A))) / g * g);
        const std::size_t r_tile = std::max<std::size_t>(1, 128 * 1024 / row_bytes);
        parallel_for(pool, w.rows, [&](std::size_t r0, std::size_t r1) {
          for (std::size_t t0 = 0; t0 < n_tokens; t0 += t_tile) {
            const std::size_t t1 = std::min(n_tokens, t0 + t_tile);
            for (std::size_t rb = r0; rb < r1; rb += r_tile) {
              const std::size_t re = std::min(r1, rb + r_tile);
              for (std::size_t t = t0; t < t1; t += g) {
                const std::size_t nt = std::min(g, t1 - t);
                for (std::size_t r = rb; r < re; ++r)
                  quant::vec_dot_tokens(reinterpret_cast<const B*>(base + r * row_bytes), a + t * nb, cols, nt,
                                        y + t * w.rows + r, w.rows);
              }
            }
          }
        }, n_tokens * w.rows * cols);
        return;
      }
    }
#if defined(KESTREL_LEGACY_DECODE) || defined(KESTREL_LEGACY_DECODE_AVX2)
    if constexpr (!std::is_same_v<A, quant::block_q8_K>) {
      if (!reference && n_tokens <= quant::decode_max_tokens) {
        // Decode (up to decode_max_tokens tokens): every row streamed once
        // (quant/legacy_decode.hpp).
        thread_local quant::decode_acts<B> acts[quant::decode_max_tokens];
        const quant::decode_acts<B>* ap[quant::decode_max_tokens];
        for (std::size_t t = 0; t < n_tokens; ++t) {
          acts[t].prepare(a + t * nb, nb);
          ap[t] = &acts[t];
        }
        const row_streams plan = block_row_streams(w.huge_pages, w.from_memory);
        parallel_for(pool, w.rows, [&](std::size_t r0, std::size_t r1) {
          quant::dot_rows_decode<B>(base + r0 * row_bytes, row_bytes, r1 - r0, ap, n_tokens, y + r0, w.rows, plan);
        }, n_tokens * w.rows * cols);
        return;
      }
    }
#endif
#if defined(KESTREL_LEGACY_X16_AVX2)
    if constexpr (std::is_same_v<B, quant::block_q4_0>) {
      if (!reference) {  // prefill (past decode_max_tokens), every length
        q4_0_packed_linear(base, row_bytes, w.rows, a, nb, n_tokens, y, pool);
        return;
      }
    }
#endif
#if defined(KESTREL_LEGACY_PANEL)
    if constexpr (!std::is_same_v<A, quant::block_q8_K>) {
      if (!reference) {
        legacy_panels<B>(base, row_bytes, w.rows, a, nb, n_tokens, y, pool);
        return;
      }
    }
#elif defined(KESTREL_LEGACY_TILES_AVX2)
    if constexpr (!std::is_same_v<A, quant::block_q8_K>) {
      if (!reference) {
        legacy_tiles_avx2<B>(base, row_bytes, w.rows, a, nb, n_tokens, y, pool);
        return;
      }
    }
#endif
    parallel_for(pool, w.rows, [&](std::size_t r0, std::size_t r1) {
      for (std::size_t r = r0; r < r1; ++r) {
        const B* row = reinterpret_cast<const B*>(base + r * row_bytes);
        for (std::size_t t = 0; t < n_tokens; ++t) y[t * w.rows + r] = block_dot(row, a + t * nb, cols, reference);
      }
    }, n_tokens * w.rows * cols);
  });
}

#if defined(KESTREL_LEGACY_PANEL)
/// quantized_swiglu for the row-major legacy types: legacy_swiglu_panels
/// exactly where quantized_linear would take legacy_panels' packed walk
/// (or its AMX kernel) for each.
inline bool legacy_swiglu(const weight_view& gate, const weight_view& up, const float* x, std::size_t n_tokens,
                          float* h, thread_pool* pool) {
  if (panel_rows(gate.type) > 1 || n_tokens <= quant::detail::lp::token_group) return false;
#if defined(KESTREL_LEGACY_DECODE) || defined(KESTREL_LEGACY_DECODE_AVX2)
  if (n_tokens <= quant::decode_max_tokens) return false;
#endif
  return visit_quantized(gate, [&](const auto* blocks) {
    using B = std::remove_cv_t<std::remove_pointer_t<decltype(blocks)>>;
    using A = typename activation_block<B>::type;
    if constexpr (std::is_same_v<A, quant::block_q8_K>) {
      return false;
    } else {
      const std::size_t nb = gate.cols / 32;
      const A* a = quantize_activations<A>(x, n_tokens, gate.cols, pool, false);
      legacy_swiglu_panels<B>(static_cast<const std::byte*>(gate.data), static_cast<const std::byte*>(up.data),
                              gate.row_bytes(), gate.rows, a, nb, n_tokens, h, pool);
      return true;
    }
  });
}
#endif

#if defined(KESTREL_KQUANT_AMX)
/// quantized_swiglu for the k-quants on tiles (q2_K, q4_K, q5_K), row-major
/// or interleaved by 16 rows: kquant_swiglu_tiles exactly where
/// quantized_linear (kquant_panels) or x16_linear would take kquant_tiles
/// for each, the panels packed as those pack them.
inline bool kquant_swiglu(const weight_view& gate, const weight_view& up, const float* x, std::size_t n_tokens,
                          float* h, thread_pool* pool) {
  namespace kp = quant::detail::kp;
  const std::size_t rows = gate.rows, nb = gate.cols / quant::qk_k;
  auto run = [&]<class B>(std::type_identity<B>, auto&& pack_gate, auto&& pack_up) -> bool {
    if constexpr (!quant::kquant_on_tiles<B>) {
      return false;
    } else {
      if (n_tokens < quant::kpanel_min_tokens<B>) return false;
      const auto* a = quantize_activations<quant::block_q8_K>(x, n_tokens, gate.cols, pool, false);
      kquant_swiglu_tiles<B>(rows, a, nb, n_tokens, h, pool, pack_gate, pack_up);
      return true;
    }
  };
  if (panel_rows(gate.type) > 1) {
#if defined(KESTREL_KQUANT_X16)
    return visit_x16(gate, [&](const auto* gp) -> bool {
      using X = std::remove_cv_t<std::remove_pointer_t<decltype(gp)>>;
      if constexpr (quant::legacy_x16_block<X> || !quant::x16_kernel<X>) {
        return false;
      } else {
        const X* up_p = static_cast<const X*>(up.data);
        return run(
            std::type_identity<typename quant::x16_source<X>::type>{},
            [&](std::size_t p, kp::kpanel_block* dst) { quant::detail::x16::pack_kpanel(gp + p * nb, nb, dst); },
            [&](std::size_t p, kp::kpanel_block* dst) { quant::detail::x16::pack_kpanel(up_p + p * nb, nb, dst); });
      }
    });
#else
    return false;
#endif
  }
#if defined(KESTREL_KQUANT_PANEL)
  return visit_quantized(gate, [&](const auto* blocks) -> bool {
    using B = std::remove_cv_t<std::remove_pointer_t<decltype(blocks)>>;
    if constexpr (!std::is_same_v<typename activation_block<B>::type, quant::block_q8_K>) {
      return false;
    } else {
      const std::size_t row_bytes = gate.row_bytes();
      auto packer = [&](const void* data) {
        return [&, base = static_cast<const std::byte*>(data)](std::size_t p, kp::kpanel_block* dst) {
          kp::pack_kpanel<B>(base + p * kp::panel_rows * row_bytes, row_bytes,
                             std::min(kp::panel_rows, rows - p * kp::panel_rows), nb, dst);
        };
      };
      return run(std::type_identity<B>{}, packer(gate.data), packer(up.data));
    }
  });
#else
  return false;
#endif
}
#endif

/// h = silu(X gate^T) * (X up^T) in one pass where gate and up are the same
/// quantized type and shape and their products would take the legacy
/// panels (VNNI or AMX: legacy_swiglu) or the k-quants' AMX kernel
/// (kquant_swiglu); false, with nothing written, elsewhere
/// (the caller then multiplies each and applies swiglu). The same bits as
/// quantized_linear of each and swiglu.
inline bool quantized_swiglu(const weight_view& gate, const weight_view& up, const float* x, std::size_t n_tokens,
                             float* h, thread_pool* pool) {
  if (gate.type != up.type || gate.rows != up.rows || gate.cols != up.cols) return false;
  if (gate.cols == 0 || gate.cols % block_size(gate.type) != 0) return false;
#if defined(KESTREL_KQUANT_AMX)
  if (quant::amx_enabled() && kquant_swiglu(gate, up, x, n_tokens, h, pool)) return true;
#endif
#if defined(KESTREL_LEGACY_PANEL)
  if (legacy_swiglu(gate, up, x, n_tokens, h, pool)) return true;
#endif
  (void)x, (void)n_tokens, (void)h, (void)pool;
  return false;
}

inline void quantized_row_to_f32(const weight_view& w, std::size_t row, float* out) {
  if (panel_rows(w.type) > 1)
    return visit_x16(w, [&](const auto* panels) {
      const std::size_t nb = w.cols / std::remove_pointer_t<decltype(panels)>::values;
      quant::dequantize_x16_row(panels + row / 16 * nb, row % 16, nb, out);
    });
  visit_quantized(w, [&](const auto* blocks) {
    using B = std::remove_cv_t<std::remove_pointer_t<decltype(blocks)>>;
    const auto* p = reinterpret_cast<const B*>(static_cast<const std::byte*>(w.data) + row * w.row_bytes());
    quant::dequantize_row(p, out, w.cols);
  });
}

}  // namespace detail

}  // namespace kestrel::cpu
