// core/: extents, aligned buffers, tensor views, mmap and errors.
#include <doctest/doctest.h>

#include <cstdint>
#include <string>

#include "fixtures.hpp"
#include "kestrel/core/buffer.hpp"
#include "kestrel/core/error.hpp"
#include "kestrel/core/extents.hpp"
#include "kestrel/core/mmap.hpp"
#include "kestrel/core/tensor.hpp"

using namespace kestrel;

TEST_CASE("static extents cost nothing and reject other values") {
  static_assert(sizeof(extent<64>) == 1);  // empty class
  static_assert(extent<64>{}() == 64);
  static_assert(extent<64>::is_static && !extent<dynamic>::is_static);
  CHECK(extent<64>(64, "n_embd")() == 64);
  CHECK_THROWS_WITH_AS(extent<64>(65, "n_embd"), "n_embd: expected 64 (fixed at compile time), got 65", invalid_argument);
  CHECK(extent<dynamic>(65)() == 65);
}

TEST_CASE("aligned_buffer is aligned, zeroed, movable and copies only explicitly") {
  aligned_buffer<float> b(1000);
  CHECK(reinterpret_cast<std::uintptr_t>(b.data()) % buffer_alignment == 0);
  for (float v : b) REQUIRE(v == 0.0f);
  b[3] = 7;
  auto c = b.copy();
  c[3] = 8;
  CHECK(b[3] == 7);
  aligned_buffer<float> d = std::move(b);
  CHECK(d.size() == 1000);
  CHECK(b.size() == 0);
  CHECK(aligned_buffer<float>(0).empty());
  static_assert(!std::is_copy_constructible_v<aligned_buffer<float>>);
}

TEST_CASE("tensor_view indexes row-major with shapes") {
  float data[2 * 3 * 4];
  for (int i = 0; i < 24; ++i) data[i] = static_cast<float>(i);
  tensor_view<float, 3> t(data, {2, 3, 4});
  CHECK(t.size() == 24);
  CHECK(t[1][2][3] == 23.0f);
  CHECK(t[1].extent(0) == 3);
  weight_view w{dtype::f16, data, 3, 4};
  CHECK(w.row_bytes() == 8);
  CHECK(w.bytes() == 24);
}

TEST_CASE("huge_page_buffer: 2 MiB-aligned, zeroed, movable; release_pages reads the file back") {
  huge_page_buffer empty;
  CHECK(empty.data() == nullptr);
  CHECK(huge_page_buffer(0).size() == 0);
  huge_page_buffer b(3 * 1000 * 1000);
  REQUIRE(b.data() != nullptr);
  CHECK(b.size() == 3000000u);
  CHECK(reinterpret_cast<std::uintptr_t>(b.data()) % huge_page_buffer::huge_page == 0);
  CHECK(b.data()[0] == std::byte{0});
  CHECK(b.data()[b.size() - 1] == std::byte{0});
  b.data()[b.size() - 1] = std::byte{7};
  huge_page_buffer moved = std::move(b);
  CHECK(b.data() == nullptr);
  CHECK(moved.data()[moved.size() - 1] == std::byte{7});

  // Pages given back from a file mapping come back with the file's bytes.
  const auto dir = test::scratch_dir("core");
  std::string text(3 * 65536 + 100, '\0');
  for (std::size_t i = 0; i < text.size(); ++i) text[i] = static_cast<char>('a' + i % 26);
  test::write_file(dir / "pages.bin", text);
  mapped_file f(dir / "pages.bin");
  const auto at = [&](std::size_t i) { return static_cast<char>(f.data()[i]); };
  CHECK(at(70000) == text[70000]);
  release_pages(f.data() + 1, f.size() - 1);  // every whole page inside, from the second on
  CHECK(at(0) == 'a');
  CHECK(at(70000) == text[70000]);
  CHECK(at(text.size() - 1) == text.back());
}

TEST_CASE("mapped_file and byte_reader give clear errors") {
  const auto dir = test::scratch_dir("core");
  CHECK_THROWS_WITH_AS(mapped_file{dir / "missing.bin"}, doctest::Contains("cannot open"), file_error);
  CHECK_THROWS_WITH_AS(mapped_file{dir}, doctest::Contains("is a directory"), file_error);
  test::write_file(dir / "empty.bin", "");
  CHECK_THROWS_WITH_AS(mapped_file{dir / "empty.bin"}, doctest::Contains("file is empty"), file_error);

  test::write_file(dir / "six.bin", std::string("\x01\x00\x00\x00\x02\x00", 6));
  mapped_file f(dir / "six.bin");
  CHECK(f.size() == 6);
  byte_reader r(f.bytes(), f.path());
  CHECK(r.read<std::uint32_t>("first") == 1u);
  CHECK_THROWS_WITH_AS(r.read<std::uint32_t>("second"),
                       (f.path() + ": offset 4: truncated: reading second needs 4 bytes, 2 left").c_str(), file_error);
  CHECK_THROWS_AS(r.seek(7, "x"), file_error);

  // `what` may be a callable: it is called only to build a failure's message.
  byte_reader lazy(f.bytes(), f.path());
  int built = 0;
  auto what = [&] {
    ++built;
    return std::string("lazy field");
  };
  CHECK(lazy.read<std::uint16_t>(what) == 1u);
  lazy.skip(2, what);
  CHECK(built == 0);
  CHECK_THROWS_WITH_AS(lazy.take(3, what),
                       (f.path() + ": offset 4: truncated: reading lazy field needs 3 bytes, 2 left").c_str(), file_error);
  CHECK(built == 1);
  CHECK_THROWS_WITH_AS(lazy.fail(5, "bad byte"), (f.path() + ": offset 5: bad byte").c_str(), file_error);
}
