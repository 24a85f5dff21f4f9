"""Runs inside the lender host (bench/vfio_bench.py), as root: one vfio-mmio line.

Rounds alternate ABBA: A is the NVMe mapped through VFIO by mmio_latency itself (the group
must be free: nobody lends it then), B is the same function lent by hosta (`pci = ...`),
attached on hostb, and mapped through hostb's vfio-user socket, then detached again."""
import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests" / "e2e"))
import harness as h  # noqa: E402
from cluster import Daemon  # noqa: E402
from control import Control  # noqa: E402
from vfio_inner import NVME_ID, bind_vfio, find, group_free  # noqa: E402

TOOL = REPO / "build" / "bench" / "mmio_latency"
SAMPLES = 300


def measure(backend, where):
    out = subprocess.run([str(TOOL), "--backend", backend, str(where), str(SAMPLES)],
                         capture_output=True, text=True, timeout=300)
    if out.returncode != 0:
        raise h.HarnessError(f"mmio_latency {backend}: {out.stderr.strip()[-200:]}")
    return json.loads(out.stdout)["p50_ns"]


def main():
    rounds = max(2, int(sys.argv[1]) + int(sys.argv[1]) % 2) if len(sys.argv) > 1 else 2
    res = {"direct": [], "borrower": []}
    try:
        with h.Procs() as procs:
            bdf = find(NVME_ID)
            bind_vfio(bdf)
            wd = procs.tempdir()
            fab = procs.tempdir("vn-fabric-")
            Daemon(procs, wd, "hosta", fab, lends={"nvme0": {"pci": bdf}}).start()
            b = Daemon(procs, wd, "hostb", fab).start()
            cb = Control(b.control)
            h.wait_for(lambda: any(x["device"] == "hosta/nvme0"
                                   for x in cb.execute("query-devices")), 10)

            def borrower():
                r = cb.execute("attach", device="hosta/nvme0", domain="bench")
                try:
                    return measure("vfio-user", r["socket"])
                finally:
                    cb.execute("detach", device="hosta/nvme0")
                    cb.execute("return", device="hosta/nvme0")

            def direct():
                if not h.wait_for(lambda: group_free(bdf), 15):
                    raise h.HarnessError(f"the lender did not let {bdf}'s group go")
                return measure("vfio", bdf)

            for i in range(rounds):
                order = [("direct", direct), ("borrower", borrower)]
                for kind, fn in (order if i % 2 == 0 else order[::-1]):
                    res[kind].append(fn())
    except (h.HarnessError, OSError, subprocess.TimeoutExpired, KeyError, ValueError) as e:
        print(json.dumps({"bench": "vfio-mmio", "error": str(e)[:300]}), flush=True)
        return 1
    ratios = [b / d for b, d in zip(res["borrower"], res["direct"])]
    print(json.dumps({"bench": "vfio-mmio", "order": "ABBA", "rounds": rounds,
                      "samples": SAMPLES,
                      "borrower_p50_ns": round(sorted(res["borrower"])[rounds // 2], 1),
                      "direct_p50_ns": round(sorted(res["direct"])[rounds // 2], 1),
                      "ratio": round(sorted(ratios)[len(ratios) // 2], 3),
                      "borrower_rounds_ns": res["borrower"], "direct_rounds_ns": res["direct"],
                      "spread": round(max(ratios) / min(ratios), 3),
                      "spread_is": "max/min of per-round borrower/direct ratios"}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
