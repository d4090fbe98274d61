// kestrel-generate: a prompt in, the prompt and its continuation out.
//
// stdout carries exactly the prompt followed by the generated text; the
// timings go to stderr. Flags follow llama.cpp's llama-cli.
#include <cstdio>
#include <string_view>

#include "common/cli.hpp"

static const char* usage =
    "usage: kestrel-generate -m FILE [options]\n"
    "  -m FILE          model: GGUF, or a llama2.c .bin with --tokenizer\n"
    "  --tokenizer FILE llama2.c tokenizer.bin (required for .bin models)\n"
    "  -p PROMPT        prompt (default: empty, i.e. BOS only)\n"
    "  -n N             tokens to generate (default 256; -1 or -2: until EOS or a full context)\n"
    "  --ignore-eos     never sample EOS (or BOS): generate until -n or a full context\n"
    "  --temp T         temperature, 0 = greedy (default 0.8)\n"
    "  --top-k K        (default 40, 0 = off)   --top-p P (default 0.95, 1 = off)\n"
    "  --min-p P        (default 0.05, 0 = off) --seed S (default random, printed)\n"
    "  --repeat-penalty R (default 1.0 = off)   --repeat-last-n N (tokens looked back; default 64,\n"
    "                   0 = off, -1 = the context)\n"
    "  --frequency-penalty F, --presence-penalty P (default 0 = off)\n"
    "  -t N             threads (default: all)  -c N context length (default: the model's, at most 4096)\n"
    "  --mmap           read the weights in place from the file mapping\n"
    "  --no-mmap        copy them into huge pages (faster decode where the copy is fast, a longer load)\n"
    "                   default: copy them while the copy runs fast, else read them in place\n";

int main(int argc, char** argv) {
  auto opt = kestrel::cli::parse(argc, argv, usage);
  try {
    kestrel::cli::session s(opt);
    auto& [sampler, file, tok, model] = s;
    const auto prompt = tok.encode(opt.prompt, tok.add_bos());
    if (prompt.empty())  // the default prompt is BOS alone, which this vocabulary does not add
      kestrel::cli::die("the prompt is empty and this model's vocabulary adds no BOS token: give a prompt (-p TEXT)");
    if (prompt.size() > model.n_ctx())  // before anything reaches stdout
      kestrel::cli::die("the prompt is " + std::to_string(prompt.size()) + " tokens, longer than the context length of " +
                        std::to_string(model.n_ctx()) + " (raise -c or shorten the prompt)");
    kestrel::cli::write_stdout(opt.prompt);
    const auto st =
        kestrel::generate(model, sampler, tok, prompt, kestrel::cli::generation(opt), kestrel::cli::write_stdout);
    kestrel::cli::print_stats(st);
  } catch (const std::exception& e) {
    std::fflush(stdout);
    kestrel::cli::die(e.what());
  }
}
