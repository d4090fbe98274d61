#!/usr/bin/env python3
"""Sums doctest's per-executable counts from Meson's testlog.json into one
line "tests: N passed, N failed, N skipped". An executable that ended
without doctest's summary (a crash, a timeout) counts as one failure."""
import json
import re
import sys

passed = failed = skipped = 0
pattern = re.compile(r"\[doctest\] test cases:\s*(\d+) \|\s*(\d+) passed \|\s*(\d+) failed \|\s*(\d+) skipped")
with open(sys.argv[1]) as log:
    for line in log:
        entry = json.loads(line)
        found = pattern.findall(entry.get("stdout", "") or "")
        if found:
            _, p, f, s = map(int, found[-1])
            passed, failed, skipped = passed + p, failed + f, skipped + s
            if entry.get("result") not in ("OK", "SKIP", "EXPECTEDFAIL") and f == 0:
                failed += 1  # failed outside a test case
        elif entry.get("result") == "SKIP":
            skipped += 1
        else:
            failed += 1 if entry.get("result") != "OK" else 0
            passed += 1 if entry.get("result") == "OK" else 0
print(f"tests: {passed} passed, {failed} failed, {skipped} skipped")
