"""The p2p bench (bench/run-bench): device-to-device DMA between two borrowed devices
(docs/p2p.md), the cluster of tests/e2e/test_p2p.py (A lends the disk, C an NVMe whose CMB the
guest uses as p2pmem, B borrows both into one VM behind one switch).

One VM; its p2p check in bench mode (tests/guest/vn-p2p.c -B) reads VN_BENCH_P2P_MIB MiB
(default 48) from the disk into the CMB and the same into guest RAM, round after round in ABBA
order (VN_BENCH_ROUNDS rounds, made even): ratio = the median of the rounds' p2p/RAM throughput
ratios.  cpu_s_per_gib: utime + stime of vfio-ntb's own processes (the three vfio-ntbd, their
borrower and lender workers; the simdevs, stand-ins for hardware, apart) between the guest's
"VNEVENT p2p-bench-start" and "p2p-bench-end", per GiB moved (both kinds of reads): goal 0.
Under TCG a CMB read is a trapped-free memcpy by the simulated device into the other device's
memory, so the ratio says whether the path adds anything, not what an NTB costs.
"""
import json
import os
import re
import statistics

import harness as h
import test_p2p
from cluster_bench import cpu_s, our_pids

ROUNDS = int(os.environ.get("VN_BENCH_ROUNDS", "3"))
AB_ROUNDS = max(2, ROUNDS + ROUNDS % 2)
MIB = int(os.environ.get("VN_BENCH_P2P_MIB", "48"))
GIB = float(1 << 30)
ROUND = re.compile(r"bench: round \d+ \w+ p2p ([\d.]+) MB/s ram ([\d.]+) MB/s")


def _kv(text):
    return dict(w.split("=", 1) for w in text.split() if "=" in w)


def run():
    with h.Procs() as procs:
        wd, _disk, _sds, (a, b, c) = test_p2p.cluster(procs, "vm1")
        q = test_p2p.guest(procs, wd, b, "p2p", {"p2p_expect": "bench", "p2p_rounds": AB_ROUNDS,
                                                 "p2p_bench_mib": MIB, "p2p_size": 1 << 20})
        q.wait_line("VNEVENT", "p2p-bench-start")
        pids = [d.proc.pid for d in (a, b, c)] + our_pids(wd, "vfio-ntb-borrower") + \
            our_pids(wd, "vfio-ntb-lender")
        c0 = sum(cpu_s(p) for p in pids)
        end = q.wait_line("VNEVENT", "p2p-bench-end")
        c1 = sum(cpu_s(p) for p in pids)
        run_ = q.wait_done()
        q.stop()
        r = run_.results.get("p2p", {})
        if r.get("status") != "PASS":
            raise h.HarnessError(f"guest p2p bench failed: {r}")
        kv = _kv(end)
        ratios = []
        for _t, ln in run_.info:
            m = ROUND.search(ln)
            if m:
                ratios.append(round(float(m.group(1)) / float(m.group(2)), 3))
        nbytes = int(kv["bytes"])
        print(json.dumps({"bench": "p2p", "ratio": float(kv["ratio"]),
                          "p2p_mb_s": float(kv["p2p_mb_s"]), "ram_mb_s": float(kv["ram_mb_s"]),
                          "rounds": ratios,
                          "spread": round(max(ratios) / min(ratios), 3) if ratios else None,
                          "spread_is": "max/min of the rounds' p2p/ram ratios",
                          "cpu_s_per_gib": round((c1 - c0) / (nbytes / GIB), 4), "goal": 0,
                          "gib_moved": round(nbytes / GIB, 3), "processes": len(pids),
                          "order": "ABBA (A: p2p, B: ram)"}), flush=True)
        return statistics.median(ratios) if ratios else None
