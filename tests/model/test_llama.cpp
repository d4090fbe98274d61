// model/llama.hpp: the invariants of the decoder on real files.
//  - decode after prefill(p) gives the last logits of prefill(p + t);
//  - the fast backend equals the scalar-twin backend;
//  - a static config computes exactly what the dynamic one does, and a file
//    that does not fit a static config is a clear error;
//  - impossible requests (context overflow, bad token ids, unsupported files)
//    are clear errors.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "kestrel/model/llama.hpp"
#include "model/model_fixtures.hpp"

using namespace kestrel;

namespace {

// Tolerance for two computations of the same logits that differ only in the
// order of floating-point sums (matmul vs matvec blocking, SIMD vs scalar).
// One dot product of length n is off by at most gamma_n * sum|a_i b_i|,
// gamma_n = n u / (1 - n u), u = 2^-24 (Higham, Accuracy and Stability, 3.1).
// A logit is the end of a chain of n_mat = 7 * n_layer + 1 such products
// (q, k, v, attention, o, gate/up, down per layer, then the classifier);
// to first order their relative errors add. Terms sum|a_i b_i| are bounded
// by (1 + max|logit|) for these small models (checked: the ratio of
// sum|a_i b_i| to |logit| stays below ~3 here), and rmsnorm/softmax can
// amplify by their condition number, which we allow as a factor 8.
double logits_tolerance(const llama_hparams& hp, std::span<const float> logits) {
  const double u = std::ldexp(1.0, -24);
  const double n = static_cast<double>(std::max({hp.n_embd, hp.n_ff, hp.n_ctx_train}));
  const double gamma = n * u / (1 - n * u);
  const double n_mat = 7.0 * static_cast<double>(hp.n_layer) + 1;
  double max_abs = 0;
  for (float v : logits) max_abs = std::max(max_abs, std::abs(static_cast<double>(v)));
  return 8 * n_mat * gamma * (1 + max_abs);
}

double max_diff(std::span<const float> a, std::span<const float> b) {
  REQUIRE(a.size() == b.size());
  double m = 0;
  for (std::size_t i = 0; i < a.size(); ++i) m = std::max(m, std::abs(static_cast<double>(a[i]) - b[i]));
  return m;
}

std::vector<token_id> some_tokens(std::size_t n, std::size_t n_vocab) {
  std::vector<token_id> t{1};  // BOS
  for (std::size_t i = 1; i < n; ++i) t.push_back(static_cast<token_id>((i * 7919 + 13) % n_vocab));
  return t;
}

template <class Model>
void check_decode_matches_prefill(Model& model, const llama_hparams& hp) {
  const auto seq = some_tokens(40, hp.n_vocab);
  for (std::size_t p : {1u, 2u, 7u, 20u, 39u}) {
    CAPTURE(p);
    // reference: the whole sequence up to p (inclusive) in one prefill
    model.reset();
    const auto all = model.prefill(std::span(seq.data(), p + 1));
    const std::vector<float> want(all.begin(), all.end());
    // cached: prefill the first p, then decode token p
    model.reset();
    model.prefill(std::span(seq.data(), p));
    const auto got = model.decode(seq[p]);
    CHECK(model.n_past() == p + 1);
    const double tol = logits_tolerance(hp, want);
    CHECK(max_diff(got, want) <= tol);
    CHECK(std::max_element(got.begin(), got.end()) - got.begin() == std::max_element(want.begin(), want.end()) - want.begin());
  }
  // a chain of decodes from scratch equals a prefill, token by token
  model.reset();
  const auto all = model.prefill_all_logits(std::span(seq.data(), 12));
  model.reset();
  for (std::size_t i = 0; i < 12; ++i) {
    const auto got = model.decode(seq[i]);
    const std::span<const float> want(all.data() + i * hp.n_vocab, hp.n_vocab);
    CHECK(max_diff(got, want) <= logits_tolerance(hp, want));
  }
}

}  // namespace

TEST_CASE("KV cache: decode after prefill(p) equals the last logits of prefill(p + t)") {
  SUBCASE("stories260K (f32)") {
    const auto f = test::stories260k(true);
    if (!f) return;
    llama_model<> model(f->weights, 64, cpu_backend(2));
    check_decode_matches_prefill(model, f->weights.hparams);
  }
  SUBCASE("llama-2-tiny-random (f16 weights, untied output, 32000 vocab)") {
    const auto p = test::fixture("gguf/llama-2-tiny-random.gguf");
    if (!p) return;
    const auto f = load_model_file(*p);
    CHECK(f.weights.token_embd.type == dtype::f16);
    CHECK(f.weights.output.data != f.weights.token_embd.data);
    llama_model<> model(f.weights, 64, cpu_backend(2));
    check_decode_matches_prefill(model, f.weights.hparams);
  }
}

TEST_CASE("the fast CPU backend equals the scalar-twin backend end to end") {
  for (const char* name : {"gguf/stories260K.gguf", "gguf/llama-2-tiny-random.gguf"}) {
    CAPTURE(name);
    const auto p = test::fixture(name);
    if (!p) return;
    const auto f = load_model_file(*p);
    const auto& hp = f.weights.hparams;
    llama_model<dynamic_llama_config, cpu_backend> fast(f.weights, 64, cpu_backend(2));
    llama_model<dynamic_llama_config, cpu_ref_backend> ref(f.weights, 64, cpu_ref_backend());
    const auto seq = some_tokens(24, hp.n_vocab);
    const auto a = fast.prefill_all_logits(seq);
    const auto b = ref.prefill_all_logits(seq);
    CHECK(max_diff(a, b) <= logits_tolerance(hp, b));
    const auto da = fast.decode(5);
    const std::vector<float> dav(da.begin(), da.end());
    const auto db = ref.decode(5);
    CHECK(max_diff(dav, db) <= logits_tolerance(hp, db));
  }
}

TEST_CASE("stories260K in a static config gives the dynamic config's logits exactly") {
  using stories260k_config = llama_config<64, 5, 8, 4, 172, 512>;
  static_assert(stories260k_config::fully_static);
  static_assert(sizeof(stories260k_config) <= 6, "static extents take no storage");
  const auto bin = test::stories260k(false);
  if (!bin) return;
  llama_model<stories260k_config> fixed(bin->weights, 32, cpu_backend(1));
  llama_model<> dyn(bin->weights, 32, cpu_backend(1));
  CHECK(fixed.config().n_embd() == 64);
  const auto seq = some_tokens(10, 512);
  const auto a = fixed.prefill_all_logits(seq);
  const auto b = dyn.prefill_all_logits(seq);
  CHECK(a == b);
  const auto da = fixed.decode(42);
  const std::vector<float> dav(da.begin(), da.end());
  const auto db = dyn.decode(42);
  CHECK(std::equal(dav.begin(), dav.end(), db.begin(), db.end()));

  // The same dimensions from the GGUF file: same logits too (bitwise-identical weights).
  const auto gguf = test::stories260k(true);
  if (!gguf) return;
  llama_model<stories260k_config> from_gguf(gguf->weights, 32, cpu_backend(1));
  CHECK(from_gguf.prefill_all_logits(seq) == a);

  // A file that does not fit is a clear error naming the dimension.
  using wrong = llama_config<128, 5, 8, 4, 172, 512>;
  CHECK_THROWS_WITH_AS(llama_model<wrong>(bin->weights, 32, cpu_backend(1)),
                       doctest::Contains("n_embd: expected 128 (fixed at compile time), got 64"), invalid_argument);
  using wrong_vocab = llama_config<64, 5, 8, 4, 172, 32000>;
  CHECK_THROWS_WITH_AS(llama_model<wrong_vocab>(bin->weights, 32, cpu_backend(1)),
                       doctest::Contains("n_vocab: expected 32000"), invalid_argument);
}

TEST_CASE("impossible requests are clear errors") {
  const auto f = test::stories260k(true);
  if (!f) return;
  llama_model<> model(f->weights, 8, cpu_backend(1));
  const auto nine = some_tokens(9, 512);
  CHECK_THROWS_WITH_AS(model.prefill(nine), doctest::Contains("exceed the context length of 8"), invalid_argument);
  CHECK(model.n_past() == 0);  // nothing was half-processed
  CHECK_THROWS_WITH_AS(model.prefill(std::vector<token_id>{1, 512}), doctest::Contains("token id 512 is outside the vocabulary of 512"), invalid_argument);
  CHECK_THROWS_WITH_AS(model.decode(-1), doctest::Contains("token id -1"), invalid_argument);
  CHECK_THROWS_AS(model.prefill(std::vector<token_id>{}), invalid_argument);
  model.prefill(some_tokens(8, 512));
  CHECK_THROWS_WITH_AS(model.decode(3), doctest::Contains("exceed the context length of 8"), invalid_argument);
}

TEST_CASE("files that are not llama models are clear errors") {
  if (const auto p = test::fixture("llamacpp-vocab/ggml-vocab-baichuan.gguf"))
    CHECK_THROWS_WITH_AS(load_model_file(*p), doctest::Contains("general.architecture is 'baichuan'"), error);
  if (const auto p = test::fixture("llamacpp-vocab/ggml-vocab-llama-spm.gguf"))  // vocabulary only, no tensors
    CHECK_THROWS_WITH_AS(load_model_file(*p), doctest::Contains("token_embd.weight"), error);
  if (const auto p = test::fixture("llama2c/stories260K.bin"))
    CHECK_THROWS_WITH_AS(load_model_file(*p), doctest::Contains("pass its tokenizer.bin"), error);
  if (const auto p = test::fixture("llama2c/tok512.bin"))  // a tokenizer is not a checkpoint
    CHECK_THROWS_AS(load_model_file(*p), error);
  if (const auto bin = test::fixture("llama2c/stories260K.bin"); bin)
    if (const auto tok = test::fixture("llama2c/tokenizer.bin"))  // 32000 pieces for a 512-token model
      CHECK_THROWS_AS(load_model_file(*bin, *tok), error);
}

TEST_CASE("corrupt and truncated model files: an error or a model that runs, never a crash") {
  // The io tests cover the readers byte by byte; this covers what the loader
  // adds on top (shapes, types, tied output, vocabulary) on seeded damage.
  const auto p = test::fixture("gguf/stories260K.gguf");
  if (!p) return;
  const std::string bytes = test::read_file(*p);
  const auto dir = test::scratch_dir("model-corrupt");
  const std::size_t tensor_table_end = 14176;  // data offset (GGUF_INSPECTION.txt)
  std::uint64_t state = 12345;
  auto next = [&] { return state = state * 6364136223846793005ull + 1442695040888963407ull; };
  int errors = 0, loaded = 0;
  for (int i = 0; i < 120; ++i) {
    std::string copy = bytes;
    if (i % 3 == 0) {
      copy.resize(next() % bytes.size());  // truncated anywhere
    } else {
      for (int k = 0; k < 1 + i % 4; ++k) copy[next() % tensor_table_end] = static_cast<char>(next() >> 56);
    }
    const auto path = dir / ("c" + std::to_string(i) + ".gguf");
    test::write_file(path, copy);
    try {
      const auto f = load_model_file(path);
      llama_model<> model(f.weights, 16, cpu_backend(1));
      model.prefill(std::vector<token_id>{1, 2, 3});
      model.decode(4);
      ++loaded;
    } catch (const kestrel::error& e) {
      CHECK(std::string(e.what()).size() > 10);
      ++errors;
    }
  }
  CHECK(errors + loaded == 120);
  CHECK(errors > 40);  // every truncation is an error
}
