#!/usr/bin/env python3
"""The command-line programs as a user runs them.

usage: test_cli.py BUILD_DIR

kestrel-generate's stdout must be exactly the prompt followed by the generated
text (timings go to stderr); bad flags and impossible requests must exit 1
with a message naming the problem. Fixtures come from $KESTREL_FIXTURES or
../shared/fixtures; without them the test skips (exit 77), or fails in CI.
"""
import json
import os
import subprocess
import sys

import clitest
from clitest import check

build = sys.argv[1]
fixtures = clitest.fixtures_dir()
gen = os.path.join(build, "examples", "kestrel-generate")
chat = os.path.join(build, "examples", "kestrel-chat")
tokenize = os.path.join(build, "examples", "kestrel-tokenize")


def fx(rel):
    return os.path.join(fixtures, rel)


clitest.require(fx("gguf/stories260K.gguf"))


def run(args, stdin=None):
    return subprocess.run(args, input=stdin, capture_output=True, timeout=120)


ref = json.load(open(fx("llama2c/stories260K_reference_outputs.json")))
expected = {c["name"]: c["expected_text"] for c in ref["cases"]}

# Greedy from BOS, GGUF and llama2.c files: stdout is the text and nothing else.
for model in (["-m", fx("gguf/stories260K.gguf")],
              ["-m", fx("llama2c/stories260K.bin"), "--tokenizer", fx("llama2c/tok512.bin")]):
    r = run([gen, *model, "-n", "200", "--temp", "0", "-t", "2"])
    check(f"greedy 200 {model[1]}", r.returncode == 0 and r.stdout.decode() == expected["test_all_greedy_200"],
          f"rc={r.returncode} stdout={r.stdout[:120]!r} stderr={r.stderr[-300:]!r}")
    check("timings go to stderr", b"TTFT" in r.stderr and b"TTFT" not in r.stdout)

# --mmap (weights read in place) and --no-mmap (always copied into huge
# pages; the default copies while the copy is fast): the same text.
for flag in ("--mmap", "--no-mmap"):
    r = run([gen, "-m", fx("gguf/stories260K.gguf"), "-n", "200", "--temp", "0", "-t", "2", flag])
    check(f"greedy 200 with {flag}", r.returncode == 0 and r.stdout.decode() == expected["test_all_greedy_200"],
          f"rc={r.returncode} stdout={r.stdout[:120]!r} stderr={r.stderr[-300:]!r}")

# A prompt is echoed verbatim, then continued.
prompt = "Once upon a time, there was a little girl named Lily."
r = run([gen, "-m", fx("gguf/stories260K.gguf"), "-p", prompt, "-n", "30", "--temp", "0", "-t", "1"])
out = r.stdout.decode()
check("prompt then continuation", r.returncode == 0 and out.startswith(prompt) and len(out) > len(prompt)
      and expected["test_all_greedy_200"].startswith(out[:len(prompt) + 20]), repr(out[:200]))

# Seeded sampling is reproducible.
args = [gen, "-m", fx("gguf/stories260K.gguf"), "-n", "50", "--temp", "0.9", "--top-p", "0.9", "--seed", "7"]
a, b = run(args), run(args)
check("same seed, same text", a.returncode == 0 and a.stdout == b.stdout and len(a.stdout) > 20, repr(a.stdout[:100]))

# Repetition penalties, greedy: the text llama.cpp's llama-cli (794fe23) prints
# for the same flags (`-p "Once upon a time" -n 200 --temp 0 -no-cnv`, its
# leading space and trailing newlines dropped). Where the winning token leads
# by 0.005 or more at every step; settings whose steps come closer (0.001)
# part from llama.cpp at such a near tie, as its f16 KV cache rounds.
penalized = {
    ("--presence-penalty", "5"): "Once upon a time, there was a little girl named Lily. She loved to play outside in the park with her friends and daddy would spray on it every day. One day, she saw that behind himself! It had many costumes of another bird's favorite tower in the park with her friends and they played games on it.\nLily was so happy that she went home, but Lily did not want to show his mommy anymore because he had made journey flips and could play with the bird. She put on her nest into twigs, but she was very saf",
    ("--frequency-penalty", "0.5", "--repeat-last-n", "16"): "Once upon a time, there was a little girl named Lily. She loved to play outside in the park. One day, she saw a big box with a shiny blue ball. She wanted to play with it, but she didn't know what to do.\nLily's mommy said, \"Lily, let's go to the park.\" Lily was sad and didn't know what to do. She said, \"I want to play with your ball, but I can't find it.\"\nLily was sad and didn't know what to do. She said, \"I don't want to play with me.\" Her mommy said, \"I'm sorry, Lily.",
}
for flags, text in penalized.items():
    r = run([gen, "-m", fx("gguf/stories260K.gguf"), "-p", "Once upon a time", "-n", "200", "--temp", "0", "-t", "2", *flags])
    out = r.stdout.decode().rstrip("\n")
    check(f"greedy 200 with {' '.join(flags)}: llama.cpp's text", r.returncode == 0 and out == text,
          f"rc={r.returncode} stdout={out[:160]!r} stderr={r.stderr[-300:]!r}")

# --repeat-last-n -1 looks back over the whole context (set once the model is made).
r = run([gen, "-m", fx("gguf/stories260K.gguf"), "-n", "200", "--temp", "0", "-t", "2", "--repeat-last-n", "-1",
         "--repeat-penalty", "1.5"])
check("--repeat-last-n -1: the whole context", r.returncode == 0 and len(r.stdout) > 100
      and r.stdout.decode() != expected["test_all_greedy_200"], f"rc={r.returncode} stderr={r.stderr[-300:]!r}")
r2 = run([gen, "-m", fx("gguf/stories260K.gguf"), "-n", "200", "--temp", "0", "-t", "2", "--repeat-last-n", "1000000",
          "--repeat-penalty", "1.5"])
check("--repeat-last-n beyond the context: the context", r2.returncode == 0 and r2.stdout == r.stdout,
      f"rc={r2.returncode} stderr={r2.stderr[-300:]!r}")

import re
# -n -1 / -2 (llama.cpp's "no limit"): generation runs until EOS or the context is full.
r = run([gen, "-m", fx("gguf/stories260K.gguf"), "-n", "-1", "--temp", "0", "-t", "2", "-c", "64"])
m = re.search(rb"prompt: 1 tokens, generated: (\d+) tokens \((end of text|context full)\)", r.stderr)
check("-n -1: until EOS or a full context of 64", r.returncode == 0 and m is not None and 0 < int(m.group(1)) <= 64
      and expected["test_all_greedy_200"].startswith(r.stdout.decode()), f"rc={r.returncode} stderr={r.stderr[-300:]!r}")
# --ignore-eos: greedy from BOS ends with EOS after 345 tokens; without it, the context (-c 512) fills.
r = run([gen, "-m", fx("gguf/stories260K.gguf"), "-n", "-1", "--temp", "0", "-t", "2", "-c", "512", "--ignore-eos"])
m = re.search(rb"prompt: 1 tokens, generated: (\d+) tokens \(context full\)", r.stderr)
check("--ignore-eos -n -1: until the context is full", r.returncode == 0 and m is not None and int(m.group(1)) == 512
      and r.stdout.decode().startswith(expected["test_all_greedy_200"]), f"rc={r.returncode} stderr={r.stderr[-300:]!r}")
r = run([gen, "-m", fx("gguf/stories260K.gguf"), "-n", "-3"])
check("-n -3 is an error", r.returncode == 1 and b"-n must be >= 0, or -1 / -2" in r.stderr, repr(r.stderr[-200:]))

# Mistakes are clear errors with exit status 1, never crashes.
bad = [
    (["-m", fx("gguf/stories260K.gguf"), "--temp", "-1"], b"temperature"),
    (["-m", fx("gguf/stories260K.gguf"), "--top-p", "1.5"], b"top_p"),
    (["-m", fx("gguf/stories260K.gguf"), "--top-k", "-3"], b"top_k"),
    (["-m", fx("gguf/stories260K.gguf"), "--repeat-penalty", "0"], b"penalty_repeat = 0"),
    (["-m", fx("gguf/stories260K.gguf"), "--repeat-last-n", "-2"], b"--repeat-last-n must be >= -1"),
    (["-m", fx("gguf/stories260K.gguf"), "--repeat-last-n", "2000000000", "--repeat-penalty", "1.1"], b"penalty_last_n = 2000000000"),
    (["-m", fx("gguf/stories260K.gguf"), "--presence-penalty", "inf"], b"penalty_present = inf"),
    (["-m", fx("gguf/stories260K.gguf"), "--frequency-penalty", "x"], b"not a valid number"),
    (["-m", fx("gguf/stories260K.gguf"), "-n", "abc"], b"not a valid number"),
    (["-m", fx("gguf/stories260K.gguf"), "--bogus"], b"unknown argument"),
    (["-m", fx("gguf/stories260K.gguf"), "-c", "4", "-p", prompt], b"longer than the context length of 4"),
    (["-m", fx("llama2c/stories260K.bin")], b"tokenizer"),
    (["-m", "/nonexistent/model.gguf"], b"cannot open"),
    (["-m", fixtures], b"a Hugging Face model directory needs config.json"),  # a directory is read as an HF model
    (["-m", fx("llamacpp-vocab/ggml-vocab-llama-spm.gguf.inp")], b"not a GGUF file"),
    (["-m", fx("llama2c/stories260K.bin"), "--tokenizer", fx("gguf/stories260K.gguf")], b"not a llama2.c tokenizer.bin"),
    (["-m", fx("gguf/llama-2-tiny-random.gguf"), "--tokenizer", fx("llama2c/tok512.bin")],
     b"smaller vocabulary than the model's"),
    ([], b"no model"),
]
for argv, needle in bad:
    r = run([gen, *argv, "-n", "5"] if argv else [gen])
    check(f"error: {' '.join(os.path.basename(x) for x in argv)}",
          r.returncode == 1 and needle in r.stderr and b"error" in r.stderr and r.stdout == b"",
          f"rc={r.returncode} stderr={r.stderr[-300:]!r}")

# kestrel-chat: each line continues the conversation; end of input quits cleanly.
r = run([chat, "-m", fx("gguf/stories260K.gguf"), "-n", "20", "--temp", "0", "-t", "1"],
        stdin=b"Once upon a time\nThe dog\n")
check("chat answers two lines and exits at EOF", r.returncode == 0 and r.stderr.count(b"tokens, TTFT") == 2 and len(r.stdout) > 20,
      f"rc={r.returncode} stdout={r.stdout[:200]!r} stderr={r.stderr[-300:]!r}")

# kestrel-chat with a chat template chosen by name: the turn is formatted (the
# tiny model knows no template, but the run must work and stop cleanly).
r = run([chat, "-m", fx("gguf/stories260K.gguf"), "-n", "10", "--temp", "0", "-t", "1", "--chat-template", "chatml"],
        stdin=b"Hello\nAgain\n")
check("chat --chat-template chatml: two turns", r.returncode == 0 and r.stderr.count(b"tokens, TTFT") == 2,
      f"rc={r.returncode} stderr={r.stderr[-300:]!r}")
import re
prefilled = [int(x) for x in re.findall(rb"(\d+) prefilled\]", r.stderr)]
t = run([tokenize, "-m", fx("gguf/stories260K.gguf"), "--no-bos", "--show-count", "--ids", "-p",
         "<|im_end|>\\n<|im_start|>user\\nAgain<|im_end|>\\n<|im_start|>assistant\\n"])
suffix = re.search(rb"Total number of tokens: (\d+)", t.stdout)
check("chat template: the second turn prefills only the new suffix", len(prefilled) == 2 and suffix is not None
      and prefilled[1] == int(suffix.group(1)), f"prefilled={prefilled} tokenize={t.stdout[-60:]!r}")
# A full context starts a new conversation; a line that alone leaves no room
# for a reply is refused and the chat goes on (plain and templated turns).
long_line = b" ".join([b"the little dog ran"] * 12) + b"\n"
# (chatml's markup is ~40 tokens a turn in this tiny vocabulary.)
for ctx, extra in (("40", []), ("100", ["--chat-template", "chatml"])):
    r = run([chat, "-m", fx("gguf/stories260K.gguf"), "-c", ctx, "-n", "30", "--temp", "0", "-t", "1", *extra],
            stdin=b"Once upon a time\nThe dog\nThe cat\n" + long_line + b"A bird\n")
    check(f"chat -c {ctx} {' '.join(extra)}: context full starts over, a too long line is refused",
          r.returncode == 0 and b"[context full: starting a new conversation]" in r.stderr
          and b"leaves no room for a reply" in r.stderr and r.stderr.count(b"tokens, TTFT") == 4,
          f"rc={r.returncode} stderr={r.stderr[-600:]!r}")
r = run([chat, "-m", fx("gguf/stories260K.gguf"), "--chat-template", "nonsense"], stdin=b"")
check("chat: unknown --chat-template is an error", r.returncode == 1 and b"chatml" in r.stderr, f"rc={r.returncode} stderr={r.stderr[-300:]!r}")

# kestrel-tokenize: llama-tokenize's flags and output.
if os.path.exists(tokenize):
    spm = fx("llamacpp-vocab/ggml-vocab-llama-spm.gguf")
    r = run([tokenize, "-m", spm, "-p", "Hello world"])
    check("tokenize: default output", r.returncode == 0 and r.stdout == b"     1 -> '<s>'\n 15043 -> ' Hello'\n  3186 -> ' world'\n",
          repr(r.stdout) + repr(r.stderr[-200:]))
    r = run([tokenize, "-m", spm, "-p", "Hello world", "--ids", "--no-bos"])
    check("tokenize: --ids --no-bos", r.returncode == 0 and r.stdout == b"[15043, 3186]\n", repr(r.stdout))
    r = run([tokenize, "-m", spm, "-p", "a\\nb<s>", "--ids", "--no-bos"])
    with_special = r.stdout
    check("tokenize: escapes and special tokens", r.returncode == 0 and with_special.startswith(b"[") and b", 13, " in with_special
          and with_special.endswith(b", 1]\n"), repr(with_special))
    r = run([tokenize, "-m", spm, "-p", "a\\nb<s>", "--ids", "--no-bos", "--no-parse-special", "--no-escape"])
    check("tokenize: --no-parse-special --no-escape", r.returncode == 0 and b", 1]" not in r.stdout and b", 13, " not in r.stdout,
          repr(r.stdout))
    r = run([tokenize, "-m", spm, "--stdin", "--ids", "--show-count"], stdin=b"Hello world")
    check("tokenize: --stdin --show-count", r.returncode == 0 and r.stdout == b"[1, 15043, 3186]\nTotal number of tokens: 3\n",
          repr(r.stdout))
    r = run([tokenize, "-m", fx("llamacpp-vocab/ggml-vocab-gpt-2.gguf"), "-p", "Hello world", "--ids", "--no-bos"])
    check("tokenize: byte-level BPE (gpt-2)", r.returncode == 0 and r.stdout == b"[15496, 995]\n", repr(r.stdout))
    r = run([tokenize, "-m", spm, "-f", fx("llamacpp-vocab/ggml-vocab-llama-spm.gguf.inp"), "--ids"])
    check("tokenize: -f FILE", r.returncode == 0 and r.stdout.startswith(b"[1, "), repr(r.stdout[:80]))
    r = run([tokenize, "-m", fx("gguf/stories260K.gguf"), "-p", "Once upon a time"])
    check("tokenize: a model GGUF", r.returncode == 0 and r.stdout.startswith(b"     1 -> '<s>'\n"), repr(r.stdout[:80]))
    for argv, needle in [
        (["-m", spm], b"exactly one of"),
        (["-m", spm, "-p", "x", "--stdin"], b"exactly one of"),
        (["-p", "x"], b"no model"),
        (["-m", "/nonexistent.gguf", "-p", "x"], b"cannot open"),
        (["-m", spm, "-f", "/nonexistent.txt"], b"cannot open"),
        (["-m", fx("llamacpp-vocab/ggml-vocab-bert-bge.gguf"), "-p", "x"], b"bert"),
        (["-m", spm, "-p", "x", "--bogus"], b"unknown argument"),
    ]:
        r = run([tokenize, *argv])
        check(f"tokenize error: {' '.join(os.path.basename(x) for x in argv)}",
              r.returncode == 1 and needle in r.stderr and b"error" in r.stderr and r.stdout == b"",
              f"rc={r.returncode} stderr={r.stderr[-300:]!r}")
else:
    check("kestrel-tokenize was built", False, tokenize)

clitest.finish("CLI")
