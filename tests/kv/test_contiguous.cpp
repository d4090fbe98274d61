// kv/contiguous.hpp: layout, bounds and the KvCache concept.
#include <doctest/doctest.h>

#include <cmath>

#include "kestrel/kv/contiguous.hpp"

using namespace kestrel;

static_assert(KvCache<contiguous_kv_cache>);
static_assert(KvCache<f16_kv_cache>);
static_assert(!KvCache<int>);
static_assert(!std::is_copy_constructible_v<contiguous_kv_cache>, "copies of a cache are explicit: copy()");

TEST_CASE("contiguous cache: each KV head's positions in one run, contents kept") {
  // 3 layers, 16 positions, kv_dim 8 as 2 KV heads of 4 (and as 1 head of 8).
  for (std::size_t n_head_kv : {1, 2}) {
    CAPTURE(n_head_kv);
    const std::size_t head_dim = 8 / n_head_kv;
    contiguous_kv_cache c(3, 16, 8, n_head_kv);
    CHECK(c.n_layer() == 3);
    CHECK(c.n_ctx() == 16);
    CHECK(c.kv_dim() == 8);
    CHECK(c.n_head_kv() == n_head_kv);
    CHECK(c.size() == 0);
    for (std::size_t l = 0; l < 3; ++l)
      for (std::size_t p = 0; p < 16; ++p) {
        float k[8], v[8];
        for (std::size_t i = 0; i < 8; ++i) {
          k[i] = static_cast<float>(l * 1000 + p * 10 + i);
          v[i] = -k[i];
        }
        c.store(l, p, k, v);
      }
    for (std::size_t l = 0; l < 3; ++l) {
      const kv_rows k = c.keys(l), v = c.values(l);
      CHECK(k.stride == head_dim);
      CHECK(k.head_stride == 16 * head_dim);
      CHECK(v.stride == head_dim);
      CHECK(v.head_stride == 16 * head_dim);
      for (std::size_t h = 0; h < n_head_kv; ++h)
        for (std::size_t p = 0; p < 16; ++p)
          for (std::size_t d = 0; d < head_dim; ++d) {
            const auto want = static_cast<float>(l * 1000 + p * 10 + h * head_dim + d);
            CHECK(k.at(h, p)[d] == want);
            CHECK(v.at(h, p)[d] == -want);
          }
      // One head's positions are one run: position p + 1 right after p.
      CHECK(k.at(n_head_kv - 1, 5) + head_dim == k.at(n_head_kv - 1, 6));
    }
    c.resize(16);
    CHECK(c.size() == 16);
    CHECK_THROWS_WITH_AS(c.resize(17), "KV cache: 17 positions exceed the context of 16", invalid_argument);
    auto d = c.copy();
    c.clear();
    CHECK(c.size() == 0);
    CHECK(d.size() == 16);
    CHECK(d.n_head_kv() == n_head_kv);
    CHECK(d.keys(2).at(n_head_kv - 1, 15)[head_dim - 1] == 2157.0f);
  }
}

TEST_CASE("f16 cache: store rounds to nearest f16, half the memory of f32") {
  f16_kv_cache c(2, 8, 6, 2);  // 2 layers, 8 positions, 2 KV heads of 3
  const float k[6] = {1.0f, 1.0f / 3.0f, -65504.0f, 1e-8f, 0.1f, 2049.0f};
  const float v[6] = {-2.5f, 3.14159265f, 0.0f, -0.0f, 1e5f, 6.1e-5f};
  c.store(1, 5, k, v);
  for (std::size_t h = 0; h < 2; ++h)
    for (std::size_t d = 0; d < 3; ++d) {
      CHECK(to_f32(c.keys(1).at(h, 5)[d]) == to_f32(to_f16(k[h * 3 + d])));
      CHECK(to_f32(c.values(1).at(h, 5)[d]) == to_f32(to_f16(v[h * 3 + d])));
    }
  CHECK(to_f32(c.keys(1).at(0, 5)[1]) != 1.0f / 3.0f);  // rounded: 1/3 is not an f16
  CHECK(std::isinf(to_f32(c.values(1).at(1, 5)[1])));   // 1e5 overflows f16's 65504
  static_assert(sizeof(*f16_kv_cache{}.keys(0).base) * 2 == sizeof(*contiguous_kv_cache{}.keys(0).base));
}

TEST_CASE("f16 cache: the vector conversion gives to_f16's bits, subnormals, ties and overflow included") {
  // 4 KV heads of 37 (rows of 148: the 16- and 8-wide loops and the scalar
  // tail), values spread over every f16 exponent and past it, ties at the
  // halfway points of both normal and subnormal steps.
  f16_kv_cache c(1, 64, 148, 4);
  std::uint32_t state = 12345;
  auto next = [&] { return state = state * 1664525u + 1013904223u; };
  for (std::size_t p = 0; p < 64; ++p) {
    float k[148], v[148];
    for (std::size_t i = 0; i < 148; ++i) {
      const int e = static_cast<int>(next() % 48) - 30;  // 2^-30 .. 2^17
      const float m = 1.0f + static_cast<float>(next() % 2048) / 2048.0f;  // 11-bit: some exact ties after rounding
      k[i] = std::ldexp(next() % 2 ? m : -m, e);
      v[i] = std::ldexp(1.0f + static_cast<float>(next() % 1024) / 1024.0f + 1.0f / 2048.0f, e);  // exact ties
    }
    c.store(0, p, k, v);
    for (std::size_t h = 0; h < 4; ++h)
      for (std::size_t d = 0; d < 37; ++d) {
        CHECK(c.keys(0).at(h, p)[d].bits == to_f16(k[h * 37 + d]).bits);
        CHECK(c.values(0).at(h, p)[d].bits == to_f16(v[h * 37 + d]).bits);
      }
  }
}

TEST_CASE("an absurd context is a clear error, not a bad_alloc") {
  CHECK_THROWS_WITH_AS(contiguous_kv_cache(80, 1u << 24, 8192), doctest::Contains("lower the context"), invalid_argument);
  CHECK_THROWS_WITH_AS(contiguous_kv_cache(2, 16, 8, 3), doctest::Contains("3 KV heads do not divide kv_dim 8"),
                       invalid_argument);
  CHECK_THROWS_WITH_AS(contiguous_kv_cache(2, 16, 8, 0), doctest::Contains("0 KV heads"), invalid_argument);
}
