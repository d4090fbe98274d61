// Chat templates: recognition of real templates, and each family's
// formatting compared byte for byte with what jinja2 renders from the real
// template (tests/tokenizer/data/chat_templates/, made by
// tools/gen_chat_template_reference.py).
#include <doctest/doctest.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "kestrel/tokenizer/chat_template.hpp"

using namespace kestrel;

namespace {

std::filesystem::path data_dir() {
  // __FILE__ is this source as the compiler saw it: absolute, or relative to
  // the build directory (two levels above this test binary, build/tests/).
  const auto rel = std::filesystem::path(__FILE__).parent_path() / "data" / "chat_templates";
  if (rel.is_absolute() || std::filesystem::exists(rel)) return rel;
  std::error_code ec;
  const auto exe = std::filesystem::read_symlink("/proc/self/exe", ec);
  if (!ec) {
    const auto from_build = exe.parent_path().parent_path() / rel;
    if (std::filesystem::exists(from_build)) return from_build;
  }
  return rel;
}

std::string slurp(const std::filesystem::path& p) {
  std::ifstream in(p, std::ios::binary);
  REQUIRE_MESSAGE(in.good(), "cannot open ", p.string());
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

const std::vector<chat_message> conversation = {
    {"system", "You are a helpful assistant"},
    {"user", "Hello"},
    {"assistant", "   Hi there, how can I help?   "},
    {"user", "Who are you?"},
};

}  // namespace

TEST_CASE("every family formats a conversation exactly as its real Jinja template renders it") {
  std::istringstream manifest(slurp(data_dir() / "manifest.tsv"));
  std::string line;
  int n = 0;
  while (std::getline(manifest, line)) {
    std::vector<std::string> f;
    std::istringstream ls(line);
    for (std::string x; std::getline(ls, x, '\t');) f.push_back(x);
    while (f.size() < 4) f.emplace_back();  // an empty bos/eos at the end of the line
    const std::string& name = f[0];
    CAPTURE(name);
    const auto kind = chat_template_from_name(f[1]);
    REQUIRE(kind);
    const std::string jinja = slurp(data_dir() / (name + ".jinja"));
    CHECK(detect_chat_template(jinja) == *kind);
    const chat_special_text sp{f[2], f[3]};
    CHECK(apply_chat_template(*kind, conversation, true, sp) == slurp(data_dir() / (name + ".gen.txt")));
    CHECK(apply_chat_template(*kind, conversation, false, sp) == slurp(data_dir() / (name + ".nogen.txt")));
    ++n;
  }
  CHECK(n == 8);
}

TEST_CASE("every family is covered by the reference data and has a name") {
  const std::string all = slurp(data_dir() / "manifest.tsv");
  for (auto k : all_chat_template_kinds) {
    CAPTURE(name_of(k));
    std::string field = "\t";
    field += name_of(k);
    field += '\t';
    CHECK(all.find(field) != std::string::npos);
    CHECK(chat_template_from_name(name_of(k)) == k);
  }
  CHECK(chat_template_from_name("qwen") == chat_template_kind::chatml);
  CHECK(!chat_template_from_name("vicuna"));
}

TEST_CASE("an unknown template is a clear error, or an explicit fallback") {
  const std::string vicuna =
      "{%- for message in messages %}{%- if message['role'] == 'user' -%}{{-'USER: ' + message['content'] + '\\n'-}}"
      "{%- else -%}{{-'ASSISTANT: ' + message['content'] + '</s>\\n' -}}{%- endif -%}{%- endfor -%}";
  CHECK(!try_detect_chat_template(vicuna));
  CHECK(try_detect_chat_template(vicuna).value_or(chat_template_kind::chatml) == chat_template_kind::chatml);
  try {
    detect_chat_template(vicuna);
    FAIL("no exception");
  } catch (const invalid_argument& e) {
    const std::string msg = e.what();
    CHECK(msg.find("unrecognized chat template") != std::string::npos);
    CHECK(msg.find("chatml") != std::string::npos);
    CHECK(msg.find("--chat-template") != std::string::npos);
  }
  CHECK_THROWS_AS(detect_chat_template(""), invalid_argument);
}

TEST_CASE("a conversation grows by suffixes: formatting without the generation prompt, then adding a turn") {
  // kestrel-chat prefills only the new suffix of the formatted conversation,
  // which needs the formatted history to be a prefix of the longer one.
  for (auto k : all_chat_template_kinds) {
    CAPTURE(name_of(k));
    std::vector<chat_message> msgs(conversation.begin(), conversation.begin() + 2);
    const std::string prompt = apply_chat_template(k, msgs, true);
    msgs.push_back({"assistant", "Fine."});
    const std::string history = apply_chat_template(k, msgs, false);
    msgs.push_back({"user", "And?"});
    const std::string next = apply_chat_template(k, msgs, true);
    CHECK(next.compare(0, prompt.size(), prompt) == 0);
    if (k != chat_template_kind::phi3)  // phi3 without a generation prompt ends in eos instead
      CHECK(next.compare(0, history.size(), history) == 0);
  }
}

TEST_CASE("empty conversation and system-only conversations") {
  for (auto k : all_chat_template_kinds) {
    CAPTURE(name_of(k));
    CHECK_NOTHROW(apply_chat_template(k, {}, true));
    const std::vector<chat_message> sys = {{"system", "S"}};
    // Llama 2's template prints a system message only inside the first [INST].
    if (k != chat_template_kind::llama2) CHECK(apply_chat_template(k, sys, true).find('S') != std::string::npos);
  }
}
