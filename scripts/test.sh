#!/usr/bin/env bash
# Install what is missing, build, run every test, and print one summary line
# "tests: N passed, N failed, N skipped" counted over doctest test cases.
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
bash scripts/deps.sh || exit 1
if [ ! -d build ]; then
  meson setup build --wrap-mode=nodownload || meson setup build || exit 1
fi
meson compile -C build || { echo "tests: 0 passed, 1 failed (build failed)"; exit 1; }
meson test -C build --print-errorlogs --num-processes "${KESTREL_TEST_JOBS:-2}"
status=$?
python3 "$root/scripts/test-summary.py" build/meson-logs/testlog.json
exit $status
