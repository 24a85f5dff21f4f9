#!/usr/bin/python3
"""The test runner itself: tests/run-checks must never print "0 failed" when something failed.

Each scene runs the real runner on a made-up unit binary or e2e directory and checks its
closing line and exit code, as CI reads them:
- a libcheck binary whose summary is clean but which exits non-zero (what LeakSanitizer does
  after the summary) is a failure; the same binary exiting 0 is not;
- an e2e file that prints fewer RESULT lines than it declares counts each missing one failed;
- an e2e file that declares nothing, or prints more results than it declares, fails.
"""
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness import result  # noqa: E402

EXPECTED_RESULTS = 5

RUNNER = Path(__file__).resolve().parents[1] / "run-checks"
SUMMARY = "100%: Checks: 3, Failures: 0, Errors: 0"
CLOSING = re.compile(r"^(\d+) passed, (\d+) failed$", re.M)
DECLARE = "EXPECTED_RESULTS"   # spelled apart so the runner does not read this file's copies


def run(args):
    p = subprocess.run([sys.executable, str(RUNNER)] + args, capture_output=True, text=True,
                       timeout=120)
    m = CLOSING.findall(p.stdout)
    passed, failed = map(int, m[-1]) if m else (-1, -1)
    return p.returncode, passed, failed


def fake_unit(d, name, rc):
    path = d / name
    path.write_text(f"#!/bin/sh\necho '{SUMMARY}'\nexit {rc}\n")
    path.chmod(0o755)
    return str(path)


def fake_e2e(d, declared, printed):
    """A directory with one e2e file that prints @printed PASS lines and exits 0."""
    e = Path(tempfile.mkdtemp(dir=d))
    lines = [f"{DECLARE} = {declared}"] if declared is not None else []
    lines += [f"print('RESULT scene{i} PASS')" for i in range(printed)]
    (e / "test_fake.py").write_text("\n".join(lines) + "\n")
    return ["--e2e", "--e2e-dir", str(e)]


def main():
    ok = True
    with tempfile.TemporaryDirectory() as tmp:
        d = Path(tmp)
        rc, p, f = run(["--unit", fake_unit(d, "check_leaky", 23)])
        ok &= result("runner-nonzero-exit-after-summary", rc != 0 and (p, f) == (3, 1),
                     rc=rc, passed=p, failed=f)
        rc, p, f = run(["--unit", fake_unit(d, "check_clean", 0)])
        ok &= result("runner-clean-binary-passes", rc == 0 and (p, f) == (3, 0),
                     rc=rc, passed=p, failed=f)
        rc, p, f = run(fake_e2e(d, 3, 2))
        ok &= result("runner-e2e-shortfall", rc != 0 and (p, f) == (2, 1),
                     rc=rc, passed=p, failed=f)
        rc, p, f = run(fake_e2e(d, None, 2))
        ok &= result("runner-e2e-undeclared", rc != 0 and f >= 1, rc=rc, passed=p, failed=f)
        rc, p, f = run(fake_e2e(d, 1, 2))
        ok &= result("runner-e2e-surplus", rc != 0 and f >= 1, rc=rc, passed=p, failed=f)
    return 0 if ok else 1


if __name__ == "__main__":
    os.environ.pop("FUZZ_SECONDS", None)
    sys.exit(main())
