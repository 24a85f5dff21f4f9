"""A real guest driver on a device lent over `fabric = ntb` (run from ntb_inner.py with
--guest-data, by test_ntb_patched.py): host a lends its NVMe (vfio-pci, its IOMMU real) with
vfio-ntbd on the simulated NTB; host b borrows it and boots a guest of its own (the test
guest, TCG inside host b's TCG) with the device as vfio-user-pci.  In the guest, Linux's
unmodified nvme driver probes it and the data check writes, reads back and verifies a
seeded pattern with O_DIRECT.

Around the data phase host b stops the guest (QMP) at each of its two pauses and both hosts
read their counters there, so what they count is the data phase and nothing else:
- host b: BAR accesses its borrower forwarded, config accesses, fabric requests it sent,
  interrupts its worker relayed;
- host a: BAR accesses its lender's backend served (region accesses less config's),
  requests it answered, interrupts its worker relayed, doorbells its daemon rang.

Facts (guest_*) are host b's but for guest_lender_* (host a's).  The regions the guest
wrote (guest_regions, offset,length,md5 separated by `;`) are checked against host a's
disk by test_ntb.py, which holds that file.
"""
import time
from pathlib import Path

import harness as h
from control import Control
import ntb_lend
import vfio_inner as vi

# The guest's RAM: one file, exported through one of host b's windows (test_ntb.py gives
# the patched run windows of this size).
GUEST_MIB = 256
# The guest's RAM is in huge pages, as a host that lends and borrows gives its VMs: host b's
# module pins it behind host b's IOMMU when it exports it, and each IOMMU mapping is one the
# simulated NTB hears of (a message under TCG): 128 of 2 MiB, not 65,536 of 4 KiB (which
# took longer than the fabric's request timeout), and few enough for ntbsim to map the
# window onto them (at most 1024 pieces).
HUGEPAGE_MIB = 2
# How long the guest's QEMU waits for an answer of our borrower's (QEMU's default: 5 s): its
# first DMA_MAP waits for that export.
MSG_TIMEOUT_MS = 60000
# How long the guest's data check writes (MiB) and its pauses last when nobody stops it.
DATA_MIB = 4
PAUSE_S = 5
PHASES = ("guest-lent", "guest-before", "guest-before-counted", "guest-after",
          "guest-after-counted", "guest-done", "guest-stopped")


def lender_counters(a):
    """What host a's software did for the lent device until now."""
    s = a.stats()
    lent = s["lent"][0]
    return {"forwarded": lent["region_rw"] - lent["config_rw"], "config": lent["config_rw"],
            "requests": lent["requests"], "relayed": lent["relayed_irqs"],
            "doorbells": s["fabric"]["doorbells_sent"]}


def borrower_counters(b):
    """What host b's software did for the borrowed device until now."""
    bor = b.stats()["borrowed"][0]
    return {"forwarded": bor["region_forwarded"], "config": bor["config_forwarded"],
            "requests": bor["fabric_requests"], "relayed": bor["relayed_irqs"],
            "messages": bor["vfio_user"]["messages"]}


def delta(before, after):
    return {k: after[k] - before[k] for k in after}


def lender(procs, bdf, barrier, fact):
    nvme = vi.find(vi.NVME_ID)
    if vi.driver_of(nvme) != "vfio-pci":        # run alone (ntb_inner.py --guest-only)
        h.wait_for(lambda: vi.driver_of(nvme) != "", 60)
        vi.unbind(nvme)
        vi.bind_vfio(nvme)
    a = ntb_lend.daemon(procs, "a", bdf, lends={"nvme0": {"pci": nvme}})
    try:
        barrier("a", "guest-lent")
        barrier("a", "guest-before", timeout=900)       # host b's guest booted and probed
        before = lender_counters(a)
        barrier("a", "guest-before-counted")
        barrier("a", "guest-after", timeout=600)        # its data check done
        d = delta(before, lender_counters(a))
        barrier("a", "guest-after-counted")
        fact(**{f"guest_lender_{k}": v for k, v in d.items()})
        barrier("a", "guest-done", timeout=600)
    finally:
        # For a person: what host a's daemon and its lender worker said.
        (ntb_lend.SHARE / "inner-a-guest.log").write_text(a.log()[-30000:])
        a.stop()
    barrier("a", "guest-stopped", timeout=300)


def _counted_pause(q, b, barrier, name):
    """At the guest's next pause: stop it, read host b's counters, let host a read its own,
    and let the guest go on.  Host b's counters then."""
    q.wait_line("VNREADY", "pause")
    q.qmp.execute("stop")
    try:
        counters = borrower_counters(b)
        barrier("b", name)
        barrier("b", f"{name}-counted")
    finally:
        q.qmp.execute("cont")
    return counters


def borrower(procs, bdf, barrier, fact):
    b = ntb_lend.daemon(procs, "b", bdf)
    cb = Control(b.control)
    try:
        barrier("b", "guest-lent")
        if not vi.wait_listed(cb, "hosta/nvme0", 120):
            raise h.HarnessError("hosta/nvme0 was not listed")
        _reserve_hugepages(GUEST_MIB // HUGEPAGE_MIB)
        r = cb.execute("attach", device="hosta/nvme0", domain="vm-ntb-guest")
        q = h.Qemu(procs, "probe,pause,data,pause",
                   [h.VfioUserDevice(r["socket"], props={"x-msg-timeout": MSG_TIMEOUT_MS})],
                   params={"seed": 33, "pause_s": PAUSE_S, "data_mib": DATA_MIB},
                   memory_mib=GUEST_MIB, hugepages=True, workdir=procs.tempdir("vn-ntb-guest-"),
                   timeout=1200).start()
        try:
            t0 = time.monotonic()
            before = _counted_pause(q, b, barrier, "guest-before")
            up_s = time.monotonic() - t0
            t1 = time.monotonic()
            after = _counted_pause(q, b, barrier, "guest-after")
            data_s = time.monotonic() - t1
            run = q.wait_done(timeout=300)
        finally:
            # For a person: what the guest and host b's daemon said (test_ntb.py keeps the
            # share's inner-*.log files).
            (ntb_lend.SHARE / "inner-b-guest.log").write_text(
                q.serial_path.read_text(errors="replace")[-60000:] + q.diagnostics() +
                "\n--- vfio-ntbd\n" + b.log()[-30000:])
            q.stop()
        cb.execute("detach", device="hosta/nvme0")
        cb.execute("return", device="hosta/nvme0")
        d = delta(before, after)
        probe = run.results.get("probe", {})
        data = run.results.get("data", {})
        fact(guest_probe=probe.get("status", "none"), guest_serial=probe.get("serial", "-"),
             guest_data=data.get("status", "none"), guest_up_s=round(up_s, 1),
             guest_data_s=round(data_s, 1),
             guest_regions=";".join(f"{o},{n},{m}" for o, n, m in run.data) or "-",
             **{f"guest_borrower_{k}": v for k, v in d.items()})
    except BaseException:
        ntb_lend.passed("b", PHASES[:-2])     # host a is not left waiting for a failed guest
        raise
    finally:
        barrier("b", "guest-done", timeout=600)
        b.stop()
    barrier("b", "guest-stopped", timeout=300)


def _reserve_hugepages(n):
    """At least @n free 2 MiB pages in this host (its kernel's pool grown to that)."""
    pool = Path("/proc/sys/vm/nr_hugepages")
    pool.write_text(str(int(pool.read_text()) + n))
    free = int(next(ln.split()[1] for ln in Path("/proc/meminfo").read_text().splitlines()
                    if ln.startswith("HugePages_Free:")))
    if free < n:
        raise h.HarnessError(f"only {free} of {n} huge pages free for the guest's RAM")


def run(role, bdf, barrier, fact):
    """Both hosts' part (see the top)."""
    ntb_lend.run_phase(role, (lender, borrower), bdf, barrier, fact, PHASES, "guest_error")
