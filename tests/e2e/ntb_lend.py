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

Then peer_lost(), the last phase: the device lent again, in use by host b's consumer, and
host a's VM killed (by test_ntb.py, when host b asks).  Host b's daemon sees the link go
down (our module's link event), the consumer's BAR reads all ones and its writes are
dropped (the window reaches nothing), the borrower reports the lender lost once the lease
timeout passed, the consumer keeps running, and the device is given back.  Then, with the
daemon stopped, the module on its own: the link reads down, the window all ones, and it
unloads.
"""
import mmap
import os
import subprocess
import time
from pathlib import Path

import harness as h
from cluster import Daemon
from control import Control, ControlError
import vfio_inner as vi

SHARE = Path("/tmp/share")
RAM_SIZE = 64 << 20         # the consumer's: one segment through one window (--window-mib)


def daemon(procs, role, ntb_bdf, lends=None, lease_timeout_ms=20000):
    me, peer = ("hosta", "hostb") if role == "a" else ("hostb", "hosta")
    return Daemon(procs, procs.tempdir(f"vn-lend-{role}-"), me, None, fabric="ntb",
                  fabric_params={"ports": f"/dev/vfio-ntb/{ntb_bdf}={peer}"}, lends=lends,
                  lease_timeout_ms=lease_timeout_ms).start()


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
        fact(lend_listed=bool(vi.wait_listed(cb, "hosta/nvme0", 120)))
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


# The lease timeout of the last phase: how long host b waits for a lender whose link went
# down before calling its device lost.
LOST_LEASE_MS = 3000
CSTS = vi.BAR + 0x1c


def peer_lost(role, ntb_bdf, barrier, fact, kmod):
    """The last phase (see the top); @kmod: ntb_kmod, for the module's own checks."""
    with h.Procs() as procs:
        try:
            if role == "a":
                daemon(procs, "a", ntb_bdf, lends={"nvme0": {"pci": vi.find(vi.NVME_ID)}},
                       lease_timeout_ms=LOST_LEASE_MS)
                barrier("a", "lost-lent")
                time.sleep(600)         # until test_ntb.py kills this VM
                return
            _lost_borrower(procs, ntb_bdf, barrier, fact)
        except (h.HarnessError, ControlError, TimeoutError, KeyError, OSError,
                subprocess.SubprocessError) as e:
            fact(lost_error=f"{type(e).__name__}:{str(e)[:160]}")
            if role == "b":
                (SHARE / "kill-a").write_text("")
                return
    _module_after_loss(ntb_bdf, fact, kmod)


def _lost_borrower(procs, ntb_bdf, barrier, fact):
    b = daemon(procs, "b", ntb_bdf, lease_timeout_ms=LOST_LEASE_MS)
    cb = Control(b.control)
    barrier("b", "lost-lent")
    if not vi.wait_listed(cb, "hosta/nvme0", 120):
        raise h.HarnessError("hosta/nvme0 was not listed")
    r = cb.execute("attach", device="hosta/nvme0", domain="vm0")
    q = vi.qtest_qemu(procs, r["socket"], ram_size=RAM_SIZE)
    vi.consumer_view(q)
    status, _ = vi.identify(q)
    fact(lost_identify_before=status)

    def link_down():
        nodes = cb.execute("query-nodes")
        return any(n.get("node") == "hosta" and n.get("link") != "up" for n in nodes)

    def lost():
        return bool(b.stats()["borrowed"][0].get("lender_lost"))

    # Mid-I/O: the consumer keeps reading the device's CSTS (and writing a register) while
    # host a's VM is killed.
    (SHARE / "kill-a").write_text("")
    marker = SHARE / "killed-a"
    killed = down = ones = gone = None
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and gone is None:
        if killed is None and marker.exists():
            killed = time.monotonic()
        csts = int(h.qtest_command(q, f"readl {CSTS:#x}")[1], 16)
        h.qtest_command(q, f"writel {vi.BAR + 0x24:#x} 0x10001")     # AQA: dropped once lost
        now = time.monotonic()
        if killed is not None:
            if ones is None and csts == 0xffffffff:
                ones = now
            if down is None and link_down():
                down = now
            if gone is None and lost():
                gone = now
        time.sleep(0.05)

    def since(t):
        return round(max(0.0, t - killed), 2) if t is not None and killed is not None \
            else "none"
    bor = b.stats()["borrowed"][0]
    fact(kmod_link_down_s=since(down), lost_all_ones_s=since(ones), lost_reported_s=since(gone),
         lost_stat=bool(bor.get("lender_lost")), lost_consumer_alive=q.poll() is None)
    procs.stop(q)
    try:
        cb.execute("detach", device="hosta/nvme0")
    except ControlError:
        pass                            # the device may be out already (the lender lost)
    cb.execute("return", device="hosta/nvme0")
    fact(lost_returned=not any(x["device"] == "hosta/nvme0" and x.get("attached_to")
                               for x in cb.execute("query-devices")))
    b.stop()


def _module_after_loss(ntb_bdf, fact, kmod):
    """Host b, the daemon gone: the module's own view of the lost peer, then its unload."""
    fd = os.open(f"/dev/vfio-ntb/{ntb_bdf}", os.O_RDWR)
    try:
        down = not kmod.info(fd)[1] & 1
        window = mmap.mmap(fd, 4096, offset=kmod.mw_info(fd, 0)[3])
        ones = window[:8] == b"\xff" * 8
        window.close()
    finally:
        os.close(fd)
    r = subprocess.run(["rmmod", "vfio_ntb"], capture_output=True, text=True)
    fact(kmod_link_down=down, kmod_window_all_ones=ones,
         kmod_unloaded_after_loss=r.returncode == 0)
