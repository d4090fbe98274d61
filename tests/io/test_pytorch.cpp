// tests/io/test_pytorch.cpp: the PyTorch zip checkpoint reader (io/pytorch.hpp)
// on the fixture hf-tiny/tiny-random-llama/pytorch_model.bin, and on archives
// and pickles built here opcode by opcode (good ones, hostile ones, corrupt
// ones).
//
// The fixture's expected values were read independently of kestrel: Python's
// zipfile + pickletools.genops (a disassembler, nothing unpickled) to find each
// tensor's storage, struct.unpack for the floats; first and last element
// printed with %.9g (exact for a float), the sum in double in storage order.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include "fixtures.hpp"
#include "kestrel/io/hf_model.hpp"
#include "kestrel/io/json.hpp"
#include "kestrel/io/pytorch.hpp"

using namespace kestrel;
using namespace kestrel::io;
namespace fs = std::filesystem;
using kestrel::test::error_of;

namespace {

bool has(const std::string& msg, std::string_view part) { return msg.find(part) != std::string::npos; }

// ---------------------------------------------------------------------------
// A pickle writer: just enough opcodes to say what torch.save says.

struct pickle {
  std::string b;

  pickle& op(std::uint8_t o) { b += static_cast<char>(o); return *this; }
  template <class T>
  pickle& raw(T v) { b.append(reinterpret_cast<const char*>(&v), sizeof v); return *this; }
  pickle& str(std::string_view s) { op('X').raw(static_cast<std::uint32_t>(s.size())); b += s; return *this; }
  pickle& integer(std::int64_t v) {
    if (v >= 0 && v < 256) return op('K').raw(static_cast<std::uint8_t>(v));
    if (v >= 0 && v < 65536) return op('M').raw(static_cast<std::uint16_t>(v));
    if (v >= INT32_MIN && v <= INT32_MAX) return op('J').raw(static_cast<std::int32_t>(v));
    return op(0x8a).raw(std::uint8_t{8}).raw(v);  // LONG1
  }
  pickle& global(std::string_view module, std::string_view name) {
    op('c');
    b += module;
    b += '\n';
    b += name;
    b += '\n';
    return *this;
  }
  pickle& tuple(const std::vector<std::int64_t>& v) {
    if (v.empty()) return op(')');
    if (v.size() > 3) op('(');
    for (auto x : v) integer(x);
    return op(v.size() > 3 ? 't' : static_cast<std::uint8_t>(0x85 + v.size() - 1));
  }
  /// One state-dict entry as torch.save writes it (name, then
  /// _rebuild_tensor_v2(persistent storage, offset, size, stride, False, OrderedDict())).
  pickle& tensor(std::string_view name, std::string_view storage_class, std::string_view key, std::int64_t numel,
                 std::int64_t offset, const std::vector<std::int64_t>& shape, const std::vector<std::int64_t>& stride) {
    str(name).global("torch._utils", "_rebuild_tensor_v2").op('(').op('(');
    str("storage").global("torch", storage_class).str(key).str("cpu").integer(numel).op('t').op('Q');
    integer(offset).tuple(shape).tuple(stride).op(0x89);
    global("collections", "OrderedDict").op(')').op('R');
    return op('t').op('R');
  }
  pickle& begin_dict() { return op(0x80).raw(std::uint8_t{2}).op('}').op('('); }
  pickle& end_dict() { return op('u').op('.'); }
};

// ---------------------------------------------------------------------------
// A ZIP writer: stored entries, data padded to 64 bytes like torch's writer,
// optionally every size and offset moved to zip64 records.

struct zip_file {
  std::string name, data;
  std::uint16_t method = 0;
};

template <class T>
void put(std::string& b, T v) { b.append(reinterpret_cast<const char*>(&v), sizeof v); }

std::string make_zip(const std::vector<zip_file>& files, bool zip64 = false) {
  std::string out, cd;
  for (const auto& f : files) {
    const auto crc = kestrel::io::detail::crc32(
        {reinterpret_cast<const std::byte*>(f.data.data()), f.data.size()});
    const std::uint64_t local = out.size();
    // Pad with an extra field (id 0x4b46, torch's "FB") so the data start on 64 bytes.
    std::size_t pad = (64 - (local + 30 + f.name.size() + 4) % 64) % 64;
    put<std::uint32_t>(out, 0x04034b50);
    put<std::uint16_t>(out, 20);
    put<std::uint16_t>(out, 0);
    put<std::uint16_t>(out, f.method);
    put<std::uint32_t>(out, 0);  // time, date
    put<std::uint32_t>(out, crc);
    put<std::uint32_t>(out, static_cast<std::uint32_t>(f.data.size()));
    put<std::uint32_t>(out, static_cast<std::uint32_t>(f.data.size()));
    put<std::uint16_t>(out, static_cast<std::uint16_t>(f.name.size()));
    put<std::uint16_t>(out, static_cast<std::uint16_t>(4 + pad));
    out += f.name;
    put<std::uint16_t>(out, 0x4b46);
    put<std::uint16_t>(out, static_cast<std::uint16_t>(pad));
    out.append(pad, 'Z');
    out += f.data;

    std::string extra;
    if (zip64) {
      put<std::uint16_t>(extra, 1);
      put<std::uint16_t>(extra, 24);
      put<std::uint64_t>(extra, f.data.size());
      put<std::uint64_t>(extra, f.data.size());
      put<std::uint64_t>(extra, local);
    }
    const std::uint32_t big = 0xFFFFFFFFu;
    put<std::uint32_t>(cd, 0x02014b50);
    put<std::uint16_t>(cd, zip64 ? 45 : 20);
    put<std::uint16_t>(cd, zip64 ? 45 : 20);
    put<std::uint16_t>(cd, 0);
    put<std::uint16_t>(cd, f.method);
    put<std::uint32_t>(cd, 0);
    put<std::uint32_t>(cd, crc);
    put<std::uint32_t>(cd, zip64 ? big : static_cast<std::uint32_t>(f.data.size()));
    put<std::uint32_t>(cd, zip64 ? big : static_cast<std::uint32_t>(f.data.size()));
    put<std::uint16_t>(cd, static_cast<std::uint16_t>(f.name.size()));
    put<std::uint16_t>(cd, static_cast<std::uint16_t>(extra.size()));
    put<std::uint16_t>(cd, 0);  // comment
    put<std::uint16_t>(cd, 0);  // disk
    put<std::uint16_t>(cd, 0);
    put<std::uint32_t>(cd, 0);
    put<std::uint32_t>(cd, zip64 ? big : static_cast<std::uint32_t>(local));
    cd += f.name;
    cd += extra;
  }
  const std::uint64_t cd_offset = out.size();
  out += cd;
  if (zip64) {
    const std::uint64_t z = out.size();
    put<std::uint32_t>(out, 0x06064b50);
    put<std::uint64_t>(out, 44);
    put<std::uint16_t>(out, 45);
    put<std::uint16_t>(out, 45);
    put<std::uint32_t>(out, 0);
    put<std::uint32_t>(out, 0);
    put<std::uint64_t>(out, files.size());
    put<std::uint64_t>(out, files.size());
    put<std::uint64_t>(out, cd.size());
    put<std::uint64_t>(out, cd_offset);
    put<std::uint32_t>(out, 0x07064b50);
    put<std::uint32_t>(out, 0);
    put<std::uint64_t>(out, z);
    put<std::uint32_t>(out, 1);
  }
  put<std::uint32_t>(out, 0x06054b50);
  put<std::uint16_t>(out, 0);
  put<std::uint16_t>(out, 0);
  put<std::uint16_t>(out, zip64 ? 0xFFFF : static_cast<std::uint16_t>(files.size()));
  put<std::uint16_t>(out, zip64 ? 0xFFFF : static_cast<std::uint16_t>(files.size()));
  put<std::uint32_t>(out, zip64 ? 0xFFFFFFFFu : static_cast<std::uint32_t>(cd.size()));
  put<std::uint32_t>(out, zip64 ? 0xFFFFFFFFu : static_cast<std::uint32_t>(cd_offset));
  put<std::uint16_t>(out, 0);
  return out;
}

template <class T>
std::string bytes_of(const std::vector<T>& v) {
  return std::string(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(T));
}

/// A state dict of: "w" f32 (2, 3) on storage 0; "row" f32 (3,), a view of
/// w's second row (offset 3, same storage); "h" f16 (2, 1, 2) with a size-1
/// dimension carrying an arbitrary stride; "ids" i64 (2,).
pickle sample_pickle() {
  pickle p;
  p.begin_dict();
  p.tensor("w", "FloatStorage", "0", 6, 0, {2, 3}, {3, 1});
  p.tensor("row", "FloatStorage", "0", 6, 3, {3}, {1});
  p.tensor("h", "HalfStorage", "1", 4, 0, {2, 1, 2}, {2, 99, 1});
  p.tensor("ids", "LongStorage", "2", 2, 0, {2}, {1});
  p.end_dict();
  return p;
}

std::vector<zip_file> sample_files(const std::string& pkl, std::string top = "archive") {
  return {{top + "/data.pkl", pkl},
          {top + "/data/0", bytes_of(std::vector<float>{1, 2, 3, 4, 5, 6})},
          {top + "/data/1", bytes_of(std::vector<std::uint16_t>{to_f16(1).bits, to_f16(2).bits, to_f16(3).bits,
                                                                 to_f16(4).bits})},
          {top + "/data/2", bytes_of(std::vector<std::int64_t>{10, 20})},
          {top + "/version", "3\n"},
          {top + "/byteorder", "little"}};
}

fs::path scratch(std::string_view name, std::string_view bytes) {
  return kestrel::test::write_scratch("pytorch", name, bytes);
}

std::string open_error(std::string_view bytes) {
  const auto p = scratch("bad.bin", bytes);
  return error_of<file_error>([&] { pytorch_checkpoint c(p); });
}

/// The error of a checkpoint whose data.pkl is `pkl` and whose storages are the sample's.
std::string pickle_error(const pickle& pkl) { return open_error(make_zip(sample_files(pkl.b))); }

void check_sample(const pytorch_checkpoint& c) {
  REQUIRE(c.tensors().size() == 4);
  CHECK(c.tensors()[0].name == "w");
  CHECK(c.tensors()[3].name == "ids");
  const auto w = c.tensor("w");
  CHECK(w.type == dtype::f32);
  CHECK(w.shape == std::vector<std::size_t>{2, 3});
  CHECK(reinterpret_cast<std::uintptr_t>(w.data) % 64 == 0);
  CHECK(w.values<float>()[5] == 6.0f);
  const auto row = c.tensor("row");
  CHECK(row.data == w.data + 12);  // a view into the same storage
  CHECK(row.values<float>()[0] == 4.0f);
  const auto& hi = c.info("h");
  CHECK(hi.strides == std::vector<std::size_t>{2, 99, 1});
  CHECK(hi.storage_key == "1");
  const auto h = c.tensor("h");
  CHECK(h.type == dtype::f16);
  CHECK(h.shape == std::vector<std::size_t>{2, 1, 2});
  CHECK(to_f32(h.values<kestrel::f16>()[3]) == 4.0f);
  CHECK(c.info("ids").element == element_type::i64);
  CHECK(c.info("ids").nbytes == 16);
  const auto e = error_of<file_error>([&] { (void)c.tensor("ids"); });
  CHECK(has(e, "tensor 'ids'"));
  CHECK(has(e, "I64"));
  CHECK(has(error_of<file_error>([&] { (void)c.tensor("nope"); }), "missing tensor 'nope'"));
}

}  // namespace

// ---------------------------------------------------------------------------
// The fixture

TEST_CASE("pytorch: tiny-random-llama pytorch_model.bin holds every llama tensor with its shape") {
  auto p = kestrel::test::fixture("hf-tiny/tiny-random-llama/pytorch_model.bin");
  auto cfg_path = kestrel::test::fixture("hf-tiny/tiny-random-llama/config.json");
  if (!p || !cfg_path) return;
  const auto cfg = read_json_file(*cfg_path);
  const auto n_embd = static_cast<std::size_t>(cfg.at("hidden_size").as_int());
  const auto n_ff = static_cast<std::size_t>(cfg.at("intermediate_size").as_int());
  const auto n_layer = static_cast<std::size_t>(cfg.at("num_hidden_layers").as_int());
  const auto n_head = static_cast<std::size_t>(cfg.at("num_attention_heads").as_int());
  const auto n_vocab = static_cast<std::size_t>(cfg.at("vocab_size").as_int());
  const auto* kv = cfg.find("num_key_value_heads");
  const std::size_t n_head_kv = kv ? static_cast<std::size_t>(kv->as_int()) : n_head;
  const std::size_t head_dim = n_embd / n_head;
  CHECK_FALSE(cfg.at("tie_word_embeddings").as_bool());

  using shape = std::vector<std::size_t>;
  std::vector<std::pair<std::string, shape>> want = {{"model.embed_tokens.weight", {n_vocab, n_embd}}};
  for (std::size_t l = 0; l < n_layer; ++l) {
    const std::string b = "model.layers." + std::to_string(l) + ".";
    want.push_back({b + "self_attn.q_proj.weight", {n_head * head_dim, n_embd}});
    want.push_back({b + "self_attn.k_proj.weight", {n_head_kv * head_dim, n_embd}});
    want.push_back({b + "self_attn.v_proj.weight", {n_head_kv * head_dim, n_embd}});
    want.push_back({b + "self_attn.o_proj.weight", {n_embd, n_head * head_dim}});
    want.push_back({b + "self_attn.rotary_emb.inv_freq", {head_dim / 2}});  // a buffer transformers 4.28 saved
    want.push_back({b + "mlp.gate_proj.weight", {n_ff, n_embd}});
    want.push_back({b + "mlp.down_proj.weight", {n_embd, n_ff}});
    want.push_back({b + "mlp.up_proj.weight", {n_ff, n_embd}});
    want.push_back({b + "input_layernorm.weight", {n_embd}});
    want.push_back({b + "post_attention_layernorm.weight", {n_embd}});
  }
  want.push_back({"model.norm.weight", {n_embd}});
  want.push_back({"lm_head.weight", {n_vocab, n_embd}});

  pytorch_checkpoint c(*p);
  CHECK(c.archive_name() == "pytorch_model");
  REQUIRE(c.tensors().size() == want.size());
  for (std::size_t i = 0; i < want.size(); ++i) {
    CAPTURE(want[i].first);
    CHECK(c.tensors()[i].name == want[i].first);  // the state dict's order
    const auto& t = c.info(want[i].first);
    CHECK(t.element == element_type::f32);
    CHECK(t.shape == want[i].second);
    CHECK(t.storage_offset == 0);
    CHECK(t.storage_key == std::to_string(i));
    const auto r = c.tensor(want[i].first);
    CHECK(r.type == dtype::f32);
    CHECK(r.shape == want[i].second);
    CHECK(r.nbytes == r.n_elements() * 4);
    CHECK(reinterpret_cast<std::uintptr_t>(r.data) % 64 == 0);  // torch aligns entries to 64 bytes
  }
  CHECK(c.info("model.embed_tokens.weight").strides == std::vector<std::size_t>{n_embd, 1});
  CHECK_NOTHROW(c.verify_checksums());
  const auto q = as_weight(c.tensor("model.layers.0.self_attn.q_proj.weight"));
  CHECK(q.rows == n_embd);
  CHECK(q.cols == n_embd);
}

TEST_CASE("pytorch: tiny-random-llama values match an independent reading") {
  auto p = kestrel::test::fixture("hf-tiny/tiny-random-llama/pytorch_model.bin");
  if (!p) return;
  pytorch_checkpoint c(*p);
  struct expect {
    const char* name;
    float first, last;
    double sum;
  };
  const expect cases[] = {
      {"model.embed_tokens.weight", 0.0f, -0.0158788562f, -2.3212677},
      {"model.layers.0.self_attn.q_proj.weight", -0.0456346758f, -0.00734053599f, 0.0822587945},
      {"model.layers.0.self_attn.k_proj.weight", 0.0153863998f, 0.0188971683f, 0.0439427434},
      {"model.layers.0.mlp.up_proj.weight", 0.00641187886f, 0.0256646462f, -0.0148111139},
      {"model.layers.1.mlp.down_proj.weight", 0.00373880914f, -0.0132521158f, 0.000625062414},
      {"model.layers.1.input_layernorm.weight", 1.0f, 1.0f, 4.0},
      {"model.layers.1.self_attn.rotary_emb.inv_freq", 1.0f, 1.0f, 1.0},
      {"model.norm.weight", 1.0f, 1.0f, 4.0},
      {"lm_head.weight", 0.0160636734f, -0.0141171478f, -6.49206451},
  };
  for (const auto& e : cases) {
    CAPTURE(e.name);
    const auto v = c.tensor(e.name).values<float>();
    REQUIRE(!v.empty());
    CHECK(v.front() == e.first);
    CHECK(v.back() == e.last);
    double sum = 0;
    for (float x : v) sum += x;
    CHECK(sum == doctest::Approx(e.sum).epsilon(1e-8));  // e.sum was printed with 9 digits
  }
}

TEST_CASE("pytorch: hf_model reads the fixture directory") {
  auto p = kestrel::test::fixture("hf-tiny/tiny-random-llama/pytorch_model.bin");
  if (!p) return;
  tensor_ref embed;
  {
    hf_model m(p->parent_path());
    CHECK(m.format() == hf_model::weight_format::pytorch);
    CHECK(m.config().at("model_type").as_string() == "llama");
    CHECK(m.names().size() == 23);
    CHECK(m.info("lm_head.weight").shape == std::vector<std::size_t>{32000, 4});
    embed = m.tensor("model.embed_tokens.weight");
  }
  CHECK(embed.values<float>()[127999] == -0.0158788562f);  // the view keeps the file mapped
}

TEST_CASE("pytorch: truncated copies of the fixture are clear errors") {
  auto p = kestrel::test::fixture("hf-tiny/tiny-random-llama/pytorch_model.bin");
  if (!p) return;
  const std::string full = kestrel::test::read_file(*p);
  const auto dst = kestrel::test::scratch_dir("pytorch") / "cut.bin";
  for (std::size_t n : {std::size_t{1}, std::size_t{3}, std::size_t{30}, std::size_t{100}, std::size_t{2400},
                        std::size_t{600000}, full.size() - 300, full.size() - 23, full.size() - 1}) {
    kestrel::test::write_file(dst, std::string_view(full).substr(0, n));
    const auto e = error_of<file_error>([&] { pytorch_checkpoint c(dst); });
    CHECK_MESSAGE(has(e, dst.string()), "length ", n, ": ", e);
  }
}

// ---------------------------------------------------------------------------
// Archives built here

TEST_CASE("pytorch: a hand-built checkpoint (f32, a view, f16, i64), plain and zip64") {
  const auto pkl = sample_pickle().b;
  pytorch_checkpoint plain(scratch("plain.bin", make_zip(sample_files(pkl))));
  CHECK(plain.archive_name() == "archive");
  check_sample(plain);
  CHECK_NOTHROW(plain.verify_checksums());
  CHECK(plain.zip().find("archive/version")->size == 2);

  pytorch_checkpoint z64(scratch("zip64.bin", make_zip(sample_files(pkl, "my_model"), true)));
  CHECK(z64.archive_name() == "my_model");
  check_sample(z64);

  tensor_ref kept;
  {
    pytorch_checkpoint c(scratch("keep.bin", make_zip(sample_files(pkl))));
    kept = c.tensor("w");
  }
  CHECK(kept.values<float>()[1] == 2.0f);
}

TEST_CASE("pytorch: what else torch.save writes for a state dict") {
  SUBCASE("state_dict(): an OrderedDict with a _metadata attribute set by BUILD") {
    pickle p;
    p.op(0x80).raw(std::uint8_t{2}).global("collections", "OrderedDict").op('q').raw(std::uint8_t{0}).op(')').op('R');
    p.op('(');
    p.tensor("w", "FloatStorage", "0", 6, 0, {2, 3}, {3, 1});
    p.op('u');
    // state: {'_metadata': OrderedDict({'': {'version': 1}})}
    p.op('}').str("_metadata").op('h').raw(std::uint8_t{0}).op(')').op('R');
    p.str("").op('}').str("version").integer(1).op('s').op('s');
    p.op('s').op('b').op('.');
    pytorch_checkpoint c(scratch("od.bin", make_zip(sample_files(p.b))));
    REQUIRE(c.tensors().size() == 1);
    CHECK(c.tensor("w").values<float>()[3] == 4.0f);
  }
  SUBCASE("protocol 4: FRAME, SHORT_BINUNICODE, MEMOIZE, STACK_GLOBAL, LONG1, BFloat16Storage") {
    pickle p;
    p.op(0x80).raw(std::uint8_t{4}).op(0x95).raw(std::uint64_t{0});
    p.op('}').op(0x94).op('(');
    p.op(0x8c).raw(std::uint8_t{1}).b += "b";
    p.op(0x8c).raw(std::uint8_t{12}).b += "torch._utils";
    p.op(0x8c).raw(std::uint8_t{18}).b += "_rebuild_tensor_v2";
    p.op(0x93).op(0x94).op('(').op('(');
    p.str("storage").global("torch", "BFloat16Storage").str("3").str("cpu");
    p.op(0x8a).raw(std::uint8_t{2}).raw(std::uint16_t{2});  // LONG1 numel = 2
    p.op('t').op('Q').integer(0).tuple({2}).tuple({1}).op(0x88).op('}').op('N').op('t').op('R');
    p.op('u').op('.');
    auto files = sample_files(p.b);
    files.push_back({"archive/data/3", bytes_of(std::vector<std::uint16_t>{to_bf16(0.5f).bits, to_bf16(-3.0f).bits})});
    pytorch_checkpoint c(scratch("p4.bin", make_zip(files)));
    const auto b = c.tensor("b");
    CHECK(b.type == dtype::bf16);
    CHECK(to_f32(b.values<kestrel::bf16>()[1]) == -3.0f);
  }
  SUBCASE("_rebuild_parameter around a tensor; an empty tensor; a scalar") {
    pickle p;
    p.begin_dict();
    p.str("param").global("torch._utils", "_rebuild_parameter").op('(');
    p.global("torch._utils", "_rebuild_tensor_v2").op('(').op('(');
    p.str("storage").global("torch", "FloatStorage").str("0").str("cpu").integer(6).op('t').op('Q');
    p.integer(0).tuple({6}).tuple({1}).op(0x89).global("collections", "OrderedDict").op(')').op('R').op('t').op('R');
    p.op(0x88).global("collections", "OrderedDict").op(')').op('R').op('t').op('R');
    p.tensor("empty", "FloatStorage", "0", 6, 6, {0, 5}, {5, 1});
    p.tensor("scalar", "FloatStorage", "0", 6, 2, {}, {});
    p.end_dict();
    pytorch_checkpoint c(scratch("param.bin", make_zip(sample_files(p.b))));
    CHECK(c.tensor("param").values<float>()[5] == 6.0f);
    CHECK(c.tensor("empty").nbytes == 0);
    CHECK(c.tensor("scalar").shape.empty());
    CHECK(c.tensor("scalar").values<float>()[0] == 3.0f);
  }
}

TEST_CASE("pytorch: pickles that are not a plain state dict are refused, never run") {
  SUBCASE("a foreign global names itself and its offset") {
    pickle p;
    p.begin_dict().str("x").global("os", "system").str("echo hi").op(0x85).op('R').end_dict();
    const auto e = pickle_error(p);
    CHECK(has(e, "GLOBAL 'os system' is not allowed"));
    CHECK(has(e, "archive/data.pkl offset 10:"));
  }
  SUBCASE("a torch global that is not a storage class") {
    pickle p;
    p.begin_dict().str("x").global("torch", "load").end_dict();
    CHECK(has(pickle_error(p), "GLOBAL 'torch load' is not allowed"));
  }
  SUBCASE("an opcode outside the subset") {
    pickle p;
    p.begin_dict().str("x").op('(').op(0x81);  // NEWOBJ
    const auto e = pickle_error(p);
    CHECK(has(e, "pickle opcode NEWOBJ (0x81)"));
    CHECK(has(e, "offset 11:"));
    pickle q;
    q.begin_dict().op(0xfe);
    CHECK(has(pickle_error(q), "pickle opcode 0xfe"));
  }
  SUBCASE("structure") {
    CHECK(has(pickle_error(pickle{}.op(0x80).raw(std::uint8_t{2}).op(']').op('.')), "not a dict"));
    CHECK(has(pickle_error(pickle{}.begin_dict().str("a").integer(1).end_dict()), "entry 'a' is not a tensor"));
    CHECK(has(pickle_error(pickle{}.begin_dict().integer(1).integer(1).end_dict()), "key that is not a string"));
    CHECK(has(pickle_error(pickle{}.begin_dict().op('h').raw(std::uint8_t{7})), "memo entry 7 read before"));
    CHECK(has(pickle_error(pickle{}.begin_dict()), "without STOP"));
    CHECK(has(pickle_error(pickle{}.begin_dict().end_dict().op('N')), "1 bytes after STOP"));
    CHECK(has(pickle_error(pickle{}.op(0x80).raw(std::uint8_t{2}).op('.')), "STOP with 0 values"));
    CHECK(has(pickle_error(pickle{}.op(0x80).raw(std::uint8_t{2}).op('R')), "REDUCE needs a value"));
    CHECK(has(pickle_error(pickle{}.op(0x80).raw(std::uint8_t{9})), "pickle protocol 9"));
    CHECK(has(pickle_error(pickle{}.op(0x80).raw(std::uint8_t{2}).op('X').raw(std::uint32_t{1000})),
              "BINUNICODE claims 1000 bytes"));
    CHECK(has(pickle_error(pickle{}.begin_dict().str("a").str("b").str("c").end_dict()), "odd number"));
    pickle dup;
    dup.begin_dict().tensor("w", "FloatStorage", "0", 6, 0, {6}, {1}).tensor("w", "FloatStorage", "0", 6, 0, {6}, {1});
    CHECK(has(pickle_error(dup.end_dict()), "duplicate state dict key 'w'"));
    pickle pid;
    pid.begin_dict().str("w").str("not a tuple").op('Q').end_dict();
    CHECK(has(pickle_error(pid), "persistent id is not a ('storage'"));
  }
}

TEST_CASE("pytorch: tensors that do not fit their storage or are not contiguous") {
  SUBCASE("not contiguous (a transpose)") {
    pickle p;
    p.begin_dict().tensor("t", "FloatStorage", "0", 6, 0, {3, 2}, {1, 3}).end_dict();
    const auto e = pickle_error(p);
    CHECK(has(e, "tensor 't' is not contiguous: shape (3, 2) has strides (1, 3)"));
  }
  SUBCASE("past the end of the storage") {
    pickle p;
    p.begin_dict().tensor("t", "FloatStorage", "0", 6, 4, {3}, {1}).end_dict();
    CHECK(has(pickle_error(p), "tensor 't' (3 elements at offset 4) runs past its storage '0' of 6 elements"));
  }
  SUBCASE("storage entry missing or of the wrong size") {
    pickle p;
    p.begin_dict().tensor("t", "FloatStorage", "7", 6, 0, {6}, {1}).end_dict();
    CHECK(has(pickle_error(p), "uses storage '7', but the archive has no entry 'archive/data/7'"));
    pickle q;
    q.begin_dict().tensor("t", "FloatStorage", "0", 8, 0, {8}, {1}).end_dict();
    CHECK(has(pickle_error(q), "entry 'archive/data/0' holds 24 bytes, but its storage of 8 F32 elements needs 32"));
  }
  SUBCASE("shape and stride disagree") {
    pickle p;
    p.begin_dict().tensor("t", "FloatStorage", "0", 6, 0, {6}, {1, 1}).end_dict();
    CHECK(has(pickle_error(p), "size has 1 dimensions, stride 2"));
  }
}

TEST_CASE("pytorch: archives that are not torch.save zips") {
  const auto pkl = sample_pickle().b;
  SUBCASE("compressed entries") {
    auto files = sample_files(pkl);
    files[1].method = 8;
    const auto e = open_error(make_zip(files));
    CHECK(has(e, "entry 'archive/data/0' is compressed (deflate)"));
  }
  SUBCASE("a corrupt pickle fails its CRC") {
    auto z = make_zip(sample_files(pkl));
    z[64 + 20] ^= 0x01;  // inside data.pkl (its data start at 64)
    CHECK(has(open_error(z), "fails its CRC-32 check"));
  }
  SUBCASE("legacy and foreign formats") {
    CHECK(has(open_error(std::string("\x80\x02\x8a\x0a", 4) + std::string(40, 'x')), "legacy (torch < 1.6"));
    CHECK(has(open_error("{\"not\": \"zip\"}"), "not a PyTorch checkpoint"));
    CHECK(has(open_error("PK\x03\x04" + std::string(40, '\0')), "no ZIP end-of-central-directory record"));
    CHECK(has(open_error(make_zip({{"archive/version", "3\n"}})), "no <folder>/data.pkl entry"));
    CHECK(has(open_error(make_zip({{"a/data.pkl", pkl}, {"b/data.pkl", pkl}})), "two pickles"));
    auto files = sample_files(pkl);
    files.back().data = "big";
    CHECK(has(open_error(make_zip(files)), "byteorder is 'big'"));
  }
  SUBCASE("a central directory pointing outside the file") {
    auto z = make_zip(sample_files(pkl));
    const std::uint32_t bad = 0x7fffffff;
    std::memcpy(z.data() + z.size() - 6, &bad, 4);  // central directory offset
    CHECK(has(open_error(z), "central directory"));
  }
}

TEST_CASE("pytorch: truncations and random corruption are errors or valid files, never crashes") {
  const auto good = make_zip(sample_files(sample_pickle().b));
  const auto p = kestrel::test::scratch_dir("pytorch") / "fuzz.bin";
  for (std::size_t n = 1; n < good.size(); n += 7) {
    kestrel::test::write_file(p, std::string_view(good).substr(0, n));
    CHECK_MESSAGE(!error_of<file_error>([&] { pytorch_checkpoint c(p); }).empty(), "length ", n);
  }
  std::mt19937 rng(99);
  for (int i = 0; i < 300; ++i) {
    std::string b = good;
    for (int k = 0; k < 2; ++k) b[rng() % b.size()] = static_cast<char>(rng() & 0xff);
    kestrel::test::write_file(p, b);
    try {
      pytorch_checkpoint c(p);
      for (const auto& t : c.tensors()) REQUIRE(t.data + t.nbytes <= c.file().data() + c.file().size());
    } catch (const kestrel::error& e) {
      CHECK_MESSAGE(std::string(e.what()).find(p.string()) == 0, e.what());
    }
  }
}

TEST_CASE("pytorch: the pickle machine on random mutations of a state dict (no CRC to hide behind)") {
  const auto good = sample_pickle().b;
  std::mt19937 rng(7);
  int ok = 0;
  for (int i = 0; i < 3000; ++i) {
    std::string b = good;
    const int n = 1 + static_cast<int>(rng() % 4);
    for (int k = 0; k < n; ++k) {
      const auto at = rng() % b.size();
      switch (rng() % 3) {
        case 0: b[at] = static_cast<char>(rng() & 0xff); break;
        case 1: b.erase(at, 1); break;
        default: b.insert(at, 1, static_cast<char>(rng() & 0xff)); break;
      }
    }
    kestrel::io::detail::pickle_machine m({reinterpret_cast<const std::byte*>(b.data()), b.size()}, "fuzz.pkl", 0,
                                          "data.pkl");
    try {
      (void)m.run();
      ++ok;
    } catch (const kestrel::file_error& e) {
      CHECK_MESSAGE(has(e.what(), "fuzz.pkl: offset "), e.what());
    }
  }
  MESSAGE(ok << " of 3000 mutated pickles still ran to STOP");
}
