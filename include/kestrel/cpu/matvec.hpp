// kestrel/cpu/matvec.hpp: y = W x, the decode-time product of a weight
// matrix with one activation vector.
//
// Decode is bound by memory bandwidth (every weight is read once per token),
// so the kernel streams each weight row exactly once, converts f16 / bf16 to
// f32 in registers (no temporary row), and reads each thread's rows as two
// (f32 on AVX2: four; on Intel with AVX-512: eight, cpu/streaming.hpp)
// long sequential streams. Rows are split across the thread pool.
#pragma once

#include <algorithm>
#include <cstddef>
#include <span>

#include "kestrel/core/diagnostics.hpp"
#include "kestrel/core/error.hpp"
#include "kestrel/core/tensor.hpp"
#include "kestrel/cpu/convert.hpp"
#include "kestrel/cpu/dot.hpp"
#include "kestrel/cpu/quantized.hpp"
#include "kestrel/cpu/streaming.hpp"
#include "kestrel/cpu/thread_pool.hpp"
#include "kestrel/cpu/activation.hpp"
#include "kestrel/cpu/xsimd_compat.hpp"

KESTREL_INTRINSICS_BEGIN  // GCC 12 (core/diagnostics.hpp)

namespace kestrel::cpu {

namespace detail {

/// Streams of consecutive rows that matvec_rows reads side by side.
///
/// Consecutive rows are adjacent in memory, so reading a range row after row
/// is one sequential stream however short the rows are; the hardware
/// prefetcher follows it across row boundaries. Reading 4 adjacent rows
/// together (the earlier kernel, sharing each load of x) instead made 4
/// streams that each end after one row: 1.5 KB at n_embd 768 in f16, too
/// short for the prefetcher to ramp up. Two long streams (the two halves of
/// the range) keep two prefetchers busy. Measured on Zen 4, 2 threads,
/// 400 MB of 2048-row f16 matrices (/tmp-style harness, medians of 7):
/// cols 768: 15 -> 29 GB/s, cols 2048: 15 -> 27, cols 5632: 25 -> 26.
/// End to end (kestrel-bench tg32, f16, 2 threads, alternated), 1, 2 and 4
/// streams: TinyLlama shape 14.1 / 14.6 / 14.6 t/s and 13.1 / 14.1 / 14.8,
/// 110M shape 121 / 140 / 140 and 133 / 142 / 108: 2 is never far behind.
/// x stays in L1, so reloading it for each row costs nothing measurable.
/// f32 on AVX2 without AVX-512 takes 4 (four quarters of the range): on Zen
/// 2, a /tmp harness (1 GiB of f32 rows in huge pages, 2 threads, 2048
/// columns, median of 9) read 27-28 GB/s with 2 streams and 31.7-32.3 with
/// 4, and kestrel-bench tg32 (2 threads, 4 alternated rounds) gave
/// TinyLlama f32 7.7-8.0 t/s with 2 and 7.8-8.2 with 4, 110M f32 (3
/// rounds) 72.9-74.9 and 75.6-76.5; f16 showed no difference (TinyLlama
/// 15.6-20.7 t/s either way, the host changing level mid-run). A row's
/// result does not depend on the streams (row_acc), so neither do the bits.
/// With AVX-512 that is for row_streams::pairs (AMD); row_streams::wide
/// (Intel, cpu/streaming.hpp) takes 8: on the Emerald Rapids host
/// (bench/ab_decode.sh, TinyLlama f16, token time against 2 streams, 1
/// KiB prefetch beside each) 4 streams 0.80, 8 0.70; 16 took 1.09x the
/// time of 8 (one run each, 4-5 alternated rounds). row_streams::far
/// (Intel, 16-bit rows in 2 MiB pages) takes two, asked for far ahead
/// (matvec_prefetch_bytes).
template <class T, row_streams P>
inline constexpr std::size_t matvec_streams =
#if defined(__AVX2__) && !defined(__AVX512F__)
    sizeof(T) == 4 ? 4 : 2;
#else
    P == row_streams::wide ? 8 : 2;
#endif

/// Software prefetch of matvec_rows' streams, bytes ahead, non-temporal, once
/// per step of each stream (a step is 64 bytes of f32 or 32 of f16 / bf16
/// on AVX2); 0: none. Measured on Zen 2 (kestrel-bench tg32, 2 threads, 2
/// alternated rounds, t/s without / with 576 bytes): TinyLlama f32 7.0-7.5
/// / 7.3-7.8, f16 14.1-15.0 / 15.6-16.0, 110M f16 114-136 / 151-153 (as
/// the quantized decode kernels found, quant/kquant_x16_avx2.hpp). The
/// distance, 288 / 576 / 1152 bytes: TinyLlama f32 7.9-9.4 / 7.8-8.8 /
/// 6.8-7.0, f16 14.4-15.7 / 15.3 / 13.6-13.8, 110M f16 135-139 / 157-160 /
/// not run; f32 takes 288 and 576 alike, f16 576. A plain
/// streaming read loses by it (/tmp harness, 1 GiB, two streams per
/// thread: 31.4 -> 28.7 GB/s), so it pays only between a kernel's
/// arithmetic. With AVX-512, row_streams::pairs (Zen 4) keeps none;
/// row_streams::wide asks for the line 1 KiB ahead into L1 (Emerald Rapids,
/// 8 streams, TinyLlama f16 token time: 2 KiB 1.02x of 1 KiB, 2 KiB into L2
/// 1.21x; with 4 streams none 1.15x; the non-temporal 576 bytes of AVX2,
/// 2 streams, 1.13x of none). row_streams::pairs_ahead (Zen 5) asks for
/// 16-bit rows 2 KiB ahead into L1 and for none of f32's: on the Zen 5
/// host (bench/ab_decode.sh, token time against none, median [quartiles]
/// over 45-343 rounds) TinyLlama f16 512 B 1.04, 1 KiB 0.95-0.96, 2 KiB
/// 0.90 [0.83, 0.95] (twice), 4 KiB 0.90 [0.75, 0.97], 2 KiB into L2 0.97;
/// 110M f16 2 KiB 0.87 [0.77, 0.95], 4 KiB 0.85 [0.72, 0.95]; TinyLlama
/// f32 1 KiB 1.05, 2 KiB 1.04, 4 KiB 1.07 (quartiles 0.89-1.22). The same
/// kernel with four streams instead of two: TinyLlama f16 1.02.
/// With AVX-512 a step of f32 rows is two lines (128 bytes), and each is
/// asked for (of the plans there, only row_streams::wide prefetches f32
/// rows). On the AMX Xeon (family 6 model 167), TinyLlama f32 token time
/// against the first line alone: 0.980 [0.977, 0.990] read in place in the
/// file mapping (bench/ab_decode.sh --placement file), level in huge pages
/// (1.007 and 0.992 in the two orders).
/// row_streams::far, the same host with 16-bit rows in 2 MiB pages: two
/// streams, every line asked for 3 KiB ahead into L2. bench/ab_decode.sh
/// with the files on a tmpfs mounted huge=always (read in place, so every
/// build reads the same 2 MiB pages), token time against wide, median
/// [quartiles]: TinyLlama f16, two streams 3 KiB into L2 0.966 [0.960,
/// 0.969] and 0.965 [0.946, 0.980] (the second with each stream's first 3
/// KiB asked for at its start); one stream 2 / 3 / 6 KiB into L2 1.086 /
/// 0.979 / 1.001. 110M f16 0.991 [0.973, 1.008]. f32 rows walked a step
/// (two lines) at a time gained nothing so: one stream 3 KiB into L2 read
/// TinyLlama f32 at 0.955, 0.981 and 1.008 in three runs, 110M f32 at 1.025
/// and 1.003; with each stream's first 3 KiB asked for at its start 1.054
/// and 0.942; two streams 3 KiB into L2 1.001, 4 KiB 1.016; one stream 4
/// KiB 1.034, 1 KiB into L1 1.070. Walked a line at a time instead
/// (interleave_lines, with its measurements), two streams 3 KiB into L2
/// gained, so far takes f32 rows too; 2 / 4 / 6 KiB ahead read 0.95 / 0.97
/// / 0.94x as fast as 3 KiB (a /tmp harness of matvec over TinyLlama f32's
/// products in its 2 MiB page-cache folios). In the page cache's 4 KiB
/// pages one f32 stream 3 KiB into L2 took 1.098x wide's time, 2 KiB into
/// L1 1.175x (a run of 2026-12-04): so far only where the rows lie in 2 MiB
/// pages (float_row_streams).
#if defined(__AVX2__) && !defined(__AVX512F__)
template <class T, row_streams P> inline constexpr std::size_t matvec_prefetch_bytes = 576;
template <row_streams P> inline constexpr int matvec_prefetch_locality = 0;  // non-temporal
#else
template <class T, row_streams P>
inline constexpr std::size_t matvec_prefetch_bytes = P == row_streams::wide                            ? 1024
                                                     : P == row_streams::far                           ? 3072
                                                     : P == row_streams::pairs_ahead && sizeof(T) == 2 ? 2048
                                                                                                       : 0;
template <row_streams P> inline constexpr int matvec_prefetch_locality = P == row_streams::far ? 2 : 3;  // into L2 / L1
#endif

/// A second prefetch of matvec_rows' streams, bytes ahead, into L1, beside
/// matvec_prefetch_bytes' into L2; 0: none. row_streams::far's 16-bit rows
/// (f16, bf16) take 1 KiB, its f32 rows 1.5 KiB. The 16-bit walk converts
/// each line before its multiply-add, and the loads' dependent work, not
/// the loads, held it back: on an AMX Xeon (family 6 model 207), a /tmp harness of every
/// product of TinyLlama f16 in decode's regions on the pool (2 threads,
/// the page cache's 2 MiB folios, paired medians of 21-25 passes) read a
/// plain walk of the same lines (loads OR'd) 1.11-1.13x as fast as the
/// kernel, converting half of each line and OR'ing 1.10x, converting all
/// of it 1.00x, four dependent integer operations a line 1.05x; the
/// converts and multiply-adds issued 1 to 8 steps after their loads (in
/// registers) 1.00-1.03x. The lines asked for into L1 too, 128 / 256 /
/// 512 / 768 / 1024 / 1536 / 2048 bytes ahead: 1.04 / 1.04 / 1.06 / 1.08 /
/// 1.10 / 1.09 / 1.07x, with the plain walk 1.11-1.13x. bench/ab_decode.sh
/// against the walk without it (TinyLlama f16 in place, 21 rounds, median
/// [quartiles]): 0.933 [0.915, 0.966] of the token time, the control
/// 1.007. bf16 rows take it as f16's bytes (not measured apart). f32 rows
/// (interleave_lines' walk) take 1.5 KiB: the same harness over TinyLlama
/// f32, 512 / 1024 / 1536 / 2048 / 2560 bytes against none: 0.99 / 1.016
/// / 1.01-1.03 / 1.016 / 0.954; bench/ab_decode.sh (18 rounds) 0.971
/// [0.945, 0.992] of the token time without, the control 1.001.
template <class T, row_streams P>
inline constexpr std::size_t matvec_near_bytes =
#if defined(__AVX512F__)
    P == row_streams::far ? (sizeof(T) == 2 ? 1024 : 1536) : 0;
#else
    0;
#endif

/// Whether matvec_rows_as walks its streams a line at a time (each stream's
/// first line of a step, then each stream's second) rather than a step at a
/// time: for row_streams::far, where a step of f32 rows is two lines (with
/// AVX-512). Measured on the AMX Xeon (family 6 model 167), TinyLlama f32
/// in the page cache's 2 MiB folios, a /tmp harness (8 layers' products
/// walked on the pool, 2 threads, two streams 3 KiB ahead into L2, median
/// of 7): 31.0-31.7 GB/s a line at a time, 27.6-28.1 two lines at a time
/// (wide's eight streams 1 KiB into L1: 28.6-28.8 either way). The same
/// operations on each accumulator in the same order, so the same bits.
/// bench/ab_decode.sh, token time against wide's (TinyLlama f32 in place,
/// median [quartiles]): 0.962 [0.957, 0.968] without the compiler fences of
/// matvec_rows_as, 0.940 [0.931, 0.944] with them; in a second run with
/// them 0.980-0.990 of the same loop without (the host drifting 2% between
/// the first and the last build). The fences do not order the prefetches
/// (the compiler still issues a step's four together); they make it keep
/// the accumulators in memory and reload x for each stream, which reads
/// faster here for reasons not found. The same fences in f16's walk (a
/// step is one line there): 1.016 [1.011, 1.018] of its time without
/// them, so only here. Since replaced (on the model 207 AMX host) by
/// loads issued in a fixed order (simd::in_order): x's two lines first,
/// then the streams' first lines, then their second lines, each a load of
/// its own, then the four multiply-adds. A /tmp harness (every f32 product of TinyLlama f32 in
/// decode's regions on the pool, 2 threads, page-cache 2 MiB folios,
/// paired medians of 25-31 passes): the fenced loop read 0.95-0.96x as
/// fast as this one, and this one as fast as a plain read of the same walk
/// (loads OR'd, no arithmetic: 1.007); without x's ordering 0.97, with
/// the four prefetches issued before the four loads 0.997, two steps a
/// time 0.985. bench/ab_decode.sh against the fenced loop (TinyLlama f32
/// in place, 23 rounds, median [quartiles]): 0.965 [0.929, 0.992], the
/// control 0.991.
template <class T, row_streams P>
inline constexpr bool interleave_lines = P == row_streams::far && 2 * simd::width * sizeof(T) == 128;

/// One row's dot product as matvec_rows computes it: two accumulators over
/// 2W-element steps, then one masked step for the tail. Every row goes
/// through exactly this sequence of operations, whichever rows it is paired
/// with, so a row's result never depends on how the rows were split.
template <class T>
struct row_acc {
  simd::fbatch a0 = simd::fbatch(0.0f), a1 = simd::fbatch(0.0f);
  void step(const T* w, const float* x) noexcept {
    first_half(w, x);
    second_half(w, x);
  }
  /// step's two halves, for a walk that interleaves its streams half a step
  /// at a time (matvec_rows_as): the same operations on each accumulator.
  void first_half(const T* w, const float* x) noexcept {
    first_half(load_f32(w), simd::fbatch::load_unaligned(x));
  }
  void second_half(const T* w, const float* x) noexcept {
    constexpr std::size_t W = simd::width;
    second_half(load_f32(w + W), simd::fbatch::load_unaligned(x + W));
  }
  /// The halves with w's and x's elements already loaded (w + i and x + i
  /// for the first, w + i + W and x + i + W for the second).
  void first_half(const simd::fbatch& w, const simd::fbatch& x) noexcept { a0 = xsimd::fma(w, x, a0); }
  void second_half(const simd::fbatch& w, const simd::fbatch& x) noexcept { a1 = xsimd::fma(w, x, a1); }
  float finish(const T* w, const float* x, std::size_t i, std::size_t cols) noexcept {
    constexpr std::size_t W = simd::width;
    if (i + W <= cols) {
      a0 = xsimd::fma(load_f32(w + i), simd::fbatch::load_unaligned(x + i), a0);
      i += W;
    }
    if (i < cols) a1 = xsimd::fma(load_f32_partial(w + i, cols - i), load_f32_partial(x + i, cols - i), a1);
    return simd::reduce_add(a0 + a1);
  }
};

/// y[r] = dot(w row r, x) for r in [r0, r1), the rows walked as plan P.
/// w: (rows, cols), x: (cols), y: (rows)
template <row_streams P, class T>
inline void matvec_rows_as(const T* w, std::size_t cols, const float* x, float* y, std::size_t r0,
                           std::size_t r1) noexcept {
  constexpr std::size_t W = simd::width, S = matvec_streams<T, P>;
  constexpr std::size_t ahead = matvec_prefetch_bytes<T, P>, near = matvec_near_bytes<T, P>;
  const std::size_t main = cols - cols % (2 * W);
  const std::size_t per = (r1 - r0) / S;
  // Rows r0 + s * per + j for the S streams s side by side; the last
  // (r1 - r0) % S rows alone.
  for (std::size_t j = 0; j < per; ++j) {
    const T* wr[S];
    row_acc<T> acc[S];
    for (std::size_t s = 0; s < S; ++s) wr[s] = w + (r0 + s * per + j) * cols;
    if constexpr (interleave_lines<T, P>) {
      // One line of each stream in turn: x's two lines, then the first line
      // of every stream's step, then the second, each load issued in this
      // order as a load of its own (in_order), then the multiply-adds.
      for (std::size_t i = 0; i < main; i += 2 * W) {
        simd::fbatch xh[2] = {simd::fbatch::load_unaligned(x + i), simd::fbatch::load_unaligned(x + i + W)};
        simd::in_order(xh[0]);
        simd::in_order(xh[1]);
        simd::fbatch wh[2][S];  // [half][stream]
        for (std::size_t h = 0; h < 2; ++h)
          for (std::size_t s = 0; s < S; ++s) {
            const T* line = wr[s] + i + h * W;
            __builtin_prefetch(reinterpret_cast<const char*>(line) + ahead, 0, matvec_prefetch_locality<P>);
            if constexpr (near > 0) __builtin_prefetch(reinterpret_cast<const char*>(line) + near, 0, 3);
            wh[h][s] = load_f32(line);
            simd::in_order(wh[h][s]);
          }
        for (std::size_t s = 0; s < S; ++s) {
          acc[s].first_half(wh[0][s], xh[0]);
          acc[s].second_half(wh[1][s], xh[1]);
        }
      }
    } else {
      for (std::size_t i = 0; i < main; i += 2 * W)
        for (std::size_t s = 0; s < S; ++s) {
          if constexpr (ahead > 0) {
            __builtin_prefetch(reinterpret_cast<const char*>(wr[s] + i) + ahead, 0, matvec_prefetch_locality<P>);
            if constexpr (2 * W * sizeof(T) > 64)
              __builtin_prefetch(reinterpret_cast<const char*>(wr[s] + i) + ahead + 64, 0, matvec_prefetch_locality<P>);
          }
          if constexpr (near > 0) {
            static_assert(2 * W * sizeof(T) <= 64, "one near prefetch per step: a step of one line");
            __builtin_prefetch(reinterpret_cast<const char*>(wr[s] + i) + near, 0, 3);
          }
          acc[s].step(wr[s] + i, x + i);
        }
    }
    for (std::size_t s = 0; s < S; ++s) y[r0 + s * per + j] = acc[s].finish(wr[s], x, main, cols);
  }
  for (std::size_t r = r0 + S * per; r < r1; ++r) {
    const T* wr = w + r * cols;
    row_acc<T> a;
    for (std::size_t i = 0; i < main; i += 2 * W) a.step(wr + i, x + i);
    y[r] = a.finish(wr, x, main, cols);
  }
}

/// y[r] = dot(w row r, x) for r in [r0, r1), the rows walked as `plan`
/// (float_row_streams); the same bits for every plan.
template <class T>
inline void matvec_rows(const T* w, std::size_t cols, const float* x, float* y, std::size_t r0, std::size_t r1,
                        row_streams plan) noexcept {
  switch (plan) {
    case row_streams::wide: return matvec_rows_as<row_streams::wide>(w, cols, x, y, r0, r1);
    case row_streams::far: return matvec_rows_as<row_streams::far>(w, cols, x, y, r0, r1);
    case row_streams::pairs_ahead: return matvec_rows_as<row_streams::pairs_ahead>(w, cols, x, y, r0, r1);
    case row_streams::pairs: break;
  }
  matvec_rows_as<row_streams::pairs>(w, cols, x, y, r0, r1);
}

/// The granularity of the row split: parallel tasks hand out whole blocks of
/// 4 rows (the quantized kernels' row group), so no thread but the last gets
/// a ragged block; an interleaved type's whole panels (16 rows of
/// q4_k_x16), which a thread cannot split, in decode's pairs
/// (decode_panels, cpu/quantized.hpp).
inline constexpr std::size_t matvec_row_block = 4;
inline constexpr std::size_t row_block(dtype t) noexcept {
  return panel_rows(t) > 1 ? decode_panels * panel_rows(t) : matvec_row_block;
}

/// Bytes of weights per chunk when threads split a float decode product
/// (float_decode_for); 0: the pool's guided schedule, as every other product.
///
/// The guided chunks (thread_pool::chunk_begin) start the two threads a
/// quarter of the matrix apart and end them within 1/32 of it. llama.cpp's
/// threads claim 64-row chunks instead, and on the Zen 4 host its f16 decode
/// read TinyLlama's weights about 12% faster than kestrel's (bench/README.md).
/// A /tmp harness (the decode's f16 matrices in place, 2 threads, the
/// kernels alternated) put the difference in the split, not the kernel:
/// the pairs kernel in 64-row chunks claimed in order read 1.03-1.16x as
/// fast as in the guided chunks (7 runs), llama.cpp's loop (one row at a
/// time, x in f16) in the same chunks 1.05-1.12x; the same 64-row chunks
/// dealt out in turn (thread t taking t, t + 2, ...) 0.96-0.97x. End to
/// end (bench/ab_decode.sh, token time over the guided chunks' in the same
/// process, median [quartiles]), chunks of 64 KiB / 256 KiB / 512 KiB / 1
/// MiB: TinyLlama f16 1.14 / 0.92-0.97 / 0.89-0.93 / 0.97; with 512 KiB
/// TinyLlama f32 0.79 [0.77, 0.92], 110M f16 0.96 [0.87, 1.04], 110M f32
/// 0.93 [0.79, 1.02]. The quantized decode kernels gained nothing so
/// (TinyLlama Q4_K_M 1.02, q8_0 1.01 with 256 KiB) and keep the guided
/// chunks. Measured on AMD with AVX-512 only (row_streams::pairs and
/// pairs_ahead; on the Zen 5 host the two splits were level, TinyLlama f16
/// guided 0.99 [0.94, 1.07] of these chunks' token time): Intel
/// (row_streams::wide and far) and AVX2 builds keep the
/// guided chunks until measured.
inline std::size_t float_decode_chunk_bytes() noexcept {
#if defined(__AVX512F__)
  return walks_wide(host_row_streams()) ? 0 : std::size_t{512} << 10;
#else
  return 0;
#endif
}

/// Runs f over [0, n) units of unit_bytes of float weights each, `work`
/// multiply-adds in all, for a decode product: on the pool in chunks of about
/// chunk_bytes (whole units, at least one) claimed in order, or with
/// parallel_for's guided chunks when chunk_bytes is 0; inline below
/// min_parallel_work. A row's result never depends on the split, so neither
/// do the bits.
template <class F>
inline void float_decode_for(thread_pool* pool, std::size_t n, std::size_t unit_bytes, std::size_t work, F&& f,
                             std::size_t chunk_bytes = float_decode_chunk_bytes()) {
  if (pool && work >= min_parallel_work && chunk_bytes != 0)
    pool->parallel_for_chunks(n, chunk_bytes / std::max<std::size_t>(1, unit_bytes), std::forward<F>(f));
  else
    parallel_for(pool, n, std::forward<F>(f), work);
}

}  // namespace detail

/// y = W x. w: (rows, cols) of f32, f16 or bf16; x: (cols); y: (rows).
/// pool may be null (single thread). y must not alias x. The result does not
/// depend on the pool's size: threads split rows, never a row's sum.
inline void matvec(const weight_view& w, const float* x, float* y, thread_pool* pool) {
  if (is_quantized(w.type)) return detail::quantized_linear(w, x, 1, y, pool, /*reference=*/false);
  visit_weight(w, [&](const auto* data) {
    const std::size_t rows = w.rows, cols = w.cols;
    const std::size_t blocks = (rows + detail::matvec_row_block - 1) / detail::matvec_row_block;
    const row_streams plan = float_row_streams(w.huge_pages, sizeof(*data));
    detail::float_decode_for(pool, blocks, detail::matvec_row_block * cols * sizeof(*data), rows * cols,
                             [&](std::size_t b0, std::size_t b1) {
                               const std::size_t r0 = b0 * detail::matvec_row_block;
                               const std::size_t r1 = std::min(rows, b1 * detail::matvec_row_block);
                               detail::matvec_rows(data, cols, x, y, r0, r1, plan);
                             });
  });
}

/// One product of a fused matvec: y = (*w) x. y: (w->rows)
struct matvec_job {
  const weight_view* w;
  float* y;
};

namespace detail {

/// y[r0, r1) = rows [r0, r1) of W times x, on the calling thread. Float
/// rows go through matvec_rows; block-quantized ones through a view of just
/// those rows, with acts = quantize_for(w, x) (shared_acts), or null to
/// quantize x here.
inline void matvec_row_range(const weight_view& w, const float* x, float* y, std::size_t r0, std::size_t r1,
                             const void* acts = nullptr) {
  if (r0 >= r1) return;
  if (is_quantized(w.type)) {
    weight_view sub = w;
    sub.data = w.row(r0);
    sub.rows = r1 - r0;
    return quantized_linear(sub, x, 1, y + r0, nullptr, /*reference=*/false, acts);
  }
  visit_weight(w, [&](const auto* data) {
    matvec_rows(data, w.cols, x, y, r0, r1, float_row_streams(w.huge_pages, sizeof(*data)));
  });
}

inline std::size_t matvec_blocks(const weight_view& w) noexcept {
  const std::size_t rb = row_block(w.type);
  return (w.rows + rb - 1) / rb;
}

/// Runs the row blocks [b0, b1) of the jobs' concatenated blocks (each job
/// contributes ceil(rows / row_block) blocks, so a block never straddles
/// two matrices and every row lands in the same row group as in matvec()).
inline void matvec_jobs_blocks(std::span<const matvec_job> jobs, const float* x, std::size_t b0, std::size_t b1,
                               const void* acts) {
  std::size_t base = 0;
  for (const matvec_job& j : jobs) {
    const std::size_t nb = matvec_blocks(*j.w), rb = row_block(j.w->type);
    const std::size_t lo = std::max(b0, base), hi = std::min(b1, base + nb);
    if (lo < hi) matvec_row_range(*j.w, x, j.y, (lo - base) * rb, std::min(j.w->rows, (hi - base) * rb), acts);
    base += nb;
  }
}

/// Bytes of one row block of w (row_block rows; a matrix's last block may
/// hold fewer).
inline std::size_t block_bytes(const weight_view& w) noexcept { return row_block(w.type) * w.row_bytes(); }

/// The first of the jobs' concatenated row blocks (matvec_jobs_blocks)
/// whose weights start at or past fraction u / n of all their bytes:
/// matvec_fused's threads split bytes, not blocks, so that a q6_K v beside
/// q4_K q and k (Q4_K_M's attn_v in a third of the layers) does not give
/// the thread with the last blocks 30% more to read. Monotone in u, 0 at
/// u = 0 and every block at u >= n, also where blocks hold no bytes (no
/// columns), so the chunks always cover every block.
inline std::size_t block_at_bytes(std::span<const matvec_job> jobs, std::size_t u, std::size_t n) noexcept {
  std::size_t total = 0, blocks = 0;
  for (const matvec_job& j : jobs) {
    total += matvec_blocks(*j.w) * block_bytes(*j.w);
    blocks += matvec_blocks(*j.w);
  }
  if (u == 0) return 0;
  if (u >= n) return blocks;
  // floor(total u / n) without overflow: total = q n + r, so it is q u +
  // floor(r u / n), and r u < n^2 (n is a count of row blocks).
  const std::size_t at = total / n * u + total % n * u / n;
  std::size_t base = 0, bytes = 0;
  for (const matvec_job& j : jobs) {
    const std::size_t nb = matvec_blocks(*j.w), per = block_bytes(*j.w);
    if (at <= bytes) return base;                                      // this job's blocks start at or past `at`
    if (at < bytes + nb * per) return base + (at - bytes + per - 1) / per;  // per > 0 here
    base += nb;
    bytes += nb * per;
  }
  return base;
}

/// x (n_tokens rows) quantized once by the calling thread (quantize_for;
/// prefill's tokens split over pool) for products of x whose weights are
/// all block-quantized with the same width and activation blocks;
/// otherwise null, and each product or chunk quantizes x for itself.
/// Quantizing in every chunk (8-10 a region on 2 threads, twice in
/// matvec_swiglu's) cost about 2% of 110M q4_0 decode (perf, Zen 3).
inline const void* shared_acts(std::span<const matvec_job> jobs, const float* x, std::size_t n_tokens = 1,
                               thread_pool* pool = nullptr) {
  if (jobs.empty()) return nullptr;
  for (const matvec_job& j : jobs)
    if (!is_quantized(j.w->type) || j.w->cols != jobs[0].w->cols || !same_activations(j.w->type, jobs[0].w->type))
      return nullptr;
  return quantize_for(*jobs[0].w, x, n_tokens, pool);
}

}  // namespace detail

/// y_j = W_j x for every job, in ONE parallel region: decode's q, k and v
/// (or any products of the same input) pay one wake-up and one join instead
/// of three. Rows of all matrices are split together, so threads stay
/// balanced when the matrices differ in size (GQA's small k and v). Each
/// y_j equals matvec(*w_j, x) bit for bit, whatever the pool size. No y may
/// alias x.
inline void matvec_fused(std::span<const matvec_job> jobs, const float* x, thread_pool* pool) {
  std::size_t blocks = 0, work = 0;
  for (const matvec_job& j : jobs) {
    blocks += detail::matvec_blocks(*j.w);
    work += j.w->rows * j.w->cols;
  }
  const void* acts = detail::shared_acts(jobs, x);
  auto run = [&](std::size_t b0, std::size_t b1) { detail::matvec_jobs_blocks(jobs, x, b0, b1, acts); };
  if (std::none_of(jobs.begin(), jobs.end(), [](const matvec_job& j) { return is_quantized(j.w->type); })) {
    std::size_t bytes = 0;
    for (const matvec_job& j : jobs) bytes += j.w->bytes();
    return detail::float_decode_for(pool, blocks, bytes / std::max<std::size_t>(1, blocks), work, run);
  }
  // Units of equal bytes (as many as blocks), each chunk's mapped to blocks.
  parallel_for(pool, blocks, [&](std::size_t u0, std::size_t u1) {
    run(detail::block_at_bytes(jobs, u0, blocks), detail::block_at_bytes(jobs, u1, blocks));
  }, work);
}

/// h = silu(gate x) * (up x), the SwiGLU feed-forward's first half, in one
/// parallel region: each thread computes the same rows of gate and up and
/// applies swiglu to them, so the activation needs no second pass over
/// threads. h, up_scratch: (gate.rows); gate and up have the same shape.
/// Equals swiglu(matvec(gate), matvec(up)) bit for bit.
inline void matvec_swiglu(const weight_view& gate, const weight_view& up, const float* x, float* h, float* up_scratch,
                          thread_pool* pool) {
  require(gate.rows == up.rows && gate.cols == up.cols, "matvec_swiglu: gate and up differ in shape");
  const std::size_t rows = gate.rows;
  // Row blocks whole for both (4 or 32 rows: the larger is a multiple of the other).
  const std::size_t rb = std::max(detail::row_block(gate.type), detail::row_block(up.type));
  const matvec_job jobs[2] = {{&gate, h}, {&up, up_scratch}};
  const void* acts = detail::shared_acts(jobs, x);
  const std::size_t blocks = (rows + rb - 1) / rb, work = 2 * rows * gate.cols;
  auto run = [&](std::size_t b0, std::size_t b1) {
    const std::size_t r0 = b0 * rb, r1 = std::min(rows, b1 * rb);
    detail::matvec_row_range(gate, x, h, r0, r1, acts);
    detail::matvec_row_range(up, x, up_scratch, r0, r1, acts);
    swiglu(h + r0, h + r0, up_scratch + r0, r1 - r0);
  };
  if (!is_quantized(gate.type) && !is_quantized(up.type))
    return detail::float_decode_for(pool, blocks, (gate.bytes() + up.bytes()) / std::max<std::size_t>(1, blocks), work,
                                    run);
  parallel_for(pool, blocks, run, work);
}

}  // namespace kestrel::cpu
KESTREL_INTRINSICS_END
