#!/usr/bin/python3
"""A BAR larger than any window, lent over an NTB: the two TCG VMs of test_ntb.py (Linux's
ntb_hw_epf on vfio-ntb-ntbsim, our module, vfio-ntbd with `fabric = ntb`), but with three
windows each way (ntb_hw_epf's j721e map: 4 MiB for the messages, two of 512 MiB for
segments).  Host a lends an ivshmem-plain function whose BAR2 is 1 GiB of memory (a file of
the share, as vfio-large-bar's); host b's borrower maps it through two windows joined into
one file for its consumer, a qtest QEMU (ntb_bar_inner.py says what each host does).

- vfio-large-bar-ntb: host b used two windows for the BAR; every mark the consumer wrote
  (one per 16 MiB slice and the BAR's last 8 bytes, through both windows) reads back in
  the consumer (a read the simulated NTB's busy peer QEMU left unanswered, all ones, read
  again) and lies at its place in the device's memory as host a reads it; the marks
  host a wrote at the end of each window's half read right in the consumer; no BAR access
  was forwarded by the borrower or served by the lender's backend, and the simulated NTB
  carried them through host b's windows peer to peer into host a's device, none failing.
  Every access through a simulated window is trapped, so the consumer touches marks, not
  all of the BAR (vfio-large-bar, over shm, writes and reads all of it).
"""
import os
import shutil
import signal
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import harness as h  # noqa: E402
from lenderhost import GPU_MEM, IVSHMEM, LenderHost  # noqa: E402
from test_ntb import device, hosts_facts, serve_stats_requests, start_ntbsim  # noqa: E402

EXPECTED_RESULTS = 1
# Two TCG VMs at once; tests/run-checks reads this.
TIMEOUT_S = 900
# Window 0 carries the message ring (fabric/ntb.c: 512 KiB and its header); 1 and 2 a half of
# the BAR each (ntb_bar_inner.WINDOW).
WINDOW_MIB = "4,512,512"
SLICES = 64


def main():
    with h.Procs() as procs:
        try:
            mods = h._script_output("build-ntb-modules")
        except Exception as e:          # noqa: BLE001 (any failure is this test's)
            return h.failed("vfio-large-bar-ntb", e)
        share = procs.tempdir("vn-ntb-bar-share-")
        run = procs.tempdir("vn-ntbsim-bar-")
        stats = run / "stats.json"
        sim = start_ntbsim(procs, run, 3, WINDOW_MIB)
        if sim is None:
            return h.result("vfio-large-bar-ntb", False, error="ntbsim did not listen")
        hosts = {r: LenderHost(procs, "ntb_bar_inner.py", args=("--modules", mods),
                               devices=(IVSHMEM,) if r == "a" else (),
                               objects=(GPU_MEM,) if r == "a" else (),
                               share=share, role=r, raw_devices=[device(run / f"p{i}")],
                               memfd=True, mem_mib=1024, timeout=TIMEOUT_S - 60)
                 for i, r in enumerate("ab")}
        for lh in hosts.values():
            lh.start()
        while all(lh.proc.poll() is None for lh in hosts.values()):
            serve_stats_requests(share, sim, stats)
            time.sleep(0.1)
        seen = hosts_facts(hosts)
        os.kill(sim.pid, signal.SIGUSR1)
        h.wait_for(stats.exists, 5)
        procs.stop(sim)
        logs = h.REPO / "build" / "artifacts" / "ntb-bar-logs"
        logs.mkdir(parents=True, exist_ok=True)
        for f in [run / "ntbsim.log", stats, *share.glob("inner-*.log")]:
            if f.exists():
                shutil.copy(f, logs / f.name)
    a, b = seen["a"], seen["b"]
    n = int
    ok = (b.get("bar_windows_in_use") == "2" and b.get("bar_consumer_slices_wrong") == "0" and
          a.get("bar_lender_slices_wrong") == "0" and a.get("bar_lender_last") == "True" and
          b.get("bar_lender_marks_read") == "2" and b.get("bar_forwarded") == "0" and
          a.get("bar_lender_served") == "0" and
          n(b.get("bar_window_accesses", 0)) >= 2 * SLICES and
          n(b.get("bar_p2p", 0)) >= 2 * SLICES and b.get("bar_p2p_failed") == "0" and
          # A read the busy peer QEMU left unanswered is read again (ntb_bar_inner.read8).
          n(b.get("bar_rereads", 0)) <= n(b.get("bar_p2p_unanswered", 0)) and
          b.get("bar_returned") == "True" and a.get("done") == "True" and
          b.get("done") == "True")
    return h.result("vfio-large-bar-ntb", ok,
                    bar_mib=1024, windows=WINDOW_MIB, windows_in_use=b.get("bar_windows_in_use"),
                    slices_wrong_consumer=b.get("bar_consumer_slices_wrong"),
                    slices_wrong_lender=a.get("bar_lender_slices_wrong"),
                    last_mark=a.get("bar_lender_last"),
                    lender_marks_read=b.get("bar_lender_marks_read"),
                    forwarded=b.get("bar_forwarded"), lender_served=a.get("bar_lender_served"),
                    window_accesses=b.get("bar_window_accesses"), p2p=b.get("bar_p2p"),
                    p2p_failed=b.get("bar_p2p_failed"),
                    p2p_unanswered=b.get("bar_p2p_unanswered"), rereads=b.get("bar_rereads"),
                    rw_s=b.get("bar_rw_s"),
                    error=f"{a.get('error', '-')}|{b.get('error', '-')}")


if __name__ == "__main__":
    sys.exit(0 if main() else 1)
