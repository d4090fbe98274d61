// core/dtype.hpp: f16/bf16 <-> f32 conversions.
//
// The widening conversions are checked exhaustively (all 65536 bit patterns)
// against an independent construction (ldexp on the decoded fields). The
// narrowing ones round to nearest even: checked on every f16/bf16 value, the
// midpoints between neighbours, overflow, underflow and NaN, and (where the
// CPU has F16C) against the hardware conversion on random floats.
#include <doctest/doctest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <ios>
#include <random>

#if defined(__F16C__)
#include <immintrin.h>
#endif

#include "kestrel/core/dtype.hpp"

using namespace kestrel;

namespace {

// Independent decode of binary16 from its fields.
float f16_reference(std::uint16_t bits) {
  const int sign = bits >> 15;
  const int exp = (bits >> 10) & 0x1f;
  const int mant = bits & 0x3ff;
  float v;
  if (exp == 0x1f) v = mant ? std::numeric_limits<float>::quiet_NaN() : std::numeric_limits<float>::infinity();
  else if (exp == 0) v = std::ldexp(static_cast<float>(mant), -24);
  else v = std::ldexp(static_cast<float>(mant + 1024), exp - 25);
  return sign ? -v : v;
}

bool same_value(float a, float b) {
  if (std::isnan(a) || std::isnan(b)) return std::isnan(a) && std::isnan(b);
  return std::bit_cast<std::uint32_t>(a) == std::bit_cast<std::uint32_t>(b);  // distinguishes -0 from +0
}

}  // namespace

TEST_CASE("f16 -> f32 is exact for all 65536 values") {
  for (std::uint32_t b = 0; b < 65536; ++b) {
    const auto h = static_cast<std::uint16_t>(b);
    REQUIRE_MESSAGE(same_value(to_f32(f16{h}), f16_reference(h)), "bits 0x" << std::hex << b);
  }
}

TEST_CASE("bf16 -> f32 is exact for all 65536 values") {
  for (std::uint32_t b = 0; b < 65536; ++b) {
    const auto h = static_cast<std::uint16_t>(b);
    const int sign = h >> 15, exp = (h >> 7) & 0xff, mant = h & 0x7f;
    float ref;
    if (exp == 0xff) ref = mant ? std::numeric_limits<float>::quiet_NaN() : std::numeric_limits<float>::infinity();
    else if (exp == 0) ref = std::ldexp(static_cast<float>(mant), -133);
    else ref = std::ldexp(static_cast<float>(mant + 128), exp - 134);
    if (sign) ref = -ref;
    REQUIRE_MESSAGE(same_value(to_f32(bf16{h}), ref), "bits 0x" << std::hex << b);
  }
}

TEST_CASE("f32 -> f16 -> f32 round-trips every finite f16 and keeps NaN/inf") {
  for (std::uint32_t b = 0; b < 65536; ++b) {
    const auto h = static_cast<std::uint16_t>(b);
    const float f = to_f32(f16{h});
    if (std::isnan(f)) {
      CHECK(std::isnan(to_f32(to_f16(f))));
    } else {
      REQUIRE_MESSAGE(to_f16(f).bits == h, "bits 0x" << std::hex << b);
    }
  }
}

TEST_CASE("f32 -> bf16 -> f32 round-trips every bf16 and keeps NaN") {
  for (std::uint32_t b = 0; b < 65536; ++b) {
    const auto h = static_cast<std::uint16_t>(b);
    const float f = to_f32(bf16{h});
    if (std::isnan(f)) CHECK(std::isnan(to_f32(to_bf16(f))));
    else REQUIRE(to_bf16(f).bits == h);
  }
}

TEST_CASE("f32 -> f16 rounds midpoints to even, overflows to inf, underflows to zero") {
  // Between each pair of adjacent positive f16 values (normal and subnormal),
  // the exact midpoint goes to the even neighbour; a hair above goes up.
  for (std::uint16_t b = 0; b < 0x7bff; ++b) {
    const double lo = to_f32(f16{b}), hi = to_f32(f16{static_cast<std::uint16_t>(b + 1)});
    const float mid = static_cast<float>((lo + hi) / 2);  // exact: f16 midpoints fit in f32
    const std::uint16_t even = (b & 1) ? static_cast<std::uint16_t>(b + 1) : b;
    REQUIRE(to_f16(mid).bits == even);
    REQUIRE(to_f16(std::nextafter(mid, 1e9f)).bits == b + 1);
    REQUIRE(to_f16(std::nextafter(mid, -1e9f)).bits == b);
    REQUIRE(to_f16(-mid).bits == (even | 0x8000));
  }
  CHECK(to_f16(65504.0f).bits == 0x7bff);
  CHECK(to_f16(65519.99f).bits == 0x7bff);     // below the midpoint to 2^16
  CHECK(to_f16(65520.0f).bits == 0x7c00);      // midpoint, ties to even = inf
  CHECK(to_f16(1e10f).bits == 0x7c00);
  CHECK(to_f16(-1e10f).bits == 0xfc00);
  CHECK(to_f16(std::numeric_limits<float>::infinity()).bits == 0x7c00);
  CHECK(to_f16(std::ldexp(1.0f, -25)).bits == 0x0000);                     // half of the smallest subnormal: tie to even
  CHECK(to_f16(std::nextafter(std::ldexp(1.0f, -25), 1.0f)).bits == 0x0001);
  CHECK(to_f16(1e-30f).bits == 0x0000);
  CHECK(to_f16(-0.0f).bits == 0x8000);
  CHECK(std::isnan(to_f32(to_f16(std::numeric_limits<float>::quiet_NaN()))));
}

TEST_CASE("f32 -> bf16 rounds to nearest even") {
  CHECK(to_bf16(1.0f).bits == 0x3f80);
  // 1 + 2^-8 is the midpoint between 1 and 1 + 2^-7: ties to even (1.0).
  CHECK(to_bf16(1.0f + std::ldexp(1.0f, -8)).bits == 0x3f80);
  CHECK(to_bf16(std::nextafter(1.0f + std::ldexp(1.0f, -8), 2.0f)).bits == 0x3f81);
  // 1 + 3*2^-8 is the midpoint between 0x3f81 and 0x3f82: ties to even (0x3f82).
  CHECK(to_bf16(1.0f + 3 * std::ldexp(1.0f, -8)).bits == 0x3f82);
  CHECK(to_bf16(std::numeric_limits<float>::max()).bits == 0x7f80);  // rounds up to inf
  CHECK(to_bf16(-0.0f).bits == 0x8000);
  CHECK(std::isnan(to_f32(to_bf16(std::numeric_limits<float>::quiet_NaN()))));
  CHECK(std::isnan(to_f32(to_bf16(-std::numeric_limits<float>::quiet_NaN()))));
}

#if defined(__F16C__)
TEST_CASE("f32 -> f16 agrees with the F16C hardware conversion on random floats") {
  std::mt19937 rng(1234);
  std::uniform_int_distribution<std::uint32_t> bits;
  for (int i = 0; i < 2'000'000; ++i) {
    const float f = std::bit_cast<float>(bits(rng));
    if (std::isnan(f)) continue;
    const auto hw = static_cast<std::uint16_t>(_cvtss_sh(f, _MM_FROUND_TO_NEAREST_INT));
    REQUIRE_MESSAGE(to_f16(f).bits == hw, "float bits 0x" << std::hex << std::bit_cast<std::uint32_t>(f));
  }
}
#endif
