#!/usr/bin/env python3
"""compare_table.py KESTREL.jsonl LLAMA.jsonl: the table of compare_llama.sh.

compare_table.py --batched MODEL THREADS < llama-batched-bench output: its
decode rows (one prompt of PP tokens, then TG tokens) as llama-bench -o jsonl
lines of a tg test at depth PP (avg_ts = S_TG), for compare_llama.sh -d.

Both files hold -o jsonl lines (kestrel-bench's also its probe lines). Per
(model file, test) it averages avg_ts over the rounds of each program and
prints tokens/s, the ratio kestrel / llama.cpp, the bound kestrel-bench
computed for that test and both programs' ratios to it. A tg bound comes from
kestrel-bench's reads of its own weights (weights_gbps); llama-bench reads
its copy of them from the file mapping, so its ratio to that bound is an
approximation.
"""
import json
import os
import sys
from collections import defaultdict


def read(path):
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip().startswith("{")]


def mean(xs):
    return sum(xs) / len(xs) if xs else float("nan")


def batched_lines(model, threads):
    """llama-batched-bench's table rows (| PP | TG | B | N_KV | T_PP s |
    S_PP t/s | T_TG s | S_TG t/s | ...) as llama-bench jsonl lines."""
    for line in sys.stdin:
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) < 8 or not cells[0].isdigit():
            continue
        pp, tg, s_tg = int(cells[0]), int(cells[1]), float(cells[7])
        print(json.dumps({"model_filename": model, "n_threads": int(threads), "n_prompt": 0, "n_gen": tg,
                          "n_depth": pp, "avg_ts": s_tg, "source": "llama-batched-bench"}))


def main():
    if len(sys.argv) == 4 and sys.argv[1] == "--batched":
        return batched_lines(sys.argv[2], sys.argv[3])
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    kestrel, llama = read(sys.argv[1]), read(sys.argv[2])
    bw = [p["gbps"] for p in kestrel if p.get("probe") == "read_bandwidth"]
    peaks = [p for p in kestrel if p.get("probe") == "compute_peak"]
    ts = defaultdict(lambda: {"k": [], "l": [], "bound": [], "type": "", "rss": [], "limit": 0})
    order = []

    def key(r):
        test = f"pp{r['n_prompt']}" if r["n_prompt"] else ""
        if r["n_gen"]:
            test += ("+" if test else "") + f"tg{r['n_gen']}"
        if r.get("n_depth"):
            test += f" @ d{r['n_depth']}"
        return (os.path.basename(r["model_filename"]), test)

    for r in kestrel:
        if "probe" in r:
            continue
        k = key(r)
        if k not in ts:
            order.append(k)
        e = ts[k]
        e["k"].append(r["avg_ts"])
        e["bound"].append(r["bound_ts"])
        e["type"] = r["model_type"]
        e["rss"].append(r["peak_rss_bytes"])
        e["limit"] = r["file_size"] + r["kv_cache_bytes"] + (64 << 20)
    for r in llama:
        k = key(r)
        if k not in ts:
            order.append(k)
        ts[k]["l"].append(r["avg_ts"])

    wr = [r["weights_gbps"] for r in kestrel if "weights_gbps" in r]
    if bw:
        print(f"read bandwidth: {min(bw):.1f} .. {max(bw):.1f} GB/s over {len(bw)} probes (median of 7 each)")
    if wr:
        print(f"weights read (the tg bounds): {min(wr):.1f} .. {max(wr):.1f} GB/s over {len(wr)} tests")
    pk = [r["peak_gops"] for r in kestrel if "peak_gops" in r]
    if pk:
        print(f"compute peak between repetitions (the pp bounds): {min(pk):.0f} .. {max(pk):.0f} GOP/s over {len(pk)} tests")
    if peaks:
        print("int8 peak at the start: %.0f .. %.0f GOP/s, f32 peak: %.0f .. %.0f GFLOP/s" % (
            min(p["int8_gops"] for p in peaks), max(p["int8_gops"] for p in peaks),
            min(p["f32_gflops"] for p in peaks), max(p["f32_gflops"] for p in peaks)))
        amx = [p["amx_int8_gops"] for p in peaks if p.get("amx_int8_gops")]
        if amx:
            print("AMX int8 peak (prefill's tiles; not in the bounds): %.0f .. %.0f GOP/s" % (min(amx), max(amx)))
        bf16 = [p["amx_bf16_gflops"] for p in peaks if p.get("amx_bf16_gflops")]
        if bf16:
            print("AMX bf16 peak (float prompts' tiles; their pp bounds take a third of it): %.0f .. %.0f GFLOP/s" % (
                min(bf16), max(bf16)))
    print()
    print("| file | model | test | kestrel t/s | llama.cpp t/s | kestrel / llama.cpp | bound t/s | kestrel / bound | llama.cpp / bound | kestrel peak RSS MiB (limit) |")
    print("|---|---|---|---:|---:|---:|---:|---:|---:|---:|")
    for k in order:
        e = ts[k]
        kt, lt, b = mean(e["k"]), mean(e["l"]), mean(e["bound"])
        rss = max(e["rss"]) / 2**20 if e["rss"] else float("nan")
        print(f"| {k[0]} | {e['type']} | {k[1]} | {kt:.2f} | {lt:.2f} | {kt / lt:.2f} | {b:.1f} | {kt / b:.2f} | {lt / b:.2f} | {rss:.0f} ({e['limit'] / 2**20:.0f}) |")


if __name__ == "__main__":
    main()
