"""Runs inside each of the two NTB hosts of test_ntb_bar.py: a BAR larger than any window lent
over `fabric = ntb` (vfio-large-bar-ntb).  Prints `FACT key=value` lines.

The simulated NTB has three windows each way here (ntb_hw_epf's j721e map): window 0 of
4 MiB carries the messages, windows 1 and 2 of 512 MiB carry segments.  Host a lends its
ivshmem-plain function, whose BAR2 is 1 GiB of memory (lenderhost.GPU_MEM, a file of the
share); host b's borrower asks for windows of 512 MiB, so the lender cuts the BAR into two
segments, and host b's daemon maps each through a window of its own and joins the two into
one file (the module's VN_NTB_MW_SPAN_FD), which a qtest QEMU of host b's maps as the
consumer's BAR2.  Then:

- the consumer writes a mark at the start of each 16 MiB slice and in the last 8 bytes of the
  BAR, and reads them all back;
- host a finds each mark in the device's memory (the backing file), at its place;
- host a writes a mark of its own at the end of each window's half of the BAR, which the
  consumer reads;
- host b mapped the BAR through two windows, one fd; no access was forwarded by the borrower
  or served by the lender's backend; the accesses went through host b's windows and reached
  the device peer to peer in host a (the simulated NTB's counters, asked of the outside).
"""
import os
import subprocess
import sys
import time
from pathlib import Path

import harness as h
from control import Control, ControlError
import ntb_inner
import ntb_lend
import vfio_gpu
import vfio_inner as vi

SHARE = Path("/tmp/share")
BAR_SIZE = vfio_gpu.BAR_SIZE
WINDOW = 512 << 20                  # the simulated NTB's segment windows (test_ntb_bar.py)
SLICE = vfio_gpu.SLICE
RAM_SIZE = 64 << 20                 # the consumer's, through one of host a's windows
PHASES = ("lent", "written", "checked", "lender-marks", "read", "returned")


def mark(k):
    return b"VNBAR%03d" % k


def lender(procs, bdf, fact):
    gpu = vi.find(vfio_gpu.IVSHMEM_ID)
    vi.bind_vfio(gpu)
    a = ntb_lend.daemon(procs, "a", bdf, lends={"gpu0": {"pci": gpu}})
    wrong, last = [], None
    try:
        ntb_inner.barrier("a", "lent")
        ntb_inner.barrier("a", "written", timeout=600)
        with open(vfio_gpu.GPU_MEM, "r+b", buffering=0) as f:
            for k in range(BAR_SIZE // SLICE):
                if os.pread(f.fileno(), 8, k * SLICE) != mark(k):
                    wrong.append(k)
            last = os.pread(f.fileno(), 8, BAR_SIZE - 8)
            fact(bar_lender_slices_wrong=len(wrong), bar_lender_last=last == b"VNBARend")
            for w in range(BAR_SIZE // WINDOW):
                os.pwrite(f.fileno(), b"LENDER%02d" % w, (w + 1) * WINDOW - 16)
        lent = a.stats()["lent"][0]
        fact(bar_lender_served=lent["region_rw"] - lent["config_rw"])
        ntb_inner.barrier("a", "lender-marks")
        ntb_inner.barrier("a", "returned", timeout=600)
    finally:
        if wrong or not last == b"VNBARend":
            print(a.log()[-4000:], file=sys.stderr, flush=True)     # for a person
        a.stop()


def borrower(procs, bdf, fact):
    b = ntb_lend.daemon(procs, "b", bdf)
    cb = Control(b.control)
    ntb_inner.barrier("b", "lent")
    try:
        borrow(procs, b, cb, fact)
    except (h.HarnessError, ControlError, KeyError, OSError) as e:
        # What the daemon said about it (its worker's log lines are its own).
        fact(error=f"{type(e).__name__}:{str(e)[:200]}")
        print(b.log()[-3000:], file=sys.stderr, flush=True)
        raise
    finally:
        b.stop()


ALL_ONES = "0x" + "ff" * 8


def read8(q, addr, rereads):
    """8 bytes of the consumer's at @addr.  All ones is read again (at most twice, counted in
    @rereads): what a peer-to-peer read gives when the simulated NTB's peer, a busy TCG QEMU,
    does not answer in time (ntbsim's p2p_unanswered; a hardware NTB has no such peer).  Any
    other wrong value is returned as read."""
    got = h.qtest_command(q, f"read {addr:#x} 8")[1]
    for _ in range(2):
        if got != ALL_ONES:
            break
        rereads.append(addr)
        got = h.qtest_command(q, f"read {addr:#x} 8")[1]
    return got


def borrow(procs, b, cb, fact):
    """Host b's part, its daemon running (see the top)."""
    rereads = []
    fact(bar_listed=bool(vi.wait_listed(cb, "hosta/gpu0", 120)))
    r = cb.execute("attach", device="hosta/gpu0", domain="vm-gpu")
    q = vi.qtest_qemu(procs, r["socket"], ram_size=RAM_SIZE)
    try:
        before = ntb_lend.ntbsim_counters("bar-before")
        vfio_gpu.place_bar2(q)
        fact(bar_windows_in_use=b.stats()["fabric"]["windows_in_use"])
        t0 = time.monotonic()
        for k in range(BAR_SIZE // SLICE):
            h.qtest_command(q, f"write {vfio_gpu.BAR2 + k * SLICE:#x} 8 0x{mark(k).hex()}")
        h.qtest_command(q, f"write {vfio_gpu.BAR2 + BAR_SIZE - 8:#x} 8 "
                           f"0x{b'VNBARend'.hex()}")
        wrong = [k for k in range(BAR_SIZE // SLICE)
                 if read8(q, vfio_gpu.BAR2 + k * SLICE, rereads) != "0x" + mark(k).hex()]
        fact(bar_consumer_slices_wrong=len(wrong), bar_rw_s=round(time.monotonic() - t0, 1))
        ntb_inner.barrier("b", "written")
        ntb_inner.barrier("b", "lender-marks", timeout=600)
        back = [read8(q, vfio_gpu.BAR2 + (w + 1) * WINDOW - 16, rereads)
                for w in range(BAR_SIZE // WINDOW)]
        fact(bar_lender_marks_read=sum(back[w] == "0x" + (b"LENDER%02d" % w).hex()
                                       for w in range(len(back))))
        after = ntb_lend.ntbsim_counters("bar-after")
        if before is not None and after is not None:
            fact(bar_window_accesses=(after["window_reads"] + after["window_writes"]) -
                 (before["window_reads"] + before["window_writes"]),
                 bar_p2p=(after["p2p_reads"] + after["p2p_writes"]) -
                 (before["p2p_reads"] + before["p2p_writes"]),
                 bar_p2p_failed=after["p2p_failures"] - before["p2p_failures"],
                 bar_p2p_unanswered=after["p2p_unanswered"] - before["p2p_unanswered"])
        fact(bar_forwarded=b.stats()["borrowed"][0]["region_forwarded"],
             bar_rereads=len(rereads))
    finally:
        procs.stop(q)
    cb.execute("detach", device="hosta/gpu0")
    cb.execute("return", device="hosta/gpu0")
    fact(bar_returned=True)
    ntb_inner.barrier("b", "returned")


def main():
    args = ntb_inner.arguments()
    role, mods = args.role, args.modules
    with h.Procs() as procs:
        try:
            bdf = ntb_inner.find_ntb()
            ntb_inner.setup(mods, bdf)
            subprocess.run(["insmod", str(mods / "vfio_ntb.ko")], check=True)
            ntb_inner.wait_path(f"/dev/vfio-ntb/{bdf}")
            (lender if role == "a" else borrower)(procs, bdf, ntb_inner.fact)
        except (OSError, RuntimeError, TimeoutError, KeyError, h.HarnessError, ControlError,
                subprocess.SubprocessError) as e:
            ntb_inner.fact(error=f"{type(e).__name__}:{str(e)[:200]}")
            for name in PHASES:             # the other host is not left waiting
                (SHARE / f"sync-{name}-{role}").write_text(str(time.time()))
            return 1
    ntb_inner.fact(done=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
