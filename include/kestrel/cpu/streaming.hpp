// kestrel/cpu/streaming.hpp: how decode's row-major kernels stream their
// weight rows on this host, chosen once at run time.
//
// Decode reads every weight once per token, so its speed is the rate at
// which one core keeps cache lines in flight, and that differs between CPU
// families more than any arithmetic does:
// - AMD Zen 2 to 4: two long sequential streams per thread (the two halves
//   of its rows), with a short software prefetch or none; four streams
//   gained nothing on Zen 4 (cpu/matvec.hpp) and one stream lost. Intel's
//   plan on a Zen 4 host (bench/ab_decode.sh, token time against pairs):
//   TinyLlama f16 1.84x, f32 1.27x, q8_0 1.07x, q4_0 1.04x; 110M f16 1.30x,
//   f32 1.33x, q8_0 1.12x, q4_0 0.98x.
// - AMD Zen 5 (family 1Ah, an EPYC host with 2 vCPUs): the same two
//   streams, asked for further ahead into L1 than Zen 4 took: 16-bit float
//   rows (f16, bf16) 2 KiB (cpu/matvec.hpp), the legacy blocks 2 KiB
//   instead of 256 bytes (quant/legacy_decode.hpp), the k-quant x16
//   blocks the next block into L1 instead of 8 blocks ahead into L2
//   (quant/kquant_x16.hpp). bench/ab_decode.sh, token time against pairs:
//   TinyLlama f16 0.90 / 0.90, 110M f16 0.87, TinyLlama q8_0 0.83 / 0.85,
//   q4_0 0.95, 110M q4_0 0.90 / 0.93, Q4_K_M 0.86-0.89; f32 rows gained
//   nothing (1.04, noise) and keep none. Intel's plan there: TinyLlama f16
//   1.05x.
// - Intel Xeon (an Emerald Rapids host with AVX-512 and a 300 MiB L3): one
//   core's read rate grows with the streams it walks at once (its hardware
//   prefetcher follows each stream only within a 4 KiB page): eight streams
//   per thread for float rows and for the legacy blocks (q4_0 .. q8_0;
//   four until the AMX Xeon host measured eight 0.94-0.98x the time), each
//   asked for 1 KiB ahead into L1; the k-quant x16 blocks two panels side
//   by side, the next block asked into L1 unit by unit (quant/kquant_x16.hpp).
//   TinyLlama-shape decode, bench/ab_decode.sh against two streams: f16
//   0.70x the token time, q8_0 0.76-0.80x (bench/README.md).
//   (Prefill's float GEMM takes one pass over the columns on every
//   AVX-512 host, whatever the plan: cpu/gemm.hpp.)
// - Intel, float rows in 2 MiB pages (cpu_backend's copy of the weights,
//   or the page cache's 2 MiB folios: weight_view::huge_pages):
//   row_streams::far, two streams per thread, each line asked for 3 KiB
//   ahead into L2 and again 1 KiB (16-bit rows) or 1.5 KiB (f32) ahead into
//   L1, f32's streams taken a line at a time (TinyLlama f16 0.965 of wide's
//   token time before the L1 prefetch, 0.933 of that with it; f32 0.940,
//   then 0.965 by its load order and 0.971 by the L1 prefetch:
//   cpu/matvec.hpp); wide for everything else but the case below.
//   Measured on AMX Xeons (family 6 models 167 and 207) only, with f16 and f32
//   rows (bf16 rows take it as f16's bytes); in 4 KiB pages (the file
//   mapping) such a walk lost (1.10x wide's time).
// - Intel, legacy blocks in 2 MiB pages of a model larger than the
//   last-level cache (weight_view::from_memory): far, which for them is
//   wide's eight streams also asked for 3 KiB ahead into L2, a row's tables
//   and prefetches taken just before its arithmetic
//   (quant/legacy_decode.hpp, block_row_streams). bench/ab_decode.sh on
//   the family 6 model 207 host, token time against wide: TinyLlama q8_0
//   0.928 [0.917, 0.937] (far forced) and 0.932 [0.923, 0.948] (chosen so),
//   q4_0 0.979; 110M q8_0, which the L3 partly holds, 1.114 with far forced
//   (so it keeps wide: 1.009 as chosen, the control 1.003).
// The choice changes only the order in which memory is read: every row and
// every output runs the same operations whatever is beside it, so the
// results are the same bits either way (tests/cpu/test_linear.cpp,
// tests/quant/test_legacy_tokens.cpp). It applies to AVX-512 builds;
// AVX2-only builds keep their own measured settings (cpu/matvec.hpp,
// quant/legacy_decode.hpp).
//
// KESTREL_ROW_STREAMS=pairs|pairs_ahead|wide|far in the environment
// overrides the choice (read once, at the first decode), to measure each on
// one host; far then walks float rows so wherever they lie.
#pragma once

#include <cstddef>
#include <cstdlib>
#include <cstring>

#if defined(__unix__)
#include <unistd.h>
#endif

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#endif

namespace kestrel::cpu {

/// How decode's row-major kernels walk a thread's rows.
enum class row_streams : unsigned char {
  pairs,        ///< two streams per thread, short prefetch: AMD to Zen 4, and every host not known to want more
  pairs_ahead,  ///< pairs, 16-bit float rows and legacy blocks prefetched 2 KiB ahead, k-quant x16 blocks one block ahead: AMD Zen 5
  wide,         ///< eight streams of float rows and of legacy blocks, 1 KiB prefetch; x16 panels in pairs: Intel
  far,          ///< wide, but float rows in two streams asked for 3 KiB ahead into L2 and 1-1.5 KiB into L1: Intel, rows in 2 MiB pages;
                ///< legacy blocks as wide, also 3 KiB ahead into L2 (a model larger than the last-level cache)
};

/// Whether kernels other than the float rows' take wide's streams (far takes them too; the legacy blocks'
/// decode adds its L2 prefetch under far: quant/legacy_decode.hpp).
inline constexpr bool walks_wide(row_streams p) noexcept { return p == row_streams::wide || p == row_streams::far; }

/// The plan for the CPU this runs on: wide for Intel ("GenuineIntel"),
/// pairs_ahead for AMD family 1Ah (Zen 5), pairs otherwise;
/// KESTREL_ROW_STREAMS=pairs|pairs_ahead|wide|far overrides it.
inline row_streams detect_row_streams() noexcept {
  if (const char* e = std::getenv("KESTREL_ROW_STREAMS")) {
    if (std::strcmp(e, "wide") == 0) return row_streams::wide;
    if (std::strcmp(e, "pairs") == 0) return row_streams::pairs;
    if (std::strcmp(e, "pairs_ahead") == 0) return row_streams::pairs_ahead;
    if (std::strcmp(e, "far") == 0) return row_streams::far;
  }
#if defined(__x86_64__) || defined(__i386__)
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  if (!__get_cpuid(0, &eax, &ebx, &ecx, &edx)) return row_streams::pairs;
  if (ebx == 0x756e6547u && edx == 0x49656e69u && ecx == 0x6c65746eu) return row_streams::wide;  // "Genu" "ineI" "ntel"
  const bool amd = ebx == 0x68747541u && edx == 0x69746e65u && ecx == 0x444d4163u;           // "Auth" "enti" "cAMD"
  if (amd && __get_cpuid(1, &eax, &ebx, &ecx, &edx)) {
    // The family as AMD counts it: the base field, plus the extended field when the base is 0Fh.
    const unsigned base = (eax >> 8) & 0xfu, family = base == 0xfu ? base + ((eax >> 20) & 0xffu) : base;
    if (family == 0x1au) return row_streams::pairs_ahead;
  }
#endif
  return row_streams::pairs;
}

/// detect_row_streams(), computed once per process.
inline row_streams host_row_streams() noexcept {
  static const row_streams s = detect_row_streams();
  return s;
}

/// The plan for float rows (cpu/matvec.hpp) of element_bytes each (4: f32,
/// 2: f16 or bf16) that lie in 2 MiB pages or not (weight_view::huge_pages):
/// the host's, with far in place of wide for rows in 2 MiB pages.
/// The legacy blocks choose by block_row_streams instead; every other
/// kernel reads far as wide.
inline row_streams float_row_streams(bool huge_pages, std::size_t element_bytes) noexcept {
  const row_streams p = host_row_streams();
  return p == row_streams::wide && huge_pages && (element_bytes == 2 || element_bytes == 4) ? row_streams::far : p;
}

/// The plan for the legacy blocks' decode (quant/legacy_decode.hpp) of rows
/// in 2 MiB pages or not, of a model whose weights exceed the last-level
/// cache or not (weight_view::huge_pages, from_memory): the host's, with far
/// in place of wide where both hold.
inline row_streams block_row_streams(bool huge_pages, bool from_memory) noexcept {
  const row_streams p = host_row_streams();
  return p == row_streams::wide && huge_pages && from_memory ? row_streams::far : p;
}

/// The last-level cache's size in bytes as the C library reports it
/// (sysconf), or `otherwise` where it does not.
inline std::size_t last_level_cache_bytes(std::size_t otherwise = std::size_t{32} << 20) noexcept {
#if defined(_SC_LEVEL3_CACHE_SIZE)
  if (const long l3 = ::sysconf(_SC_LEVEL3_CACHE_SIZE); l3 > 0) return static_cast<std::size_t>(l3);
#endif
#if defined(_SC_LEVEL2_CACHE_SIZE)
  if (const long l2 = ::sysconf(_SC_LEVEL2_CACHE_SIZE); l2 > 0) return static_cast<std::size_t>(l2);
#endif
  return otherwise;
}

}  // namespace kestrel::cpu
