// kestrel-perplexity: perplexity of a model over a text file, with
// llama.cpp's llama-perplexity conventions (include/kestrel/engine/perplexity.hpp),
// so the numbers compare with it.
//
//   kestrel-perplexity -m model.gguf -f wiki.test.raw -c 512
#include <chrono>
#include <cstdio>
#include <string>

#include "common/cli.hpp"
#include "kestrel/engine/perplexity.hpp"

static const char* usage =
    "usage: kestrel-perplexity -m FILE -f TEXT [options]\n"
    "  -m FILE          model: GGUF, or a llama2.c .bin with --tokenizer\n"
    "  --tokenizer FILE llama2.c tokenizer.bin (required for .bin models)\n"
    "  -f FILE          text to score\n"
    "  -c N             tokens per chunk (default 512); the second half of each chunk is scored\n"
    "  -b N             tokens per forward call (default: the whole chunk; changes the result only by\n"
    "                   rounding: kernels are chosen by the number of tokens in a call)\n"
    "  --chunks N       score at most N chunks (default: all)\n"
    "  -t N             threads (default: all)\n"
    "  --mmap / --no-mmap  weights read in place / copied into huge pages (default: copied while fast)\n"
    "  (-p, -n and the sampling flags of kestrel-generate are accepted and have no effect here)\n";

int main(int argc, char** argv) {
  std::string text_file;
  long n_batch = 0, n_chunks = 0;
  auto opt = kestrel::cli::parse(argc, argv, usage,
                                 {{"-f", [&](std::string_view v) { text_file = v; }},
                                  {"--file", [&](std::string_view v) { text_file = v; }},
                                  {"-b", [&](std::string_view v) { n_batch = kestrel::cli::parse_number<long>("-b", v); }},
                                  {"--batch-size", [&](std::string_view v) { n_batch = kestrel::cli::parse_number<long>("-b", v); }},
                                  {"--chunks", [&](std::string_view v) { n_chunks = kestrel::cli::parse_number<long>("--chunks", v); }}});
  if (text_file.empty()) kestrel::cli::die("no text given (-f FILE)");
  if (n_batch < 0) kestrel::cli::die("-b must be >= 1, got " + std::to_string(n_batch));
  if (n_chunks < 0) kestrel::cli::die("--chunks must be >= 1, got " + std::to_string(n_chunks));
  const std::size_t n_ctx = opt.n_ctx ? static_cast<std::size_t>(opt.n_ctx) : 512;
  if (n_ctx < 4)  // before the text and the model are read (engine/perplexity.hpp says the same)
    kestrel::cli::die("-c " + std::to_string(n_ctx) + " is too small for perplexity (at least 4: the second half of each chunk is scored)");
  try {
    const std::string text = kestrel::io::read_whole_file(text_file);

    auto file = kestrel::load_model_file(opt.model, kestrel::cli::tokenizer_path(opt));
    const auto& tok = file.tokenizer;
    const auto t0 = std::chrono::steady_clock::now();
    const auto tokens = tok.encode(text, tok.add_bos());
    std::fprintf(stderr, "perplexity: %s: %zu bytes, %zu tokens\n", text_file.c_str(), text.size(), tokens.size());
    if (tokens.size() < n_ctx)  // before the model's KV cache is allocated
      kestrel::cli::die("the text has " + std::to_string(tokens.size()) + " tokens, fewer than one chunk of -c " +
                        std::to_string(n_ctx) + "; give a longer text or a smaller -c");
    kestrel::llama_model<> model(file.weights, n_ctx, kestrel::cpu_backend(static_cast<std::size_t>(opt.n_threads), opt.placement));
    kestrel::perplexity_options po;
    po.n_ctx = n_ctx;
    po.n_batch = static_cast<std::size_t>(n_batch);
    po.max_chunks = static_cast<std::size_t>(n_chunks);
    po.add_bos = tok.add_bos();
    po.bos = tok.bos();
    const std::size_t total = n_chunks ? std::min<std::size_t>(tokens.size() / n_ctx, static_cast<std::size_t>(n_chunks))
                                       : tokens.size() / n_ctx;
    std::fprintf(stderr, "perplexity: calculating perplexity over %zu chunks, n_ctx=%zu, scoring %zu tokens per chunk\n",
                 total, n_ctx, kestrel::scored_per_chunk(n_ctx));
    const auto r = kestrel::perplexity(model, tokens, po, [](std::size_t i, double ppl) {
      std::printf("[%zu]%.4f,", i + 1, ppl);
      std::fflush(stdout);
    });
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    std::printf("\nFinal estimate: PPL = %.4f +/- %.5f\n", r.ppl, r.ppl_error);
    std::fprintf(stderr, "perplexity: %zu chunks, %zu tokens scored, %.2f s (%.1f tokens/s evaluated)\n", r.n_chunks,
                 r.n_scored, s, static_cast<double>(r.n_chunks * n_ctx) / s);
  } catch (const std::exception& e) {
    std::fflush(stdout);
    kestrel::cli::die(e.what());
  }
}
