// tests/model/test_hf.cpp: every architecture against an independent
// reference. tests/model/data/hf/<arch>/ holds tiny random models saved by
// Hugging Face transformers (config.json + safetensors) and the logits
// transformers computes for three token sequences (made by
// tools/gen_hf_reference.py; see data/hf/README.md). kestrel loads the
// directory (model/hf.hpp) and must reproduce every row, by prefill and by
// decode after a one-token prefill, with the fast and the scalar backends.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "fixtures.hpp"
#include "json.hpp"
#include "kestrel/model/hf.hpp"
#include "kestrel/model/llama.hpp"
#include "kestrel/model/load.hpp"
#include "kestrel/model/save.hpp"

using namespace kestrel;
namespace fs = std::filesystem;

namespace {

fs::path hf_dir(const std::string& name) { return test::source_data_dir(__FILE__, "data/hf") / name; }

struct reference {
  std::vector<std::vector<token_id>> tokens;
  std::vector<std::vector<float>> logits;  // per sequence: (n, n_vocab)
  double max_abs = 0;
};

reference read_reference(const fs::path& dir) {
  const auto j = io::read_json_file(dir / "logits.json");
  reference r;
  r.max_abs = j.at("max_abs_logit").as_number();
  for (const auto& s : j.at("sequences").as_array()) {
    r.tokens.push_back(test::json_ids(s.at("tokens")));
    auto& out = r.logits.emplace_back();
    for (const auto& row : s.at("logits").as_array())
      for (const auto& v : row.as_array()) out.push_back(static_cast<float>(v.as_number()));
  }
  return r;
}

// Tolerance, absolute, on logits of magnitude <= max_abs (4.3..5.6 here).
// The reference is float32 PyTorch printed to 6 significant digits (<= 5e-7
// relative). Both sides evaluate the same formulas in float32, in different
// orders. Rounding errors of a k-term sum grow like sqrt(k) u (the
// probabilistic bound; the worst case k u is ~16x looser and would hide
// real bugs such as a wrong epsilon); four such stages of k <= 256 (two
// layers' attention and FFN, then the classifier) give 4 sqrt(256) = 64 u of
// the logit scale per implementation, 128 u for the two. Measured: <= 1.1e-5
// on every architecture, under half this bound.
double tolerance(const reference& r) { return (5e-7 + 128 * 5.96e-8) * r.max_abs; }

/// The model of HF directory `name`, or of the GGUF file write_gguf makes of it.
llama_weights weights_of(const std::string& name, bool via_gguf) {
  auto w = load_hf_weights(hf_dir(name));
  if (!via_gguf) return w;
  const auto path = test::scratch_dir("hf_gguf") / (name + ".gguf");
  write_gguf(w, path, name);
  return load_gguf_weights(std::make_shared<const io::gguf_file>(path));
}

template <class Backend>
void check_arch(const std::string& name, bool via_gguf = false) {
  const auto dir = hf_dir(name);
  REQUIRE_MESSAGE(fs::exists(dir / "config.json"), "missing test data " << dir);
  const reference ref = read_reference(dir);
  llama_model<dynamic_llama_config, Backend> m(weights_of(name, via_gguf), 0, Backend(2));
  const std::size_t V = m.n_vocab();
  const double tol = tolerance(ref);
  for (std::size_t s = 0; s < ref.tokens.size(); ++s) {
    const auto& toks = ref.tokens[s];
    const auto& want = ref.logits[s];
    INFO(name << " sequence " << s << " (" << toks.size() << " tokens)");
    m.reset();
    const auto all = m.prefill_all_logits(toks);
    REQUIRE(all.size() == want.size());
    double worst = 0;
    for (std::size_t i = 0; i < all.size(); ++i) worst = std::max(worst, std::fabs(double(all[i]) - want[i]));
    CHECK_MESSAGE(worst <= tol, "prefill: max |logit - reference| " << worst << " > " << tol);
    // prefill() without every token's logits: the last layer takes only the
    // last token past its keys and values (biases, windows and learned
    // positions included).
    m.reset();
    const auto last = m.prefill(toks);
    double worst_last = 0;
    for (std::size_t v = 0; v < V; ++v)
      worst_last = std::max(worst_last, std::fabs(double(last[v]) - want[(toks.size() - 1) * V + v]));
    CHECK_MESSAGE(worst_last <= tol, "prefill, last token: max |logit - reference| " << worst_last << " > " << tol);
    // Decode after a one-token prefill: the KV-cache path, window included.
    m.reset();
    auto row = m.prefill(std::span(toks).first(1));
    double worst_decode = 0;
    for (std::size_t t = 0; t < toks.size(); ++t) {
      if (t) row = m.decode(toks[t]);
      for (std::size_t v = 0; v < V; ++v)
        worst_decode = std::max(worst_decode, std::fabs(double(row[v]) - want[t * V + v]));
    }
    CHECK_MESSAGE(worst_decode <= tol, "decode: max |logit - reference| " << worst_decode << " > " << tol);
    MESSAGE(name << " seq " << s << ": max error prefill " << worst << ", decode " << worst_decode);
  }
}

}  // namespace

TEST_CASE("hf: every architecture matches transformers' logits (fast backend)") {
  for (const char* name : {"llama", "llama-sharded", "llama-bf16", "llama3", "mistral", "qwen2", "gpt2", "gpt2-f16", "phi3"}) {
    SUBCASE(name) { check_arch<cpu_backend>(name); }
  }
}

TEST_CASE("hf: every architecture matches transformers' logits (scalar twins)") {
  for (const char* name : {"llama", "llama3", "mistral", "qwen2", "gpt2", "phi3"}) {
    SUBCASE(name) { check_arch<cpu_ref_backend>(name); }
  }
}

TEST_CASE("hf -> GGUF: every architecture written in llama.cpp's conventions loads back to the same logits") {
  // llama's q/k rows are permuted to adjacent pairs and run normal RoPE;
  // phi3/gpt2 tensors are fused; the GGUF loader undoes all of it.
  for (const char* name : {"llama", "llama-bf16", "llama3", "mistral", "qwen2", "gpt2", "gpt2-f16", "phi3"}) {
    SUBCASE(name) { check_arch<cpu_backend>(name, /*via_gguf=*/true); }
  }
}

TEST_CASE("hf: the parts each architecture is made of") {
  auto hp = [](const char* name) { return load_hf_weights(hf_dir(name)).hparams; };
  CHECK(hp("llama").arch == model_arch::llama);
  CHECK(hp("mistral").sliding_window == 8);
  CHECK(hp("qwen2").sliding_window == 0);  // use_sliding_window false
  CHECK(hp("gpt2").norm == norm_type::layer);
  CHECK(hp("gpt2").ffn == ffn_type::gelu);
  CHECK(hp("gpt2").positions == position_type::learned);
  CHECK(hp("phi3").arch == model_arch::phi3);
  CHECK(hp("llama3").rope_theta == 500000.0f);
  // Llama 3's divisors, as the README derives them: [1, 2.44226, 8, ...].
  const auto w = load_hf_weights(hf_dir("llama3"));
  REQUIRE(w.rope_freqs);
  CHECK(w.rope_freqs[0] == doctest::Approx(1.0));
  CHECK(w.rope_freqs[1] == doctest::Approx(2.44226).epsilon(1e-5));
  for (std::size_t i = 2; i < 8; ++i) CHECK(w.rope_freqs[i] == doctest::Approx(8.0));
}

namespace {

/// A copy of HF test model `name` in a scratch folder, with config.json
/// edited by `edit` (a find/replace on its text), and `drop` (a tensor name)
/// left out of the safetensors file when non-empty.
fs::path broken_copy(const std::string& name, const std::string& find, const std::string& replace) {
  const auto dir = test::scratch_dir("hf_bad_" + name + "_" + std::to_string(std::hash<std::string>{}(find + replace)));
  for (const auto& e : fs::directory_iterator(hf_dir(name)))
    fs::copy_file(e.path(), dir / e.path().filename(), fs::copy_options::overwrite_existing);
  std::string cfg = test::read_file(dir / "config.json");
  const auto at = cfg.find(find);
  REQUIRE_MESSAGE(at != std::string::npos, "config.json of " << name << " has no '" << find << "'");
  cfg.replace(at, find.size(), replace);
  test::write_file(dir / "config.json", cfg);
  return dir;
}

}  // namespace

TEST_CASE("hf: bad configs and weights are clear errors naming the key or tensor") {
  auto err = [](const fs::path& dir) { return test::error_of([&] { (void)load_hf_weights(dir); }); };
  // A missing key names the key and config.json.
  auto e = err(broken_copy("llama", "\"hidden_size\"", "\"hidden_size_x\""));
  CHECK(e.find("hidden_size") != std::string::npos);
  CHECK(e.find("config.json") != std::string::npos);
  CHECK(err(broken_copy("gpt2", "\"n_layer\"", "\"n_layer_x\"")).find("n_layer") != std::string::npos);
  // A wrong type of value.
  CHECK(err(broken_copy("llama", "\"num_hidden_layers\": 2", "\"num_hidden_layers\": \"two\"")).find("num_hidden_layers") !=
        std::string::npos);
  // Unsupported architecture / activation / scaling.
  CHECK(err(broken_copy("llama", "\"model_type\": \"llama\"", "\"model_type\": \"falcon\"")).find("falcon") != std::string::npos);
  CHECK(err(broken_copy("llama", "\"hidden_act\": \"silu\"", "\"hidden_act\": \"relu\"")).find("relu") != std::string::npos);
  CHECK(err(broken_copy("llama3", "\"rope_type\": \"llama3\"", "\"rope_type\": \"yarn\"")).find("yarn") != std::string::npos);
  // Shapes that disagree with the config name the tensor and both shapes.
  e = err(broken_copy("llama", "\"intermediate_size\": 128", "\"intermediate_size\": 96"));
  CHECK(e.find("gate_proj") != std::string::npos);
  CHECK(e.find("(128, 64)") != std::string::npos);
  e = err(broken_copy("llama", "\"vocab_size\": 256", "\"vocab_size\": 300"));
  CHECK(e.find("embed_tokens") != std::string::npos);
  // Impossible hyperparameters.
  CHECK(err(broken_copy("llama", "\"num_key_value_heads\": 2", "\"num_key_value_heads\": 3")).find("n_head_kv") !=
        std::string::npos);
  // An untied model whose lm_head is missing: the config says untied.
  e = err(broken_copy("qwen2", "\"tie_word_embeddings\": true", "\"tie_word_embeddings\": false"));
  CHECK(e.find("lm_head.weight") != std::string::npos);
  // Not a directory / no config.
  CHECK(!err(hf_dir("no-such-model")).empty());
}

TEST_CASE("hf: the hf-tiny llama directory (pytorch_model.bin + tokenizer.model) loads as a model file and runs") {
  const auto dir = test::fixture("hf-tiny/tiny-random-llama");
  if (!dir) return;
  auto file = load_model_file(*dir);
  CHECK(file.format == model_format::hf);
  CHECK(file.tokenizer.spm() != nullptr);
  CHECK(file.weights.hparams.n_vocab == 32000);
  CHECK(file.weights.hparams.n_embd == 4);
  llama_model<> m(file.weights, 64, cpu_backend(1));
  const auto toks = file.tokenizer.encode("Hello world", true);
  CHECK(toks == std::vector<token_id>{1, 15043, 3186});
  for (float v : m.prefill(toks)) REQUIRE(std::isfinite(v));
}
