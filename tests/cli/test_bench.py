#!/usr/bin/env python3
"""kestrel-bench as a llama-bench user runs it.

usage: test_bench.py BUILD_DIR

The tests llama-bench runs (pp, tg, pp+tg with -pg) in each output form
(md, csv, json, jsonl) with llama-bench's field names, and bad input (a
malformed -pg, an unknown -o, an impossible -r, a missing or truncated
model file) exiting 1 with a message that names the problem. Fixtures come
from $KESTREL_FIXTURES or ../shared/fixtures; without them the test skips
(exit 77), or fails in CI.
"""
import csv
import io
import json
import os
import subprocess
import sys

import clitest
from clitest import check, fails_with

build = sys.argv[1]
bench = os.path.join(build, "bench", "kestrel-bench")
stories = os.path.join(clitest.fixtures_dir(), "gguf", "stories260K.gguf")
clitest.require(stories)


def run(*args):
    return subprocess.run([bench, *args], capture_output=True, timeout=300)


# One thread, two repetitions of small tests: pp8, tg4 and pp8+tg4.
tests = ["-m", stories, "-t", "1", "-p", "8", "-n", "4", "-pg", "8,4", "-r", "2"]
want = [(8, 0), (0, 4), (8, 4)]  # (n_prompt, n_gen) in the order they run

# llama-bench's fields (the ones kestrel-bench has), then kestrel's.
llama_fields = ["build_commit", "model_filename", "model_type", "model_size", "model_n_params", "n_batch",
                "n_ubatch", "n_threads",
                "n_prompt", "n_gen", "test_time", "avg_ns", "stddev_ns", "avg_ts", "stddev_ts", "type_k", "type_v",
                "use_mmap"]

r = run(*tests, "-o", "jsonl")
out = r.stdout.decode()
check("jsonl runs", r.returncode == 0, r.stderr.decode()[-400:])
lines = [json.loads(line) for line in out.splitlines() if line.strip()]
rows = [x for x in lines if "probe" not in x]
probes = [x["probe"] for x in lines if "probe" in x]
check("jsonl: the read bandwidth and compute probes, then one object per test",
      probes == ["read_bandwidth", "compute_peak"] and [(x["n_prompt"], x["n_gen"]) for x in rows] == want,
      out[-600:])
check("jsonl: llama-bench's field names", all(all(f in x for f in llama_fields) for x in rows),
      str([sorted(set(llama_fields) - set(x)) for x in rows]))
check("jsonl: 2 samples each, tokens/s = (n_prompt + n_gen) / time",
      all(len(x["samples_ns"]) == 2 and len(x["samples_ts"]) == 2 and x["avg_ts"] > 0
          and all(abs(ts - 1e9 * (x["n_prompt"] + x["n_gen"]) / ns) <= 1e-6 * ts
                  for ns, ts in zip(x["samples_ns"], x["samples_ts"])) for x in rows), out[-600:])
check("jsonl: bounds; the weights' read rate for the tests that decode",
      all(x["bound_ts"] > 0 and ("weights_gbps" in x) == (x["n_gen"] > 0) for x in rows), out[-600:])

r = run(*tests, "-o", "json")
try:
    doc = json.loads(r.stdout.decode())
except ValueError as e:
    doc = None
    check("json parses", False, f"{e}: {r.stdout.decode()[-400:]!r}")
if doc is not None:
    check("json: one array, the probes then the tests",
          r.returncode == 0 and isinstance(doc, list)
          and [(x["n_prompt"], x["n_gen"]) for x in doc if "probe" not in x] == want, r.stdout.decode()[-400:])

r = run(*tests, "-o", "csv")
table = list(csv.DictReader(io.StringIO(r.stdout.decode())))
check("csv: a header and one row per test, llama-bench's columns",
      r.returncode == 0 and [(int(x["n_prompt"]), int(x["n_gen"])) for x in table] == want
      and all(f in table[0] for f in llama_fields), r.stdout.decode()[-600:])
check("csv: fields as in json (the model's path quoted, tokens/s a number)",
      all(x["model_filename"] == stories and float(x["avg_ts"]) > 0 for x in table), r.stdout.decode()[-400:])

r = run(*tests)
out = r.stdout.decode()
check("md: a table with pp8, tg4 and pp8+tg4",
      r.returncode == 0 and "| pp8 |" in out and "| tg4 |" in out and "| pp8+tg4 |" in out, out[-600:])

# -b / -ub: a test per size; the prompt goes in calls of min(b, ub) tokens.
r = run("-m", stories, "-t", "1", "-p", "8", "-n", "0", "-ub", "3,512", "-r", "1", "-o", "jsonl")
rows = [json.loads(line) for line in r.stdout.decode().splitlines() if line.strip() and "probe" not in line]
check("-ub 3,512: a pp8 test for each, n_batch 2048", r.returncode == 0 and
      [(x["n_prompt"], x["n_ubatch"], x["n_batch"]) for x in rows] == [(8, 3, 2048), (8, 512, 2048)], r.stdout.decode()[-400:])
r = run("-m", stories, "-t", "1", "-p", "8", "-n", "0", "-b", "4", "-r", "1")
check("-b 4: the md table names the test's passes", r.returncode == 0 and "| pp8 ub4 |" in r.stdout.decode(),
      r.stdout.decode()[-300:])

# Bad input: exit 1, an error naming the problem, no crash.
fails_with("-ub above the model's pass", run("-m", stories, "-ub", "1024"), "-ub 1024", "512")
fails_with("-b 0", run("-m", stories, "-b", "0"), "-b values must be >= 1")
fails_with("-pg with one number", run("-m", stories, "-pg", "8"), "-pg takes two numbers")
fails_with("-pg with a zero", run("-m", stories, "-pg", "8,0"), "-pg values must be >= 1")
fails_with("-pg not numbers", run("-m", stories, "-pg", "a,4"), "-pg", "'a' is not a valid number")
fails_with("-o unknown", run("-m", stories, "-o", "xml"), "-o must be md, csv, json or jsonl", "xml")
fails_with("-r 0", run("-m", stories, "-r", "0"), "-r must be >= 1")
fails_with("no model", run("-p", "8"), "no model given")
tmp = clitest.scratch("kestrel-bench-")
fails_with("missing model file", run("-m", os.path.join(tmp, "nope.gguf")), "nope.gguf", "no such file")
truncated = os.path.join(tmp, "truncated.gguf")
with open(stories, "rb") as f, open(truncated, "wb") as g:
    g.write(f.read()[: 100_000])
fails_with("truncated model file", run("-m", truncated, "-t", "1", "-p", "8", "-n", "0", "-r", "1"), "truncated.gguf")
fails_with("a directory as the model", run("-m", tmp), "is a directory")
fails_with("-t past the pool's limit", run("-m", stories, "-t", "5000"), "-t 5000 exceeds 1024 threads")
fails_with("-mmp 2", run("-m", stories, "-mmp", "2"), "-mmp must be 0 or 1")

clitest.finish("kestrel-bench")
