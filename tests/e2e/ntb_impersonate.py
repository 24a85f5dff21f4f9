"""A host that takes the name of one that is down, on the two NTB hosts of test_ntb.py (run
from ntb_inner.py after ntb_lend.run), both daemons with the link's key ([fabric] key-file):

- host a lends its NVMe; host b's daemon borrows it (a lease, no worker) and is killed
  (SIGKILL): the lease is orphaned, its holder down;
- on host b, a config whose port does not name its node is refused by
  `vfio-ntbd --check-config` (exit 2, saying PORT=NODE);
- on host b's NTB port, a daemon that names itself hostb without the link's key (a key of
  its own) is refused by host a at each session: host a says so in its log, lists hostb
  down, and the lease stays hostb's; the impostor never sees hosta up;
- the impostor goes, the real hostb comes back (its state dir, the key): the link is up
  again, it still holds the lease, and returns it: host a lists the device free.

Facts: imp_* (host a's: imp_refused_logged, imp_holder_during, imp_hostb_up_during,
imp_free_after; host b's the rest).
"""
import subprocess
import time
from pathlib import Path

import harness as h
from cluster import VFIO_NTBD
from control import Control, ControlError
import ntb_lend
import vfio_inner as vi

SHARE = Path("/tmp/share")
WRONG_KEY = "ee" * 32
REFUSED = "refused the host that says it is hostb"


def _borrower_of(control, device):
    x = [d for d in control.execute("query-devices") if d["device"] == device]
    return x[0].get("borrower") if x else None


def _link(control, node):
    x = [n for n in control.execute("query-nodes") if n.get("node") == node]
    return x[0].get("link") if x else None


def lender(procs, bdf, barrier, fact):
    nvme = vi.find(vi.NVME_ID)
    a = ntb_lend.daemon(procs, "a", bdf, lends={"nvme0": {"pci": nvme}},
                        lease_timeout_ms=600000)
    ca = Control(a.control)
    try:
        barrier("a", "imp-lent")
        barrier("a", "imp-impostor-up", timeout=300)
        fact(imp_refused_logged=h.wait_for(lambda: REFUSED in a.log(), 30))
        # Sessions the impostor asks for keep coming; none makes it hostb.
        time.sleep(3)
        fact(imp_holder_during=_borrower_of(ca, "hosta/nvme0") or "-",
             imp_hostb_up_during=_link(ca, "hostb") == "up")
        barrier("a", "imp-checked", timeout=300)
        barrier("a", "imp-returned", timeout=300)
        fact(imp_free_after=h.wait_for(lambda: _borrower_of(ca, "hosta/nvme0") is None, 20))
    finally:
        a.stop()
    barrier("a", "imp-done", timeout=300)


def unnamed_port_refused(procs, bdf):
    """`--check-config` on a port that does not name its node: (exit code, its words)."""
    d = procs.tempdir("vn-imp-conf-")
    conf = d / "unnamed.conf"
    conf.write_text(f"[node]\nname = hostb\nfabric = ntb\nrun-dir = {d}/run\n"
                    f"[fabric]\nports = /dev/vfio-ntb/{bdf}\n")
    r = subprocess.run([str(VFIO_NTBD), "--check-config", "--config", str(conf)],
                       capture_output=True, text=True, timeout=30)
    return r.returncode, r.stderr


def borrower(procs, bdf, barrier, fact):
    b = ntb_lend.daemon(procs, "b", bdf, lease_timeout_ms=600000)
    cb = Control(b.control)
    barrier("b", "imp-lent")
    fact(imp_listed=bool(vi.wait_listed(cb, "hosta/nvme0", 120)))
    cb.execute("borrow", device="hosta/nvme0")
    fact(imp_borrowed=_borrower_of(cb, "hosta/nvme0") == "hostb")
    cb.close()
    b.kill()
    rc, words = unnamed_port_refused(procs, bdf)
    fact(imp_unnamed_rc=rc, imp_unnamed_said=("PORT=NODE" in words))
    impostor = ntb_lend.daemon(procs, "b", bdf, lease_timeout_ms=600000, key=WRONG_KEY)
    try:
        barrier("b", "imp-impostor-up")
        ci = Control(impostor.control)
        up = h.wait_for(lambda: _link(ci, "hosta") == "up", 10)
        ci.close()
        fact(imp_impostor_up=bool(up))
        barrier("b", "imp-checked", timeout=300)
    finally:
        impostor.stop()
    b.start()
    cb = Control(b.control)         # the old connection went with the killed daemon
    try:
        fact(imp_back_up=bool(h.wait_for(lambda: _link(cb, "hosta") == "up", 60)),
             imp_back_holds=_borrower_of(cb, "hosta/nvme0") == "hostb")
        try:
            cb.execute("return", device="hosta/nvme0")
            fact(imp_returned=True)
        except ControlError as e:
            fact(imp_returned=f"no:{str(e)[:80]}")
        barrier("b", "imp-returned")
    finally:
        b.stop()
    barrier("b", "imp-done", timeout=300)


PHASES = ("imp-lent", "imp-impostor-up", "imp-checked", "imp-returned", "imp-done")


def run(role, bdf, barrier, fact):
    """This host's part; a failure is a fact, and the other host is not left waiting (the
    phases after this one go on)."""
    ntb_lend.run_phase(role, (lender, borrower), bdf, barrier, fact, PHASES, "imp_error")
