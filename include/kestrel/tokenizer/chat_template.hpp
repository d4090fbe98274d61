// kestrel/tokenizer/chat_template.hpp: chat templates by recognition.
//
// A GGUF file carries its chat format as a Jinja program
// (tokenizer.chat_template). Rather than interpret Jinja, kestrel recognises
// the common families by distinctive substrings (as llama.cpp's
// llm_chat_detect_template does) and formats a conversation with one small
// function per family. Each formatter reproduces, byte for byte, what the
// family's reference template renders under Hugging Face's settings
// (trim_blocks, lstrip_blocks): tests/tokenizer/data/chat_templates/ holds the
// templates and the outputs tools/gen_chat_template_reference.py rendered
// with jinja2.
//
// Decision on unknown templates: detect_chat_template() throws
// invalid_argument naming the supported families (a wrong format silently
// applied would make a model answer badly without any sign); a caller that
// wants a fallback picks one explicitly, e.g. chat_template_kind::chatml
// through try_detect_chat_template(...).value_or(...), or lets the user name
// one (kestrel-chat --chat-template NAME).
//
// Templates that reject a system message (Mistral v0.2, Gemma) get it folded
// into the next user message as "SYSTEM\n\nUSER" (what Mistral v0.3's own
// template does); role alternation is not enforced.
#pragma once

#include <array>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "kestrel/core/error.hpp"

namespace kestrel {

enum class chat_template_kind {
  chatml,   // <|im_start|>role\n...<|im_end|>\n (OpenHermes, Qwen/Qwen2, Yi, ...)
  llama2,   // <s>[INST] <<SYS>>\n...\n<</SYS>>\n\n... [/INST] ... </s> (Llama-2-chat)
  llama3,   // <|start_header_id|>role<|end_header_id|>\n\n...<|eot_id|> (Llama 3, 3.1, 3.2)
  mistral,  // <s>[INST] ... [/INST]...</s> (Mistral-7B-Instruct v0.1/v0.2, Mixtral)
  phi3,     // <|role|>\n...<|end|>\n (Phi-3, Phi-3.5)
  gemma,    // <start_of_turn>role\n...<end_of_turn>\n (Gemma, Gemma 2)
  zephyr,   // <|role|>\n...</s>\n (Zephyr)
};

inline constexpr std::array<chat_template_kind, 7> all_chat_template_kinds = {
    chat_template_kind::chatml, chat_template_kind::llama2, chat_template_kind::llama3, chat_template_kind::mistral,
    chat_template_kind::phi3,   chat_template_kind::gemma,  chat_template_kind::zephyr};

struct chat_message {
  std::string role;  // "system", "user" or "assistant"
  std::string content;
};

/// The spellings a template writes for bos_token / eos_token.
struct chat_special_text {
  std::string bos, eos;
};

constexpr std::string_view name_of(chat_template_kind k) noexcept {
  switch (k) {
    case chat_template_kind::chatml: return "chatml";
    case chat_template_kind::llama2: return "llama2";
    case chat_template_kind::llama3: return "llama3";
    case chat_template_kind::mistral: return "mistral";
    case chat_template_kind::phi3: return "phi3";
    case chat_template_kind::gemma: return "gemma";
    case chat_template_kind::zephyr: return "zephyr";
  }
  return "unknown";
}

/// "chatml, llama2, ..." for messages.
inline std::string chat_template_names() {
  std::string s;
  for (auto k : all_chat_template_kinds) {
    if (!s.empty()) s += ", ";
    s += name_of(k);
  }
  return s;
}

/// The kind named `name` (as name_of() spells it; "qwen" is chatml), or nullopt.
inline std::optional<chat_template_kind> chat_template_from_name(std::string_view name) {
  if (name == "qwen" || name == "qwen2") return chat_template_kind::chatml;
  for (auto k : all_chat_template_kinds)
    if (name == name_of(k)) return k;
  return std::nullopt;
}

/// The family of a Jinja chat template, recognised by its distinctive
/// markers (checked in this order), or nullopt.
inline std::optional<chat_template_kind> try_detect_chat_template(std::string_view jinja) {
  auto has = [&](std::string_view s) { return jinja.find(s) != std::string_view::npos; };
  if (has("<|im_start|>")) return chat_template_kind::chatml;
  if (has("<|start_header_id|>") && has("<|end_header_id|>")) return chat_template_kind::llama3;
  if (has("<start_of_turn>")) return chat_template_kind::gemma;
  if (has("<|assistant|>") && has("<|end|>")) return chat_template_kind::phi3;
  if (has("[INST]")) return has("<<SYS>>") ? chat_template_kind::llama2 : chat_template_kind::mistral;
  if (has("<|user|>") && has("<|assistant|>")) return chat_template_kind::zephyr;
  return std::nullopt;
}

/// As try_detect_chat_template(), but an unrecognised template is an
/// invalid_argument naming the supported families.
inline chat_template_kind detect_chat_template(std::string_view jinja) {
  if (auto k = try_detect_chat_template(jinja)) return *k;
  throw invalid_argument("unrecognized chat template (supported: " + chat_template_names() +
                         "); choose one by name (--chat-template NAME)");
}

/// The usual bos/eos spellings of each family's models.
inline chat_special_text default_chat_special_text(chat_template_kind k) {
  switch (k) {
    case chat_template_kind::llama3: return {"<|begin_of_text|>", "<|eot_id|>"};
    case chat_template_kind::gemma: return {"<bos>", "<eos>"};
    case chat_template_kind::phi3: return {"<s>", "<|endoftext|>"};
    case chat_template_kind::chatml: return {"", "<|im_end|>"};
    default: return {"<s>", "</s>"};
  }
}

/// The spelling that ends an assistant turn in family `k` (a stop token).
constexpr std::string_view end_of_turn_text(chat_template_kind k) noexcept {
  switch (k) {
    case chat_template_kind::chatml: return "<|im_end|>";
    case chat_template_kind::llama3: return "<|eot_id|>";
    case chat_template_kind::phi3: return "<|end|>";
    case chat_template_kind::gemma: return "<end_of_turn>";
    default: return "</s>";
  }
}

namespace detail {
/// Appends each part to `out` (no temporaries, unlike chains of operator+).
template <class... Parts>
void chat_append(std::string& out, const Parts&... parts) {
  (out.append(std::string_view(parts)), ...);
}

/// Python's str.strip() / Jinja's trim for ASCII whitespace.
inline std::string_view chat_strip(std::string_view s) {
  constexpr std::string_view ws = " \t\n\r\v\f";
  const auto b = s.find_first_not_of(ws);
  if (b == std::string_view::npos) return {};
  return s.substr(b, s.find_last_not_of(ws) - b + 1);
}

/// System messages prepended to the next user message ("SYSTEM\n\nUSER"),
/// for templates without a system role.
inline std::vector<chat_message> fold_system(std::span<const chat_message> msgs) {
  std::vector<chat_message> out;
  std::string pending;
  for (const auto& m : msgs) {
    if (m.role == "system") {
      pending += m.content;
      pending += "\n\n";
    } else if (m.role == "user" && !pending.empty()) {
      pending += m.content;
      out.push_back({m.role, std::move(pending)});
      pending.clear();
    } else {
      out.push_back(m);
    }
  }
  if (!pending.empty()) out.push_back({"user", pending.substr(0, pending.size() - 2)});
  return out;
}
}  // namespace detail

/// The conversation `msgs` in family `k`'s format, ending with the prompt for
/// the assistant's next turn when `add_generation_prompt` (families whose
/// template has no such prompt, llama2 and mistral, end after "[/INST]"
/// anyway). `sp` gives the bos/eos spellings the template writes.
inline std::string apply_chat_template(chat_template_kind k, std::span<const chat_message> msgs,
                                       bool add_generation_prompt, const chat_special_text& sp) {
  using detail::chat_strip;
  std::string out;
  switch (k) {
    case chat_template_kind::chatml:
      for (const auto& m : msgs) detail::chat_append(out, "<|im_start|>", m.role, "\n", m.content, "<|im_end|>\n");
      if (add_generation_prompt) out += "<|im_start|>assistant\n";
      break;
    case chat_template_kind::llama2: {
      // meta-llama/Llama-2-7b-chat-hf: a leading system message goes inside
      // the first [INST] between <<SYS>> markers; every user turn starts with BOS.
      std::span<const chat_message> loop = msgs;
      std::optional<std::string> system;
      if (!msgs.empty() && msgs[0].role == "system") {
        system = msgs[0].content;
        loop = msgs.subspan(1);
      }
      for (std::size_t i = 0; i < loop.size(); ++i) {
        std::string content;
        if (i == 0 && system) detail::chat_append(content, "<<SYS>>\n", *system, "\n<</SYS>>\n\n");
        content += loop[i].content;
        if (loop[i].role == "user")
          detail::chat_append(out, sp.bos, "[INST] ", chat_strip(content), " [/INST]");
        else if (loop[i].role == "assistant")
          detail::chat_append(out, " ", chat_strip(content), " ", sp.eos);
      }
      break;
    }
    case chat_template_kind::llama3:
      for (std::size_t i = 0; i < msgs.size(); ++i) {
        if (i == 0) out += sp.bos;
        detail::chat_append(out, "<|start_header_id|>", msgs[i].role, "<|end_header_id|>\n\n", chat_strip(msgs[i].content),
                            "<|eot_id|>");
      }
      if (add_generation_prompt) out += "<|start_header_id|>assistant<|end_header_id|>\n\n";
      break;
    case chat_template_kind::mistral:
      out += sp.bos;
      for (const auto& m : detail::fold_system(msgs)) {
        if (m.role == "user")
          detail::chat_append(out, "[INST] ", m.content, " [/INST]");
        else if (m.role == "assistant")
          detail::chat_append(out, m.content, sp.eos);
      }
      break;
    case chat_template_kind::phi3:
      out += sp.bos;
      for (const auto& m : msgs) detail::chat_append(out, "<|", m.role, "|>\n", m.content, "<|end|>\n");
      out += add_generation_prompt ? "<|assistant|>\n" : sp.eos;
      break;
    case chat_template_kind::gemma:
      out += sp.bos;
      for (const auto& m : detail::fold_system(msgs)) {
        const std::string_view role = m.role == "assistant" ? std::string_view("model") : std::string_view(m.role);
        detail::chat_append(out, "<start_of_turn>", role, "\n", chat_strip(m.content), "<end_of_turn>\n");
      }
      if (add_generation_prompt) out += "<start_of_turn>model\n";
      break;
    case chat_template_kind::zephyr:
      for (const auto& m : msgs)
        if (m.role == "user" || m.role == "system" || m.role == "assistant")
          detail::chat_append(out, "<|", m.role, "|>\n", m.content, sp.eos, "\n");
      if (add_generation_prompt && !msgs.empty()) out += "<|assistant|>\n";
      break;
  }
  return out;
}

/// apply_chat_template() with the family's usual bos/eos spellings.
inline std::string apply_chat_template(chat_template_kind k, std::span<const chat_message> msgs,
                                       bool add_generation_prompt) {
  return apply_chat_template(k, msgs, add_generation_prompt, default_chat_special_text(k));
}

}  // namespace kestrel
