// engine/generate.hpp: the loop's stopping rules and accounting, on a
// scripted model (its logits pick a given token at each step) and a small
// real SentencePiece tokenizer.
#include <doctest/doctest.h>

#include <string>
#include <vector>

#include "kestrel/engine/generate.hpp"
#include "kestrel/sampler/greedy.hpp"
#include "kestrel/tokenizer/spm.hpp"

using namespace kestrel;

namespace {

/// Step i (0 = prefill) returns logits whose argmax is script[i].
struct scripted_model {
  explicit scripted_model(std::vector<token_id> s, std::size_t n_ctx = 64) : script(std::move(s)), ctx(n_ctx) {}
  std::vector<token_id> script;
  std::size_t ctx;
  std::size_t past = 0, calls = 0;
  std::vector<token_id> decoded;  // the tokens decode() was given
  std::vector<float> logits = std::vector<float>(6, 0.0f);

  std::span<const float> step() {
    std::fill(logits.begin(), logits.end(), 0.0f);
    logits[static_cast<std::size_t>(script.at(calls++))] = 1.0f;
    return logits;
  }
  std::span<const float> prefill(std::span<const token_id> t) {
    past += t.size();
    return step();
  }
  std::span<const float> decode(token_id t) {
    decoded.push_back(t);
    ++past;
    return step();
  }
  std::size_t n_past() const { return past; }
  std::size_t n_ctx() const { return ctx; }
};
static_assert(GenerativeModel<scripted_model>);

spm_tokenizer tiny_tokenizer() {
  spm_vocab v;
  v.pieces = {"<unk>", "<s>", "</s>", "\xe2\x96\x81hello", "\xe2\x96\x81world", "!"};
  v.scores = {0, 0, 0, -1, -2, -3};
  v.types = {2, 3, 3, 1, 1, 1};
  return spm_tokenizer(v);
}

struct run_result {
  std::string text;
  generation_stats stats;
  token_id last = 99;
};

run_result run(scripted_model& m, std::size_t n_predict, std::vector<token_id> prompt = {1}) {
  const auto tok = tiny_tokenizer();
  greedy_sampler greedy;
  run_result r;
  r.stats = generate(m, greedy, tok, prompt, n_predict, [&](std::string_view s) { r.text += s; }, &r.last);
  return r;
}

}  // namespace

TEST_CASE("generation stops at EOS, without emitting or decoding it") {
  scripted_model m({3, 4, 5, 2});
  const auto r = run(m, 100);
  CHECK(r.text == "hello world!");  // the dummy-prefix space after BOS is dropped
  CHECK(r.stats.n_generated == 3);
  CHECK(r.stats.stop == stop_reason::end_of_text);
  CHECK(r.last == 2);
  CHECK(m.decoded == std::vector<token_id>{3, 4, 5});
  CHECK(r.stats.n_prompt == 1);
}

TEST_CASE("generation stops at BOS (a new document), llama2.c's rule") {
  scripted_model m({3, 1, 4});
  const auto r = run(m, 100);
  CHECK(r.text == "hello");
  CHECK(r.stats.stop == stop_reason::end_of_text);
}

TEST_CASE("n_predict counts emitted tokens; the last one is not run through the model") {
  scripted_model m({3, 4, 5, 4});
  const auto r = run(m, 2);
  CHECK(r.text == "hello world");
  CHECK(r.stats.n_generated == 2);
  CHECK(r.stats.stop == stop_reason::length);
  CHECK(r.last == 4);
  CHECK(m.decoded == std::vector<token_id>{3});
  CHECK(m.n_past() == 2);
}

TEST_CASE("n_predict 0 only prefills the prompt") {
  scripted_model m({3});
  const auto r = run(m, 0, {1, 3, 4});
  CHECK(r.text.empty());
  CHECK(r.stats.n_generated == 0);
  CHECK(m.n_past() == 3);
  CHECK(r.last == no_token);
}

TEST_CASE("a full context stops generation instead of overflowing") {
  scripted_model m({3, 4, 5, 4, 3}, 3);
  const auto r = run(m, 100);
  CHECK(r.stats.stop == stop_reason::context_full);
  CHECK(m.n_past() == 3);
  CHECK(r.stats.n_generated == 3);
  CHECK(r.text == "hello world!");
}

TEST_CASE("a prompt that is not at the start keeps its leading spaces") {
  scripted_model m({4, 2});
  const auto r = run(m, 10, {1, 3});
  CHECK(r.text == " world");
}

TEST_CASE("an empty prompt is an error") {
  scripted_model m({3});
  CHECK_THROWS_AS(run(m, 10, {}), invalid_argument);
}

TEST_CASE("a tokenizer smaller than the model's vocabulary is an error before any text") {
  struct wide_model : scripted_model {
    using scripted_model::scripted_model;
    std::size_t n_vocab() const { return 7; }  // the tiny tokenizer has 6
  };
  wide_model m({3, 4});
  const auto tok = tiny_tokenizer();
  greedy_sampler greedy;
  std::string text;
  const std::vector<token_id> prompt{1};
  CHECK_THROWS_WITH_AS(generate(m, greedy, tok, prompt, 4, [&](std::string_view s) { text += s; }),
                       doctest::Contains("the tokenizer has 6 tokens, fewer than the model's vocabulary of 7"),
                       invalid_argument);
  CHECK(text.empty());
  CHECK(m.calls == 0);
}

TEST_CASE("stop tokens end the text; feed_last runs the last emitted token through the model") {
  const auto tok = tiny_tokenizer();
  greedy_sampler greedy;
  const std::vector<token_id> prompt{1};
  {
    scripted_model m({3, 4, 5, 2});
    const token_id stops[] = {5};
    generation_options g;
    g.stop_tokens = stops;
    std::string text;
    const auto st = generate(m, greedy, tok, prompt, g, [&](std::string_view s) { text += s; });
    CHECK(text == "hello world");
    CHECK(st.stop == stop_reason::end_of_text);
    CHECK(m.decoded == std::vector<token_id>{3, 4});  // the stop token is not fed
  }
  {
    scripted_model m({3, 4, 5, 4});
    generation_options g;
    g.n_predict = 2;
    g.feed_last = true;
    std::string text;
    const auto st = generate(m, greedy, tok, prompt, g, [&](std::string_view s) { text += s; });
    CHECK(text == "hello world");
    CHECK(st.stop == stop_reason::length);
    CHECK(m.decoded == std::vector<token_id>{3, 4});  // both emitted tokens are in the cache
    CHECK(m.n_past() == 3);
  }
}

TEST_CASE("the sampler's accept() sees the prompt and each token fed to the model, as the KV cache holds them") {
  /// Greedy, recording what accept() is given.
  struct recording_sampler {
    std::vector<token_id> accepted;
    token_id sample(std::span<float> logits) { return greedy_sampler{}.sample(logits); }
    void accept(token_id t) { accepted.push_back(t); }
  };
  static_assert(AcceptingSampler<recording_sampler>);
  const auto tok = tiny_tokenizer();
  const std::vector<token_id> prompt{1, 3};
  for (const bool feed_last : {false, true}) {
    scripted_model m({4, 3, 5, 4});
    recording_sampler s;
    generation_options g;
    g.n_predict = 3;
    g.feed_last = feed_last;
    generate(m, s, tok, prompt, g, [](std::string_view) {});
    std::vector<token_id> in_cache = prompt;
    in_cache.insert(in_cache.end(), m.decoded.begin(), m.decoded.end());
    CHECK(s.accepted == in_cache);
    CHECK(s.accepted.size() == m.n_past());
  }
  {  // a stop token is neither fed nor accepted
    scripted_model m({3, 2});
    recording_sampler s;
    generate(m, s, tok, prompt, 8, [](std::string_view) {});
    CHECK(s.accepted == std::vector<token_id>{1, 3, 3});
  }
}

TEST_CASE("ignore_eos: EOS, BOS and stop tokens are never sampled; the text ends at n_predict") {
  const auto tok = tiny_tokenizer();
  greedy_sampler greedy;
  const std::vector<token_id> prompt{1};
  // The script's argmax is EOS (2), then BOS (1), then the stop token 5:
  // masked, each step's greedy pick is the lowest id left among the zeros.
  scripted_model m({2, 1, 5, 4});
  const token_id stops[] = {5};
  generation_options g;
  g.n_predict = 4;
  g.stop_tokens = stops;
  g.ignore_eos = true;
  token_id last = 99;
  const auto st = generate(m, greedy, tok, prompt, g, [](std::string_view) {}, &last);
  CHECK(st.stop == stop_reason::length);
  CHECK(st.n_generated == 4);
  CHECK(m.decoded == std::vector<token_id>{0, 0, 0});  // <unk>, the lowest id not masked
  CHECK(last == 4);
}
