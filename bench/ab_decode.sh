#!/usr/bin/env bash
# ab_decode.sh: decode speed of two or more revisions of kestrel in one
# process, alternated round by round (bench/ab_decode.cpp), for changes
# worth a few percent on a noisy machine where separate runs of
# kestrel-bench differ by 10-20%. Each REV (a git revision, or "." for the
# working tree) is built from its own include/ into a shared object of
# bench/ab_decode_model.cpp; the driver loads them all, and each decodes
# --ctx tokens from an empty cache per round for --seconds in all. Prints
# one JSON line per revision: the median token time, and the median and
# quartiles over rounds of its round median over the first revision's.
# With --prefill N, each round each build prefills N random tokens from an
# empty cache in one call instead, timed as a whole (prefill changes).
# --placement file|huge_pages|automatic places every build's weights so
# (cpu_backend's weight_placement; default automatic, which decides per
# build at load time and so may place builds loaded one after another
# differently). Each build copies the weights into its own memory except
# with `file`, where all builds read the same page-cache pages. With
# models of several GB, where that memory lies shows as much as a kernel
# change: TinyLlama f32 (4.4 GB a copy) with huge_pages, one build listed
# four times as A B A B, read 1.00 / 0.98 / 1.015 / 1.074 (the last copy
# slowest); with file, HEAD listed first and last read 1.000 / 0.997. So
# for large models compare with --placement file, and list a build twice
# (first and last) to see the spread. --placement file on a file that lies
# on a tmpfs mounted huge=always compares in 2 MiB pages, the same for all
# builds (bench/README.md).
#
#   bench/ab_decode.sh MODEL REV REV... [--seconds 60] [--ctx 64] [--prefill N] [-t 2] [--placement P] [--work DIR]
#
# Built with the C++ compiler in $CXX (default c++), -O3 -march=native, and
# Eigen from pkg-config (or /usr/include/eigen3). Nothing is installed.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/.." && pwd)
seconds=60 ctx=64 threads=2 work="" mode=()
args=()
while [ $# -gt 0 ]; do
  case "$1" in
    --seconds) seconds=$2; shift 2 ;;
    --ctx) ctx=$2; shift 2 ;;
    --prefill) ctx=$2 mode=(--prefill); shift 2 ;;
    -t) threads=$2; shift 2 ;;
    --placement)
      case "$2" in
        file|huge_pages|automatic) export AB_PLACEMENT=$2 ;;
        *) echo "error: --placement takes file, huge_pages or automatic, not '$2'" >&2; exit 1 ;;
      esac
      shift 2 ;;
    --work) work=$2; shift 2 ;;
    -h|--help) sed -n 2,30p "$0"; exit 0 ;;
    -*) echo "error: unknown option $1" >&2; exit 1 ;;
    *) args+=("$1"); shift ;;
  esac
done
if [ ${#args[@]} -lt 3 ]; then
  echo "error: give a model file and at least two revisions (see --help)" >&2
  exit 1
fi
model=${args[0]}
revs=("${args[@]:1}")
[ -f "$model" ] || { echo "error: no model file $model" >&2; exit 1; }
if [ -z "$work" ]; then
  work=$(mktemp -d "${TMPDIR:-/tmp}/ab_decode.XXXXXX")
  trap 'rm -rf "$work"' EXIT
fi
mkdir -p "$work"
cxx=${CXX:-c++}
eigen=$(pkg-config --cflags eigen3 2>/dev/null || echo -isystem/usr/include/eigen3)
flags=(-std=c++20 -O3 -march=native -DNDEBUG -D_FILE_OFFSET_BITS=64 -pthread -Wno-maybe-uninitialized)

libs=() pids=()
for i in "${!revs[@]}"; do
  rev=${revs[$i]} src="$work/src$i"
  rm -rf "$src" && mkdir -p "$src"
  if [ "$rev" = . ]; then
    cp -r "$root/include" "$src/"
  else
    git -C "$root" rev-parse --verify -q "$rev^{commit}" >/dev/null || { echo "error: no revision $rev" >&2; exit 1; }
    git -C "$root" archive "$rev" include | tar x -C "$src"
  fi
  lib="$work/$i-$(echo "$rev" | tr -c 'A-Za-z0-9._\n-' _).so"
  echo "# building $rev" >&2
  # shellcheck disable=SC2086
  "$cxx" "${flags[@]}" $eigen -shared -fPIC -fvisibility=hidden -I"$src/include" "$here/ab_decode_model.cpp" -o "$lib" &
  libs+=("$lib") pids+=($!)
done
"$cxx" -std=c++20 -O2 "$here/ab_decode.cpp" -o "$work/ab_decode" -ldl &
pids+=($!)
for p in "${pids[@]}"; do wait "$p" || { echo "error: a build failed" >&2; exit 1; }; done
echo "# $model: ${revs[*]}, ${seconds} s, $ctx tokens per round${mode:+ (prefill)}, $threads threads" >&2
"$work/ab_decode" "$model" "$seconds" "$ctx" "$threads" "${mode[@]}" "${libs[@]}"
