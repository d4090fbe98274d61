// tests/tools: the library halves of kestrel-quantize and kestrel-make-model
// that need no model: the mix rules (quant/mix.hpp), conversion through f32
// rows (quant/convert.hpp) and the streaming GGUF writer (io/gguf_stream.hpp).
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "fixtures.hpp"
#include "kestrel/io/gguf.hpp"
#include "kestrel/io/gguf_stream.hpp"
#include "kestrel/io/gguf_write.hpp"
#include "kestrel/quant/convert.hpp"
#include "kestrel/quant/mix.hpp"
#include "tools/error_bound.hpp"

using kestrel::io::ggml_type;
namespace q = kestrel::quant;

namespace {

ggml_type type_of(std::string_view name, std::vector<std::uint64_t> dims, const q::mix_params& p) {
  return q::tensor_type(name, dims, ggml_type::f32, p);
}

}  // namespace

TEST_CASE("mix: names, case-insensitive, and llama.cpp's file type numbers") {
  CHECK(q::parse_mix("q4_k_m") == q::quant_mix::q4_k_m);
  CHECK(q::parse_mix("Q4_K_M") == q::quant_mix::q4_k_m);
  CHECK(q::parse_mix("bf16") == q::quant_mix::bf16);
  CHECK_FALSE(q::parse_mix("Q4_K"));  // a tensor type, not a mix
  CHECK_FALSE(q::parse_mix("Q7_0"));
  CHECK(q::llama_ftype(q::quant_mix::f32) == 0);
  CHECK(q::llama_ftype(q::quant_mix::f16) == 1);
  CHECK(q::llama_ftype(q::quant_mix::q4_0) == 2);
  CHECK(q::llama_ftype(q::quant_mix::q8_0) == 7);
  CHECK(q::llama_ftype(q::quant_mix::q4_k_m) == 15);
  CHECK(q::llama_ftype(q::quant_mix::q6_k) == 18);
  CHECK(q::llama_ftype(q::quant_mix::bf16) == 32);
  CHECK(q::parse_ggml_type("q6_k") == ggml_type::q6_k);
  CHECK_FALSE(q::parse_ggml_type("iq2_xs"));
}

TEST_CASE("mix: Q4_K_M gives output Q6_K and attn_v / ffn_down Q6_K in the use-more-bits layers") {
  q::mix_params p{.type = q::quant_mix::q4_k_m, .n_layer = 22, .n_gqa = 8};
  CHECK(type_of("output.weight", {2048, 32000}, p) == ggml_type::q6_k);
  CHECK(type_of("token_embd.weight", {2048, 32000}, p) == ggml_type::q4_k);
  // 22 layers: the first eighth (0, 1), the last eighth (19..21), and every
  // third layer from n/8 on (4, 7, 10, 13, 16): 10 of 22.
  const std::vector<std::size_t> more = {0, 1, 4, 7, 10, 13, 16, 19, 20, 21};
  for (std::size_t l = 0; l < 22; ++l) {
    const std::string b = "blk." + std::to_string(l) + ".";
    const bool m = std::find(more.begin(), more.end(), l) != more.end();
    CAPTURE(l);
    CHECK(q::use_more_bits(l, 22) == m);
    CHECK(type_of(b + "attn_v.weight", {2048, 256}, p) == (m ? ggml_type::q6_k : ggml_type::q4_k));
    CHECK(type_of(b + "ffn_down.weight", {5632, 2048}, p) == (m ? ggml_type::q6_k : ggml_type::q4_k));
    CHECK(type_of(b + "attn_q.weight", {2048, 2048}, p) == ggml_type::q4_k);
    CHECK(type_of(b + "ffn_gate.weight", {2048, 5632}, p) == ggml_type::q4_k);
    CHECK(type_of(b + "attn_norm.weight", {2048}, p) == ggml_type::f32);
  }
}

TEST_CASE("mix: the other mixes' promotions") {
  auto t = [](q::quant_mix m, std::string_view name, std::size_t gqa = 1) {
    q::mix_params p{.type = m, .n_layer = 32, .n_gqa = gqa};
    return q::tensor_type(name, std::vector<std::uint64_t>{4096, 4096}, ggml_type::f32, p);
  };
  using M = q::quant_mix;
  CHECK(t(M::q2_k, "blk.5.attn_v.weight") == ggml_type::q3_k);
  CHECK(t(M::q2_k, "blk.5.attn_v.weight", 4) == ggml_type::q4_k);  // GQA >= 4: V is small, give it more
  CHECK(t(M::q2_k, "blk.5.ffn_down.weight") == ggml_type::q3_k);
  CHECK(t(M::q2_k, "blk.5.attn_output.weight") == ggml_type::q3_k);
  CHECK(t(M::q2_k, "blk.5.attn_q.weight") == ggml_type::q2_k);
  CHECK(t(M::q3_k_m, "blk.1.attn_v.weight") == ggml_type::q5_k);
  CHECK(t(M::q3_k_m, "blk.2.attn_v.weight") == ggml_type::q4_k);
  CHECK(t(M::q3_k_m, "blk.1.ffn_down.weight") == ggml_type::q5_k);  // 1 < 32/16
  CHECK(t(M::q3_k_m, "blk.2.ffn_down.weight") == ggml_type::q4_k);
  CHECK(t(M::q3_k_m, "blk.2.attn_output.weight") == ggml_type::q4_k);
  CHECK(t(M::q3_k_s, "blk.2.attn_output.weight") == ggml_type::q3_k);
  CHECK(t(M::q3_k_l, "blk.9.ffn_down.weight") == ggml_type::q5_k);
  CHECK(t(M::q4_k_s, "blk.3.attn_v.weight") == ggml_type::q5_k);
  CHECK(t(M::q4_k_s, "blk.4.attn_v.weight") == ggml_type::q4_k);
  CHECK(t(M::q4_k_s, "blk.3.ffn_down.weight") == ggml_type::q5_k);  // 3 < 32/8
  CHECK(t(M::q4_k_s, "blk.4.ffn_down.weight") == ggml_type::q4_k);
  CHECK(t(M::q5_k_m, "blk.0.ffn_down.weight") == ggml_type::q6_k);
  CHECK(t(M::q5_k_m, "blk.5.ffn_down.weight") == ggml_type::q5_k);
  CHECK(t(M::q4_0, "output.weight") == ggml_type::q6_k);  // every mix below Q8_0
  CHECK(t(M::q4_0, "blk.0.attn_v.weight") == ggml_type::q4_0);
  CHECK(t(M::q8_0, "output.weight") == ggml_type::q8_0);
  CHECK(t(M::q6_k, "output.weight") == ggml_type::q6_k);
  // The float mixes convert every matrix, output and embedding included.
  CHECK(t(M::f16, "output.weight") == ggml_type::f16);
  CHECK(t(M::bf16, "token_embd.weight") == ggml_type::bf16);
}

TEST_CASE("mix: 1-D tensors stay F32, whatever they were") {
  q::mix_params p{.type = q::quant_mix::q4_0, .n_layer = 4};
  for (auto src : {ggml_type::f32, ggml_type::f16, ggml_type::bf16})
    CHECK(q::tensor_type("blk.0.attn_norm.weight", std::vector<std::uint64_t>{4096}, src, p) == ggml_type::f32);
  CHECK(q::tensor_type("output_norm.weight", std::vector<std::uint64_t>{4096}, ggml_type::f32, p) == ggml_type::f32);
  CHECK(q::tensor_type("blk.0.attn_q.bias", std::vector<std::uint64_t>{4096}, ggml_type::f32, p) == ggml_type::f32);
}

TEST_CASE("mix: rows that k-quant blocks do not divide fall back to legacy types, then F16") {
  q::mix_params p{.type = q::quant_mix::q4_k_m, .n_layer = 5};
  CHECK(type_of("blk.2.attn_q.weight", {64, 64}, p) == ggml_type::q5_0);    // Q4_K -> Q5_0
  CHECK(type_of("blk.0.attn_v.weight", {64, 32}, p) == ggml_type::q5_0);    // 0 is not a more-bits layer of 5
  CHECK(type_of("blk.4.attn_v.weight", {64, 32}, p) == ggml_type::q8_0);    // Q6_K -> Q8_0
  CHECK(type_of("output.weight", {64, 512}, p) == ggml_type::q8_0);         // the classifier: Q8_0, not a low-bit fallback
  CHECK(type_of("blk.2.ffn_down.weight", {172, 64}, p) == ggml_type::f16);  // 172: not even 32 divides it
  p.type = q::quant_mix::q5_k_s;
  CHECK(type_of("blk.2.attn_q.weight", {64, 64}, p) == ggml_type::q5_1);    // Q5_K -> Q5_1
  p.type = q::quant_mix::q2_k;
  CHECK(type_of("blk.2.attn_q.weight", {96, 64}, p) == ggml_type::q4_0);    // Q2_K -> Q4_0 (llama.cpp: IQ4_NL)
  p.type = q::quant_mix::q4_0;
  CHECK(type_of("blk.2.ffn_down.weight", {172, 64}, p) == ggml_type::f16);  // a legacy type -> F16
  CHECK(q::fallback_type(ggml_type::q6_k, 512) == ggml_type::q6_k);
}

TEST_CASE("mix: --pure, --output-tensor-type, --token-embedding-type, tied embeddings") {
  q::mix_params p{.type = q::quant_mix::q4_k_m, .n_layer = 8, .pure = true};
  CHECK(type_of("output.weight", {512, 1000}, p) == ggml_type::q4_k);
  CHECK(type_of("blk.0.attn_v.weight", {512, 512}, p) == ggml_type::q4_k);
  p.output_type = ggml_type::q8_0;
  p.token_embd_type = ggml_type::f16;
  CHECK(type_of("output.weight", {512, 1000}, p) == ggml_type::q8_0);
  CHECK(type_of("token_embd.weight", {512, 1000}, p) == ggml_type::f16);
  q::mix_params tied{.type = q::quant_mix::q4_k_m, .n_layer = 8, .has_output = false};
  CHECK(type_of("token_embd.weight", {512, 1000}, tied) == ggml_type::q6_k);  // it is the classifier
}

TEST_CASE("convert: every writable type round-trips random rows within its derived error bound") {
  const std::size_t n = 512, rows = 3;
  std::vector<float> x(n * rows);
  std::uint64_t s = 42;
  for (auto& v : x) {  // normal-ish, with a few outliers as real weights have
    s = s * 6364136223846793005ull + 1442695040888963407ull;
    const double u = static_cast<double>(s >> 11) * 0x1.0p-53;
    v = static_cast<float>((u - 0.5) * 2.0 + ((s >> 5) % 97 == 0 ? 6.0 : 0.0));
  }
  kestrel::cpu::thread_pool pool(2);
  for (auto t : q::writable_types) {
    CAPTURE(std::string(kestrel::io::name_of(t)));
    std::vector<std::byte> bytes(rows * q::row_bytes(t, n));
    q::convert_rows(ggml_type::f32, reinterpret_cast<const std::byte*>(x.data()), t, bytes.data(), n, rows, &pool);
    std::vector<float> y(n * rows);
    q::convert_rows(t, bytes.data(), ggml_type::f32, reinterpret_cast<std::byte*>(y.data()), n, rows, nullptr);
    const auto e = kestrel::test::conversion_error(t, x, y, n);
    CHECK(e.ok);
    CHECK(e.rms_err <= e.rms_bound);
    // Converting again from the converted data changes nothing for the
    // float types and little for the others (requantizing is near-idempotent).
    if (!q::is_block_quantized(t)) CHECK(e.max_err <= e.max_bound);
  }
}

TEST_CASE("convert: unsupported types are a clear error") {
  std::vector<std::byte> in(64), out(64);
  const auto msg = kestrel::test::error_of([&] {
    q::convert_rows(ggml_type::iq2_xs, in.data(), ggml_type::f32, out.data(), 256, 0, nullptr);
  });
  CHECK(msg.find("IQ2_XS") != std::string::npos);
  CHECK(kestrel::test::error_of([&] { q::row_bytes(ggml_type::q4_k, 100); }).find("not a whole number") != std::string::npos);
}

TEST_CASE("gguf_stream_writer: the same bytes as gguf_builder, and no partial file on failure") {
  kestrel::io::gguf_builder meta;
  meta.set("general.architecture", std::string("llama"));
  meta.set("general.alignment", std::uint32_t{64});
  meta.set_array("tokenizer.ggml.tokens", std::vector<std::string>{"a", "bb", ""});
  meta.set("x.zero", std::uint8_t{0});  // a value ending in zero bytes, just before the padding
  std::vector<float> a(96, 1.5f), b(7, -2.0f);
  auto bytes = [](const std::vector<float>& v) { return std::as_bytes(std::span<const float>(v)); };

  kestrel::io::gguf_builder full = meta;
  full.add_tensor("a", {32, 3}, ggml_type::f32, bytes(a));
  full.add_tensor("b", {7}, ggml_type::f32, bytes(b));
  const auto dir = kestrel::test::scratch_dir("tools-stream");
  {
    kestrel::io::gguf_stream_writer w(dir / "s.gguf", meta, {{"a", {32, 3}, ggml_type::f32}, {"b", {7}, ggml_type::f32}});
    CHECK(w.alignment() == 64);
    w.write_tensor(bytes(a));
    CHECK_THROWS_AS(w.write_tensor(bytes(a)), kestrel::invalid_argument);  // b has 7 values
    w.write_tensor(bytes(b));
    w.finish();
  }
  CHECK(kestrel::test::read_file(dir / "s.gguf") == full.bytes());
  CHECK_FALSE(std::filesystem::exists(dir / "s.gguf.part"));

  {
    kestrel::io::gguf_stream_writer w(dir / "t.gguf", meta, {{"a", {32, 3}, ggml_type::f32}});
    CHECK(std::filesystem::exists(dir / "t.gguf.part"));
  }  // abandoned: neither the file nor its .part remains
  CHECK_FALSE(std::filesystem::exists(dir / "t.gguf"));
  CHECK_FALSE(std::filesystem::exists(dir / "t.gguf.part"));
}
