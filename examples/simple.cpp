// kestrel-simple: the whole path from a file to tokens, in one screen.
// (The README's library example is this file.)
//
//   kestrel-simple MODEL.gguf ["prompt"]
#include <cstdio>
#include <iostream>
#include <span>
#include <string_view>
#include <vector>

#include <kestrel/kestrel.hpp>

int main(int argc, char** argv) try {
  const std::string_view first = argc > 1 ? argv[1] : "";
  if (first == "-h" || first == "--help") {
    std::printf("usage: kestrel-simple MODEL.gguf [prompt]\n");
    return 0;
  }
  if (argc < 2 || argc > 3) {
    std::fprintf(stderr, "usage: kestrel-simple MODEL.gguf [prompt]\n");
    return 1;
  }
  // 1. Load: the weights are viewed in the file's memory map (zero copy); the
  //    CPU backend below copies the matrices once into huge pages when the
  //    model is built, where that copy runs fast (weight_placement,
  //    model/backend.hpp).
  auto file = kestrel::load_model_file(argv[1]);
  const auto& tok = file.tokenizer;  // SentencePiece or byte-level BPE, as the file says

  // 2. Compose the model from policies: config (dynamic dims), backend, KV cache (default: contiguous).
  kestrel::llama_model<> model(file.weights, /*n_ctx=*/0, kestrel::cpu_backend(/*threads=*/2));
  kestrel::sampler_chain sampler({.temperature = 0.8f, .top_k = 40, .top_p = 0.95f, .min_p = 0.05f, .seed = 42});

  // 3. Generate: prefill the prompt (matrix x matrix), then decode token by token (matrix x vector).
  const std::string_view text = argc > 2 ? argv[2] : "Once upon a time";
  const auto prompt = tok.encode(text, tok.add_bos());
  std::cout << text;
  const auto stats = kestrel::generate(model, sampler, tok, prompt, /*n_predict=*/100,
                                       [](std::string_view piece) { std::cout << piece << std::flush; });
  std::cout << "\n";
  std::fprintf(stderr, "TTFT %.2f ms, decode %.1f tokens/s\n", stats.ttft_ms, stats.decode_tokens_per_s());

  // 4. Or step by step: logits of the next token after the sequence so far.
  model.reset();
  std::span<const float> logits = model.prefill(prompt);   // (n_vocab)
  std::vector<float> scratch(logits.begin(), logits.end());  // samplers may use their input as scratch
  logits = model.decode(kestrel::greedy_sampler{}.sample(scratch));
  std::fprintf(stderr, "after %zu tokens: %zu logits\n", model.n_past(), logits.size());
} catch (const std::exception& e) {
  std::fprintf(stderr, "error: %s\n", e.what());
  return 1;
}
