#!/usr/bin/env python3
"""kestrel-quantize, kestrel-make-model and kestrel-perplexity as a user runs them.

usage: test_tools.py BUILD_DIR

Bad input (unknown TYPE, missing files, impossible shapes, a vocabulary
file without a vocabulary, too short a text) must exit 1 with a message
naming the problem and no crash; good input must give files that the other
tools read. Fixtures come from $KESTREL_FIXTURES or ../shared/fixtures;
without them the test skips (exit 77), or fails in CI.
"""
import os
import re
import subprocess
import sys

import clitest
from clitest import check, fails_with

build = sys.argv[1]
here = os.path.dirname(os.path.abspath(__file__))
exe = {n: os.path.join(build, "examples", "kestrel-" + n) for n in ("quantize", "make-model", "perplexity")}
text = os.path.join(here, "..", "tools", "data", "stories.txt")
stories = os.path.join(clitest.fixtures_dir(), "gguf", "stories260K.gguf")
clitest.require(stories)


def run(args):
    return subprocess.run(args, capture_output=True, timeout=300)


tmp = clitest.scratch("kestrel-tools-")
q8 = os.path.join(tmp, "q8.gguf")

# kestrel-quantize
r = run([exe["quantize"], stories, q8, "q8_0", "2"])
out = r.stdout.decode()
check("quantize q8_0", r.returncode == 0 and os.path.exists(q8), r.stderr.decode()[-300:])
check("quantize prints a line per tensor (37 matrices converted) and the sizes",
      out.count("converting to") == 37 and "model size" in out and "quant size" in out, out[-400:])
fails_with("quantize: unknown TYPE", run([exe["quantize"], stories, os.path.join(tmp, "x.gguf"), "Q7_K"]),
           "unknown TYPE 'Q7_K'", "Q4_K_M")
fails_with("quantize: missing input", run([exe["quantize"], os.path.join(tmp, "nope.gguf"), os.path.join(tmp, "x.gguf"), "Q4_0"]),
           "nope.gguf")
fails_with("quantize: too few arguments", run([exe["quantize"], stories]), "expected IN.gguf OUT.gguf TYPE")
fails_with("quantize: requantizing needs --allow-requantize",
           run([exe["quantize"], q8, os.path.join(tmp, "q4.gguf"), "Q4_0"]), "already quantized", "--allow-requantize")
check("quantize: no output file after an error", not os.path.exists(os.path.join(tmp, "q4.gguf")))
r = run([exe["quantize"], "--allow-requantize", q8, os.path.join(tmp, "q4.gguf"), "Q4_0"])
check("quantize --allow-requantize", r.returncode == 0, r.stderr.decode()[-300:])
fails_with("quantize: bad --output-tensor-type",
           run([exe["quantize"], "--output-tensor-type", "q9", stories, os.path.join(tmp, "x.gguf"), "Q4_0"]), "q9")

# kestrel-make-model
shape = ["--arch", "llama", "--n-embd", "256", "--n-layer", "3", "--n-head", "8", "--n-head-kv", "2", "--n-ff", "512",
         "--vocab", stories]
a, b = os.path.join(tmp, "a.gguf"), os.path.join(tmp, "b.gguf")
r1 = run([exe["make-model"], *shape, "--seed", "5", "-o", a])
r2 = run([exe["make-model"], *shape, "--seed", "5", "-t", "1", "-o", b])
check("make-model runs", r1.returncode == 0 and r2.returncode == 0, (r1.stderr + r2.stderr).decode()[-300:])
check("make-model: same seed, same bytes", open(a, "rb").read() == open(b, "rb").read())
r = run([exe["make-model"], *shape, "--seed", "6", "--tied", "--type", "q8_0", "-o", b])
check("make-model --tied --type q8_0", r.returncode == 0 and open(a, "rb").read() != open(b, "rb").read()
      and (13).to_bytes(8, "little") + b"output.weight" not in open(b, "rb").read(), r.stderr.decode()[-300:])
fails_with("make-model: n_embd not a multiple of n_head",
           run([exe["make-model"], *shape[:7], "7", *shape[8:], "-o", os.path.join(tmp, "x.gguf")]),
           "--n-embd 256 is not a multiple of --n-head 7")
fails_with("make-model: unsupported arch", run([exe["make-model"], "--arch", "mamba", *shape[2:], "-o", os.path.join(tmp, "x.gguf")]),
           "--arch mamba is not supported")
novocab = os.path.join(tmp, "novocab.gguf")
with open(novocab, "wb") as f:  # a valid GGUF v3 with no metadata and no tensors
    f.write(b"GGUF" + (3).to_bytes(4, "little") + (0).to_bytes(8, "little") + (0).to_bytes(8, "little"))
fails_with("make-model: vocab file without tokenizer metadata",
           run([exe["make-model"], *shape[:-1], novocab, "-o", os.path.join(tmp, "x.gguf")]), "no tokenizer metadata")
fails_with("make-model: missing vocab file", run([exe["make-model"], *shape[:-1], os.path.join(tmp, "nope.gguf"), "-o", b]),
           "nope.gguf")
bert = os.path.join(clitest.fixtures_dir(), "llamacpp-vocab", "ggml-vocab-bert-bge.gguf")
if os.path.exists(bert):
    fails_with("make-model: a vocabulary the loaders refuse", run([exe["make-model"], *shape[:-1], bert, "-o", b]),
               "'bert' is not supported")
fails_with("make-model: unknown type", run([exe["make-model"], *shape, "--type", "q3", "-o", b]), "--type q3")
check("make-model: no partial file after an error", not os.path.exists(os.path.join(tmp, "x.gguf")))
own = os.path.join(tmp, "own-vocab.gguf")  # -o naming the --vocab file must not replace it
with open(stories, "rb") as f, open(own, "wb") as g:
    g.write(f.read())
fails_with("make-model: -o is the --vocab file", run([exe["make-model"], *shape[:-1], own, "-o", own]),
           "is the vocabulary file")
check("make-model: the --vocab file is left as it was", open(own, "rb").read() == open(stories, "rb").read())
fails_with("quantize: NTHREADS too long for a number", run([exe["quantize"], stories, os.path.join(tmp, "x.gguf"), "Q8_0",
                                                          "99999999999999999999999"]), "is not a number from 1 to 1024")

# kestrel-perplexity: llama-perplexity's output form
r = run([exe["perplexity"], "-m", stories, "-f", text, "-c", "128", "-t", "2"])
out = r.stdout.decode()
m = re.search(r"Final estimate: PPL = ([0-9.]+) \+/- ([0-9.]+)", out)
check("perplexity runs", r.returncode == 0 and m is not None, f"rc={r.returncode} {out[-300:]!r} {r.stderr[-300:]!r}")
check("perplexity prints every chunk", re.search(r"^\[1\][0-9.]+,\[2\][0-9.]+,", out) is not None and "[18]" in out, out[:200])
if m:
    # llama.cpp's llama-perplexity gives 4.7931 +/- 0.27008 on this file and text.
    check("perplexity matches llama-perplexity", abs(float(m.group(1)) - 4.7931) < 0.005 and abs(float(m.group(2)) - 0.27008) < 0.001,
          m.group(0))
r = run([exe["perplexity"], "-m", a, "-f", text, "-c", "64", "--chunks", "2"])
check("perplexity of a make-model file, --chunks", r.returncode == 0 and "[2]" in r.stdout.decode() and "[3]" not in r.stdout.decode(),
      r.stderr.decode()[-300:])
short = os.path.join(tmp, "short.txt")
with open(short, "w") as f:
    f.write("Once upon a time there was a cat.")
fails_with("perplexity: text shorter than one chunk", run([exe["perplexity"], "-m", stories, "-f", short, "-c", "128"]),
           "fewer than one chunk of -c 128")
fails_with("perplexity: missing text", run([exe["perplexity"], "-m", stories, "-f", os.path.join(tmp, "nope.txt")]), "nope.txt")
fails_with("perplexity: -c 2", run([exe["perplexity"], "-m", stories, "-f", text, "-c", "2"]), "-c 2 is too small")
fails_with("perplexity: a directory as the text", run([exe["perplexity"], "-m", stories, "-f", tmp]), "is a directory")

clitest.finish("tools")
