// tests/sampler/test_rng.cpp: the generators' outputs, bit for bit.
#include <doctest/doctest.h>

#include <cstdint>
#include <set>

#include "kestrel/sampler/rng.hpp"

using namespace kestrel;

TEST_CASE("splitmix64 matches the published reference stream for seed 0") {
  // The reference outputs of Vigna's splitmix64.c for x = 0 (also what
  // xoshiro's documentation uses to seed), recomputed with Python integers.
  splitmix64 g(0);
  CHECK(g.next_u64() == 0xE220A8397B1DCDAFull);
  CHECK(g.next_u64() == 0x6E789E6AA1B965F4ull);
  CHECK(g.next_u64() == 0x06C45D188009454Full);
  CHECK(g.next_u64() == 0xF88BB8A8724C81ECull);
}

TEST_CASE("splitmix64 derived outputs are the documented bit slices") {
  splitmix64 a(133742), b(133742);
  CHECK(a.next_u64() == 0xC80C1308A7E09170ull);  // Python integers, as above
  CHECK(b.next_u32() == 0xC80C1308u);
  const std::uint64_t z2 = 0x02111F67C0BF8F2Eull;
  CHECK(a.next_float() == float(z2 >> 40) / 16777216.0f);
  CHECK(b.next_double() == double(z2 >> 11) / 9007199254740992.0);
  CHECK(a.state() == b.state());
  splitmix64 c(a.state());  // the state is the whole state
  CHECK(c.next_u64() == a.next_u64());
}

TEST_CASE("splitmix64 floats and doubles stay in [0, 1)") {
  splitmix64 g(42);
  for (int i = 0; i < 100000; ++i) {
    const float f = g.next_float();
    const double d = g.next_double();
    REQUIRE(f >= 0.0f);
    REQUIRE(f < 1.0f);
    REQUIRE(d >= 0.0);
    REQUIRE(d < 1.0);
  }
  // The extremes of the documented formulas are still < 1.
  CHECK(float(0xFFFFFFull) * 0x1p-24f < 1.0f);
  CHECK(double((~0ull) >> 11) * 0x1p-53 < 1.0);
}

TEST_CASE("splitmix64 is usable at compile time and as a std URBG") {
  constexpr auto first = [] {
    splitmix64 g(0);
    return g();
  }();
  static_assert(first == 0xE220A8397B1DCDAFull);
  static_assert(splitmix64::min() == 0 && splitmix64::max() == ~0ull);
}

TEST_CASE("llama2c_rng reproduces run.c's xorshift* for seed 133742") {
  // Expected values from an independent Python evaluation of run.c's
  // recurrence with explicit mod-2^64 masks.
  llama2c_rng g(133742);
  CHECK(g.next_u32() == 0xB4D0037Eu);
  CHECK(g.next_u32() == 0x9F67C4B0u);
  CHECK(g.next_u32() == 0x89DB8337u);
  CHECK(g.next_u32() == 0x8857315Bu);
  CHECK(g.next_u32() == 0x53F322D1u);
  CHECK(g.next_u32() == 0xDE71006Du);

  llama2c_rng f(133742);
  CHECK(f.next_float() == 0.7062990069389343f);  // (0xB4D0037E >> 8) / 2^24
  CHECK(f.next_float() == 0.6226770877838135f);
}

TEST_CASE("llama2c_rng agrees with a 128-bit evaluation of the recurrence") {
  std::uint64_t s = 133742;
  llama2c_rng g(s);
  for (int i = 0; i < 1000; ++i) {
    s ^= s >> 12;
    s ^= s << 25;
    s ^= s >> 27;
    // The low 64 bits of the full product, then its bits 32..63.
    const unsigned __int128 prod = static_cast<unsigned __int128>(s) * 0x2545F4914F6CDD1Dull;
    const auto expected = static_cast<std::uint32_t>(static_cast<std::uint64_t>(prod) >> 32);
    REQUIRE(g.next_u32() == expected);
    REQUIRE(g.state() == s);
  }
}

TEST_CASE("different seeds give different streams") {
  std::set<std::uint64_t> firsts;
  for (std::uint64_t seed = 0; seed < 1000; ++seed) firsts.insert(splitmix64(seed).next_u64());
  CHECK(firsts.size() == 1000);  // splitmix64's output is a bijection of the state
  std::set<std::uint32_t> l2c;
  for (std::uint64_t seed = 1; seed <= 1000; ++seed) l2c.insert(llama2c_rng(seed).next_u32());
  CHECK(l2c.size() > 990);
  CHECK(llama2c_rng(0).next_u32() == 0);  // the documented fixed point
}
