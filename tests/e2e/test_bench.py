#!/usr/bin/python3
"""`make bench` still runs: the benches that need no guest (and vfio-mmio's lender host, p2p's
one guest), once, as a user would start them.

A bench that breaks (a change elsewhere makes its setup fail) prints an "error" line instead
of numbers and nothing else notices; this runs bench/run-bench for the fast benches and checks
that each prints its line with the fields the issues name.  Never a timing: only that the
numbers are there and positive.
"""
import json
import os
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import harness as h  # noqa: E402
from harness import result  # noqa: E402

# tests/run-checks counts a result this file did not print as failed.
EXPECTED_RESULTS = 4

BENCHES = {
    "forwarded-access": ("p50_ns", "direct_p50_ns", "ratio"),
    "irq-relay": ("relay_p50_ns", "fd_p50_ns"),
    # In the lender host (a TCG VM, about 30 s).
    "vfio-mmio": ("borrower_p50_ns", "direct_p50_ns", "ratio"),
    # One forky guest (about 40 s); its cpu_s_per_gib is 0 when all is well, so not here.
    "p2p": ("ratio", "p2p_mb_s", "ram_mb_s"),
}


def main():
    env = dict(os.environ, VN_BENCH_ONLY=",".join(BENCHES), VN_BENCH_ROUNDS="2",
               VN_BENCH_CROSSING_NS="0")
    p = subprocess.run([sys.executable, str(h.REPO / "bench" / "run-bench")], env=env,
                       capture_output=True, text=True, timeout=600)
    lines = []
    for text in p.stdout.splitlines():
        try:
            lines.append(json.loads(text))
        except json.JSONDecodeError:
            pass
    ok = True
    for name, fields in BENCHES.items():
        got = [o for o in lines if o.get("bench") == name]
        line = got[0] if got else {}
        have = all(isinstance(line.get(f), (int, float)) and line[f] > 0 for f in fields)
        ok &= result(f"bench-{name}-runs", len(got) == 1 and "error" not in line and have,
                     rc=p.returncode, error=str(line.get("error", "-"))[:120].replace(" ", "_"),
                     **{f: line.get(f) for f in fields})
    if not ok:
        print(p.stderr[-3000:], file=sys.stderr)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
