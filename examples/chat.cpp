// kestrel-chat: an interactive loop over one model, streaming its replies.
//
// With a chat template (the GGUF's tokenizer.chat_template, recognised by
// family, or --chat-template NAME), each line is a user message: the whole
// conversation is formatted, only the suffix the KV cache does not hold yet
// is prefilled, and the reply ends at EOS / end of turn. Without one (a base
// model such as stories260K), each line is appended to the text held in the
// KV cache and the model continues from it; an empty line lets the model
// continue on its own. End of input (Ctrl-D) quits.
#include <cstdio>
#include <iostream>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "common/cli.hpp"
#include "kestrel/io/gguf.hpp"
#include "kestrel/tokenizer/chat_template.hpp"
#include "kestrel/tokenizer/special.hpp"

static const char* usage =
    "usage: kestrel-chat -m FILE [options]   (then type; Ctrl-D quits)\n"
    "  -m FILE          model: GGUF, or a llama2.c .bin with --tokenizer\n"
    "  --tokenizer FILE llama2.c tokenizer.bin (required for .bin models)\n"
    "  -n N             tokens per reply (default 256; -1 or -2: until EOS or a full context)\n"
    "  --chat-template NAME  format turns as NAME (chatml, llama2, llama3, mistral, phi3, gemma,\n"
    "                   zephyr) instead of the model's tokenizer.chat_template\n"
    "  --temp T --top-k K --top-p P --min-p P --seed S -t N -c N --mmap --no-mmap\n"
    "  --repeat-penalty R --repeat-last-n N --frequency-penalty F --presence-penalty P --ignore-eos\n"
    "                   as in kestrel-generate\n";

namespace {

struct chat_setup {
  kestrel::chat_template_kind kind;
  kestrel::chat_special_text text;  // bos/eos spellings the template writes
  kestrel::special_ids ids;         // end_of_generation: where a reply stops
};

/// The chat format: --chat-template NAME, else the file's template, else none.
template <class Tok>
std::optional<chat_setup> chat_format(const kestrel::cli::options& opt, const kestrel::model_file& file, const Tok& tok,
                                      std::optional<kestrel::chat_template_kind> by_name) {
  kestrel::special_ids ids;
  ids.bos = tok.bos();
  ids.eos = tok.eos();
  ids.add_bos = tok.add_bos();
  std::optional<std::string> jinja;
  if (file.gguf && !opt.tokenizer) {
    const kestrel::io::gguf_file& f = *file.gguf;
    jinja = f.get_optional<std::string>("tokenizer.chat_template");
    ids = kestrel::read_special_ids(f, ids);
  } else {
    ids.end_of_generation = {ids.eos};
  }
  std::optional<kestrel::chat_template_kind> kind = by_name;
  if (!kind && jinja) kind = kestrel::detect_chat_template(*jinja);  // unknown: a clear error
  if (!kind) return std::nullopt;
  chat_setup c{*kind, {}, ids};
  if (tok.bos() != kestrel::no_token) c.text.bos = std::string(tok.piece(tok.bos()));
  if (tok.eos() != kestrel::no_token) c.text.eos = std::string(tok.piece(tok.eos()));
  // The family's end-of-turn token, when the vocabulary has it, also stops a reply.
  if (auto id = tok.specials().find(kestrel::end_of_turn_text(*kind)); id != kestrel::no_token)
    c.ids.end_of_generation.push_back(id);
  if (tok.bos() != kestrel::no_token) c.ids.end_of_generation.push_back(tok.bos());
  return c;
}

/// One assistant reply after `input`, streamed to stdout and appended to
/// `text`. Every printed token is fed to the model, so the KV cache holds
/// exactly the conversation printed so far; returns false when the context
/// filled up before that held.
template <class Sampler, class Tok, class Model>
bool reply(const kestrel::cli::options& opt, const chat_setup& chat, Sampler& sampler, const Tok& tok, Model& model,
           const std::vector<kestrel::token_id>& input, std::string& text) {
  auto g = kestrel::cli::generation(opt);
  g.stop_tokens = chat.ids.end_of_generation;
  g.feed_last = true;
  const auto st = kestrel::generate(model, sampler, tok, input, g, [&](std::string_view piece) {
    kestrel::cli::write_stdout(piece);
    text += piece;
  });
  std::fprintf(stderr, "\n[%zu tokens, TTFT %.1f ms, %.1f tokens/s, %zu prefilled]", st.n_generated, st.ttft_ms,
               st.decode_tokens_per_s(), st.n_prompt);
  return st.stop != kestrel::stop_reason::context_full;
}

/// Makes `input` fit the context: when the conversation so far leaves it no
/// room, the model starts over and `restart()` gives the turn's input
/// without the history. Returns false, with a message, when even that
/// input leaves no room for a reply.
template <class Model, class Restart>
bool fit_context(Model& model, std::vector<kestrel::token_id>& input, Restart restart) {
  if (model.n_past() + input.size() < model.n_ctx()) return true;
  if (model.n_past() > 0) std::fprintf(stderr, "[context full: starting a new conversation]\n");
  model.reset();
  input = restart();
  if (input.size() < model.n_ctx()) return true;
  std::fprintf(stderr, "error: the line is %zu tokens: a context of %zu leaves no room for a reply (raise -c)\n",
               input.size(), model.n_ctx());
  return false;
}

template <class Sampler, class Tok, class Model>
void run_templated(const kestrel::cli::options& opt, const chat_setup& chat, Sampler& sampler, const Tok& tok,
                   Model& model) {
  std::vector<kestrel::chat_message> msgs;
  std::string cached;  // the formatted text whose tokens the KV cache holds
  auto tokens_of = [&](const std::string& text, bool fresh) {
    auto ids = tok.encode(text, false, /*parse_special=*/true);
    // The template may write BOS itself; add it only when it did not.
    if (fresh && chat.ids.add_bos && tok.bos() != kestrel::no_token && (ids.empty() || ids.front() != tok.bos()))
      ids.insert(ids.begin(), tok.bos());
    return ids;
  };
  std::string line;
  while (true) {
    std::fprintf(stderr, "\n> ");
    if (!std::getline(std::cin, line)) break;
    msgs.push_back({"user", line});
    std::string formatted = kestrel::apply_chat_template(chat.kind, msgs, true, chat.text);
    std::vector<kestrel::token_id> input;
    if (model.n_past() > 0 && formatted.compare(0, cached.size(), cached) == 0) {
      input = tokens_of(formatted.substr(cached.size()), false);  // only the new suffix
    } else {
      model.reset();  // history no longer a prefix (e.g. a template that trims replies): start over
      input = tokens_of(formatted, true);
    }
    const bool fits = fit_context(model, input, [&] {
      msgs = {msgs.back()};
      formatted = kestrel::apply_chat_template(chat.kind, msgs, true, chat.text);
      return tokens_of(formatted, true);
    });
    if (!fits) {
      msgs.clear();
      continue;
    }
    std::string text;
    const bool in_cache = reply(opt, chat, sampler, tok, model, input, text);
    msgs.push_back({"assistant", text});
    cached = in_cache ? formatted + text : std::string();
    if (!in_cache) model.reset();
  }
}

}  // namespace

int main(int argc, char** argv) {
  std::optional<kestrel::chat_template_kind> by_name;
  auto opt = kestrel::cli::parse(argc, argv, usage,
                                 {{"--chat-template", [&](std::string_view v) {
                                     by_name = kestrel::chat_template_from_name(v);
                                     if (!by_name)
                                       kestrel::cli::die("--chat-template: unknown template '" + std::string(v) +
                                                         "' (known: " + kestrel::chat_template_names() + ")");
                                   }}});
  try {
    kestrel::cli::session s(opt);
    auto& [sampler, file, tok, model] = s;
    const auto chat = chat_format(opt, file, tok, by_name);
    std::fprintf(stderr, "kestrel-chat: %s, context %zu tokens%s%s. Type a line and press Enter; Ctrl-D quits.\n",
                 opt.model.c_str(), model.n_ctx(), chat ? ", chat template " : "",
                 chat ? std::string(kestrel::name_of(chat->kind)).c_str() : "");
    if (chat) {
      run_templated(opt, *chat, sampler, tok, model);
      std::fprintf(stderr, "\n");
      return 0;
    }
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
      if (!fit_context(model, input, turn)) continue;
      const auto st = kestrel::generate(model, sampler, tok, input, kestrel::cli::generation(opt),
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
