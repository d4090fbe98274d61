// tests/io/test_safetensors.cpp: the safetensors reader (io/safetensors.hpp)
// and HF model directories holding safetensors (io/hf_model.hpp), on files
// written by hand here, on tests/io/data/reference.safetensors (written by the
// official `safetensors` package: tools/gen_safetensors_reference.py), and on
// every kind of bad input.
#include <doctest/doctest.h>

#include <bit>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include "fixtures.hpp"
#include "kestrel/io/hf_model.hpp"
#include "kestrel/io/safetensors.hpp"

using namespace kestrel;
using namespace kestrel::io;
namespace fs = std::filesystem;
using kestrel::test::error_of;
using kestrel::test::write_scratch;

namespace {

fs::path data_dir() {
  // __FILE__ is this source as the compiler saw it: absolute, or relative to
  // the build directory (two levels above this test binary, build/tests/).
  const auto rel = fs::path(__FILE__).parent_path() / "data";
  if (rel.is_absolute() || fs::exists(rel)) return rel;
  std::error_code ec;
  const auto exe = fs::read_symlink("/proc/self/exe", ec);
  if (!ec) {
    const auto from_build = exe.parent_path().parent_path() / rel;
    if (fs::exists(from_build)) return from_build;
  }
  return rel;
}

template <class T>
std::string bytes_of(const std::vector<T>& v) {
  return std::string(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(T));
}

/// u64 header length + header + data.
std::string raw_file(std::string_view header, std::string_view data) {
  std::string out(8, '\0');
  const std::uint64_t n = header.size();
  std::memcpy(out.data(), &n, 8);
  out += header;
  out += data;
  return out;
}

struct spec {
  std::string name, dtype;
  std::vector<std::size_t> shape;
  std::string bytes;
};

/// A well-formed file: tensors in the given order, back to back; the header
/// padded with spaces to a multiple of 8 like the reference writer does.
std::string st_file(const std::vector<spec>& ts, std::string metadata = "") {
  std::string h = "{";
  if (!metadata.empty()) h += "\"__metadata__\":" + metadata;
  std::string data;
  for (const auto& t : ts) {
    if (h.size() > 1) h += ",";
    h += "\"" + t.name + "\":{\"dtype\":\"" + t.dtype + "\",\"shape\":[";
    for (std::size_t i = 0; i < t.shape.size(); ++i) {
      if (i) h += ",";
      h += std::to_string(t.shape[i]);
    }
    h += "],\"data_offsets\":[" + std::to_string(data.size()) + "," + std::to_string(data.size() + t.bytes.size()) + "]}";
    data += t.bytes;
  }
  h += "}";
  while ((8 + h.size()) % 8) h += ' ';
  return raw_file(h, data);
}

std::vector<spec> sample() {
  return {{"w", "F32", {2, 3}, bytes_of(std::vector<float>{1, 2, 3, 4, 5, 6})},
          {"h", "F16", {2}, bytes_of(std::vector<std::uint16_t>{to_f16(1.5f).bits, to_f16(-2.0f).bits})},
          {"b", "BF16", {2}, bytes_of(std::vector<std::uint16_t>{to_bf16(0.5f).bits, to_bf16(8.0f).bits})},
          {"ids", "I64", {3}, bytes_of(std::vector<std::int64_t>{7, 8, 9})}};
}

/// The file_error message of opening `bytes` as a safetensors file ("" if it opens).
std::string open_error(std::string_view bytes, std::string_view name = "bad.safetensors") {
  const auto p = write_scratch("safetensors", name, bytes);
  return error_of<file_error>([&] { safetensors_file f(p); });
}

bool has(const std::string& msg, std::string_view part) { return msg.find(part) != std::string::npos; }

}  // namespace

TEST_CASE("safetensors: a hand-written file") {
  const auto p = write_scratch("safetensors", "good.safetensors", st_file(sample(), R"({"format":"pt","k":"v"})"));
  safetensors_file f(p);
  CHECK(f.path() == p.string());
  REQUIRE(f.tensors().size() == 4);
  CHECK(f.tensors()[0].name == "w");
  CHECK(f.tensors()[3].name == "ids");
  CHECK(f.metadata().size() == 2);
  CHECK(f.metadata("format") == "pt");
  CHECK(f.metadata("k") == "v");
  CHECK_FALSE(f.metadata("nope"));
  CHECK(f.data_offset() % 8 == 0);

  const auto& ids = f.info("ids");
  CHECK(ids.element == element_type::i64);
  CHECK(ids.shape == std::vector<std::size_t>{3});
  CHECK(ids.nbytes == 24);
  std::int64_t third = 0;
  std::memcpy(&third, ids.data + 16, 8);
  CHECK(third == 9);

  const auto w = f.tensor("w");
  CHECK(w.type == dtype::f32);
  CHECK(w.shape == std::vector<std::size_t>{2, 3});
  CHECK(w.n_elements() == 6);
  CHECK(w.nbytes == 24);
  CHECK(w.data == f.file().data() + f.data_offset());  // zero copy: the first tensor starts the buffer
  const auto wv = w.values<float>();
  CHECK(wv.size() == 6);
  CHECK(wv[5] == 6.0f);
  const auto m = as_weight(w);
  CHECK(m.rows == 2);
  CHECK(m.cols == 3);
  CHECK(m.type == dtype::f32);

  const auto h = f.tensor("h");
  CHECK(h.type == dtype::f16);
  CHECK(to_f32(h.values<kestrel::f16>()[1]) == -2.0f);
  CHECK(to_f32(f.tensor("b").values<kestrel::bf16>()[1]) == 8.0f);
  CHECK(has(error_of<invalid_argument>([&] { (void)h.values<float>(); }), "holds f16"));
  CHECK(has(error_of<invalid_argument>([&] { (void)as_weight(h); }), "rank 1"));

  // Recorded, but no kernel takes it: a clear error naming tensor and type.
  const auto e = error_of<file_error>([&] { (void)f.tensor("ids"); });
  CHECK(has(e, "tensor 'ids'"));
  CHECK(has(e, "I64"));
  CHECK(has(error_of<file_error>([&] { (void)f.tensor("zz"); }), "missing tensor 'zz'"));
  CHECK(f.find("zz") == nullptr);
}

TEST_CASE("safetensors: views outlive the reader") {
  const auto p = write_scratch("safetensors", "keep.safetensors", st_file(sample()));
  tensor_ref w;
  {
    safetensors_file f(p);
    w = f.tensor("w");
  }
  CHECK(w.keep_alive);
  CHECK(w.values<float>()[4] == 5.0f);  // the mapping is still there (ASan would see otherwise)
}

TEST_CASE("safetensors: scalars, empty tensors, no metadata, every listed dtype") {
  std::vector<spec> ts = {{"empty", "F32", {0, 4}, ""},
                          {"scalar", "F32", {}, bytes_of(std::vector<float>{2.5f})},
                          {"zero_dim_first", "BF16", {3, 0}, ""}};
  const char* names[] = {"BOOL", "U8", "I8", "F8_E4M3", "F8_E5M2", "I16", "U16", "F16",
                         "BF16", "I32", "U32", "F32", "I64", "U64", "F64"};
  for (const char* n : names) {
    const auto t = parse_safetensors_dtype(n);
    REQUIRE(t);
    CHECK(name_of(*t) == n);
    ts.push_back({std::string("t_") + n, n, {2}, std::string(2 * size_of(*t), '\x01')});
  }
  const auto p = write_scratch("safetensors", "dtypes.safetensors", st_file(ts));
  safetensors_file f(p);
  CHECK(f.metadata().empty());
  CHECK(f.info("empty").nbytes == 0);
  CHECK(f.info("empty").shape == std::vector<std::size_t>{0, 4});
  CHECK(f.info("scalar").shape.empty());
  CHECK(f.tensor("scalar").n_elements() == 1);
  CHECK(f.tensor("scalar").values<float>()[0] == 2.5f);
  CHECK(f.info("t_F64").element == element_type::f64);
  CHECK(f.tensor("t_BF16").type == dtype::bf16);
  CHECK(has(error_of<file_error>([&] { (void)f.tensor("t_F8_E4M3"); }), "F8_E4M3"));
  CHECK(has(error_of<file_error>([&] { (void)f.tensor("t_BOOL"); }), "BOOL"));
}

TEST_CASE("safetensors: the reference file written by the safetensors package") {
  safetensors_file f(data_dir() / "reference.safetensors");
  CHECK(f.tensors().size() == 6);
  CHECK(f.metadata("format") == "pt");
  CHECK(f.metadata("producer") == "kestrel gen_safetensors_reference.py");

  const auto embed = f.tensor("embed.weight");
  CHECK(embed.type == dtype::f32);
  CHECK(embed.shape == std::vector<std::size_t>{5, 3});
  const auto ev = embed.values<float>();
  for (std::size_t r = 0; r < 5; ++r)
    for (std::size_t c = 0; c < 3; ++c) CHECK(ev[r * 3 + c] == 0.25f * static_cast<float>(3 * r + c) - 1.0f);

  const auto proj = f.tensor("proj.weight");
  CHECK(proj.type == dtype::f16);
  CHECK(proj.shape == std::vector<std::size_t>{2, 4});
  const auto pv = proj.values<kestrel::f16>();
  for (std::size_t i = 0; i < 8; ++i) CHECK(to_f32(pv[i]) == static_cast<float>(i) - 3.5f);

  const auto norm = f.tensor("norm.weight");
  CHECK(norm.type == dtype::bf16);
  CHECK(norm.shape == std::vector<std::size_t>{4});
  const auto nv = norm.values<kestrel::bf16>();
  for (std::size_t i = 0; i < 4; ++i) CHECK(to_f32(nv[i]) == 1.0f + 0.5f * static_cast<float>(i));

  const auto& pos = f.info("position_ids");
  CHECK(pos.element == element_type::i64);
  CHECK(pos.shape == std::vector<std::size_t>{1, 6});
  std::int64_t last = 0;
  std::memcpy(&last, pos.data + 40, 8);
  CHECK(last == 5);
  CHECK(has(error_of<file_error>([&] { (void)f.tensor("position_ids"); }), "I64"));

  CHECK(f.tensor("scale").shape.empty());
  CHECK(f.tensor("scale").values<float>()[0] == 3.25f);
  CHECK(f.tensor("empty").nbytes == 0);
  CHECK(f.tensor("empty").shape == std::vector<std::size_t>{0, 2});
}

TEST_CASE("safetensors: bad files are clear errors") {
  const auto good = st_file(sample());
  CHECK(open_error(good).empty());

  SUBCASE("short and absent") {
    CHECK(has(open_error(good.substr(0, 5)), "8-byte header length"));
    CHECK(has(error_of<file_error>([] { safetensors_file f("/nonexistent/x.safetensors"); }), "cannot open"));
    CHECK(has(open_error(""), "empty"));
  }
  SUBCASE("header length past the end") {
    std::string b = good;
    const std::uint64_t n = good.size();
    std::memcpy(b.data(), &n, 8);
    const auto e = open_error(b);
    CHECK(has(e, "offset 0: header length"));
    CHECK(has(e, "runs past the end"));
    // A big-endian or garbage length too.
    std::memset(b.data(), 0xff, 8);
    CHECK(has(open_error(b), "runs past the end"));
  }
  SUBCASE("truncated data") {
    const auto e = open_error(good.substr(0, good.size() - 3));
    CHECK(has(e, "tensor 'ids'"));
    CHECK(has(e, "past the end of the data buffer"));
  }
  SUBCASE("not JSON") {
    CHECK(has(open_error(raw_file("[1,2]", "")), "does not start with '{'"));
    CHECK(has(open_error(raw_file("hello", "")), "does not start with '{'"));
    // Errors inside the JSON name the file offset: a key expected at header offset 7 = file offset 15.
    const auto e = open_error(raw_file(R"({"a":1,)", ""));
    CHECK(has(e, "offset 15: in the header: json:"));
    CHECK(has(open_error(raw_file(R"({"a":{"dtype":"F32"}})", "")), "lacks field \"shape\""));
    CHECK(has(open_error(raw_file(R"({"a":[]})", "")), "tensor 'a' is an array, expected an object"));
  }
  SUBCASE("unknown dtype names tensor and dtype") {
    const auto e = open_error(st_file({{"x.weight", "Q4_0", {2}, "ab"}}));
    CHECK(has(e, "tensor 'x.weight'"));
    CHECK(has(e, "unknown dtype \"Q4_0\""));
    CHECK(has(open_error(st_file({{"x", "f32", {1}, "abcd"}})), "unknown dtype \"f32\""));  // case matters
  }
  SUBCASE("size does not match shape") {
    const auto e = open_error(st_file({{"w", "F32", {2, 3}, std::string(20, '\0')}}));
    CHECK(has(e, "tensor 'w'"));
    CHECK(has(e, "hold 20 bytes, but shape (2, 3) of F32 needs 24"));
  }
  SUBCASE("offsets: past end, backwards, overlapping, gaps, trailing bytes") {
    CHECK(has(open_error(raw_file(R"({"a":{"dtype":"U8","shape":[4],"data_offsets":[0,4]}})", "abc")),
              "run past the end of the data buffer (3 bytes)"));
    CHECK(has(open_error(raw_file(R"({"a":{"dtype":"U8","shape":[0],"data_offsets":[3,1]}})", "abc")),
              "end before they begin"));
    const auto overlap = open_error(raw_file(
        R"({"a":{"dtype":"U8","shape":[3],"data_offsets":[0,3]},"b":{"dtype":"U8","shape":[2],"data_offsets":[2,4]}})",
        "abcd"));
    CHECK(has(overlap, "tensor 'b' bytes [2, 4) overlap tensor 'a'"));
    const auto same = open_error(raw_file(
        R"({"a":{"dtype":"U8","shape":[2],"data_offsets":[0,2]},"b":{"dtype":"U8","shape":[2],"data_offsets":[0,2]}})",
        "ab"));
    CHECK(has(same, "overlap"));
    const auto gap = open_error(raw_file(
        R"({"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1]},"b":{"dtype":"U8","shape":[1],"data_offsets":[2,3]}})",
        "abc"));
    CHECK(has(gap, "bytes [1, 2) belong to no tensor"));
    CHECK(has(open_error(raw_file(R"({"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1]}})", "ab")),
              "1 bytes after the last tensor"));
  }
  SUBCASE("numbers that are not offsets") {
    CHECK(has(open_error(raw_file(R"({"a":{"dtype":"U8","shape":[-1],"data_offsets":[0,0]}})", "")),
              "dimension 0 is -1, expected a non-negative integer"));
    CHECK(has(open_error(raw_file(R"({"a":{"dtype":"U8","shape":[1.5],"data_offsets":[0,0]}})", "")),
              "expected a non-negative integer"));
    CHECK(has(open_error(raw_file(R"({"a":{"dtype":"U8","shape":[1],"data_offsets":[0,"1"]}})", "")),
              "data_offsets end is a string"));
    CHECK(has(open_error(raw_file(R"({"a":{"dtype":"U8","shape":[1],"data_offsets":[0]}})", "")),
              "data_offsets must be an array [begin, end]"));
    CHECK(has(open_error(raw_file(R"({"a":{"dtype":"U8","shape":[99999999999999999999],"data_offsets":[0,0]}})", "")),
              "does not fit in 64 bits"));
    CHECK(has(open_error(raw_file(
                  R"({"a":{"dtype":"F64","shape":[4294967296,4294967296],"data_offsets":[0,0]}})", "")),
              "more bytes than 2^64"));
  }
  SUBCASE("duplicates and stray fields") {
    const auto dup = open_error(raw_file(
        R"({"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1]},"a":{"dtype":"U8","shape":[1],"data_offsets":[1,2]}})",
        "ab"));
    CHECK(has(dup, "duplicate tensor name 'a'"));
    CHECK(has(open_error(raw_file(R"({"a":{"dtype":"U8","shape":[0],"data_offsets":[0,0],"x":1}})", "")),
              "unknown field \"x\""));
    CHECK(has(open_error(raw_file(R"({"__metadata__":{"n":1}})", "")), "value of 'n' is a number, expected a string"));
    CHECK(has(open_error(raw_file(R"({"__metadata__":[]})", "")), "\"__metadata__\" is an array"));
  }
}

TEST_CASE("safetensors: every truncation and random corruption is an error or a valid file, never a crash") {
  const auto good = st_file(sample(), R"({"format":"pt"})");
  const auto p = kestrel::test::scratch_dir("safetensors") / "cut.safetensors";
  for (std::size_t n = 1; n < good.size(); ++n) {
    kestrel::test::write_file(p, std::string_view(good).substr(0, n));
    CHECK_MESSAGE(!error_of<file_error>([&] { safetensors_file f(p); }).empty(), "length ", n);
  }
  std::mt19937 rng(1234);
  int opened = 0;
  for (int i = 0; i < 400; ++i) {
    std::string b = good;
    const int flips = 1 + static_cast<int>(rng() % 3);
    for (int k = 0; k < flips; ++k) b[rng() % b.size()] = static_cast<char>(rng() & 0xff);
    kestrel::test::write_file(p, b);
    try {
      safetensors_file f(p);
      ++opened;
      volatile unsigned sum = 0;
      for (const auto& t : f.tensors()) {
        REQUIRE(t.data + t.nbytes <= f.file().data() + f.file().size());
        if (t.nbytes) sum = sum + static_cast<unsigned>(t.data[0]) + static_cast<unsigned>(t.data[t.nbytes - 1]);
      }
    } catch (const kestrel::error& e) {
      CHECK_MESSAGE(std::string(e.what()).find(p.string()) == 0, e.what());
    }
  }
  MESSAGE(opened << " of 400 corrupted files still opened (flips in tensor data)");
}

// ---------------------------------------------------------------------------
// Model directories

namespace {

const char* tiny_config = R"({"architectures":["LlamaForCausalLM"],"hidden_size":4,"num_hidden_layers":1})";

fs::path model_dir(std::string_view name) {
  const auto d = kestrel::test::scratch_dir("hf") / name;
  fs::remove_all(d);
  fs::create_directories(d);
  return d;
}

}  // namespace

TEST_CASE("hf_model: one model.safetensors") {
  const auto d = model_dir("single");
  kestrel::test::write_file(d / "config.json", tiny_config);
  kestrel::test::write_file(d / "model.safetensors", st_file(sample()));
  tensor_ref w;
  {
    hf_model m(d);
    CHECK(m.format() == hf_model::weight_format::safetensors);
    CHECK(m.weights_path() == d / "model.safetensors");
    CHECK(m.config().at("hidden_size").as_int() == 4);
    CHECK(m.names() == std::vector<std::string>{"w", "h", "b", "ids"});
    CHECK(m.has("h"));
    CHECK_FALSE(m.has("zz"));
    CHECK(m.info("ids").element == element_type::i64);
    CHECK(has(error_of<file_error>([&] { (void)m.tensor("ids"); }), "I64"));
    CHECK(has(error_of<file_error>([&] { (void)m.tensor("zz"); }), "missing tensor 'zz'"));
    w = m.tensor("w");
  }
  CHECK(w.values<float>()[0] == 1.0f);  // shard mapping kept alive by the view
}

TEST_CASE("hf_model: sharded safetensors") {
  const auto d = model_dir("sharded");
  kestrel::test::write_file(d / "config.json", tiny_config);
  auto s = sample();
  kestrel::test::write_file(d / "model-00001-of-00002.safetensors", st_file({s[0], s[1]}));
  kestrel::test::write_file(d / "model-00002-of-00002.safetensors", st_file({s[2], s[3]}));
  const std::string index = R"({"metadata":{"total_size":48},"weight_map":{
      "b":"model-00002-of-00002.safetensors","w":"model-00001-of-00002.safetensors",
      "h":"model-00001-of-00002.safetensors","ids":"model-00002-of-00002.safetensors"}})";
  kestrel::test::write_file(d / "model.safetensors.index.json", index);

  {
    hf_model m(d);
    CHECK(m.weights_path() == d / "model.safetensors.index.json");
    CHECK(m.names() == std::vector<std::string>{"b", "w", "h", "ids"});
    const auto shards = m.shard_paths();
    REQUIRE(shards.size() == 2);
    CHECK(shards[0] == d / "model-00002-of-00002.safetensors");
    CHECK(m.tensor("w").values<float>()[2] == 3.0f);
    CHECK(to_f32(m.tensor("b").values<kestrel::bf16>()[0]) == 0.5f);
    CHECK(to_f32(m.tensor("h").values<kestrel::f16>()[0]) == 1.5f);
  }

  SUBCASE("an index naming a missing shard") {
    kestrel::test::write_file(d / "model.safetensors.index.json",
                              R"({"weight_map":{"w":"model-00001-of-00002.safetensors","x":"gone.safetensors"}})");
    const auto e = error_of<file_error>([&] { hf_model m(d); });
    CHECK(has(e, "model.safetensors.index.json"));
    CHECK(has(e, "'x'"));
    CHECK(has(e, "shard 'gone.safetensors', which does not exist"));
  }
  SUBCASE("an index putting a tensor in the wrong shard") {
    kestrel::test::write_file(d / "model.safetensors.index.json",
                              R"({"weight_map":{"w":"model-00002-of-00002.safetensors"}})");
    CHECK(has(error_of<file_error>([&] { hf_model m(d); }),
              "puts tensor 'w' in shard 'model-00002-of-00002.safetensors', which does not hold it"));
  }
  SUBCASE("an index that leaves the directory or is malformed") {
    kestrel::test::write_file(d / "model.safetensors.index.json", R"({"weight_map":{"w":"../x.safetensors"}})");
    CHECK(has(error_of<file_error>([&] { hf_model m(d); }), "expected a plain file name"));
    kestrel::test::write_file(d / "model.safetensors.index.json", R"({"metadata":{}})");
    CHECK(has(error_of<file_error>([&] { hf_model m(d); }), "no \"weight_map\""));
    kestrel::test::write_file(d / "model.safetensors.index.json", R"({"weight_map":{"w":3}})");
    CHECK(has(error_of<file_error>([&] { hf_model m(d); }), "not a file name string"));
    kestrel::test::write_file(d / "model.safetensors.index.json", R"({"weight_map":)");
    CHECK(has(error_of<file_error>([&] { hf_model m(d); }), "json:"));
  }
  SUBCASE("a corrupt shard names the shard") {
    kestrel::test::write_file(d / "model-00002-of-00002.safetensors", "12345678garbage");
    CHECK(has(error_of<file_error>([&] { hf_model m(d); }), "model-00002-of-00002.safetensors: offset 0"));
  }
}

TEST_CASE("hf_model: directories that are not models") {
  CHECK(has(error_of<file_error>([] { hf_model m("/nonexistent/model"); }), "no such directory"));
  const auto d = model_dir("no-config");
  kestrel::test::write_file(d / "model.safetensors", st_file(sample()));
  const auto e = error_of<file_error>([&] { hf_model m(d); });
  CHECK(has(e, "config.json"));
  CHECK(has(e, "missing"));
  CHECK(has(error_of<file_error>([&] { hf_model m(d / "model.safetensors"); }), "is not a directory"));

  const auto d2 = model_dir("no-weights");
  kestrel::test::write_file(d2 / "config.json", tiny_config);
  CHECK(has(error_of<file_error>([&] { hf_model m(d2); }), "no weights"));
  kestrel::test::write_file(d2 / "config.json", "{\"hidden_size\": 4,}");
  CHECK(has(error_of<file_error>([&] { hf_model m(d2); }), "config.json: offset 18: json:"));
  kestrel::test::write_file(d2 / "config.json", "[]");
  CHECK(has(error_of<file_error>([&] { hf_model m(d2); }), "not a JSON object"));
}
