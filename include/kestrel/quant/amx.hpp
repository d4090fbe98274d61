// kestrel/quant/amx.hpp: what the AMX prefill kernels need (legacy_amx.hpp,
// kquant_amx.hpp): whether this process may run them (amx_enabled), the tile
// configuration, C tiles of 16 x 16 int32 against A tiles of 16 tokens'
// activation bytes and B tiles of 16 rows' weight bytes, and the store of a
// panel's results token tile by token tile.
//
// Built where the compiler targets AMX-TILE and AMX-INT8 (-march=native on
// such a CPU) with AVX-512 (BW, VNNI), on Linux (the kernel must grant the
// tile state); elsewhere KESTREL_AMX is not defined and nothing here exists.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdlib>

#if defined(__AMX_TILE__) && defined(__AMX_INT8__) && defined(__AVX512F__) && defined(__AVX512BW__) && \
    defined(__AVX512VNNI__) && defined(__linux__) && defined(__x86_64__)
#include <cpuid.h>
#include <immintrin.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "kestrel/quant/token_groups.hpp"
#define KESTREL_AMX 1
#endif

namespace kestrel::quant {

#if defined(KESTREL_AMX)

/// Whether this process runs the AMX kernels: the CPU reports AMX-TILE and
/// AMX-INT8 (cpuid leaf 7, EDX bits 24 and 25), Linux grants the process the
/// tile data state (arch_prctl ARCH_REQ_XCOMP_PERM, asked once; the grant
/// covers every thread of the process), and the environment does not say
/// KESTREL_AMX=0 (for measuring against the VNNI panels).
inline bool amx_enabled() noexcept {
  static const bool ok = [] {
    if (const char* e = std::getenv("KESTREL_AMX"); e && e[0] == '0') return false;
    unsigned a = 0, b = 0, c = 0, d = 0;
    if (!__get_cpuid_count(7, 0, &a, &b, &c, &d)) return false;
    if (!((d >> 24) & 1u) || !((d >> 25) & 1u)) return false;
    constexpr long arch_req_xcomp_perm = 0x1023, xfeature_xtiledata = 18;
    return syscall(SYS_arch_prctl, arch_req_xcomp_perm, xfeature_xtiledata) == 0;
  }();
  return ok;
}

namespace detail::amx {

inline constexpr std::size_t token_tile = 16;  // tokens per A tile (int32 rows of a C tile)

/// ldtilecfg's 64-byte operand (palette 1).
struct alignas(64) tile_config {
  std::uint8_t palette = 1, start_row = 0, reserved[14] = {};
  std::uint16_t colsb[16] = {};
  std::uint8_t rows[16] = {};
};

/// Tiles 0 and 1: C, 16 x 16 int32. Tiles 2 and 3: A, 16 tokens x a_bytes
/// activation bytes. Tiles 4 and 5: B, b_rows x 64 bytes (b_rows = a_bytes
/// / 4: 16 rows' values in 4-byte groups). Tiles 6 and 7: 16 x 64 bytes,
/// so that (64, 16) makes every tile 16 rows x 64 bytes (kquant_amx.hpp
/// takes them in other roles). Per thread; release() after.
inline void configure_tiles(std::uint16_t a_bytes, std::uint8_t b_rows) noexcept {
  tile_config c;
  for (int t : {0, 1, 6, 7}) c.colsb[t] = 64, c.rows[t] = 16;
  for (int t : {2, 3}) c.colsb[t] = a_bytes, c.rows[t] = 16;
  for (int t : {4, 5}) c.colsb[t] = 64, c.rows[t] = b_rows;
  // GCC 12's _tile_loadconfig names only the first 8 bytes of the 64 as
  // its operand, so the stores of the rest were dropped as dead (and
  // ldtilecfg faulted on stack garbage): the whole struct is the operand.
  asm volatile("ldtilecfg %0" ::"m"(c));
}

inline void release() noexcept { _tile_release(); }

/// Bytes of a call's output from which store_token_tiles streams it past
/// the caches: about half of a 2 MiB L2, beyond which the output written
/// through the caches evicts the packed panels and tokens the kernel reuses.
inline constexpr std::size_t stream_output_bytes = std::size_t{1} << 20;

/// A packed panel's outputs for the token tiles [k0, k1) of a call of
/// n_tokens: tile(k, acc) leaves acc[i] lane r = the result of row r and
/// token 16 k + i, stored to out[t * out_stride + r] for the panel's n_rows
/// real rows and the call's tokens.
///
/// Where a token's 16 outputs are one whole aligned cache line and the
/// call's output is large (stream_output_bytes), they go by non-temporal
/// stores: each line is written once, so the usual store's read of the line
/// first is wasted, and the lines would push the packed data out of L2.
/// The sfence at the end orders them before whatever the thread does next
/// (the pool's signal that its share is done). Measured (110M q4_0, prefill
/// of 512 tokens, bench/ab_decode.sh): 0.955 [0.931, 0.981] of the time of
/// plain stores; TinyLlama q4_0 0.995 [0.976, 1.009].
template <class Tile>
inline void store_token_tiles(std::size_t n_rows, std::size_t k0, std::size_t k1, std::size_t n_tokens, float* out,
                              std::size_t out_stride, Tile&& tile) noexcept {
  const __mmask16 valid = panel_row_mask(n_rows);
  const bool stream = n_rows == 16 && reinterpret_cast<std::uintptr_t>(out) % 64 == 0 && out_stride % 16 == 0 &&
                      n_tokens * out_stride * sizeof(float) >= stream_output_bytes;
  __m512 acc[token_tile];
  for (std::size_t k = k0; k < k1; ++k) {
    tile(k, acc);
    const std::size_t t0 = k * token_tile;
    if (stream) {
      for (std::size_t i = 0; i < token_tile && t0 + i < n_tokens; ++i)
        _mm512_stream_ps(out + (t0 + i) * out_stride, acc[i]);
    } else {
      for (std::size_t i = 0; i < token_tile && t0 + i < n_tokens; ++i)
        _mm512_mask_storeu_ps(out + (t0 + i) * out_stride, valid, acc[i]);
    }
  }
  if (stream) _mm_sfence();
}

/// store_token_tiles of two panels' results combined: tile_a(k, acc) and
/// tile_b(k, acc) as store_token_tiles' tile, out = combine(a, b) token by
/// token (prefill's gate and up: legacy_amx.hpp's panel_tiles_pair,
/// kquant_amx.hpp's kpanel_tiles_pair).
template <class TileA, class TileB, class Combine>
inline void store_token_tiles_pair(std::size_t n_rows, std::size_t k0, std::size_t k1, std::size_t n_tokens,
                                   float* out, std::size_t out_stride, TileA&& tile_a, TileB&& tile_b,
                                   Combine&& combine) noexcept {
  store_token_tiles(n_rows, k0, k1, n_tokens, out, out_stride, [&](std::size_t k, __m512* acc) {
    __m512 other[token_tile];
    tile_a(k, acc);
    tile_b(k, other);
    for (std::size_t i = 0; i < token_tile; ++i) acc[i] = combine(acc[i], other[i]);
  });
}

/// The tiles configured (configure_tiles) for a scope: one thread's share
/// of a call.
struct tiles_on {
  tiles_on(std::uint16_t a_bytes, std::uint8_t b_rows) noexcept { configure_tiles(a_bytes, b_rows); }
  ~tiles_on() { release(); }
  tiles_on(const tiles_on&) = delete;
  tiles_on& operator=(const tiles_on&) = delete;
};

}  // namespace detail::amx

#endif

}  // namespace kestrel::quant
