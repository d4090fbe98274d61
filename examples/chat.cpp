// kestrel-chat: an interactive loop over one model, streaming its replies.
//
// Each line typed is appended to the conversation held in the KV cache and
// the model continues from it (chat templates come with the tokenizer work;
// a base model such as stories260K simply continues the story). An empty
// line lets the model continue on its own; end of input (Ctrl-D) quits.
#include <cstdio>
#include <iostream>
#include <string>
#include <string_view>

#include "common/cli.hpp"

static const char* usage =
    "usage: kestrel-chat -m FILE [options]   (then type; Ctrl-D quits)\n"
    "  -m FILE          model: GGUF, or a llama2.c .bin with --tokenizer\n"
    "  --tokenizer FILE llama2.c tokenizer.bin (required for .bin models)\n"
    "  -n N             tokens per reply (default 256)\n"
    "  --temp T --top-k K --top-p P --min-p P --seed S -t N -c N  as in kestrel-generate\n";

int main(int argc, char** argv) {
  auto opt = kestrel::cli::parse(argc, argv, usage);
  try {
    kestrel::cli::session s(opt);
    auto& [sampler, file, tok, model] = s;
    std::fprintf(stderr, "kestrel-chat: %s, context %zu tokens. Type a line and press Enter; Ctrl-D quits.\n",
                 opt.model.c_str(), model.n_ctx());
    std::string line;
    // The last sampled token: generate() does not run it through the model,
    // so the next turn feeds it first (unless it ended the text).
    kestrel::token_id pending = kestrel::no_token;
    while (true) {
      std::fprintf(stderr, "\n> ");
      if (!std::getline(std::cin, line)) break;
      auto turn = [&] {
        std::vector<kestrel::token_id> input;
        if (model.n_past() == 0 && tok.add_bos()) input.push_back(tok.bos());
        else if (model.n_past() > 0 && pending != kestrel::no_token) input.push_back(pending);
        const auto ids = tok.encode(line, /*add_bos=*/false);
        input.insert(input.end(), ids.begin(), ids.end());
        if (input.empty()) input.push_back(tok.bos());  // nothing typed at the start: let the model begin
        return input;
      };
      auto input = turn();
      if (model.n_past() + input.size() >= model.n_ctx()) {
        std::fprintf(stderr, "[context full: starting a new conversation]\n");
        model.reset();
        input = turn();
        if (input.size() >= model.n_ctx()) {
          std::fprintf(stderr, "error: the line is %zu tokens, longer than the context of %zu\n", input.size(),
                       model.n_ctx());
          continue;
        }
      }
      const auto st = kestrel::generate(model, sampler, tok, input, static_cast<std::size_t>(opt.n_predict),
                                        kestrel::cli::write_stdout, &pending);
      std::fprintf(stderr, "\n[%zu tokens, TTFT %.1f ms, %.1f tokens/s]", st.n_generated, st.ttft_ms,
                   st.decode_tokens_per_s());
      if (st.stop == kestrel::stop_reason::end_of_text) {
        model.reset();  // the text ended: the next line starts a new one
        pending = kestrel::no_token;
      }
    }
    std::fprintf(stderr, "\n");
  } catch (const std::exception& e) {
    std::fflush(stdout);
    kestrel::cli::die(e.what());
  }
}
