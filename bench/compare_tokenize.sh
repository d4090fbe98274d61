#!/usr/bin/env bash
# Side by side: kestrel-tokenize against llama.cpp's llama-tokenize on the
# same vocabulary files and text, alternating runs in one script (this
# machine is noisy: read the ratio of medians). Checks the ids are identical.
# Prints one JSON line per vocabulary.
#
#   bench/compare_tokenize.sh LLAMA_TOKENIZE TEXT_FILE VOCAB.gguf [VOCAB.gguf ...]
#
# llama.cpp is not part of kestrel: build it yourself (e.g. under /tmp) and
# pass the path of its llama-tokenize. Both programs run with --ids and no
# escape processing; the times include loading the vocabulary and printing.
set -euo pipefail
[ $# -ge 3 ] || { sed -n 2,11p "$0"; exit 1; }
llama=$1; text=$2; shift 2
root=$(cd "$(dirname "$0")/.." && pwd)
kestrel=${KESTREL_TOKENIZE:-$root/build/examples/kestrel-tokenize}
repeats=${REPEATS:-5}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
now() { date +%s.%N; }
for vocab in "$@"; do
  kt=() lt=()
  for _ in $(seq "$repeats"); do
    t0=$(now); "$llama" -m "$vocab" -f "$text" --ids --log-disable --no-parse-special --no-escape > "$tmp/l" 2>/dev/null; t1=$(now)
    "$kestrel" -m "$vocab" -f "$text" --ids --no-parse-special > "$tmp/k"; t2=$(now)
    lt+=("$(echo "$t1 - $t0" | bc)") kt+=("$(echo "$t2 - $t1" | bc)")
  done
  same=false; cmp -s "$tmp/l" "$tmp/k" && same=true
  median() { printf '%s\n' "$@" | sort -g | awk '{a[NR]=$1} END {print (NR%2 ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2)}'; }
  ml=$(median "${lt[@]}"); mk=$(median "${kt[@]}")
  printf '{"bench":"tokenize_vs_llama_cpp","vocab":"%s","text_bytes":%d,"identical_ids":%s,"llama_cpp_s":%s,"kestrel_s":%s,"speedup":%.2f}\n' \
    "$(basename "$vocab")" "$(wc -c < "$text")" "$same" "$ml" "$mk" "$(echo "$ml / $mk" | bc -l)"
done
