"""vfio-mmio: BAR load latency of a PCI function lent through Linux VFIO, through the
borrower's mapping against VFIO's own mapping, in the lender host (tests/e2e/lenderhost.py;
a TCG VM with a real kernel's VFIO and IOMMU).  bench/vfio_mmio_inner.py runs inside it.

Both numbers come from build/bench/mmio_latency, the same loads of the same register of the
same QEMU NVMe: once opened through VFIO (`--backend vfio BDF`), once through the borrower's
vfio-user socket as QEMU would map it.  Under TCG a load of an emulated register is an exit
into QEMU's nvme model either way, so the ratio says whether the borrower's path adds
anything to a mapped BAR access (1.0: nothing), not what an NTB costs."""
import json
import sys
from pathlib import Path

import harness as h
from lenderhost import LenderHost

REPO = Path(__file__).resolve().parents[1]


def vfio_mmio(rounds):
    with h.Procs() as procs:
        lh = LenderHost(procs, str(REPO / "bench" / "vfio_mmio_inner.py"), args=[rounds])
        lines = lh.run()
    got = [ln for ln in lines if ln.startswith('{"bench"')]
    if not got:
        raise h.HarnessError("the lender host printed no vfio-mmio line: " +
                             " | ".join(lines[-5:]))
    for ln in got:
        json.loads(ln)              # a broken line is an error, not a number
        sys.stdout.write(ln + "\n")
    sys.stdout.flush()
