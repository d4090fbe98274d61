// kestrel/sampler/rng.hpp: seeded random generators whose every output is
// specified here bit for bit, so the same seed gives the same tokens with any
// compiler on any platform.
//
// The std:: engines are exactly specified but the std:: distributions are
// not (std::uniform_real_distribution and std::discrete_distribution differ
// between libstdc++, libc++ and MSVC), so samplers never use them: they take
// `next_float()` / `next_double()` from these types instead.
#pragma once

#include <cstdint>

namespace kestrel {

/// SplitMix64 (Steele, Lea, Flood 2014; the seeding generator of xoshiro):
/// a 64-bit counter advanced by the golden-ratio increment and passed through
/// a bijective mixer. Every seed, 0 included, gives a full-period (2^64)
/// stream, which is why it is the default: xorshift-family generators have 0
/// as a fixed point and need seed laundering. Passes BigCrush; not
/// cryptographic.
///
/// Output, exactly:
///   state += 0x9E3779B97F4A7C15
///   z = state; z = (z ^ z>>30) * 0xBF58476D1CE4E5B9; z = (z ^ z>>27) * 0x94D049BB133111EB
///   next_u64() = z ^ z>>31              (seed 0: 0xE220A8397B1DCDAF, 0x6E789E6AA1B965F4, ...)
///   next_u32() = next_u64() >> 32       (the high half: the best-mixed bits)
///   next_float()  = (next_u64() >> 40) * 2^-24   in [0, 1), 24 bits, exact in float
///   next_double() = (next_u64() >> 11) * 2^-53   in [0, 1), 53 bits, exact in double
/// Each call consumes exactly one 64-bit step.
///
/// Also a UniformRandomBitGenerator (result_type, min, max, operator()).
class splitmix64 {
 public:
  using result_type = std::uint64_t;

  constexpr explicit splitmix64(std::uint64_t seed = 0) noexcept : state_(seed) {}

  constexpr std::uint64_t next_u64() noexcept {
    state_ += 0x9E3779B97F4A7C15ull;
    std::uint64_t z = state_;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
  constexpr std::uint32_t next_u32() noexcept { return static_cast<std::uint32_t>(next_u64() >> 32); }
  constexpr float next_float() noexcept { return static_cast<float>(next_u64() >> 40) * 0x1p-24f; }
  constexpr double next_double() noexcept { return static_cast<double>(next_u64() >> 11) * 0x1p-53; }

  /// The whole state: `splitmix64(g.state())` continues exactly where `g` is.
  constexpr std::uint64_t state() const noexcept { return state_; }

  static constexpr result_type min() noexcept { return 0; }
  static constexpr result_type max() noexcept { return ~result_type{0}; }
  constexpr result_type operator()() noexcept { return next_u64(); }

 private:
  std::uint64_t state_;
};

/// The generator of llama2.c run.c (xorshift64* by Marsaglia/Vigna, output
/// multiplier 0x2545F4914F6CDD1D), kept separate so that `llama2c_sampler`
/// reproduces run.c's texts for a given `-s` seed:
///   state ^= state >> 12; state ^= state << 25; state ^= state >> 27
///   next_u32()   = (state * 0x2545F4914F6CDD1D) >> 32      (mod 2^64 product)
///   next_float() = float(next_u32() >> 8) / 16777216.0f    in [0, 1), 24 bits, exact
/// Seed 133742 gives 0xB4D0037E, 0x9F67C4B0, 0x89DB8337, ...
/// Seed 0 is the xorshift fixed point (all outputs 0); run.c never uses it
/// (it replaces 0 with time(NULL)), and `llama2c_sampler` rejects it.
class llama2c_rng {
 public:
  constexpr explicit llama2c_rng(std::uint64_t seed) noexcept : state_(seed) {}

  constexpr std::uint32_t next_u32() noexcept {
    state_ ^= state_ >> 12;
    state_ ^= state_ << 25;
    state_ ^= state_ >> 27;
    return static_cast<std::uint32_t>((state_ * 0x2545F4914F6CDD1Dull) >> 32);
  }
  constexpr float next_float() noexcept { return static_cast<float>(next_u32() >> 8) / 16777216.0f; }

  constexpr std::uint64_t state() const noexcept { return state_; }

 private:
  std::uint64_t state_;
};

}  // namespace kestrel
