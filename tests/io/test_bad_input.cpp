// tests/io/test_bad_input.cpp: every file reader in io/ rejects truncated,
// corrupted and absent files with a kestrel::error, never a crash, a hang or
// a huge allocation. Run under ASan/UBSan or valgrind to make "never a crash"
// mean "never an invalid read" too.
#include <doctest/doctest.h>

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "fixtures.hpp"
#include "io/gguf_writer.hpp"
#include "kestrel/io/gguf.hpp"
#include "kestrel/io/llama2c.hpp"

using kestrel::io::gguf_file;
using kestrel::io::llama2c_checkpoint;
namespace fs = std::filesystem;

namespace {

/// After a corrupt file was accepted, read everything it claims to hold: the
/// accessors must stay inside the map (errors are fine, crashes are not).
void exercise(const gguf_file& g) {
  for (const auto& k : g.keys()) {
    try {
      if (g.type_of(k) == kestrel::io::gguf_type::array) {
        switch (g.array_type_of(k)) {
          case kestrel::io::gguf_type::string: (void)g.get_array<std::string>(k); break;
          case kestrel::io::gguf_type::float32:
          case kestrel::io::gguf_type::float64: (void)g.get_array<double>(k); break;
          case kestrel::io::gguf_type::bool_: (void)g.get_array<bool>(k); break;
          default: (void)g.get_array<std::int64_t>(k); break;
        }
      } else {
        switch (g.type_of(k)) {
          case kestrel::io::gguf_type::string: (void)g.get<std::string>(k); break;
          case kestrel::io::gguf_type::float32:
          case kestrel::io::gguf_type::float64: (void)g.get<double>(k); break;
          case kestrel::io::gguf_type::bool_: (void)g.get<bool>(k); break;
          default: (void)g.get<std::int64_t>(k); break;
        }
      }
    } catch (const kestrel::error&) {
    }
  }
  volatile unsigned sum = 0;
  for (const auto& t : g.tensors()) {
    REQUIRE(t.offset + t.size_bytes <= g.file().size());
    if (t.size_bytes) sum = sum + static_cast<unsigned>(t.data[0]) + static_cast<unsigned>(t.data[t.size_bytes - 1]);
  }
}

/// Opens `p` with Reader; returns true if it was accepted, false on a
/// kestrel::error with a message naming the file. Any other exception fails the test.
template <class Reader>
bool open_ok(const fs::path& p) {
  try {
    Reader r(p);
    if constexpr (std::is_same_v<Reader, gguf_file>) exercise(r);
    return true;
  } catch (const kestrel::error& e) {
    const std::string m = e.what();
    CHECK_MESSAGE(m.find(p.string()) == 0, m);
    return false;
  }
}

/// Copies `src` into the scratch folder and truncates the copy to every size
/// in `points` (largest first, so the file is written once): each must fail.
template <class Reader>
void truncations(const fs::path& src, const std::string& name, std::set<std::uint64_t> points) {
  const auto dst = kestrel::test::scratch_dir("io-bad") / name;
  fs::copy_file(src, dst, fs::copy_options::overwrite_existing);
  fs::permissions(dst, fs::perms::owner_read | fs::perms::owner_write, fs::perm_options::add);
  const auto full = fs::file_size(dst);
  std::size_t accepted = 0;
  for (auto it = points.rbegin(); it != points.rend(); ++it) {
    if (*it >= full) continue;
    fs::resize_file(dst, *it);
    if (open_ok<Reader>(dst)) {
      ++accepted;
      FAIL_CHECK(name << " truncated to " << *it << " bytes was accepted");
    }
  }
  CHECK(accepted == 0);
  MESSAGE(name << ": " << points.size() << " truncation points rejected");
}

std::set<std::uint64_t> dense_then_sparse(std::uint64_t dense_to, std::uint64_t size, std::uint64_t sparse_n) {
  std::set<std::uint64_t> pts;
  for (std::uint64_t i = 0; i <= std::min(dense_to, size - 1); ++i) pts.insert(i);
  for (std::uint64_t k = 1; k <= sparse_n; ++k) pts.insert(dense_to + (size - dense_to) * k / (sparse_n + 1));
  pts.insert(size - 1);
  return pts;
}

/// Corrupts `count` copies of `src` (seeded): 1 to 4 bytes in [lo, hi) set
/// to random values, bit flips, 0x00 or 0xff; half of the hits fall in the
/// first 64 bytes of the range, where counts and lengths live. Each copy must either parse
/// or throw a kestrel::error. The file is patched in place and restored.
template <class Reader>
std::size_t corruptions(const fs::path& src, const std::string& name, std::uint64_t lo, std::uint64_t hi,
                        int count, std::uint32_t seed) {
  const auto dst = kestrel::test::scratch_dir("io-bad") / name;
  fs::copy_file(src, dst, fs::copy_options::overwrite_existing);
  fs::permissions(dst, fs::perms::owner_read | fs::perms::owner_write, fs::perm_options::add);
  const std::string original = kestrel::test::read_file(dst);
  hi = std::min<std::uint64_t>(hi, original.size());
  REQUIRE(lo < hi);
  std::mt19937 rng(seed);
  std::fstream f(dst, std::ios::in | std::ios::out | std::ios::binary);
  REQUIRE(f.good());
  std::size_t rejected = 0;
  for (int it = 0; it < count; ++it) {
    const int n = 1 + static_cast<int>(rng() % 4);
    std::vector<std::uint64_t> at;
    for (int j = 0; j < n; ++j) {
      const std::uint64_t pos = lo + ((rng() & 1) ? rng() % std::min<std::uint64_t>(64, hi - lo) : rng() % (hi - lo));
      at.push_back(pos);
      char b = original[pos];
      switch (rng() % 4) {
        case 0: b = static_cast<char>(rng()); break;
        case 1: b = static_cast<char>(b ^ (1 << (rng() % 8))); break;
        case 2: b = 0; break;
        default: b = static_cast<char>(0xff); break;
      }
      f.seekp(static_cast<std::streamoff>(pos));
      f.put(b);
    }
    f.flush();
    rejected += !open_ok<Reader>(dst);
    for (auto pos : at) {
      f.seekp(static_cast<std::streamoff>(pos));
      f.put(original[pos]);
    }
    f.flush();
  }
  CHECK(open_ok<Reader>(dst));  // restored intact
  MESSAGE(name << ": " << count << " corrupted copies, " << rejected << " rejected, the rest parsed");
  return rejected;
}

}  // namespace

TEST_CASE("bad input: empty file, directory, missing path") {
  const auto dir = kestrel::test::scratch_dir("io-bad-misc");
  const auto empty = dir / "empty.gguf";
  kestrel::test::write_file(empty, "");
  const auto missing = dir / "does-not-exist.gguf";
  for (const auto& p : {empty, dir, missing}) {
    CAPTURE(p);
    CHECK(!open_ok<gguf_file>(p));
    CHECK(!open_ok<llama2c_checkpoint>(p));
    CHECK_THROWS_AS(gguf_file{p}, kestrel::file_error);
    CHECK_THROWS_AS(llama2c_checkpoint{p}, kestrel::file_error);
  }
  // The wrong kind of file: each reader names what it expected.
  if (auto bin = kestrel::test::fixture("llama2c/stories260K.bin")) {
    try {
      gguf_file g(*bin);
      FAIL("a llama2.c checkpoint was read as GGUF");
    } catch (const kestrel::file_error& e) {
      CHECK(std::string(e.what()).find("not a GGUF file") != std::string::npos);
      CHECK(e.offset() == 0);
    }
  }
  if (auto gg = kestrel::test::fixture("gguf/stories260K.gguf")) CHECK(!open_ok<llama2c_checkpoint>(*gg));
}

TEST_CASE("bad input: truncated stories260K.gguf at every header byte and through the data") {
  auto p = kestrel::test::fixture("gguf/stories260K.gguf");
  if (!p) return;
  // data_offset is 14176: every byte up to there and a little past, then 300 points in the data.
  truncations<gguf_file>(*p, "stories260K.trunc.gguf", dense_then_sparse(14176 + 64, fs::file_size(*p), 300));
}

TEST_CASE("bad input: truncated llama-2-tiny-random.gguf") {
  auto p = kestrel::test::fixture("gguf/llama-2-tiny-random.gguf");
  if (!p) return;
  // 724416 bytes of metadata (32000 tokens): dense over the header and first
  // keys, every 97th byte through the vocabulary, then points in the data.
  auto pts = dense_then_sparse(2048, fs::file_size(*p), 200);
  for (std::uint64_t i = 2048; i < 724416 + 64; i += 97) pts.insert(i);
  for (std::uint64_t i = 724416 - 600; i < 724416 + 64; ++i) pts.insert(i);  // the tensor table end
  truncations<gguf_file>(*p, "tiny-random.trunc.gguf", pts);
}

TEST_CASE("bad input: truncated stories260K.bin") {
  auto p = kestrel::test::fixture("llama2c/stories260K.bin");
  if (!p) return;
  truncations<llama2c_checkpoint>(*p, "stories260K.trunc.bin", dense_then_sparse(1024, fs::file_size(*p), 500));
  // One extra byte (or float) is as wrong as one missing.
  const auto dst = kestrel::test::scratch_dir("io-bad") / "stories260K.long.bin";
  kestrel::test::write_file(dst, kestrel::test::read_file(*p) + "abcd");
  CHECK(!open_ok<llama2c_checkpoint>(dst));
}

TEST_CASE("bad input: truncated vocab-only GGUF") {
  auto p = kestrel::test::fixture("llamacpp-vocab/ggml-vocab-gpt-2.gguf");
  if (!p) return;
  // No tensors, so the last byte is the end of the last key; all shorter sizes must fail.
  std::set<std::uint64_t> pts;
  const auto size = fs::file_size(*p);
  for (std::uint64_t i = 0; i < 512; ++i) pts.insert(i);
  for (std::uint64_t k = 1; k < 300; ++k) pts.insert(size * k / 300);
  for (std::uint64_t i = size - 64; i < size; ++i) pts.insert(i);
  truncations<gguf_file>(*p, "gpt2-vocab.trunc.gguf", pts);
}

TEST_CASE("bad input: corrupted header, metadata and tensor table (seeded)") {
  if (auto p = kestrel::test::fixture("gguf/stories260K.gguf")) {
    // Header, kv pairs and tensor table (the data section starts at 14176).
    corruptions<gguf_file>(*p, "stories260K.corrupt.gguf", 0, 14176, 3000, 1234);
    // The tensor table alone (48 infos after the last key, from about byte 11000).
    corruptions<gguf_file>(*p, "stories260K.corrupt2.gguf", 10900, 14176, 2000, 4321);
  }
  if (auto p = kestrel::test::fixture("gguf/llama-2-tiny-random.gguf"))
    {
    corruptions<gguf_file>(*p, "tiny-random.corrupt.gguf", 0, 724416, 600, 99);
    corruptions<gguf_file>(*p, "tiny-random.corrupt2.gguf", 724416 - 700, 724416, 1000, 98);  // tensor table
  }
  if (auto p = kestrel::test::fixture("llama2c/stories260K.bin")) {
    const auto rejected = corruptions<llama2c_checkpoint>(*p, "stories260K.corrupt.bin", 0, 28, 500, 7);
    CHECK(rejected > 400);  // almost any header change breaks the exact-size rule
  }
}

TEST_CASE("bad input: random mutations of a small GGUF with every structure") {
  kestrel::test::gguf_writer w;
  w.header(3, 2, 5);
  w.kv("general.alignment", 4, std::uint32_t{16});
  w.kv_str("s", "hello");
  w.kv_str_array("a.str", {"x", "yz", ""});
  w.kv_array<std::int32_t>("a.i32", 5, {1, -2, 3});
  w.kv("b", 7, std::uint8_t{1});
  w.tensor_info("t0", {32, 2}, 8, 0);   // Q8_0: 2 blocks, 68 bytes
  w.tensor_info("t1", {4}, 0, 80);      // F32
  w.pad(16).zeros(96);
  const std::string good = w.bytes;
  const auto dst = kestrel::test::scratch_dir("io-bad") / "mutate.gguf";
  kestrel::test::write_file(dst, good);
  REQUIRE(open_ok<gguf_file>(dst));

  std::mt19937 rng(42);
  std::size_t rejected = 0;
  const int n = 4000;
  for (int it = 0; it < n; ++it) {
    std::string b = good;
    const int k = 1 + static_cast<int>(rng() % 3);
    for (int j = 0; j < k; ++j) {
      const std::size_t pos = rng() % b.size();
      switch (rng() % 5) {
        case 0: b[pos] = static_cast<char>(rng()); break;
        case 1: b[pos] = static_cast<char>(b[pos] ^ (1 << (rng() % 8))); break;
        case 2: b[pos] = static_cast<char>(0xff); break;
        case 3: b.resize(pos + 1); break;  // truncate
        default: b.insert(pos, 1, static_cast<char>(rng())); break;
      }
    }
    kestrel::test::write_file(dst, b);
    rejected += !open_ok<gguf_file>(dst);
  }
  MESSAGE("small GGUF: " << n << " mutations, " << rejected << " rejected");
  CHECK(rejected > n / 2);
}
