#!/usr/bin/env bash
# compare_placement.sh: kestrel-bench's model build (load ms) and decode under
# the weight placements (model/backend.hpp), alternated per file: automatic
# (the default), huge_pages (-mmp 0) and file (-mmp 1), each run waiting
# --wait seconds first, so that the memory the previous run freed has gone
# back to the system as it would between two starts of a program. Prints a
# line per run: placement, load ms, MiB copied, t/s, bound ratio, peak RSS
# against file + KV + 64 MiB; the JSON lines are kept in --out.
#
#   bench/compare_placement.sh MODEL... [--kestrel-bench PATH] [-t 2] [-n 64] [-r 3]
#                              [--rounds 3] [--wait 8] [--placements "auto 0 1"] [--out DIR]
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
kestrel_bench="" threads=2 n_gen=64 reps=3 rounds=3 wait=8 placements="auto 0 1" out=""
models=()
while [ $# -gt 0 ]; do
  case "$1" in
    --kestrel-bench) kestrel_bench=$2; shift 2 ;;
    -t) threads=$2; shift 2 ;;
    -n) n_gen=$2; shift 2 ;;
    -r) reps=$2; shift 2 ;;
    --rounds) rounds=$2; shift 2 ;;
    --wait) wait=$2; shift 2 ;;
    --placements) placements=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    -h|--help) sed -n 2,11p "$0"; exit 0 ;;
    -*) echo "error: unknown option $1" >&2; exit 1 ;;
    *) models+=("$1"); shift ;;
  esac
done
[ ${#models[@]} -gt 0 ] || { echo "usage: $0 MODEL... [-t 2] [-n 64] [-r 3] [--rounds 3]" >&2; exit 1; }
if [ -z "$kestrel_bench" ]; then
  for b in "$here/../build-bench/bench/kestrel-bench" "$here/../build/bench/kestrel-bench"; do
    [ -x "$b" ] && { kestrel_bench=$b; break; }
  done
fi
[ -x "$kestrel_bench" ] || { echo "error: kestrel-bench not found (build it, or pass --kestrel-bench PATH)" >&2; exit 1; }
for p in $placements; do
  case "$p" in auto|0|1) ;; *) echo "error: --placements takes auto, 0 and 1, got '$p'" >&2; exit 1 ;; esac
done
[ -n "$out" ] || out=$(mktemp -d /tmp/compare_placement.XXXXXX)
mkdir -p "$out"
: > "$out/kestrel.jsonl"
echo "# $(date -u +%FT%TZ) load: $(cut -d' ' -f1-3 /proc/loadavg); results in $out" >&2
for ((r = 1; r <= rounds; r++)); do
  for m in "${models[@]}"; do
    for p in $placements; do
      sleep "$wait"
      flags=(-m "$m" -t "$threads" -p 0 -n "$n_gen" -r "$reps" -o jsonl)
      [ "$p" = auto ] || flags+=(-mmp "$p")
      "$kestrel_bench" "${flags[@]}" | grep '"avg_ts"' | tee -a "$out/kestrel.jsonl" | python3 -c '
import json, sys
for line in sys.stdin:
    d = json.loads(line)
    limit = (d["file_size"] + d["kv_cache_bytes"]) / 2**20 + 64
    print("round %s %s %s: load %d ms, %d MiB copied, tg%d %.2f t/s, bound ratio %.3f, peak RSS %d MiB (limit %d)" % (
        sys.argv[1], d["model_filename"].rsplit("/", 1)[-1], d["weight_placement"], d["load_ns"] / 1e6,
        d["weights_copied_bytes"] >> 20, d["n_gen"], d["avg_ts"], d["bound_ratio"], d["peak_rss_bytes"] >> 20, limit),
        flush=True)' "$r"
    done
  done
done
