// kestrel-make-model: a GGUF file of a real architecture's shape with
// seeded random weights and a real vocabulary, for benchmarks and tests at
// scale (see include/kestrel/io/random_gguf.hpp for the scaling).
//
//   kestrel-make-model --arch llama --n-embd 2048 --n-layer 22 --n-head 32 --n-head-kv 4 --n-ff 5632
//     --vocab ggml-vocab-llama-spm.gguf --type f16 --seed 1 -o tinyllama-shape-f16.gguf
#include <chrono>
#include <cstdio>
#include <new>
#include <string>
#include <string_view>
#include <thread>

#include <unistd.h>

#include "common/cli.hpp"
#include "kestrel/io/random_gguf.hpp"
#include "kestrel/tokenizer/any.hpp"

namespace {

const char* usage =
    "usage: kestrel-make-model --arch llama --n-embd N --n-layer N --n-head N --n-ff N --vocab VOCAB.gguf -o OUT.gguf [options]\n"
    "  --arch A          architecture: llama, qwen2, phi3 or gpt2\n"
    "  --n-embd N        embedding width          --n-layer N   blocks\n"
    "  --n-head N        query heads              --n-head-kv N KV heads (default: n_head)\n"
    "  --n-ff N          feed-forward width\n"
    "  --tied            no output.weight (the classifier is token_embd)\n"
    "  --n-ctx N         training context written to the file (default 2048)\n"
    "  --rope-theta T    RoPE base (default 10000)\n"
    "  --vocab FILE      GGUF whose tokenizer.* metadata is copied (n_vocab = its token count)\n"
    "  --type T          f32 (default), f16, bf16, q8_0, q4_0, q4_1, q5_0, q5_1, q2_k, q3_k, q4_k, q5_k, q6_k,\n"
    "                    or a mix such as Q4_K_M (llama-quantize's per-tensor rules)\n"
    "  --seed S          (default 1)     --name NAME general.name\n"
    "  -t N              threads (default: all)\n"
    "  -o FILE           output\n";

[[noreturn]] void die(const std::string& msg, bool show_usage = false) {
  std::fprintf(stderr, "error: %s\n", msg.c_str());
  if (show_usage) std::fprintf(stderr, "%s", usage);
  std::exit(1);
}

}  // namespace

int main(int argc, char** argv) {
  using kestrel::cli::parse_number;
  kestrel::io::random_model_params p;
  std::string vocab, out;
  std::size_t n_threads = std::max(1u, std::thread::hardware_concurrency());
  for (int i = 1; i < argc; ++i) {
    const std::string_view a = argv[i];
    auto value = [&]() -> std::string_view {
      if (i + 1 >= argc) die(std::string(a) + " needs a value", true);
      return argv[++i];
    };
    auto size = [&] { return parse_number<std::size_t>(a, value()); };
    if (a == "-h" || a == "--help") {
      std::printf("%s", usage);
      return 0;
    } else if (a == "--arch") p.arch = value();
    else if (a == "--n-embd") p.n_embd = size();
    else if (a == "--n-layer") p.n_layer = size();
    else if (a == "--n-head") p.n_head = size();
    else if (a == "--n-head-kv") p.n_head_kv = size();
    else if (a == "--n-ff") p.n_ff = size();
    else if (a == "--n-ctx") p.n_ctx = size();
    else if (a == "--rope-theta") p.rope_theta = parse_number<float>(a, value());
    else if (a == "--tied") p.tied = true;
    else if (a == "--vocab") vocab = value();
    else if (a == "--type") p.type = value();
    else if (a == "--seed") p.seed = parse_number<std::uint64_t>(a, value());
    else if (a == "--name") p.name = value();
    else if (a == "-t" || a == "--threads") n_threads = size();
    else if (a == "-o" || a == "--output") out = value();
    else die("unknown argument '" + std::string(a) + "'", true);
  }
  if (vocab.empty()) die("no vocabulary given (--vocab VOCAB.gguf)", true);
  if (out.empty()) die("no output file given (-o OUT.gguf)", true);
  if (n_threads == 0 || n_threads > 1024) die("-t must be from 1 to 1024");
  try {
    const auto t0 = std::chrono::steady_clock::now();
    // Parameter mistakes are reported before the vocabulary is read.
    kestrel::io::random_arch(p.arch).check(p);
    kestrel::io::random_model_mix(p.type);
    const kestrel::io::gguf_file v{std::filesystem::path(vocab)};
    // A vocabulary the loaders refuse (bert's WordPiece, ...) would make a
    // file nothing here can run: refuse it now, with the loader's reason.
    if (v.has("tokenizer.ggml.tokens")) (void)kestrel::tokenizer_from_gguf(v);
    kestrel::cpu::thread_pool pool(n_threads);
    std::uint64_t total = 0;
    const bool tty = ::isatty(2);  // progress on a terminal only: one line, rewritten
    kestrel::io::write_random_model(p, v, out, &pool, [&](const kestrel::io::random_tensor_event& e) {
      total += e.bytes;
      if (tty)
        std::fprintf(stderr, "\r[%4zu/%4zu] %-32s %6s", e.index + 1, e.count, e.tensor->name.c_str(),
                     std::string(kestrel::io::name_of(e.tensor->type)).c_str());
    });
    if (tty) std::fprintf(stderr, "\n");
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    std::fprintf(stderr, "wrote %s: %s, %zu layers, n_embd %zu, vocab %zu, %.2f MiB of tensors in %.1f s\n",
                 out.c_str(), p.arch.c_str(), p.n_layer, p.n_embd, v.array_size("tokenizer.ggml.tokens"),
                 static_cast<double>(total) / (1024.0 * 1024.0), s);
  } catch (const std::bad_alloc&) {
    // write_random_model makes one tensor at a time in memory: the
    // largest, n_embd x max(n_ff, n_vocab) values, did not fit.
    die("out of memory making a tensor of n_embd " + std::to_string(p.n_embd) + " x n_ff " + std::to_string(p.n_ff) +
        " (or x the vocabulary): smaller shapes, please");
  } catch (const std::exception& e) {
    die(e.what());
  }
}
