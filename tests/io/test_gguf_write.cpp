// io/gguf_write.hpp: what the builder writes reads back identically.
#include <doctest/doctest.h>

#include <cstring>
#include <string>
#include <vector>

#include "fixtures.hpp"
#include "kestrel/io/gguf.hpp"
#include "kestrel/io/gguf_write.hpp"

using namespace kestrel;
using namespace kestrel::io;

TEST_CASE("gguf_builder: every value type, arrays and tensors read back identically") {
  gguf_builder b;
  b.set("u8", std::uint8_t{200});
  b.set("i8", std::int8_t{-100});
  b.set("u16", std::uint16_t{60000});
  b.set("i16", std::int16_t{-30000});
  b.set("u32", std::uint32_t{4000000000u});
  b.set("i32", std::int32_t{-2000000000});
  b.set("u64", std::uint64_t{1} << 60);
  b.set("i64", -(std::int64_t{1} << 60));
  b.set("f32", 1.5f);
  b.set("f64", -2.25);
  b.set("yes", true);
  b.set("name", std::string("kestrel \xe2\x96\x81 test"));
  b.set_array("floats", std::vector<float>{1, 2, 3});
  b.set_array("strings", std::vector<std::string>{"a", "", "ccc"});
  b.set_array("bools", std::vector<bool>{true, false});
  b.set("general.alignment", std::uint32_t{64});
  std::vector<float> t1(8 * 3);
  for (std::size_t i = 0; i < t1.size(); ++i) t1[i] = static_cast<float>(i) * 0.5f;
  b.add_tensor("t1", {8, 3}, ggml_type::f32, std::as_bytes(std::span(t1)));
  std::vector<std::byte> q(34 * 2, std::byte{7});
  b.add_tensor("q", {64}, ggml_type::q8_0, q);
  CHECK_THROWS_AS(b.add_tensor("bad", {33}, ggml_type::q8_0, q), invalid_argument);
  CHECK_THROWS_AS(b.add_tensor("q", {64}, ggml_type::q8_0, q), invalid_argument);

  const auto path = test::scratch_dir("gguf-write") / "all.gguf";
  b.write(path);
  const gguf_file f(path);
  CHECK(f.version() == 3);
  CHECK(f.alignment() == 64);
  CHECK(f.get<std::uint8_t>("u8") == 200);
  CHECK(f.get<std::int8_t>("i8") == -100);
  CHECK(f.get<std::uint16_t>("u16") == 60000);
  CHECK(f.get<std::int16_t>("i16") == -30000);
  CHECK(f.get<std::uint32_t>("u32") == 4000000000u);
  CHECK(f.get<std::int32_t>("i32") == -2000000000);
  CHECK(f.get<std::uint64_t>("u64") == std::uint64_t{1} << 60);
  CHECK(f.get<std::int64_t>("i64") == -(std::int64_t{1} << 60));
  CHECK(f.get<float>("f32") == 1.5f);
  CHECK(f.get<double>("f64") == -2.25);
  CHECK(f.get<bool>("yes"));
  CHECK(f.get<std::string>("name") == "kestrel \xe2\x96\x81 test");
  CHECK(f.get_array<float>("floats") == std::vector<float>{1, 2, 3});
  CHECK(f.get_array<std::string>("strings") == std::vector<std::string>{"a", "", "ccc"});
  CHECK(f.get_array<bool>("bools") == std::vector<bool>{true, false});
  const auto& ti = f.tensor("t1");
  CHECK(ti.dims == std::vector<std::uint64_t>{8, 3});
  CHECK(std::memcmp(ti.data, t1.data(), t1.size() * 4) == 0);
  CHECK(reinterpret_cast<std::uintptr_t>(f.tensor("q").data) % 64 == 0);
  CHECK(std::memcmp(f.tensor("q").data, q.data(), q.size()) == 0);
}

TEST_CASE("gguf_builder: rewriting a real model file keeps its metadata and tensor bytes") {
  for (const char* name : {"gguf/stories260K.gguf", "gguf/llama-2-tiny-random.gguf"}) {
    CAPTURE(name);
    const auto p = test::fixture(name);
    if (!p) return;
    const gguf_file src(*p);
    gguf_builder b(src.alignment());
    for (const auto& k : src.keys()) b.copy_kv(src, k);
    for (const auto& t : src.tensors()) b.add_tensor(t.name, t.dims, t.type, {t.data, static_cast<std::size_t>(t.size_bytes)});
    const auto out = test::scratch_dir("gguf-write") / "copy.gguf";
    b.write(out);
    const gguf_file back(out);
    REQUIRE(back.keys() == src.keys());
    for (const auto& k : src.keys()) {
      CAPTURE(k);
      REQUIRE(back.type_of(k) == src.type_of(k));
      if (src.type_of(k) == gguf_type::string) CHECK(back.get<std::string>(k) == src.get<std::string>(k));
      if (src.type_of(k) == gguf_type::uint32) CHECK(back.get<std::uint32_t>(k) == src.get<std::uint32_t>(k));
      if (src.type_of(k) == gguf_type::float32) CHECK(back.get<float>(k) == src.get<float>(k));
      if (src.type_of(k) == gguf_type::array && src.array_type_of(k) == gguf_type::string)
        CHECK(back.get_array<std::string>(k) == src.get_array<std::string>(k));
      if (src.type_of(k) == gguf_type::array && src.array_type_of(k) == gguf_type::float32)
        CHECK(back.get_array<float>(k) == src.get_array<float>(k));
      if (src.type_of(k) == gguf_type::array && src.array_type_of(k) == gguf_type::int32)
        CHECK(back.get_array<std::int32_t>(k) == src.get_array<std::int32_t>(k));
    }
    REQUIRE(back.tensors().size() == src.tensors().size());
    for (std::size_t i = 0; i < src.tensors().size(); ++i) {
      const auto &a = src.tensors()[i], &c = back.tensors()[i];
      CHECK(a.name == c.name);
      CHECK(a.dims == c.dims);
      CHECK(a.type == c.type);
      CHECK(a.offset - src.data_offset() == c.offset - back.data_offset());
      CHECK(std::memcmp(a.data, c.data, a.size_bytes) == 0);
    }
    // The original layout is reproduced byte for byte when the original
    // writer used the same order and padding (llama.cpp's does).
    CHECK(test::read_file(out) == test::read_file(*p));
  }
}
