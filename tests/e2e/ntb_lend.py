"""A device lent through the `ntb` fabric backend between the two NTB hosts of test_ntb.py
(run from ntb_inner.py).  Host a (its QEMU NVMe bound to vfio-pci, its IOMMU real) lends it
with vfio-ntbd on `fabric = ntb`; host b borrows it with its own vfio-ntbd on the same NTB,
and a qtest QEMU in host b (no guest CPU) uses it through vfio-user-pci:

- its config space and BAR0's CAP as the device has them (host a read CAP through sysfs
  before lending);
- an NVMe Identify through the admin queue in the consumer's RAM: the device DMAs through
  host a's IOMMU into host a's outbound window, which host b's inbound window translates to
  the consumer's RAM (pinned, behind host b's IOMMU); the serial number is host a's NVMe's;
- an Identify completed by MSI-X vector 0, relayed by the lender as a fabric doorbell;
- every BAR access of the consumer's went through host b's window onto the device's BAR
  (host a's inbound window translated to it, peer to peer through host a's IOMMU): none
  forwarded by the borrower or served by the lender's backend.

Facts are host b's (lend_*), but for lend_cap_sysfs (host a's).
"""
import subprocess
import time
from pathlib import Path

import harness as h
from cluster import Daemon
from control import Control, ControlError
import vfio_inner as vi

SHARE = Path("/tmp/share")
RAM_SIZE = 64 << 20         # the consumer's: one segment through one window (--window-mib)


def daemon(procs, role, ntb_bdf, lends=None):
    me, peer = ("hosta", "hostb") if role == "a" else ("hostb", "hosta")
    return Daemon(procs, procs.tempdir(f"vn-lend-{role}-"), me, None, fabric="ntb",
                  fabric_params={"ports": f"/dev/vfio-ntb/{ntb_bdf}={peer}"}, lends=lends,
                  lease_timeout_ms=20000).start()


def lender(procs, ntb_bdf, barrier, fact):
    nvme = vi.find(vi.NVME_ID)
    # The host's nvme driver probes it at boot (slowly, under TCG); then it is VFIO's.
    h.wait_for(lambda: (Path("/sys/bus/pci/devices") / nvme / "driver").exists(), 60)
    vi.unbind(nvme)
    cap = vi.bar0_cap(nvme)
    vi.bind_vfio(nvme)
    fact(lend_cap_sysfs=f"{cap:#018x}")
    a = daemon(procs, "a", ntb_bdf, lends={"nvme0": {"pci": nvme}})
    try:
        barrier("a", "lend-lent")
        barrier("a", "lend-done", timeout=900)
        lent = a.stats()["lent"]
        fact(lend_lender_region_rw=sum(x["region_rw"] - x["config_rw"] for x in lent))
    finally:
        a.stop()
    barrier("a", "lend-stopped", timeout=300)


def borrower(procs, ntb_bdf, barrier, fact):
    b = daemon(procs, "b", ntb_bdf)
    cb = Control(b.control)
    barrier("b", "lend-lent")
    try:
        listed = h.wait_for(lambda: any(x["device"] == "hosta/nvme0"
                                        for x in cb.execute("query-devices")), 120)
        fact(lend_listed=bool(listed))
        r = cb.execute("attach", device="hosta/nvme0", domain="vm0")
        q = vi.qtest_qemu(procs, r["socket"], ram_size=RAM_SIZE)
        try:
            ident, cap = vi.consumer_view(q)
            fact(lend_config_id=f"{ident:#010x}", lend_cap=f"{cap:#018x}")
            t0 = time.monotonic()
            status, serial = vi.identify(q)
            fact(lend_identify_status=status, lend_serial=serial.replace(" ", "_") or "-",
                 lend_identify_s=round(time.monotonic() - t0, 2))
            word, msi_status = vi.msix_identify(q)
            fact(lend_msix_word=f"{word:#x}", lend_msix_status=msi_status)
            bor = b.stats()["borrowed"][0]
            fact(lend_forwarded=bor["region_forwarded"], lend_relayed=bor["relayed_irqs"],
                 lend_dma_maps=bor["dma_maps"])
        finally:
            procs.stop(q)
        cb.execute("detach", device="hosta/nvme0")
        cb.execute("return", device="hosta/nvme0")
    finally:
        barrier("b", "lend-done", timeout=900)
        b.stop()
    barrier("b", "lend-stopped", timeout=300)


PHASES = ("lend-lent", "lend-done", "lend-stopped")


def run(role, ntb_bdf, barrier, fact):
    """Both hosts' part.  A failure is a fact (lend_error), and this host's remaining
    barriers are passed at once so that the other host is not left waiting for them."""
    with h.Procs() as procs:
        try:
            (lender if role == "a" else borrower)(procs, ntb_bdf, barrier, fact)
        except (h.HarnessError, ControlError, TimeoutError, KeyError, OSError,
                subprocess.SubprocessError) as e:
            fact(lend_error=f"{type(e).__name__}:{str(e)[:160]}")
            for name in PHASES:
                (SHARE / f"sync-{name}-{role}").write_text(str(time.time()))
