#!/usr/bin/env bash
# Install what is missing, build, run every test, and print one summary line
# "tests: N passed, N failed, N skipped" counted over doctest test cases.
#
# Two builds: build/ with -march=native (what our binaries use), and
# build-baseline/ at the compiler's default ISA for the suites whose code
# depends on it (kernels and the model), since the library must work there too.
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
bash scripts/deps.sh || exit 1
setup() {  # DIR OPTIONS...
  [ -d "$1" ] && return 0
  meson setup "$@" --wrap-mode=nodownload || meson setup "$@"
}
setup build || { echo "tests: 0 passed, 1 failed (meson setup failed)"; exit 1; }
meson compile -C build || { echo "tests: 0 passed, 1 failed (build failed)"; exit 1; }
meson test -C build --print-errorlogs --num-processes "${KESTREL_TEST_JOBS:-2}"
status=$?
logs=(build/meson-logs/testlog.json)
baseline_suites=(core cpu quant kv model engine)
if [ "${KESTREL_SKIP_BASELINE:-0}" != 1 ]; then
  setup build-baseline -Dnative=false -Dexamples=false -Dbench=false || { echo "tests: 0 passed, 1 failed (baseline setup failed)"; exit 1; }
  meson compile -C build-baseline "${baseline_suites[@]/#/test_}" || { echo "tests: 0 passed, 1 failed (baseline build failed)"; exit 1; }
  meson test -C build-baseline --no-rebuild --print-errorlogs --num-processes "${KESTREL_TEST_JOBS:-2}" "${baseline_suites[@]}" || status=1
  logs+=(build-baseline/meson-logs/testlog.json)
fi
python3 "$root/scripts/test-summary.py" "${logs[@]}"
exit $status
