"""A lender worker killed under its holder, in the lender host (run from vfio_inner.py, with
its helpers).

- vfio-lender-worker-crash: the NVMe is lent through VFIO (`pci = ...`) to a qtest consumer
  that passes Identify.  The lender worker is killed (SIGKILL): both hosts say the device is
  lost (DEVICE_SERVER_LOST; the device's state went with the worker's VFIO fds); the lender's
  daemon then holds none of the dead worker's VFIO device fds, starts another worker
  (DEVICE_SERVER_BACK), and once the consumer let go and the device was returned, another
  host borrows it at once and its consumer passes Identify again.  (A qtest consumer has no
  guest to take a device out, so it is not presented anew here: test_deaths.py shows that
  with a guest.)
"""
import time

import harness as h
from cluster import Daemon
from control import Control
from test_deaths import fds_of, kill_lender_worker
import vfio_inner as vi

VFIO_DEVICE = "anon_inode:[vfio-device]"    # what /proc shows of a VFIO device fd


def group_free_s(bdf, after):
    """Seconds until the function's VFIO group is free (the lender's daemon lets go of a
    returned lease's VFIO device fd, which holds the group, once it has read the worker's
    unexports: an attach at once may find the group busy, docs/lending.md "Limits"); the
    holders named when it stays held 10 s @after something."""
    t0 = time.monotonic()
    if not h.wait_for(lambda: vi.group_free(bdf), 10):
        raise h.HarnessError(f"the VFIO group of {bdf} stays held after {after} by "
                             f"{' '.join(vi.group_holders(bdf)) or 'nobody known'}")
    return time.monotonic() - t0


def test_worker_crash(procs, wd, fab, bdf):
    free_after_s = group_free_s(bdf, "the earlier groups")
    a, b, cb = vi.lend_pair(procs, wd, fab, "hostw", "hostx", bdf, lease_timeout_ms=60000)
    c = Daemon(procs, wd, "hosty", fab).start()
    cc = Control(c.control)
    vi.wait_listed(cc, "hostw/nvme0")
    r = cb.execute("attach", device="hostw/nvme0", domain="vm-w")
    q = vi.qtest_qemu(procs, r["socket"])
    vi.consumer_view(q)             # its BAR placed, memory and bus mastering on
    before = vi.identify(q)
    held = fds_of(a.proc.pid, VFIO_DEVICE)
    old, lost_a, lost_b, ev_a, ev_b = kill_lender_worker(a, b, 10)
    none_held = h.wait_for(lambda: fds_of(a.proc.pid, VFIO_DEVICE) == 0, 5)
    back = ev_a.wait_event("DEVICE_SERVER_BACK", 20)["data"]
    new = a.workers()
    # The consumer lets go (its QEMU held the device's VFIO fd for the BAR mapping: the
    # one-machine fabric's), the device is returned, and lent to another host at once.
    procs.stop(q)
    cb.execute("detach", device="hostw/nvme0")
    cb.execute("return", device="hostw/nvme0")
    second_free_s = group_free_s(bdf, "the return")
    r2 = cc.execute("attach", device="hostw/nvme0", domain="vm-y")
    q2 = vi.qtest_qemu(procs, r2["socket"])
    vi.consumer_view(q2)
    try:
        after = vi.identify(q2)
    except h.HarnessError as e:
        after = (-1, str(e))
    procs.stop(q2)
    cc.execute("detach", device="hostw/nvme0")
    cc.execute("return", device="hostw/nvme0")
    for x in (ev_a, ev_b, cb, cc):
        x.close()
    for d in (c, b, a):
        d.stop()
    return h.result("vfio-lender-worker-crash",
                    before == (0, vi.SERIAL) and lost_a.get("node") == "hostx"
                    and lost_b.get("node") == "hostw" and held >= 1 and bool(none_held)
                    and back.get("device") == "hostw/nvme0" and len(new) == 1 and new != old
                    and after == (0, vi.SERIAL),
                    group_free_after_s=f"{free_after_s:.1f}",
                    group_free_after_return_s=f"{second_free_s:.2f}",
                    identify_before=before[0], daemon_vfio_fds=f"{held}->0:{bool(none_held)}",
                    workers=f"{old}->{new}", second_holder_identify=after[0])
