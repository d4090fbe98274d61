// tests/io/test_llama2c.cpp: the llama2.c checkpoint reader, on stories260K.bin
// (checked bitwise against the same model in stories260K.gguf) and on small
// checkpoints built in memory.
#include <doctest/doctest.h>

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "fixtures.hpp"
#include "kestrel/io/gguf.hpp"
#include "kestrel/io/llama2c.hpp"

using kestrel::io::llama2c_checkpoint;
namespace fs = std::filesystem;
using kestrel::test::error_of;
using kestrel::test::write_scratch;

namespace {

/// Header + `n_floats` floats whose value is their index (so a getter's
/// offset can be read off the value it points at).
std::string checkpoint_bytes(const std::vector<std::int32_t>& header, std::size_t n_floats) {
  std::string b(header.size() * 4 + n_floats * 4, '\0');
  std::memcpy(b.data(), header.data(), header.size() * 4);
  for (std::size_t i = 0; i < n_floats; ++i) {
    const float f = static_cast<float>(i);
    std::memcpy(b.data() + header.size() * 4 + i * 4, &f, 4);
  }
  return b;
}

}  // namespace

TEST_CASE("llama2c: stories260K.bin header and layout") {
  auto p = kestrel::test::fixture("llama2c/stories260K.bin");
  if (!p) return;
  llama2c_checkpoint ck(*p);
  const auto& c = ck.config();
  CHECK(c.dim == 64);
  CHECK(c.hidden_dim == 172);
  CHECK(c.n_layers == 5);
  CHECK(c.n_heads == 8);
  CHECK(c.n_kv_heads == 4);
  CHECK(c.vocab_size == 512);
  CHECK(c.shared_classifier);
  CHECK(c.seq_len == 512);
  CHECK(c.head_size() == 8);
  CHECK(c.kv_dim() == 32);
  CHECK(ck.wcls() == ck.token_embedding());
  const auto* base = reinterpret_cast<const float*>(ck.file().data() + 28);
  CHECK(ck.token_embedding() == base);
  CHECK(ck.rms_att(0) == base + 512 * 64);
  CHECK(ck.wq(1) == ck.wq(0) + 64 * 64);
  CHECK(ck.wk(1) == ck.wk(0) + 32 * 64);
  CHECK(ck.w2(4) == ck.w2(0) + 4 * 64 * 172);
  // rms_final is followed by 2 x seq_len * head_size / 2 freq_cis floats, then EOF.
  CHECK(ck.rms_final() + 64 + 512 * 8 == reinterpret_cast<const float*>(ck.file().data() + ck.file().size()));
  CHECK_THROWS_AS((void)ck.wq(5), kestrel::invalid_argument);
}

TEST_CASE("llama2c: stories260K.bin equals stories260K.gguf bitwise") {
  auto bin = kestrel::test::fixture("llama2c/stories260K.bin");
  auto gg = kestrel::test::fixture("gguf/stories260K.gguf");
  if (!bin || !gg) return;
  llama2c_checkpoint ck(*bin);
  kestrel::io::gguf_file g(*gg);
  const auto& c = ck.config();
  const std::size_t dim = c.dim, hid = c.hidden_dim, kv = c.kv_dim(), V = c.vocab_size;

  auto same = [&](const std::string& name, const float* want, std::vector<std::uint64_t> dims) {
    INFO("tensor " << name);
    const auto& t = g.tensor(name);
    REQUIRE(t.type == kestrel::io::ggml_type::f32);
    REQUIRE(t.dims == dims);
    CHECK(std::memcmp(t.data, want, t.size_bytes) == 0);
  };
  same("token_embd.weight", ck.token_embedding(), {dim, V});
  same("output.weight", ck.wcls(), {dim, V});
  same("output_norm.weight", ck.rms_final(), {dim});
  for (std::size_t l = 0; l < c.n_layers; ++l) {
    const std::string b = "blk." + std::to_string(l) + ".";
    same(b + "attn_norm.weight", ck.rms_att(l), {dim});
    same(b + "attn_q.weight", ck.wq(l), {dim, dim});
    same(b + "attn_k.weight", ck.wk(l), {dim, kv});
    same(b + "attn_v.weight", ck.wv(l), {dim, kv});
    same(b + "attn_output.weight", ck.wo(l), {dim, dim});
    same(b + "ffn_norm.weight", ck.rms_ffn(l), {dim});
    same(b + "ffn_gate.weight", ck.w1(l), {dim, hid});
    same(b + "ffn_down.weight", ck.w2(l), {hid, dim});
    same(b + "ffn_up.weight", ck.w3(l), {dim, hid});
  }
}

TEST_CASE("llama2c: unshared classifier and the offsets of every array") {
  // dim 8, hidden 12, 2 layers, 4 heads, 2 kv heads, vocab -10 (separate wcls), seq_len 6.
  const std::size_t dim = 8, hid = 12, L = 2, kv = 4, V = 10, hs = 2, seq = 6;
  const std::size_t n = V * dim + L * dim + L * dim * dim + 2 * L * kv * dim + L * dim * dim + L * dim +
                        3 * L * hid * dim + dim + seq * hs + V * dim;
  const auto p = write_scratch("io-llama2c", "unshared.bin", checkpoint_bytes({8, 12, 2, 4, 2, -10, 6}, n));
  llama2c_checkpoint ck(p);
  const auto& c = ck.config();
  CHECK(c.vocab_size == 10);
  CHECK(!c.shared_classifier);
  CHECK(c.kv_dim() == kv);
  std::size_t at = 0;
  auto expect = [&](const float* ptr, std::size_t count, const char* what) {
    INFO(what);
    CHECK(*ptr == static_cast<float>(at));
    at += count;
  };
  expect(ck.token_embedding(), V * dim, "token_embedding");
  expect(ck.rms_att(0), dim, "rms_att 0");
  expect(ck.rms_att(1), dim, "rms_att 1");
  expect(ck.wq(0), dim * dim, "wq 0");
  expect(ck.wq(1), dim * dim, "wq 1");
  expect(ck.wk(0), kv * dim, "wk 0");
  expect(ck.wk(1), kv * dim, "wk 1");
  expect(ck.wv(0), kv * dim, "wv 0");
  expect(ck.wv(1), kv * dim, "wv 1");
  expect(ck.wo(0), dim * dim, "wo 0");
  expect(ck.wo(1), dim * dim, "wo 1");
  expect(ck.rms_ffn(0), dim, "rms_ffn 0");
  expect(ck.rms_ffn(1), dim, "rms_ffn 1");
  expect(ck.w1(0), hid * dim, "w1 0");
  expect(ck.w1(1), hid * dim, "w1 1");
  expect(ck.w2(0), dim * hid, "w2 0");
  expect(ck.w2(1), dim * hid, "w2 1");
  expect(ck.w3(0), hid * dim, "w3 0");
  expect(ck.w3(1), hid * dim, "w3 1");
  expect(ck.rms_final(), dim, "rms_final");
  at += seq * hs;  // freq_cis
  expect(ck.wcls(), V * dim, "wcls");
  CHECK(at == n);
}

TEST_CASE("llama2c: bad headers and sizes") {
  const std::size_t n_shared = 10 * 8 + 2 * 8 + 2 * 64 + 2 * 2 * 32 + 2 * 64 + 2 * 8 + 3 * 2 * 96 + 8 + 12;
  auto err = [&](const std::string& name, const std::vector<std::int32_t>& h, std::size_t n) {
    const auto p = write_scratch("io-llama2c", name + ".bin", checkpoint_bytes(h, n));
    auto e = error_of([&] { llama2c_checkpoint ck(p); });
    if (!e.empty()) CHECK_MESSAGE(e.find(p.string()) == 0, e);
    return e;
  };
  CHECK(err("ok", {8, 12, 2, 4, 2, 10, 6}, n_shared).empty());
  CHECK(err("zero_dim", {0, 12, 2, 4, 2, 10, 6}, n_shared).find("dim is 0, expected a positive value") !=
        std::string::npos);
  CHECK(err("neg_layers", {8, 12, -2, 4, 2, 10, 6}, n_shared).find("n_layers is -2") != std::string::npos);
  CHECK(err("zero_vocab", {8, 12, 2, 4, 2, 0, 6}, n_shared).find("vocab_size is 0") != std::string::npos);
  CHECK(err("min_vocab", {8, 12, 2, 4, 2, INT32_MIN, 6}, n_shared).find("vocab_size") != std::string::npos);
  CHECK(err("heads", {8, 12, 2, 3, 1, 10, 6}, n_shared).find("dim 8 is not divisible by n_heads 3") !=
        std::string::npos);
  CHECK(err("kv_heads", {8, 12, 2, 4, 3, 10, 6}, n_shared).find("n_heads 4 is not a multiple of n_kv_heads 3") !=
        std::string::npos);
  CHECK(err("kv_gt_heads", {8, 12, 2, 2, 4, 10, 6}, n_shared).find("not a multiple") != std::string::npos);
  CHECK(err("odd_head", {8, 12, 2, 8, 2, 10, 6}, n_shared).find("is odd") != std::string::npos);
  auto e = err("short", {8, 12, 2, 4, 2, 10, 6}, n_shared - 1);
  CHECK(e.find("file is " + std::to_string(28 + 4 * (n_shared - 1)) + " bytes") != std::string::npos);
  CHECK(e.find("implies exactly " + std::to_string(28 + 4 * n_shared) + " bytes") != std::string::npos);
  e = err("long", {8, 12, 2, 4, 2, 10, 6}, n_shared + 1);
  CHECK(e.find("implies exactly " + std::to_string(28 + 4 * n_shared)) != std::string::npos);
  e = err("sign", {8, 12, 2, 4, 2, 10, 6}, n_shared + 80);
  CHECK(e.find("sign of vocab_size looks wrong") != std::string::npos);
  e = err("huge", {1 << 30, 1 << 30, 1 << 30, 2, 1, 1 << 30, 1 << 30}, 4);
  CHECK(e.find("overflows") != std::string::npos);
  e = err("ak42", {0x616b3432, 1, 8, 12, 2, 4, 2}, 100);
  CHECK(e.find("magic \"ak42\"") != std::string::npos);
  CHECK(err("tiny", {8, 12}, 0).find("truncated header") != std::string::npos);
}
