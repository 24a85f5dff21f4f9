"""Lending a physical PCI function through Linux VFIO, on a real kernel's VFIO and IOMMU: the
lender host (lenderhost.py) runs both daemons and a qtest consumer (vfio_inner.py says what
each result checks).  Its RESULT lines are this file's."""
import os
import shutil
import sys

import harness as h
from lenderhost import DISPLAY, E1000, GPU_MEM, IGB, IVSHMEM, NVME, SHARED_GROUP, LenderHost

EXPECTED_RESULTS = 18
# The nested guest (TCG in TCG) and the 1 GiB BAR written and read through qtest take most of
# it; tests/run-checks reads this.
TIMEOUT_S = 3000
NAMES = ("vfio-managed", "vfio-lend-qtest", "vfio-rom", "vfio-lender-restart", "vfio-msix",
         "vfio-bar-mapped", "vfio-lender-unprivileged", "vfio-dma-identify", "vfio-iommu-isolation", "vfio-nvme-guest",
         "vfio-device-request", "vfio-sriov-two-hosts", "vfio-lend-refusals", "vfio-large-bar",
         "vfio-device-removed", "vfio-gpu-display", "vfio-intx", "vfio-lender-worker-crash")
# What the lender host's display showed of the lent GPU (vfio_gpu.py), kept for a person.
ARTIFACT = "vfio-gpu-display.png"


def main():
    with h.Procs() as procs:
        h.testbed_guest()           # the nested guest's image, built here (the host is read-only)
        # VN_VFIO_ONLY=guest,intx runs only those groups of checks (vfio_inner.GROUPS): a
        # developer's shortcut; the results it leaves out are reported as not run.
        only = os.environ.get("VN_VFIO_ONLY", "")
        lh = LenderHost(procs, "vfio_inner.py", args=("--only", only) if only else (),
                        devices=(NVME, *SHARED_GROUP, IGB, IVSHMEM, DISPLAY, E1000),
                        objects=(GPU_MEM,), timeout=2700)
        try:
            lines = lh.run()
        except (h.HarnessError, OSError, TimeoutError) as e:
            print(f"lender host: {e}", file=sys.stderr)
            for name in NAMES:
                h.result(name, False, error=str(e).splitlines()[0][:120] if str(e) else "-")
            return 1
        if (lh.share / ARTIFACT).exists():
            (h.REPO / "build" / "artifacts").mkdir(parents=True, exist_ok=True)
            shutil.copy(lh.share / ARTIFACT, h.REPO / "build" / "artifacts" / ARTIFACT)
        seen = set()
        ok = True
        for ln in lines:
            if ln.startswith("RESULT "):
                print(ln, flush=True)
                seen.add(ln.split()[1])
                ok &= ln.split()[2] == "PASS"
            elif ln.strip():
                print(f"  [lender host] {ln}", file=sys.stderr)
        for name in NAMES:
            if name in seen:
                continue
            if only:
                print(f"  {name}: not run (VN_VFIO_ONLY={only})", file=sys.stderr)
            else:
                ok = h.result(name, False, error="the lender host did not report it")
        print(f"  [lender host] {lh.seconds:.1f} s", file=sys.stderr)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
