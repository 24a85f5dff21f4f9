"""Daemon restarts on `fabric = ntb` leave a lent device's data path running (run from
ntb_inner.py after ntb_lend; the result ntb-daemon-restart in test_ntb.py).

Host a lends its NVMe (vfio-pci) to host b, whose qtest consumer uses it: Identify (the
device's DMA through both hosts' windows), then Identify completed by MSI-X (through a
doorbell route rung in host a's kernel).  Then:

- host a's daemon is killed (SIGKILL, as a crash) and started again on the same state: the
  port kept its session (keep-ms), the new daemon takes it over, adopts the lender worker,
  and host b's daemon hears of it (RESUMED) without a new session.  The consumer's Identify
  by MSI-X passes again, with MSI-X set up as before (no SET_IRQS: the route kept);
- the same with host b's daemon (its borrower worker adopted; the windows onto the
  consumer's RAM and the route to its eventfd kept);
- once both daemons' workers had their time to claim what they hold (the daemons withdraw
  what nobody claimed 30 s after their start), the consumer's Identify by MSI-X passes again:
  everything the data path needs was claimed, nothing was withdrawn;
- then a restart too slow for the keep (restart_slow_*): host a's daemon killed and started
  again only after its port let the session go (keep-ms here 6 s).  Both hosts agree the
  device's data path is gone, and say so: host b reports the lender lost once its link went
  down (the NTB session ended, and the windows and routes with it), without waiting the lease
  timeout, and the device leaves the consumer's use (its BAR reads all ones); host a's
  restarted daemon does not keep the lease, and lists the device free.

Facts are host b's (restart_*), but restart_a_* (host a's).
"""
import time

import harness as h
from control import Control
import ntb_lend
import vfio_inner as vi

PHASES = ("restart-lent", "restart-baseline", "restart-a-back", "restart-b-back",
          "restart-slow", "restart-done")
# The daemons' wait for their workers' claims (VN_HOST_RECONNECT_MS), and a margin.
CLAIM_WAIT_S = 30 + 5
# How long the ports keep a session here (keep-ms): above a restart's time under TCG, short
# enough for the slow restart to outlast it.
KEEP_MS = 6000
SLOW_RESTART_S = KEEP_MS / 1000 + 4
TOOK_OVER = "took over the session"
NEW_SESSION = "the peer started a new session"
WITHDREW = "no longer hold"


def msix_again(q):
    """Identify with MSI-X as it was set up before (no SET_IRQS on the way): the word the
    vector's message stores, and the completion's status."""
    h.qtest_command(q, f"writel {vi.MSI_ADDR:#x} 0")
    status, _ = vi.identify(q)
    word = h.wait_for(lambda: int(h.qtest_command(q, f"readl {vi.MSI_ADDR:#x}")[1], 16), 10)
    return f"{word or 0:#x}", status


def restart(d, what):
    """Kill daemon @d (a crash) and start it again on the same config and state; wait until
    it took its port's session over and adopted @what (a log line's words)."""
    took, adopted = d.log().count(TOOK_OVER), d.log().count(what)
    d.kill()
    d.start()
    if not h.wait_for(lambda: d.log().count(TOOK_OVER) > took and
                      d.log().count(what) > adopted, 60):
        raise h.HarnessError(f"{d.name} did not take its session over and adopt its worker:\n"
                             f"{d.log()[-2000:]}")


def daemon(procs, role, ntb_bdf, **kw):
    return ntb_lend.daemon(procs, role, ntb_bdf, more={"keep-ms": KEEP_MS}, **kw)


def borrower_of(control, device):
    x = [d for d in control.execute("query-devices") if d["device"] == device]
    return x[0].get("borrower") if x else None


def lender(procs, ntb_bdf, barrier, fact):
    a = daemon(procs, "a", ntb_bdf, lends={"nvme0": {"pci": vi.find(vi.NVME_ID)}})
    try:
        barrier("a", "restart-lent")
        barrier("a", "restart-baseline", timeout=300)
        mark = len(a.log())
        restart(a, "adopted lender worker")
        # Its holder claims the lease again (its announcement answers ours).
        h.wait_for(lambda: "claims lease" in a.log()[mark:], 60)
        fact(restart_a_took_over=TOOK_OVER in a.log()[mark:])
        barrier("a", "restart-a-back", timeout=300)
        barrier("a", "restart-b-back", timeout=600)
        fact(restart_a_withdrew=a.log()[mark:].count(WITHDREW),
             restart_a_new_sessions=a.log()[mark:].count(NEW_SESSION))
        barrier("a", "restart-slow", timeout=300)
        slow = len(a.log())
        a.kill()
        time.sleep(SLOW_RESTART_S)
        a.start()
        fact(restart_a_slow_took_over=TOOK_OVER in a.log()[slow:])
        fact(restart_a_slow_freed=bool(h.wait_for(
            lambda: borrower_of(Control(a.control), "nvme0") is None, 60)))
        barrier("a", "restart-done", timeout=600)
    finally:
        a.stop()


def borrower(procs, ntb_bdf, barrier, fact):
    b = daemon(procs, "b", ntb_bdf)
    cb = Control(b.control)
    barrier("b", "restart-lent")
    try:
        vi.wait_listed(cb, "hosta/nvme0", 120)
        r = cb.execute("attach", device="hosta/nvme0", domain="vm0")
        q = vi.qtest_qemu(procs, r["socket"], ram_size=ntb_lend.RAM_SIZE)
        try:
            vi.consumer_view(q)
            word, status = vi.msix_identify(q)
            fact(restart_before=f"{word:#x}/{status}")
            mark = len(b.log())
            barrier("b", "restart-baseline")
            barrier("b", "restart-a-back", timeout=300)
            h.wait_for(lambda: "daemon restarted and took our session over" in b.log()[mark:],
                       30)
            fact(restart_b_heard=("daemon restarted and took our session over"
                                  in b.log()[mark:]))
            fact(restart_after_a="/".join(map(str, msix_again(q))))
            restart(b, "adopted worker")
            t_b = time.monotonic()
            fact(restart_b_took_over=True)
            fact(restart_after_b="/".join(map(str, msix_again(q))))
            barrier("b", "restart-b-back")
            # Both daemons' workers had their time to claim what they hold.
            time.sleep(max(0.0, CLAIM_WAIT_S - (time.monotonic() - t_b)))
            fact(restart_after_claims="/".join(map(str, msix_again(q))))
            bor = b.stats()["borrowed"][0]
            fact(restart_forwarded=bor["region_forwarded"], restart_relayed=bor["relayed_irqs"],
                 restart_b_withdrew=b.log()[mark:].count(WITHDREW),
                 restart_b_new_sessions=b.log()[mark:].count(NEW_SESSION))
            slow_restart(b, q, barrier, fact)
        finally:
            procs.stop(q)
    finally:
        barrier("b", "restart-done", timeout=600)
        b.stop()


def slow_restart(b, q, barrier, fact):
    """Host a's daemon away longer than its port keeps the session: host b hears of the
    session's end with the link's down, and the device is lost at once, not after the lease
    timeout (ntb_lend's 20 s)."""
    barrier("b", "restart-slow")
    t0 = time.monotonic()

    def lost():
        return bool(b.stats()["borrowed"][0].get("lender_lost"))
    gone = h.wait_for(lost, 60)
    fact(restart_slow_lost=bool(gone),
         restart_slow_lost_s=round(time.monotonic() - t0, 1) if gone else "none",
         restart_slow_said="the NTB session with its lender hosta ended" in b.log())
    csts = int(h.qtest_command(q, f"readl {vi.BAR + 0x1c:#x}")[1], 16)
    fact(restart_slow_bar=f"{csts:#x}")


def run(role, ntb_bdf, barrier, fact):
    """Both hosts' part (see the top)."""
    ntb_lend.run_phase(role, (lender, borrower), ntb_bdf, barrier, fact, PHASES,
                       "restart_error")
