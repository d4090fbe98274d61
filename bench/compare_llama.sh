#!/usr/bin/env bash
# compare_llama.sh: kestrel-bench against llama.cpp's llama-bench on the same
# GGUF files, in one run: per file, the two programs alternate (kestrel,
# llama.cpp, kestrel, llama.cpp, ... for --rounds rounds) with the same flags
# and -o jsonl; then a table of tokens/s for both, the ratio kestrel /
# llama.cpp and both programs' ratios to the bound kestrel-bench measured
# (its weights' read bandwidth for tg, int8 or f32 peak for pp). This machine is noisy:
# only ratios measured within one run mean anything. With -d DEPTH and a
# llama-bench without --n-depth (before mid-2025), llama.cpp's decode at that
# depth comes from llama-batched-bench instead (its S_TG: n_gen tokens after a
# DEPTH-token prompt, -r times per round; found beside llama-bench or given by
# --llama-batched-bench), and only the tg test is compared (pass -p 0).
#
#   bench/compare_llama.sh MODEL... [--llama-bench PATH] [--kestrel-bench PATH]
#                          [--llama-batched-bench PATH]
#                          [-t 2] [-r 3] [-p 512] [-n 128] [-pg P,N]... [-d DEPTH] [--rounds 2] [--out DIR]
#
# -pg P,N (repeatable) adds llama-bench's pp+tg test to both programs' runs.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
llama_bench=/tmp/llama.cpp/build/bin/llama-bench
kestrel_bench="" batched_bench=""
threads=2 reps=3 n_prompt=512 n_gen=128 depth="" rounds=2 out=""
models=() pg=()
while [ $# -gt 0 ]; do
  case "$1" in
    --llama-bench) llama_bench=$2; shift 2 ;;
    --kestrel-bench) kestrel_bench=$2; shift 2 ;;
    --llama-batched-bench) batched_bench=$2; shift 2 ;;
    -t) threads=$2; shift 2 ;;
    -r) reps=$2; shift 2 ;;
    -p) n_prompt=$2; shift 2 ;;
    -n) n_gen=$2; shift 2 ;;
    -pg) pg+=(-pg "$2"); shift 2 ;;
    -d) depth=$2; shift 2 ;;
    --rounds) rounds=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    -h|--help) sed -n 2,18p "$0"; exit 0 ;;
    -*) echo "error: unknown option $1" >&2; exit 1 ;;
    *) models+=("$1"); shift ;;
  esac
done
[ ${#models[@]} -gt 0 ] || { echo "usage: $0 MODEL... [--llama-bench PATH] [-t 2] [-r 3]" >&2; exit 1; }
if [ -z "$kestrel_bench" ]; then
  for b in "$here/../build-bench/bench/kestrel-bench" "$here/../build/bench/kestrel-bench"; do
    [ -x "$b" ] && { kestrel_bench=$b; break; }
  done
fi
[ -x "$kestrel_bench" ] || { echo "error: kestrel-bench not found (build it, or pass --kestrel-bench PATH)" >&2; exit 1; }
[ -x "$llama_bench" ] || { echo "error: llama-bench not found at $llama_bench (pass --llama-bench PATH)" >&2; exit 1; }
[ -n "$out" ] || out=$(mktemp -d /tmp/compare_llama.XXXXXX)
mkdir -p "$out"
: > "$out/kestrel.jsonl"
: > "$out/llama.jsonl"

flags=(-t "$threads" -p "$n_prompt" -n "$n_gen" -r "$reps" -o jsonl)
[ -z "$depth" ] || flags+=(-d "$depth")
[ ${#pg[@]} -eq 0 ] || flags+=("${pg[@]}")
use_batched=""
if [ -n "$depth" ] && ! "$llama_bench" --help 2>&1 | grep -q -- "--n-depth"; then
  [ -n "$batched_bench" ] || batched_bench=$(dirname "$llama_bench")/llama-batched-bench
  [ -x "$batched_bench" ] || { echo "error: $llama_bench has no --n-depth and llama-batched-bench is not at $batched_bench (pass --llama-batched-bench PATH)" >&2; exit 1; }
  [ "$n_prompt" = 0 ] && [ ${#pg[@]} -eq 0 ] || { echo "error: with llama-batched-bench only decode at depth is compared: pass -p 0 and no -pg" >&2; exit 1; }
  use_batched=1
fi
# llama.cpp's run of one file, as -o jsonl lines on stdout.
run_llama() {
  if [ -z "$use_batched" ]; then
    "$llama_bench" -m "$1" "${flags[@]}" 2> "$out/llama.stderr"
    return
  fi
  for ((r = 1; r <= reps; ++r)); do
    "$batched_bench" -m "$1" -c $((depth + n_gen + 16)) -b 2048 -ub 512 -npp "$depth" -ntg "$n_gen" -npl 1 \
      -t "$threads" 2> "$out/llama.stderr" | python3 "$here/compare_table.py" --batched "$1" "$threads"
  done
}
echo "# $(date -u +%FT%TZ) load: $(cut -d' ' -f1-3 /proc/loadavg); results in $out" >&2
for m in "${models[@]}"; do
  for ((i = 1; i <= rounds; i++)); do
    echo "# $m round $i/$rounds: kestrel-bench" >&2
    "$kestrel_bench" -m "$m" "${flags[@]}" >> "$out/kestrel.jsonl"
    echo "# $m round $i/$rounds: llama-bench" >&2
    run_llama "$m" >> "$out/llama.jsonl"
  done
done
echo "# done $(date -u +%FT%TZ) load: $(cut -d' ' -f1-3 /proc/loadavg)" >&2
python3 "$here/compare_table.py" "$out/kestrel.jsonl" "$out/llama.jsonl"
