// kv/contiguous.hpp: layout, bounds and the KvCache concept.
#include <doctest/doctest.h>

#include "kestrel/kv/contiguous.hpp"

using namespace kestrel;

static_assert(KvCache<contiguous_kv_cache>);
static_assert(!KvCache<int>);
static_assert(!std::is_copy_constructible_v<contiguous_kv_cache>, "copies of a cache are explicit: copy()");

TEST_CASE("contiguous cache rows are distinct, strided and keep their contents") {
  contiguous_kv_cache c(3, 16, 8);  // 3 layers, 16 positions, kv_dim 8
  CHECK(c.n_layer() == 3);
  CHECK(c.n_ctx() == 16);
  CHECK(c.kv_dim() == 8);
  CHECK(c.size() == 0);
  for (std::size_t l = 0; l < 3; ++l)
    for (std::size_t p = 0; p < 16; ++p)
      for (std::size_t i = 0; i < 8; ++i) {
        c.key(l, p)[i] = static_cast<float>(l * 1000 + p * 10 + i);
        c.value(l, p)[i] = -static_cast<float>(l * 1000 + p * 10 + i);
      }
  for (std::size_t l = 0; l < 3; ++l) {
    const kv_rows k = c.keys(l), v = c.values(l);
    CHECK(k.stride == 8);
    for (std::size_t p = 0; p < 16; ++p) {
      CHECK(k.base[p * k.stride + 3] == static_cast<float>(l * 1000 + p * 10 + 3));
      CHECK(v.base[p * v.stride + 5] == -static_cast<float>(l * 1000 + p * 10 + 5));
    }
  }
  c.resize(16);
  CHECK(c.size() == 16);
  CHECK_THROWS_WITH_AS(c.resize(17), "KV cache: 17 positions exceed the context of 16", invalid_argument);
  auto d = c.copy();
  c.clear();
  CHECK(c.size() == 0);
  CHECK(d.size() == 16);
  CHECK(d.keys(2).base[15 * 8 + 7] == 2157.0f);
}

TEST_CASE("an absurd context is a clear error, not a bad_alloc") {
  CHECK_THROWS_WITH_AS(contiguous_kv_cache(80, 1u << 24, 8192), doctest::Contains("lower the context"), invalid_argument);
}
