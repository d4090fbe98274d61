// tests/io/test_gguf.cpp: the GGUF reader on the real fixtures (checked
// against GGUF_INSPECTION.txt, an independent listing) and on files built in
// memory that use every metadata type, both versions and a custom alignment.
#include <doctest/doctest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <map>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "fixtures.hpp"
#include "io/gguf_writer.hpp"
#include "kestrel/io/gguf.hpp"

using kestrel::io::gguf_file;
using kestrel::io::gguf_type;
using kestrel::io::ggml_type;
namespace fs = std::filesystem;
using kestrel::test::error_of;
using kestrel::test::write_scratch;

namespace {

/// A tensor's data pointer is aligned for its elements (f32, f16, f64 are
/// read in place by the kernels) and, for block types, for the f16/f32
/// scales inside each block: it follows from general.alignment % 8 == 0 and
/// offsets that are multiples of the alignment.
void check_element_alignment(const kestrel::io::gguf_tensor_info& t) {
  CAPTURE(t.name);
  const auto addr = reinterpret_cast<std::uintptr_t>(t.data);
  CHECK(addr % 8 == 0);
  if (kestrel::io::block_size_of(t.type) == 1) CHECK(addr % kestrel::io::type_size_of(t.type) == 0);
}

// --- GGUF_INSPECTION.txt, parsed just far enough to check every fixture ----

struct inspected_kv {
  std::string key, type, value;  // type: "u32", "str", "[f32 x 512]", ...; value: the rest of the line
};
struct inspected_tensor {
  std::string name;
  std::vector<std::uint64_t> dims;
  std::string type;
  std::uint64_t offset = 0;
};
struct inspected_file {
  std::string rel;
  std::uint64_t size = 0, version = 0, n_tensors = 0, n_kv = 0, alignment = 0, data_offset = 0;
  std::vector<inspected_kv> kvs;
  std::vector<inspected_tensor> tensors;
};

std::uint64_t field(const std::string& line, const std::string& name) {
  auto at = line.find("  " + name + "=");
  REQUIRE(at != std::string::npos);
  return std::strtoull(line.c_str() + at + name.size() + 3, nullptr, 10);
}

std::vector<inspected_file> read_inspection(const fs::path& p) {
  std::ifstream in(p);
  std::vector<inspected_file> out;
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("== ", 0) == 0) {
      inspected_file f;
      f.rel = line.substr(3, line.find("  ") - 3);
      f.size = field(line, "size");
      f.version = field(line, "version");
      f.n_tensors = field(line, "n_tensors");
      f.n_kv = field(line, "n_kv");
      f.alignment = field(line, "alignment");
      f.data_offset = field(line, "data_offset");
      out.push_back(f);
    } else if (line.rfind("  kv ", 0) == 0) {
      REQUIRE(!out.empty());
      inspected_kv kv;
      const auto colon = line.find(": ", 5);
      kv.key = line.substr(5, colon - 5);
      std::string rest = line.substr(colon + 2);
      if (rest[0] == '[') {
        const auto close = rest.find(']');
        kv.type = rest.substr(0, close + 1);
        kv.value = rest.size() > close + 2 ? rest.substr(close + 2) : "";
      } else {
        const auto sp = rest.find(' ');
        kv.type = rest.substr(0, sp);
        kv.value = rest.substr(sp + 1);
      }
      out.back().kvs.push_back(kv);
    } else if (line.rfind("  tensor ", 0) == 0) {
      REQUIRE(!out.empty());
      inspected_tensor t;
      std::istringstream ss(line.substr(9));
      ss >> t.name;
      const auto lb = line.find("dims=[") + 6, rb = line.find(']', lb);
      std::istringstream ds(line.substr(lb, rb - lb));
      std::string d;
      while (std::getline(ds, d, ',')) t.dims.push_back(std::strtoull(d.c_str(), nullptr, 10));
      const auto ty = line.find("type=") + 5;
      t.type = line.substr(ty, line.find(' ', ty) - ty);
      t.offset = std::strtoull(line.c_str() + line.find("offset=") + 7, nullptr, 10);
      out.back().tensors.push_back(t);
    }
  }
  return out;
}

std::string short_name(gguf_type t) {
  switch (t) {
    case gguf_type::string: return "str";
    default: return std::string(kestrel::io::name_of(t));
  }
}

/// The numbers of a Python list repr "first: [0.0, -1000.0, ...]".
std::vector<double> numbers_after_first(const std::string& value) {
  std::vector<double> out;
  auto lb = value.find('[');
  if (lb == std::string::npos) return out;
  std::istringstream ss(value.substr(lb + 1, value.find(']') - lb - 1));
  std::string item;
  while (std::getline(ss, item, ',')) out.push_back(std::strtod(item.c_str(), nullptr));
  return out;
}

void check_against_inspection(const gguf_file& g, const inspected_file& f) {
  INFO("file: " << f.rel);
  CHECK(g.file().size() == f.size);
  CHECK(g.version() == f.version);
  CHECK(g.tensors().size() == f.n_tensors);
  CHECK(g.alignment() == f.alignment);
  CHECK(g.data_offset() == f.data_offset);
  const auto keys = g.keys();
  REQUIRE(keys.size() == f.n_kv);
  REQUIRE(f.kvs.size() == f.n_kv);
  for (std::size_t i = 0; i < keys.size(); ++i) {
    const auto& kv = f.kvs[i];
    INFO("key: " << kv.key);
    CHECK(keys[i] == kv.key);
    const auto t = g.type_of(kv.key);
    if (kv.type[0] == '[') {
      REQUIRE(t == gguf_type::array);
      const auto x = kv.type.find(" x ");
      const std::string elem = kv.type.substr(1, x - 1);
      const std::uint64_t n = std::strtoull(kv.type.c_str() + x + 3, nullptr, 10);
      CHECK(short_name(g.array_type_of(kv.key)) == elem);
      CHECK(g.array_size(kv.key) == n);
      const auto first = numbers_after_first(kv.value);
      if (elem == "f32") {
        const auto v = g.get_array<float>(kv.key);
        REQUIRE(v.size() == n);
        for (std::size_t j = 0; j < first.size(); ++j) CHECK(v[j] == static_cast<float>(first[j]));
      } else if (elem == "i32") {
        const auto v = g.get_array<std::int32_t>(kv.key);
        REQUIRE(v.size() == n);
        for (std::size_t j = 0; j < first.size(); ++j) CHECK(v[j] == static_cast<std::int32_t>(first[j]));
      } else if (elem == "str") {
        CHECK(g.get_array<std::string>(kv.key).size() == n);
      }
    } else if (kv.type == "u32") {
      CHECK(t == gguf_type::uint32);
      CHECK(g.get<std::uint32_t>(kv.key) == std::strtoull(kv.value.c_str(), nullptr, 10));
    } else if (kv.type == "f32") {
      CHECK(t == gguf_type::float32);
      // The listing prints the f32 widened to double, so the round trip is exact.
      CHECK(g.get<float>(kv.key) == static_cast<float>(std::strtod(kv.value.c_str(), nullptr)));
    } else if (kv.type == "bool") {
      CHECK(t == gguf_type::bool_);
      CHECK(g.get<bool>(kv.key) == (kv.value == "True"));
    } else if (kv.type == "str") {
      CHECK(t == gguf_type::string);
      const auto s = g.get<std::string>(kv.key);
      if (kv.value[0] == '\'') {
        CHECK(s == kv.value.substr(1, kv.value.size() - 2));
      } else {  // "(269 chars)"
        CHECK(s.size() == std::strtoull(kv.value.c_str() + 1, nullptr, 10));
      }
    } else {
      FAIL("unexpected type in the listing: " << kv.type);
    }
  }
  REQUIRE(f.tensors.size() == g.tensors().size());
  for (std::size_t i = 0; i < f.tensors.size(); ++i) {
    const auto& want = f.tensors[i];
    const auto& got = g.tensors()[i];
    INFO("tensor: " << want.name);
    CHECK(got.name == want.name);
    CHECK(got.dims == want.dims);
    CHECK(kestrel::io::name_of(got.type) == want.type);
    CHECK(got.offset == f.data_offset + want.offset);
    CHECK(got.data == g.file().data() + got.offset);
    CHECK(reinterpret_cast<std::uintptr_t>(got.data) % g.alignment() == 0);
    check_element_alignment(got);
    CHECK(g.find_tensor(want.name) == &got);
  }
}

}  // namespace

TEST_CASE("gguf: every fixture parses and matches GGUF_INSPECTION.txt") {
  auto listing = kestrel::test::fixture("GGUF_INSPECTION.txt");
  if (!listing) return;
  const auto files = read_inspection(*listing);
  CHECK(files.size() == 14);
  std::size_t checked = 0;
  for (const auto& f : files) {
    auto p = kestrel::test::fixture(f.rel);
    if (!p) continue;
    gguf_file g(*p);
    check_against_inspection(g, f);
    ++checked;
  }
  CHECK(checked == files.size());

  // Every .gguf in the two fixture folders is in the listing.
  for (const char* dir : {"gguf", "llamacpp-vocab"}) {
    for (const auto& e : fs::directory_iterator(kestrel::test::fixtures_dir() / dir)) {
      if (e.path().extension() != ".gguf") continue;
      const std::string rel = std::string(dir) + "/" + e.path().filename().string();
      bool listed = false;
      for (const auto& f : files) listed |= f.rel == rel;
      CHECK_MESSAGE(listed, rel);
    }
  }
}

TEST_CASE("gguf: stories260K.gguf") {
  auto p = kestrel::test::fixture("gguf/stories260K.gguf");
  if (!p) return;
  gguf_file g(*p);
  CHECK(g.version() == 3);
  CHECK(g.path() == p->string());
  CHECK(g.tensors().size() == 48);
  CHECK(g.keys().size() == 19);
  CHECK(g.alignment() == 32);
  CHECK(g.data_offset() == 14176);
  CHECK(g.get<std::string>("general.architecture") == "llama");
  CHECK(g.get<std::string_view>("general.name") == "llama");
  CHECK(g.get<std::uint32_t>("llama.context_length") == 2048);
  CHECK(g.get<int>("llama.block_count") == 5);
  CHECK(g.get<std::int64_t>("llama.embedding_length") == 64);
  CHECK(g.get<std::size_t>("llama.feed_forward_length") == 172);
  CHECK(g.get<float>("llama.attention.layer_norm_rms_epsilon") == 1e-5f);
  CHECK(g.get<double>("llama.attention.layer_norm_rms_epsilon") == static_cast<double>(1e-5f));
  CHECK(g.get<std::uint32_t>("tokenizer.ggml.padding_token_id") == 4294967295u);
  CHECK(g.get<std::int64_t>("tokenizer.ggml.padding_token_id") == 4294967295);
  CHECK(!g.has("general.alignment"));
  CHECK(g.has("tokenizer.ggml.tokens"));

  // Conversions that do not fit, wrong types, missing keys: clear errors.
  auto e = error_of([&] { (void)g.get<std::int32_t>("tokenizer.ggml.padding_token_id"); });
  CHECK(e.find("4294967295") != std::string::npos);
  CHECK(e.find("does not fit in i32") != std::string::npos);
  CHECK(e.find(p->string()) == 0);
  e = error_of([&] { (void)g.get<float>("llama.block_count"); });
  CHECK(e.find("llama.block_count") != std::string::npos);
  CHECK(e.find("u32") != std::string::npos);
  CHECK(e.find("f32 or f64") != std::string::npos);
  e = error_of([&] { (void)g.get<std::string>("tokenizer.ggml.tokens"); });
  CHECK(e.find("array of 512 string") != std::string::npos);
  e = error_of([&] { (void)g.get<int>("llama.nope"); });
  CHECK(e.find("missing key 'llama.nope'") != std::string::npos);
  CHECK(!error_of([&] { (void)g.type_of("llama.nope"); }).empty());
  CHECK(!error_of([&] { (void)g.array_size("general.name"); }).empty());
  CHECK(!error_of([&] { (void)g.get_array<float>("tokenizer.ggml.tokens"); }).empty());
  CHECK(!error_of([&] { (void)g.get_array<std::string>("tokenizer.ggml.scores"); }).empty());
  CHECK(!g.get_optional<int>("llama.nope").has_value());
  CHECK(g.get_optional<int>("llama.block_count") == 5);
  CHECK(!error_of([&] { (void)g.get_optional<std::string>("llama.block_count"); }).empty());

  const auto tokens = g.get_array<std::string>("tokenizer.ggml.tokens");
  REQUIRE(tokens.size() == 512);
  CHECK(tokens[0] == "<unk>");
  CHECK(tokens[1] == "<s>");
  CHECK(tokens[2] == "</s>");
  CHECK(tokens[3] == "<0x00>");
  const auto views = g.get_array<std::string_view>("tokenizer.ggml.tokens");
  REQUIRE(views.size() == 512);
  for (std::size_t i = 0; i < 512; ++i) CHECK(views[i] == tokens[i]);
  CHECK(g.get_array<float>("tokenizer.ggml.scores").size() == 512);
  const auto types = g.get_array<std::int32_t>("tokenizer.ggml.token_type");
  CHECK(types[0] == 2);
  CHECK(types[1] == 3);
  CHECK(types[3] == 6);
  CHECK(g.get_array<std::uint8_t>("tokenizer.ggml.token_type")[3] == 6);  // checked narrowing
  CHECK(g.get_array<double>("tokenizer.ggml.scores").size() == 512);

  const auto& emb = g.tensor("token_embd.weight");
  CHECK(emb.dims == std::vector<std::uint64_t>{64, 512});
  CHECK(emb.type == ggml_type::f32);
  CHECK(emb.offset == 14176);
  CHECK(emb.size_bytes == 64 * 512 * 4);
  CHECK(emb.n_elements() == 64 * 512);
  const auto& down = g.tensor("blk.0.ffn_down.weight");
  CHECK(down.dims == std::vector<std::uint64_t>{172, 64});
  CHECK(down.offset == 14176 + 355840);
  CHECK(g.find_tensor("blk.5.attn_q.weight") == nullptr);
  e = error_of([&] { (void)g.tensor("blk.5.attn_q.weight"); });
  CHECK(e.find("missing tensor blk.5.attn_q.weight") != std::string::npos);

  std::uint64_t params = 0;
  for (const auto& t : g.tensors()) params += t.n_elements();
  CHECK(params == 292800);  // SOURCES.md
  const auto& last = g.tensors().back();
  CHECK(last.offset + last.size_bytes == g.file().size());
}

TEST_CASE("gguf: a moved gguf_file keeps its keys, tensors and data") {
  auto p = kestrel::test::fixture("gguf/stories260K.gguf");
  if (!p) return;
  std::optional<gguf_file> holder;
  {
    gguf_file g(*p);
    holder.emplace(std::move(g));
  }
  const auto& g = *holder;
  CHECK(g.get<int>("llama.block_count") == 5);
  CHECK(g.get_array<std::string_view>("tokenizer.ggml.tokens")[1] == "<s>");
  const auto& t = g.tensor("output_norm.weight");
  CHECK(t.data == g.file().data() + t.offset);
  CHECK(g.find_tensor("token_embd.weight") == &g.tensors()[0]);
}

TEST_CASE("gguf: llama-2-tiny-random.gguf (F16, 32000 tokens)") {
  auto p = kestrel::test::fixture("gguf/llama-2-tiny-random.gguf");
  if (!p) return;
  gguf_file g(*p);
  CHECK(g.tensors().size() == 12);
  CHECK(g.keys().size() == 18);
  CHECK(g.data_offset() == 724416);
  CHECK(g.get<std::uint32_t>("general.file_type") == 1);
  CHECK(g.get<std::string>("general.name") == "LLaMA v2");
  CHECK(g.array_size("tokenizer.ggml.tokens") == 32000);
  CHECK(g.array_type_of("tokenizer.ggml.tokens") == gguf_type::string);
  const auto tokens = g.get_array<std::string>("tokenizer.ggml.tokens");
  REQUIRE(tokens.size() == 32000);
  CHECK(tokens[0] == "<unk>");
  CHECK(tokens[1] == "<s>");
  CHECK(tokens[2] == "</s>");
  const auto& emb = g.tensor("token_embd.weight");
  CHECK(emb.type == ggml_type::f16);
  CHECK(kestrel::io::name_of(emb.type) == "F16");
  CHECK(emb.dims == std::vector<std::uint64_t>{8, 32000});
  CHECK(emb.size_bytes == 8 * 32000 * 2);
  CHECK(g.tensor("blk.0.attn_norm.weight").type == ggml_type::f32);
  const auto& out = g.tensor("output.weight");
  CHECK(out.type == ggml_type::f16);
  CHECK(out.offset == 724416 + 514144);
  CHECK(out.offset + out.size_bytes == g.file().size());
}

TEST_CASE("gguf: big vocabularies load fast") {
  auto p = kestrel::test::fixture("llamacpp-vocab/ggml-vocab-deepseek-llm.gguf");
  if (!p) return;
  const auto t0 = std::chrono::steady_clock::now();
  gguf_file g(*p);
  const auto t1 = std::chrono::steady_clock::now();
  const auto tokens = g.get_array<std::string_view>("tokenizer.ggml.tokens");
  const auto merges = g.get_array<std::string>("tokenizer.ggml.merges");
  const auto t2 = std::chrono::steady_clock::now();
  CHECK(tokens.size() == 102400);
  CHECK(merges.size() == 99757);
  CHECK(merges[0] == "\xC4\xA0 \xC4\xA0");  // "Ġ Ġ"
  const double open_ms = std::chrono::duration<double, std::milli>(t1 - t0).count();
  const double read_ms = std::chrono::duration<double, std::milli>(t2 - t1).count();
  MESSAGE("deepseek-llm (3.9 MB, 202k strings): open " << open_ms << " ms, tokens+merges " << read_ms << " ms");
  // Generous: a few ms in a release build; the bound only catches quadratic behaviour.
  CHECK(open_ms < 2000);
}

// --- files built in memory -------------------------------------------------

namespace {

/// One pair of each scalar type, an array of each element type, and a few
/// tensors of block-quantized types, at alignment `align` (0 = default).
std::string all_types_file(std::uint32_t version, std::uint32_t align) {
  kestrel::test::gguf_writer w;
  const std::uint64_t n_kv = 13 + 11 + 1 + (align ? 1 : 0);
  w.header(version, 4, n_kv);
  w.kv("u8", 0, std::uint8_t{200});
  w.kv("i8", 1, std::int8_t{-5});
  w.kv("u16", 2, std::uint16_t{60000});
  w.kv("i16", 3, std::int16_t{-30000});
  w.kv("u32", 4, std::uint32_t{4000000000u});
  w.kv("i32", 5, std::int32_t{-2000000000});
  w.kv("f32", 6, 1.5f);
  w.kv("bool", 7, std::uint8_t{1});
  w.kv_str("str", "h\xC3\xA9llo");
  w.kv("u64", 10, std::uint64_t{1} << 40);
  w.kv("i64", 11, std::int64_t{-(std::int64_t{1} << 40)});
  w.kv("f64", 12, 2.25);
  w.kv_str("empty", "");
  w.kv_array<std::uint8_t>("a.u8", 0, {1, 2, 255});
  w.kv_array<std::int8_t>("a.i8", 1, {-1, 0, 127});
  w.kv_array<std::uint16_t>("a.u16", 2, {1, 65535});
  w.kv_array<std::int16_t>("a.i16", 3, {-32768, 7});
  w.kv_array<std::uint32_t>("a.u32", 4, {1, 2, 3, 4000000000u});
  w.kv_array<std::int32_t>("a.i32", 5, {-1, 2});
  w.kv_array<float>("a.f32", 6, {0.5f, -1.0f});
  w.kv_array<std::uint8_t>("a.bool", 7, {1, 0, 1});
  w.kv_str_array("a.str", {"a", "", "bc"});
  w.kv_array<std::int64_t>("a.i64", 11, {-3, 1ll << 50});
  w.kv_array<double>("a.f64", 12, {0.25, 1e300});
  w.kv_array<std::uint64_t>("a.empty", 10, {});
  if (align) w.kv("general.alignment", 4, align);
  const std::size_t a = align ? align : 32;
  // (ne0, ne1) = (256, 2) Q4_K: 2 blocks x 144; (64, 3) Q8_0: 6 x 34; (32,) BF16; (32, 1, 2) Q4_0.
  w.tensor_info("q4k", {256, 2}, 12, 0);
  w.tensor_info("q8", {64, 3}, 8, a * 10);
  w.tensor_info("bf", {32}, 30, a * 20);
  w.tensor_info("q40", {32, 1, 2}, 2, a * 30);
  w.pad(a);
  std::string data(std::max<std::size_t>(a * 30 + 36, 2 * 144), '\0');
  for (std::size_t i = 0; i < data.size(); ++i) data[i] = static_cast<char>(i * 7 + 1);
  w.bytes += data;
  return w.bytes;
}

}  // namespace

TEST_CASE("gguf: in-memory file with every value type, v2 and v3, custom alignment") {
  for (std::uint32_t version : {2u, 3u}) {
    for (std::uint32_t align : {0u, 8u, 16u, 64u, 4096u}) {
      CAPTURE(version);
      CAPTURE(align);
      const auto bytes = all_types_file(version, align);
      auto p = write_scratch("io-gguf", "all_types.gguf", bytes);
      gguf_file g(p);
      const std::size_t a = align ? align : 32;
      CHECK(g.version() == version);
      CHECK(g.alignment() == a);
      CHECK(g.keys().size() == (align ? 26u : 25u));
      CHECK(g.keys()[0] == "u8");
      CHECK(g.keys()[12] == "empty");

      CHECK(g.get<std::uint8_t>("u8") == 200);
      CHECK(g.get<int>("u8") == 200);
      CHECK(!error_of([&] { (void)g.get<std::int8_t>("u8"); }).empty());
      CHECK(g.get<int>("i8") == -5);
      CHECK(g.get<std::int8_t>("i8") == -5);
      CHECK(error_of([&] { (void)g.get<unsigned>("i8"); }).find("value -5 (i8) does not fit in u32") !=
            std::string::npos);
      CHECK(g.get<std::uint16_t>("u16") == 60000);
      CHECK(g.get<std::int16_t>("i16") == -30000);
      CHECK(g.get<std::uint32_t>("u32") == 4000000000u);
      CHECK(!error_of([&] { (void)g.get<std::int32_t>("u32"); }).empty());
      CHECK(g.get<std::int32_t>("i32") == -2000000000);
      CHECK(g.get<float>("f32") == 1.5f);
      CHECK(g.get<double>("f32") == 1.5);
      CHECK(g.get<bool>("bool") == true);
      CHECK(!error_of([&] { (void)g.get<int>("bool"); }).empty());
      CHECK(!error_of([&] { (void)g.get<bool>("u8"); }).empty());
      CHECK(g.get<std::string>("str") == "h\xC3\xA9llo");
      CHECK(g.get<std::string>("empty").empty());
      CHECK(g.get<std::uint64_t>("u64") == (std::uint64_t{1} << 40));
      CHECK(!error_of([&] { (void)g.get<std::uint32_t>("u64"); }).empty());
      CHECK(g.get<std::int64_t>("i64") == -(std::int64_t{1} << 40));
      CHECK(g.get<double>("f64") == 2.25);
      CHECK(g.get<float>("f64") == 2.25f);
      CHECK(!error_of([&] { (void)g.get<int>("f64"); }).empty());
      CHECK(!error_of([&] { (void)g.get<std::string>("u8"); }).empty());
      for (const char* k : {"u8", "i8", "u16", "i16", "u32", "i32", "f32", "bool", "str", "u64", "i64", "f64"})
        CHECK(g.type_of(k) != gguf_type::array);
      CHECK(g.type_of("u64") == gguf_type::uint64);
      CHECK(g.type_of("a.f64") == gguf_type::array);

      CHECK(g.get_array<std::uint8_t>("a.u8") == std::vector<std::uint8_t>{1, 2, 255});
      CHECK(g.get_array<int>("a.u8") == std::vector<int>{1, 2, 255});
      CHECK(!error_of([&] { (void)g.get_array<std::int8_t>("a.u8"); }).empty());
      CHECK(g.get_array<std::int8_t>("a.i8") == std::vector<std::int8_t>{-1, 0, 127});
      CHECK(error_of([&] { (void)g.get_array<std::uint32_t>("a.i8"); }).find("element 0") != std::string::npos);
      CHECK(g.get_array<std::uint16_t>("a.u16") == std::vector<std::uint16_t>{1, 65535});
      CHECK(g.get_array<std::int16_t>("a.i16") == std::vector<std::int16_t>{-32768, 7});
      CHECK(g.get_array<std::uint32_t>("a.u32") == std::vector<std::uint32_t>{1, 2, 3, 4000000000u});
      CHECK(g.get_array<std::uint64_t>("a.u32") == std::vector<std::uint64_t>{1, 2, 3, 4000000000u});
      CHECK(error_of([&] { (void)g.get_array<std::int32_t>("a.u32"); }).find("element 3") != std::string::npos);
      CHECK(g.get_array<std::int32_t>("a.i32") == std::vector<std::int32_t>{-1, 2});
      CHECK(g.get_array<float>("a.f32") == std::vector<float>{0.5f, -1.0f});
      CHECK(g.get_array<double>("a.f32") == std::vector<double>{0.5, -1.0});
      CHECK(g.get_array<bool>("a.bool") == std::vector<bool>{true, false, true});
      CHECK(g.get_array<std::string>("a.str") == std::vector<std::string>{"a", "", "bc"});
      CHECK(g.get_array<std::int64_t>("a.i64") == std::vector<std::int64_t>{-3, 1ll << 50});
      CHECK(g.get_array<double>("a.f64") == std::vector<double>{0.25, 1e300});
      CHECK(error_of([&] { (void)g.get_array<float>("a.f64"); }).find("does not fit in float") !=
            std::string::npos);
      CHECK(g.get_array<int>("a.empty").empty());
      CHECK(g.array_size("a.empty") == 0);
      CHECK(g.array_type_of("a.empty") == gguf_type::uint64);
      CHECK(g.array_size("a.str") == 3);
      CHECK(!error_of([&] { (void)g.get_array<int>("u8"); }).empty());
      CHECK(!error_of([&] { (void)g.get<int>("a.u8"); }).empty());
      CHECK(!error_of([&] { (void)g.get_array<int>("a.f32"); }).empty());
      CHECK(!error_of([&] { (void)g.get_array<bool>("a.u8"); }).empty());

      REQUIRE(g.tensors().size() == 4);
      const auto& q4k = g.tensor("q4k");
      CHECK(q4k.type == ggml_type::q4_k);
      CHECK(q4k.size_bytes == 2 * 144);
      CHECK(q4k.offset == g.data_offset());
      CHECK(g.data_offset() % a == 0);
      CHECK(g.data_offset() < bytes.size());
      const auto& q8 = g.tensor("q8");
      CHECK(q8.size_bytes == 6 * 34);
      CHECK(q8.offset == g.data_offset() + a * 10);
      CHECK(g.tensor("bf").size_bytes == 64);
      CHECK(g.tensor("bf").type == ggml_type::bf16);
      const auto& q40 = g.tensor("q40");
      CHECK(q40.dims == std::vector<std::uint64_t>{32, 1, 2});
      CHECK(q40.n_elements() == 64);
      CHECK(q40.size_bytes == 2 * 18);
      for (const auto& t : g.tensors()) {
        CHECK(reinterpret_cast<std::uintptr_t>(t.data) % a == 0);
        check_element_alignment(t);
        // The data pointer really is the bytes at the offset in the file.
        CHECK(std::memcmp(t.data, bytes.data() + t.offset, t.size_bytes) == 0);
        CHECK(t.bytes().size() == t.size_bytes);
      }
    }
  }
}

TEST_CASE("gguf: type names and block sizes") {
  using kestrel::io::name_of;
  CHECK(name_of(ggml_type::f32) == "F32");
  CHECK(name_of(ggml_type::q4_k) == "Q4_K");
  CHECK(name_of(ggml_type::bf16) == "BF16");
  CHECK(name_of(ggml_type::iq2_xxs) == "IQ2_XXS");
  // Unknown numbers have no name (the parser's errors give the number itself).
  CHECK(name_of(static_cast<ggml_type>(4)) == "unknown");
  CHECK(name_of(static_cast<ggml_type>(123456)) == "unknown");
  static_assert(name_of(ggml_type::q8_0) == "Q8_0");  // constexpr: no storage to keep alive
  CHECK(name_of(gguf_type::float64) == "f64");
  CHECK(kestrel::io::block_size_of(ggml_type::q6_k) == 256);
  CHECK(kestrel::io::type_size_of(ggml_type::q6_k) == 210);
  CHECK(kestrel::io::type_size_of(ggml_type::q8_0) == 34);
  CHECK(!kestrel::io::is_known(static_cast<ggml_type>(31)));
  int known = 0;
  for (std::uint32_t i = 0; i < 64; ++i) known += kestrel::io::is_known(static_cast<ggml_type>(i));
  CHECK(known == 32);
}

// --- malformed files built in memory: each gives a precise error -----------

namespace {

/// A valid minimal file: one u32 pair and one F32 tensor of 8 elements.
/// Parts can be replaced to make it malformed.
struct mini {
  std::uint32_t version = 3;
  std::uint64_t n_tensors = 1, n_kv = 1;
  std::uint32_t n_dims = 1;
  std::vector<std::uint64_t> dims{8};
  std::uint32_t type = 0;
  std::uint64_t offset = 0;
  std::size_t data_bytes = 32;

  std::string build() const {
    kestrel::test::gguf_writer w;
    w.header(version, n_tensors, n_kv);
    w.kv("x", 4, std::uint32_t{7});
    w.str("t").u32(n_dims);
    for (auto d : dims) w.u64(d);
    w.u32(type).u64(offset);
    w.pad(32).zeros(data_bytes);
    return w.bytes;
  }
};

void expect_error(const std::string& name, const std::string& bytes, const std::vector<std::string>& parts) {
  CAPTURE(name);
  const auto p = write_scratch("io-gguf", name + ".gguf", bytes);
  const auto e = error_of([&] { gguf_file g(p); });
  REQUIRE_MESSAGE(!e.empty(), "no error for " << name);
  CHECK_MESSAGE(e.find(p.string()) == 0, e);
  for (const auto& part : parts) CHECK_MESSAGE(e.find(part) != std::string::npos, "'" << part << "' not in: " << e);
}

}  // namespace

TEST_CASE("gguf: malformed headers, metadata and tensor tables") {
  {
    const auto ok = write_scratch("io-gguf", "mini.gguf", mini{}.build());
    gguf_file g(ok);
    CHECK(g.tensor("t").size_bytes == 32);
  }
  kestrel::test::gguf_writer w;

  expect_error("magic", "GGUG" + mini{}.build().substr(4), {"offset 0", "not a GGUF file", "47 47 55 46"});
  expect_error("short", "GG", {"not a GGUF file"});
  {
    mini m;
    m.version = 1;
    expect_error("v1", m.build(), {"offset 4", "unsupported GGUF version 1", "expected version 2 or 3"});
    m.version = 4;
    expect_error("v4", m.build(), {"unsupported GGUF version 4"});
    m.version = 0x03000000;
    expect_error("big_endian", m.build(), {"big-endian"});
  }
  {
    mini m;
    m.n_kv = 1ull << 60;
    expect_error("huge_n_kv", m.build(), {"offset 16", "metadata pairs cannot fit"});
    m = mini{};
    m.n_tensors = ~0ull;
    expect_error("huge_n_tensors", m.build(), {"offset 8", "tensor infos cannot fit"});
    m = mini{};
    m.n_kv = 2;  // the second pair would be read from the tensor table
    expect_error("n_kv_too_big", m.build(), {});
  }
  {
    w = {};
    w.header(3, 0, 1).str("k").u32(8).u64(1ull << 62);
    expect_error("huge_string", w.bytes, {"offset 37", "length 4611686018427387904", "string value of key 'k'",
                                          "exceeds"});
    w = {};
    w.header(3, 0, 1).u64(1000).zeros(20);
    expect_error("huge_key", w.bytes, {"offset 24", "key of metadata pair #0"});
    w = {};
    w.header(3, 0, 1).str("k").u32(9).u32(4).u64(1ull << 61);
    expect_error("huge_array", w.bytes, {"offset 41", "array 'k' claims 2305843009213693952 elements of type u32"});
    w = {};
    w.header(3, 0, 1).str("k").u32(9).u32(8).u64(1ull << 40).zeros(64);
    expect_error("huge_string_array", w.bytes, {"array 'k' claims 1099511627776 elements of type string"});
    w = {};
    w.header(3, 0, 1).str("k").u32(9).u32(9).u64(1).u32(4).u64(0);
    expect_error("nested_array", w.bytes, {"offset 37", "nested arrays are not supported"});
    w = {};
    w.header(3, 0, 1).str("k").u32(13).u32(0);
    expect_error("unknown_value_type", w.bytes, {"offset 33", "unknown value type 13"});
    w = {};
    w.header(3, 0, 1).str("k").u32(9).u32(99).u64(0);
    expect_error("unknown_elem_type", w.bytes, {"unknown element type 99"});
    w = {};
    w.header(3, 0, 1).str("k").u32(7).raw(std::uint8_t{2});
    expect_error("bool_2", w.bytes, {"offset 37", "expected 0 or 1"});
    w = {};
    w.header(3, 0, 1).kv_array<std::uint8_t>("k", 7, {0, 1, 5});
    expect_error("bool_array_5", w.bytes, {"element 2", "expected 0 or 1"});
    w = {};
    w.header(3, 0, 2).kv("k", 4, std::uint32_t{1}).kv("k", 4, std::uint32_t{2});
    expect_error("duplicate_key", w.bytes, {"offset 41", "duplicate key 'k' (first at offset 24)"});
    w = {};
    w.header(3, 0, 1).kv("k", 4, std::uint16_t{1});
    expect_error("truncated_value", w.bytes, {"truncated", "value of key 'k'"});
  }
  for (std::uint64_t bad : {1ull, 2ull, 4ull}) {
    // Powers of two below 8: the spec requires a multiple of 8, or an f32
    // tensor's data could start at an odd address.
    w = {};
    w.header(3, 0, 1).kv("general.alignment", 4, static_cast<std::uint32_t>(bad));
    expect_error("alignment_" + std::to_string(bad), w.bytes,
                 {"general.alignment is " + std::to_string(bad) + ", expected a multiple of 8"});
  }
  for (std::uint64_t bad : {0ull, 3ull, 12ull, 48ull, 1ull << 31}) {
    w = {};
    w.header(3, 0, 1).kv("general.alignment", 4, static_cast<std::uint32_t>(bad));
    if (bad == 1ull << 31) {
      w = {};
      w.header(3, 0, 1).kv("general.alignment", 10, bad);
    }
    expect_error("alignment_" + std::to_string(bad), w.bytes, {"general.alignment is " + std::to_string(bad)});
  }
  {
    w = {};
    w.header(3, 0, 1).kv_str("general.alignment", "32");
    expect_error("alignment_string", w.bytes, {"general.alignment is a string, expected a u32"});
  }
  {
    mini m;
    m.n_dims = 0;
    m.dims = {};
    expect_error("n_dims_0", m.build(), {"tensor 't' has n_dims 0, expected 1..4"});
    m.n_dims = 5;
    m.dims = {1, 1, 1, 1, 8};
    expect_error("n_dims_5", m.build(), {"n_dims 5"});
    m = mini{};
    m.n_dims = 4;
    m.dims = {1ull << 32, 1ull << 32, 1, 1};
    expect_error("dims_overflow", m.build(), {"more than 2^63-1 elements"});
    m.dims = {~0ull, 1, 1, 1};
    expect_error("dim_negative", m.build(), {"dimension 0 is 18446744073709551615"});
    m = mini{};
    m.type = 4;
    expect_error("ggml_type_4", m.build(), {"tensor 't' has unknown ggml type 4"});
    m.type = 1000;
    expect_error("ggml_type_1000", m.build(), {"tensor 't' has unknown ggml type 1000"});
    m = mini{};
    m.type = 2;  // Q4_0 needs ne0 % 32 == 0
    expect_error("not_whole_blocks", m.build(), {"ne0 = 8, not a multiple of the Q4_0 block size 32"});
    m = mini{};
    m.offset = 16;
    expect_error("misaligned", m.build(), {"data offset 16 is not a multiple of the alignment 32"});
    m = mini{};
    m.data_bytes = 31;
    expect_error("data_past_eof", m.build(), {"tensor 't' data (32 bytes", "runs past the end of the file"});
    m = mini{};
    m.offset = ~0ull - 31;  // aligned, and adding it to the data offset overflows
    expect_error("offset_overflow", m.build(), {"runs past the end of the file"});
    m = mini{};
    m.dims = {1ull << 62};  // F32: the element count fits, the byte size does not
    expect_error("size_overflow", m.build(), {"byte size overflows"});
  }
  {
    w = {};
    w.header(3, 2, 0).tensor_info("t", {8}, 0, 0).tensor_info("t", {8}, 0, 32).pad(32).zeros(64);
    expect_error("duplicate_tensor", w.bytes, {"offset 57", "duplicate tensor name 't' (first at offset 24)"});
  }
  {
    // Overlapping tensors and a vocab-only file whose data section lies past EOF are fine.
    w = {};
    w.header(3, 2, 0).tensor_info("a", {8}, 0, 0).tensor_info("b", {4}, 0, 0).pad(32).zeros(32);
    gguf_file g(write_scratch("io-gguf", "overlap.gguf", w.bytes));
    CHECK(g.tensor("a").data == g.tensor("b").data);
    w = {};
    w.header(3, 0, 1).kv_str("k", "v");
    gguf_file v(write_scratch("io-gguf", "vocab_only.gguf", w.bytes));
    CHECK(v.data_offset() > v.file().size());
    CHECK(v.tensors().empty());
  }
}
