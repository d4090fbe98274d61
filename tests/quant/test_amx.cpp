// tests/quant/test_amx.cpp: the legacy types' prefill on AMX tiles
// (quant/legacy_amx.hpp) against the exact-order scalar twin
// quant::ref::dot_fused, bit for bit: the tiles give each block's exact
// integer sum and the float step is dot_fused's per-block fma in block
// order, so any difference, in any tile shape, is a bug. Runs where amx_enabled()
// (a CPU with AMX-INT8 that Linux lets this process use); elsewhere it says so
// and checks nothing.
#include <doctest/doctest.h>

#include <cstdint>
#include <cstring>
#include <vector>

#include "cpu/helpers.hpp"
#include "quant/legacy_extremes.hpp"
#include "kestrel/quant/legacy.hpp"
#include "kestrel/quant/legacy_amx.hpp"

namespace q = kestrel::quant;
using kestrel::test::random_floats;

namespace {
[[maybe_unused]] bool same_bits(float a, float b) { return std::memcmp(&a, &b, sizeof a) == 0; }
}  // namespace

#define AMX_TYPES q::block_q4_0, q::block_q4_1, q::block_q5_0, q::block_q5_1, q::block_q8_0

#if defined(KESTREL_LEGACY_AMX)
namespace {

/// Every (row, token) of rows x n_tokens through pack_panel / pack_acts /
/// panel_tiles equals ref::dot_fused bit for bit; nothing is written outside
/// the outputs.
template <class W>
void check_amx(const std::vector<W>& w, const std::vector<q::activation_of_t<W>>& a, std::size_t rows,
               std::size_t n_tokens, std::size_t n) {
  namespace am = q::detail::amx;
  const std::size_t nb = n / 32, n_panels = (rows + 15) / 16, n_tiles = (n_tokens + 15) / 16;
  std::vector<am::amx_block> panels(n_panels * nb);
  std::vector<am::act_block> acts(n_tiles * nb);
  const auto* base = reinterpret_cast<const std::byte*>(w.data());
  for (std::size_t p = 0; p < n_panels; ++p)
    am::pack_panel<W>(base + 16 * p * nb * sizeof(W), nb * sizeof(W), std::min<std::size_t>(16, rows - 16 * p), nb,
                      panels.data() + p * nb);
  for (std::size_t k = 0; k < n_tiles; ++k) am::pack_acts(a.data(), n_tokens, nb, k, acts.data() + k * nb);
  // Outputs 64-byte aligned, as the model's buffers are, so that a call
  // whose output reaches am::stream_output_bytes streams it
  // (store_token_tiles); the vectors' spare 16 floats make room.
  auto aligned = [](std::vector<float>& v) {
    const auto skip = (64 - reinterpret_cast<std::uintptr_t>(v.data()) % 64) % 64 / sizeof(float);
    return v.data() + skip;
  };
  std::vector<float> out_buf(n_tokens * rows + 1 + 16, -7.0f), all_buf(n_tokens * rows + 16, -7.0f);
  float* const out = aligned(out_buf);
  float* const all = aligned(all_buf);
  am::configure();
  for (std::size_t p = 0; p < n_panels; ++p)  // the tiles one call each, then all in one: the same bits
    for (std::size_t k = 0; k < n_tiles; ++k)
      am::panel_tiles<W>(panels.data() + p * nb, std::min<std::size_t>(16, rows - 16 * p), acts.data(), nb, k, k + 1,
                         n_tokens, out + 16 * p, rows);
  for (std::size_t p = 0; p < n_panels; ++p)
    am::panel_tiles<W>(panels.data() + p * nb, std::min<std::size_t>(16, rows - 16 * p), acts.data(), nb, 0, n_tiles,
                       n_tokens, all + 16 * p, rows);
  am::release();
  std::size_t bad = 0, split = 0;
  for (std::size_t t = 0; t < n_tokens; ++t)
    for (std::size_t r = 0; r < rows; ++r) {
      bad += !same_bits(out[t * rows + r], q::ref::dot_fused(w.data() + r * nb, a.data() + t * nb, n));
      split += !same_bits(all[t * rows + r], out[t * rows + r]);
    }
  CAPTURE(rows);
  CAPTURE(n_tokens);
  CAPTURE(n);
  CHECK(bad == 0);
  CHECK(split == 0);
  CHECK(out[n_tokens * rows] == -7.0f);
}

template <class W> void check_random(std::size_t rows, std::size_t n_tokens, std::size_t n, std::uint32_t seed) {
  using A = q::activation_of_t<W>;
  std::vector<W> w(rows * n / 32);
  std::vector<A> a(n_tokens * n / 32);
  q::quantize_row(random_floats(rows * n, seed).data(), w.data(), rows * n);
  q::quantize_row(random_floats(n_tokens * n, seed + 1, -3.0f, 3.0f).data(), a.data(), n_tokens * n);
  check_amx(w, a, rows, n_tokens, n);
}

}  // namespace

TEST_CASE_TEMPLATE("quant: AMX prefill tiles == ref::dot_fused bit for bit", W, AMX_TYPES) {
  if (!q::amx_enabled()) {
    MESSAGE("skipped: this CPU or kernel gives no AMX-INT8 tiles (or KESTREL_AMX=0)");
    return;
  }
  // rows: one, a panel, a panel and a row, two and a row; tokens: under a
  // tile, a tile, a tile and one, several with a tail; blocks: one, odd, even.
  for (std::size_t rows : {1, 16, 17, 33})
    for (std::size_t n_tokens : {1, 9, 16, 17, 37})
      for (std::size_t n : {32, 96, 1024})
        check_random<W>(rows, n_tokens, n, static_cast<std::uint32_t>(rows * 1000 + n_tokens * 10 + n));
}

// An output of at least am::stream_output_bytes goes by non-temporal
// stores (whole panels of a row stride of whole cache lines):
// the same bits, every token written, the tail tile too.
TEST_CASE_TEMPLATE("quant: AMX prefill tiles, a large output streamed past the caches == ref::dot_fused", W,
                   AMX_TYPES) {
  if (!q::amx_enabled()) {
    MESSAGE("skipped: this CPU or kernel gives no AMX-INT8 tiles (or KESTREL_AMX=0)");
    return;
  }
  const std::size_t rows = 4096, n_tokens = 67;  // out_stride a whole number of panels, as streaming needs
  REQUIRE(n_tokens * rows * sizeof(float) >= q::detail::amx::stream_output_bytes);
  check_random<W>(rows, n_tokens, 64, 4242);
}

// The largest block sums (quant/legacy_extremes.hpp): every weight value at
// its extreme against activations all 127 or all -128, the scales at their
// f16 extremes; |isum_b| <= 32 * 128 * 128 stays exact.
TEST_CASE_TEMPLATE("quant: AMX prefill tiles' integer sums at the extremes are exact", W, AMX_TYPES) {
  if (!q::amx_enabled()) {
    MESSAGE("skipped: this CPU or kernel gives no AMX-INT8 tiles (or KESTREL_AMX=0)");
    return;
  }
  using A = q::activation_of_t<W>;
  const std::size_t rows = 17, n_tokens = 19, n = 96, nb = n / 32;
  for (int pattern = 0; pattern < 4; ++pattern) {
    const auto w = kestrel::test::extreme_weights<W>(rows * nb, pattern);
    const auto a = kestrel::test::extreme_acts<A>(n_tokens * nb, pattern);
    CAPTURE(pattern);
    check_amx(w, a, rows, n_tokens, n);
  }
}
#endif

#if !defined(KESTREL_LEGACY_AMX)
TEST_CASE("quant: AMX prefill tiles (not built)") {
  MESSAGE("skipped: built without AMX-INT8 (needs -march with amx-int8, Linux, AVX-512 VNNI)");
}
#endif
