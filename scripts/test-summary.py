#!/usr/bin/env python3
"""Sums doctest's per-executable counts from Meson's testlog.json files into
one line "tests: N passed, N failed, N skipped". A test without doctest's
summary (the CLI script; or a crash, a timeout) counts as one test."""
import json
import re
import sys

passed = failed = skipped = 0
pattern = re.compile(r"\[doctest\] test cases:\s*(\d+) \|\s*(\d+) passed \|\s*(\d+) failed \|\s*(\d+) skipped")
for path in sys.argv[1:]:
    with open(path) as log:
        for line in log:
            entry = json.loads(line)
            result = entry.get("result")
            found = pattern.findall(entry.get("stdout", "") or "")
            if found:
                _, p, f, s = map(int, found[-1])
                passed, failed, skipped = passed + p, failed + f, skipped + s
                if result not in ("OK", "SKIP", "EXPECTEDFAIL") and f == 0:
                    failed += 1  # failed outside any test case
            elif result == "SKIP":
                skipped += 1
            elif result == "OK":
                passed += 1
            else:
                failed += 1
print(f"tests: {passed} passed, {failed} failed, {skipped} skipped")
