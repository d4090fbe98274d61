#!/usr/bin/env bash
# Quick start: install what is missing, build, and chat with stories260K.
# Extra arguments go to kestrel-chat (e.g. -n 200 --temp 0.8).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
bash scripts/deps.sh
[ -d build ] || meson setup build --wrap-mode=nodownload >/dev/null 2>&1 || meson setup build
meson compile -C build kestrel-chat >/dev/null
model=$(bash scripts/get-model.sh)
exec ./build/examples/kestrel-chat -m "$model" "$@"
