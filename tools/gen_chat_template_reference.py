#!/usr/bin/env python3
"""Renders real chat templates with jinja2 to make kestrel's chat-template goldens.

usage: python3 tools/gen_chat_template_reference.py   (needs: pip install jinja2)

For each template below it writes, under tests/tokenizer/data/chat_templates/:
  NAME.jinja          the template text (as found in the model's tokenizer_config.json
                      / GGUF tokenizer.chat_template)
  NAME.gen.txt        the conversation rendered with add_generation_prompt=True
  NAME.nogen.txt      the same with add_generation_prompt=False
and manifest.tsv: NAME, kestrel family, bos spelling, eos spelling, one per line.

Rendering follows Hugging Face transformers' apply_chat_template: jinja2 with
trim_blocks=True, lstrip_blocks=True, raise_exception() available. Templates that
reject a system message (Mistral v0.2, Gemma) get the conversation with the
system message folded into the first user message as "SYSTEM\\n\\nUSER", which is
what kestrel's formatter does for them (see include/kestrel/tokenizer/chat_template.hpp).
"""
import os

import jinja2

CONVERSATION = [
    {"role": "system", "content": "You are a helpful assistant"},
    {"role": "user", "content": "Hello"},
    {"role": "assistant", "content": "   Hi there, how can I help?   "},
    {"role": "user", "content": "Who are you?"},
]

# name: (family, bos, eos, fold_system, template). Sources: the templates marked
# "llama.cpp" were copied from llama.cpp tests/test-chat-template.cpp
# (ggml-org/llama.cpp @ 03f94f19a2c4c9d039fa1a84838fe3e2110cc28d), which quotes
# them from the named models; the others are the named model's
# tokenizer_config.json chat_template as published on Hugging Face (transcribed).
TEMPLATES = {
    # teknium/OpenHermes-2.5-Mistral-7B (llama.cpp)
    "openhermes-2.5-mistral": ("chatml", "<s>", "<|im_end|>", False,
        "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"),
    # Qwen/Qwen2-7B-Instruct (tokenizer_config.json). Checked against the Qwen2-Instruct template
    # quoted (as tokenizer.chat_template of Qwen/Qwen2-0.5B-Instruct) in huggingface/trl
    # docs/source/chat_templates.md: the \n inside string literals are real newlines there.
    "qwen2-instruct": ("chatml", "", "<|im_end|>", False,
        "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}{{ '<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n' }}{% endif %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"),
    # meta-llama/Llama-2-7b-chat-hf (tokenizer_config.json). Checked identical to the llama2:7b GGUF
    # template in huggingface/huggingface.js packages/ollama-utils/src/chat-template-automap.ts.
    "llama-2-chat": ("llama2", "<s>", "</s>", False,
        "{% if messages[0]['role'] == 'system' %}{% set loop_messages = messages[1:] %}{% set system_message = messages[0]['content'] %}{% else %}{% set loop_messages = messages %}{% set system_message = false %}{% endif %}{% for message in loop_messages %}{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}{% if loop.index0 == 0 and system_message != false %}{% set content = '<<SYS>>\\n' + system_message + '\\n<</SYS>>\\n\\n' + message['content'] %}{% else %}{% set content = message['content'] %}{% endif %}{% if message['role'] == 'user' %}{{ bos_token + '[INST] ' + content.strip() + ' [/INST]' }}{% elif message['role'] == 'assistant' %}{{ ' '  + content.strip() + ' ' + eos_token }}{% endif %}{% endfor %}"),
    # meta-llama/Meta-Llama-3-8B-Instruct (tokenizer_config.json; llama.cpp quotes it without the
    # add_generation_prompt test). Checked identical to llama.cpp "Llama-3" plus the guard, and to the
    # llama3:8b GGUF template in huggingface.js packages/ollama-utils/src/chat-template-automap.ts:
    # the \n\n inside string literals are real newlines there.
    "llama-3-instruct": ("llama3", "<|begin_of_text|>", "<|eot_id|>", False,
        "{% set loop_messages = messages %}{% for message in loop_messages %}{% set content = '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n'+ message['content'] | trim + '<|eot_id|>' %}{% if loop.index0 == 0 %}{% set content = bos_token + content %}{% endif %}{{ content }}{% endfor %}{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}"),
    # mistralai/Mistral-7B-Instruct-v0.2 (llama.cpp)
    "mistral-7b-instruct-v0.2": ("mistral", "<s>", "</s>", True,
        "{{ bos_token }}{% for message in messages %}{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}{% if message['role'] == 'user' %}{{ '[INST] ' + message['content'] + ' [/INST]' }}{% elif message['role'] == 'assistant' %}{{ message['content'] + eos_token}}{% else %}{{ raise_exception('Only user and assistant roles are supported!') }}{% endif %}{% endfor %}"),
    # microsoft/Phi-3-small-8k-instruct (llama.cpp "Phi-3-small")
    "phi-3-small": ("phi3", "<s>", "<|endoftext|>", False,
        "{{ bos_token }}{% for message in messages %}{{'<|' + message['role'] + '|>' + '\\n' + message['content'] + '<|end|>\\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|assistant|>\\n' }}{% else %}{{ eos_token }}{% endif %}"),
    # google/gemma-2-9b-it (tokenizer_config.json; llama.cpp quotes gemma-7b-it's, the same without bos_token).
    # Checked identical to llama.cpp "google/gemma-7b-it" with {{ bos_token }} prepended.
    "gemma-2-it": ("gemma", "<bos>", "<eos>", True,
        "{{ bos_token }}{% if messages[0]['role'] == 'system' %}{{ raise_exception('System role not supported') }}{% endif %}{% for message in messages %}{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}{% if (message['role'] == 'assistant') %}{% set role = 'model' %}{% else %}{% set role = message['role'] %}{% endif %}{{ '<start_of_turn>' + role + '\\n' + message['content'] | trim + '<end_of_turn>\\n' }}{% endfor %}{% if add_generation_prompt %}{{'<start_of_turn>model\\n'}}{% endif %}"),
    # HuggingFaceH4/zephyr-7b-beta (tokenizer_config.json). Checked identical to the copy in
    # huggingface/huggingface.js packages/jinja/test/templates.test.js.
    "zephyr-7b-beta": ("zephyr", "<s>", "</s>", False,
        "{% for message in messages %}\n{% if message['role'] == 'user' %}\n{{ '<|user|>\n' + message['content'] + eos_token }}\n{% elif message['role'] == 'system' %}\n{{ '<|system|>\n' + message['content'] + eos_token }}\n{% elif message['role'] == 'assistant' %}\n{{ '<|assistant|>\n'  + message['content'] + eos_token }}\n{% endif %}\n{% if loop.last and add_generation_prompt %}\n{{ '<|assistant|>' }}\n{% endif %}\n{% endfor %}"),
}


def fold_system(msgs):
    out, pending = [], ""
    for m in msgs:
        if m["role"] == "system":
            pending += m["content"] + "\n\n"
        elif m["role"] == "user" and pending:
            out.append({"role": "user", "content": pending + m["content"]})
            pending = ""
        else:
            out.append(m)
    return out


def raise_exception(msg):
    raise jinja2.exceptions.TemplateError(msg)


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    out_dir = os.path.join(here, "..", "tests", "tokenizer", "data", "chat_templates")
    os.makedirs(out_dir, exist_ok=True)
    env = jinja2.Environment(trim_blocks=True, lstrip_blocks=True)
    env.globals["raise_exception"] = raise_exception
    manifest = []
    for name, (family, bos, eos, fold, text) in TEMPLATES.items():
        tmpl = env.from_string(text)
        msgs = fold_system(CONVERSATION) if fold else CONVERSATION
        with open(os.path.join(out_dir, name + ".jinja"), "w", newline="") as f:
            f.write(text)
        for suffix, gen in (("gen", True), ("nogen", False)):
            rendered = tmpl.render(messages=msgs, bos_token=bos, eos_token=eos, add_generation_prompt=gen)
            with open(os.path.join(out_dir, f"{name}.{suffix}.txt"), "w", newline="") as f:
                f.write(rendered)
        manifest.append(f"{name}\t{family}\t{bos}\t{eos}\n")
    with open(os.path.join(out_dir, "manifest.tsv"), "w", newline="") as f:
        f.writelines(manifest)


if __name__ == "__main__":
    main()
