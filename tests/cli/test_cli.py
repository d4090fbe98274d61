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

build = sys.argv[1]
here = os.path.dirname(os.path.abspath(__file__))
fixtures = os.environ.get("KESTREL_FIXTURES") or os.path.join(here, "..", "..", "..", "shared", "fixtures")
gen = os.path.join(build, "examples", "kestrel-generate")
chat = os.path.join(build, "examples", "kestrel-chat")
failures = 0
checks = 0


def fx(rel):
    return os.path.join(fixtures, rel)


if not os.path.exists(fx("gguf/stories260K.gguf")):
    msg = f"fixtures not found at {fixtures} (set KESTREL_FIXTURES)"
    if os.environ.get("CI") == "true":
        print("FAIL:", msg)
        sys.exit(1)
    print("SKIPPED:", msg)
    sys.exit(77)


def run(args, stdin=None):
    return subprocess.run(args, input=stdin, capture_output=True, timeout=120)


def check(name, ok, detail=""):
    global failures, checks
    checks += 1
    print(("ok   " if ok else "FAIL ") + name + ("" if ok else "\n     " + detail))
    if not ok:
        failures += 1


ref = json.load(open(fx("llama2c/stories260K_reference_outputs.json")))
expected = {c["name"]: c["expected_text"] for c in ref["cases"]}

# Greedy from BOS, GGUF and llama2.c files: stdout is the text and nothing else.
for model in (["-m", fx("gguf/stories260K.gguf")],
              ["-m", fx("llama2c/stories260K.bin"), "--tokenizer", fx("llama2c/tok512.bin")]):
    r = run([gen, *model, "-n", "200", "--temp", "0", "-t", "2"])
    check(f"greedy 200 {model[1]}", r.returncode == 0 and r.stdout.decode() == expected["test_all_greedy_200"],
          f"rc={r.returncode} stdout={r.stdout[:120]!r} stderr={r.stderr[-300:]!r}")
    check("timings go to stderr", b"TTFT" in r.stderr and b"TTFT" not in r.stdout)

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

# Mistakes are clear errors with exit status 1, never crashes.
bad = [
    (["-m", fx("gguf/stories260K.gguf"), "--temp", "-1"], b"temperature"),
    (["-m", fx("gguf/stories260K.gguf"), "--top-p", "1.5"], b"top_p"),
    (["-m", fx("gguf/stories260K.gguf"), "--top-k", "-3"], b"top_k"),
    (["-m", fx("gguf/stories260K.gguf"), "-n", "abc"], b"not a valid number"),
    (["-m", fx("gguf/stories260K.gguf"), "--bogus"], b"unknown argument"),
    (["-m", fx("gguf/stories260K.gguf"), "-c", "4", "-p", prompt], b"longer than the context length of 4"),
    (["-m", fx("llama2c/stories260K.bin")], b"tokenizer"),
    (["-m", "/nonexistent/model.gguf"], b"cannot open"),
    (["-m", fixtures], b"is a directory"),
    (["-m", fx("llamacpp-vocab/ggml-vocab-llama-spm.gguf.inp")], b""),
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

print(f"{checks - failures} of {checks} CLI checks passed")
sys.exit(1 if failures else 0)
