"""What the command-line tests share: where the fixtures are, the skip or
failure when they are missing, and the checks' bookkeeping.

    import clitest
    fixtures = clitest.fixtures_dir()
    clitest.require(os.path.join(fixtures, "gguf", "stories260K.gguf"))  # skip (77), or fail in CI
    clitest.check("name", ok, detail)
    clitest.fails_with("name", completed_process, "needle", ...)  # exit 1, "error:" and the needles on stderr
    tmp = clitest.scratch("kestrel-tools-")  # a folder removed at exit
    clitest.finish("what")  # the summary line and the exit status
"""
import atexit
import os
import shutil
import sys
import tempfile

failures = 0
checks = 0


def fixtures_dir():
    """$KESTREL_FIXTURES, or ../shared/fixtures beside the checkout."""
    here = os.path.dirname(os.path.abspath(__file__))
    return os.environ.get("KESTREL_FIXTURES") or os.path.join(here, "..", "..", "..", "shared", "fixtures")


def scratch(prefix):
    """A fresh folder under $TMPDIR, removed with its files when the test
    exits (unless KESTREL_KEEP_SCRATCH is set, to look at what it wrote)."""
    path = tempfile.mkdtemp(prefix=prefix)
    if not os.environ.get("KESTREL_KEEP_SCRATCH"):
        atexit.register(shutil.rmtree, path, True)
    return path


def require(path):
    """Without the fixture file: exit 77 (skipped), or fail when CI=true."""
    if os.path.exists(path):
        return
    msg = f"fixtures not found at {fixtures_dir()} (set KESTREL_FIXTURES)"
    if os.environ.get("CI") == "true":
        print("FAIL:", msg)
        sys.exit(1)
    print("SKIPPED:", msg)
    sys.exit(77)


def check(name, ok, detail=""):
    global failures, checks
    checks += 1
    print(("ok   " if ok else "FAIL ") + name + ("" if ok else "\n     " + detail))
    if not ok:
        failures += 1


def fails_with(name, r, *needles):
    """r exited 1 with "error:" and every needle on stderr."""
    err = r.stderr.decode(errors="replace")
    ok = r.returncode == 1 and all(n in err for n in needles) and "error:" in err
    check(name, ok, f"rc={r.returncode} stderr={err[-400:]!r}")


def finish(what=""):
    print(f"{checks - failures} of {checks} {what + ' ' if what else ''}checks passed")
    sys.exit(1 if failures else 0)
