#!/usr/bin/python3
"""End-to-end: the processes that carry a lent device die or stall under a guest's I/O.

Node A (vfio-ntbd) lends a vfio-ntb-simdev NVMe; node B borrows it and serves it to a TCG
guest through QEMU's stock vfio-user-pci, attached with the VM's QMP socket.  What an
operator would check:
- device-server-restart: the simdev is killed (SIGKILL) while the guest reads from it:
  DEVICE_SERVER_LOST on both hosts within 6 s, `ntbctl stats` and `show` work and say so;
  a simdev started again on the same socket is presented to the VM as a new device with no
  command typed (device_del + device_add through QMP), and the guest's nvme driver probes it
  and passes a data check whose bytes are in the backing file.
- device-server-long-stall: the simdev is stopped (SIGSTOP) for 150 s while the guest reads
  from it and its config space (which the lender forwards, and which time out): the lender
  takes the wedged server for lost, fences, and once it runs again the VM gets the device
  anew with no command typed; its data check passes, a new VM on the same attachment passes
  its own, and the stall shows in `show` and as warnings.
- lender-worker-crash: A's lender worker is killed (SIGKILL) under the guest's reads: both
  hosts say the device is lost (DEVICE_SERVER_LOST); A starts another worker, whose device is
  presented to the VM anew with no command typed, and its data check passes; A's daemon holds
  none of the dead worker's exports (the device's BAR memfd once, not twice); the device is
  then returned and lent to another host at once, whose VM passes the Identify check.
- adopted-lender-worker-crash: the same for a worker that A's daemon adopted after a restart
  (not its child, so no exit to hear of), killed before it reconnected: its death is seen
  all the same (its port closing, or a look every second), both hosts are told, another
  worker starts and the holder hears that the device is back.
- borrower-worker-crash: B's borrower worker (the vfio-user server QEMU talks to) is killed
  (SIGKILL) while the guest writes, reads back and compares, and reads the device's config
  space (which that worker serves): another worker takes over the same QEMU connection with
  no command typed (WORKER_REPLACED); the guest sees no I/O error, no differing data, no
  kernel message, the same PCI function (nothing was re-plugged); its longest round and
  longest config read are printed (the stall; goal < 1 s); the lender hears nothing; the
  VM then lets go of the device through the new worker (device_del) and a detach works.
- adopted-borrower-worker-crash-relay: the same with relayed interrupts, where the worker
  itself signals the VM's eventfds (kept with its daemon, given to the next worker), and B's
  daemon killed and restarted first under the guest's I/O, so the worker killed is one it
  adopted (not its child) and what it keeps came to the new daemon again.
- borrower-worker-crash-loop: a worker that dies again and again (as one that QEMU's
  requests kill each time would), under a qtest consumer: each of the first 3 deaths in a
  minute is survived (the consumer's next config read, which the worker serves, still reads
  the device's id), the 4th is not: the daemon says why, no worker is left, and the lender
  fences the device.
The simdev offers MSI here: stock QEMU aborts hot-unplugging a vfio-user-pci device with
MSI-X (docs/qemu-patches.md, patch 0002).
"""
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import harness as h  # noqa: E402
from harness import result, wait_for  # noqa: E402
from cluster import Daemon  # noqa: E402
from control import Control  # noqa: E402

# tests/run-checks counts a result this file did not print as failed.
EXPECTED_RESULTS = 7

NTBCTL = Path(os.environ.get("VN_NTBCTL", h.REPO / "build" / "ntbctl"))
SIZE_MIB = 64
SERIAL = "VN-DEATHS-0001"
BAR_MEMFD = "vfio-ntb-simdev-bar0"
SIMDEV_ID = 0x56011DE1                 # its config space's first dword (device, vendor)    # what /proc shows of the simdev's BAR0


def simdev(procs, wd, img):
    return h.Simdev(procs, wd / "dev.sock", img, SIZE_MIB, serial=SERIAL,
                    extra_args=["--interrupts", "msi"]).start()


def hosts(procs, third=False):
    """hosta lends the simdev's nvme0; hostb (and hostc) list it."""
    wd = procs.tempdir()
    fab = procs.tempdir("vn-fabric-")
    img = h.make_backing(wd / "disk.img", SIZE_MIB)
    sd = simdev(procs, wd, img)
    a = Daemon(procs, wd, "hosta", fab, lends={"nvme0": sd.socket_path}).start()
    b = Daemon(procs, wd, "hostb", fab).start()
    c = Daemon(procs, wd, "hostc", fab).start() if third else None
    ctl = Control(b.control)
    try:
        if not wait_for(lambda: any(d["device"] == "hosta/nvme0"
                                    for d in ctl.execute("query-devices")), 10):
            raise h.Timeout("hostb does not list hosta/nvme0")
    finally:
        ctl.close()
    return wd, img, sd, a, b, c


def follow(d):
    """A control connection that hears d's events from now on."""
    c = Control(d.control, timeout=30)
    c.execute("subscribe-events")
    return c


def ntbctl_ok(d, *args):
    p = subprocess.run([NTBCTL, "--socket", d.control, "--timeout-ms", "3000", *args],
                       capture_output=True, text=True, timeout=20)
    if p.returncode != 0:
        print(f"ntbctl {' '.join(args)} on {d.name}: {p.stderr.strip()}", file=sys.stderr)
    return p.returncode == 0


def show(d, device="hosta/nvme0"):
    c = Control(d.control)
    try:
        return c.execute("query-device", device=device)
    finally:
        c.close()


def vm_on_attachment(procs, b, seed, hotplug_timeout=90):
    """attach hosta/nvme0 to vm1 with its QMP socket and boot it on the guest check
    replug-wait; returned once the guest is reading, with the QMP socket left to the daemon."""
    qwd = procs.tempdir()
    ctl = Control(b.control)
    try:
        r = ctl.execute("attach", device="hosta/nvme0", domain="vm1",
                        qmp=str(qwd / "qmp.sock"), **{"qdev-id": "d0"})
    finally:
        ctl.close()
    dev = h.VfioUserDevice(r["socket"], id="d0", bus="rp1")
    q = h.Qemu(procs, "probe,replug-wait", [dev], root_port=True, workdir=qwd,
               timeout=hotplug_timeout + 200,
               params={"seed": seed, "hotplug_timeout": hotplug_timeout,
                       "check_timeout": hotplug_timeout + 60,
                       "timeout": hotplug_timeout + 150}).start()
    q.wait_line("VNREADY", "replug")
    q.qmp.close()           # QEMU's QMP socket takes one client: the daemon's now
    q.qmp = None
    return q, r["socket"]


def test_device_server_restart(procs):
    wd, img, sd, a, b, _ = hosts(procs)
    q, _ = vm_on_attachment(procs, b, 41)
    ev_a, ev_b = follow(a), follow(b)
    t0 = time.monotonic()
    sd.proc.send_signal(signal.SIGKILL)
    sd.proc.wait()
    lost_a = ev_a.wait_event("DEVICE_SERVER_LOST", 6)["data"]
    lost_b = ev_b.wait_event("DEVICE_SERVER_LOST", 6)["data"]
    t_lost = time.monotonic() - t0
    stats_lost = ntbctl_ok(a, "stats") and ntbctl_ok(b, "stats")
    shown = show(a)
    shown_b = show(b)
    # A new server on the same socket (the killed one's file is still there).
    t1 = time.monotonic()
    simdev(procs, wd, img)
    back_b = ev_b.wait_event("DEVICE_SERVER_BACK", 15)["data"]
    try:
        replugged = ev_b.wait_event("DEVICE_REPLUGGED", 120)["data"]
    except TimeoutError:
        print("hostb's log:\n" + "\n".join(b.log().splitlines()[-25:]), file=sys.stderr)
        print(q.diagnostics(), file=sys.stderr)
        raise
    t_replug = time.monotonic() - t1
    run = q.wait_done()
    alive = run.ok
    q.stop()
    stats_back = ntbctl_ok(a, "stats") and ntbctl_ok(b, "stats")
    ver = h.verify_backing(img, run.data)
    replug = run.results.get("replug-wait", {})
    warned = "device server" in a.log() and "is lost" in a.log()
    ev_a.close()
    ev_b.close()
    return result("device-server-restart",
                  t_lost <= 6 and lost_a.get("device") == "hosta/nvme0"
                  and lost_b.get("device") == "hosta/nvme0" and stats_lost and stats_back
                  and shown.get("device_server") == "lost"
                  and "socket closed" in (shown.get("device_server_loss") or "")
                  and shown_b.get("device_server_lost") is True and warned
                  and back_b.get("device") == "hosta/nvme0" and replugged.get("domain") == "vm1"
                  and replug.get("status") == "PASS" and alive and len(ver) > 0
                  and all(v["ok"] for v in ver),
                  lost_s=f"{t_lost:.2f}", replugged_s=f"{t_replug:.1f}",
                  device_server=shown.get("device_server"), stats_lost=stats_lost,
                  stats_back=stats_back, guest=replug.get("status"),
                  removed_ms=replug.get("removed_ms"), added_ms=replug.get("added_ms"),
                  regions=len(ver))


def test_adopted_lender_worker_crash(procs):
    wd, img, sd, a, b, _ = hosts(procs)
    ctl = Control(b.control)
    try:
        ctl.execute("attach", device="hosta/nvme0", domain="vm1")
    finally:
        ctl.close()
    a.kill()
    a.start()
    adopted = a.workers()
    ev_b = follow(b)
    old, lost_a, lost_b, ev_a, ev_b2 = kill_lender_worker(a, b, 6)
    back = ev_b.wait_event("DEVICE_SERVER_BACK", 10)["data"]
    new = wait_for(lambda: a.workers() if a.workers() and a.workers() != old else None, 10)
    seen = f"lender worker of nvme0 (pid {old[0]}) is gone" in a.log()
    for c in (ev_a, ev_b, ev_b2):
        c.close()
    return result("adopted-lender-worker-crash",
                  adopted == old and lost_a.get("node") == "hostb"
                  and lost_b.get("node") == "hosta" and back.get("device") == "hosta/nvme0"
                  and bool(new) and seen,
                  workers=f"{old}->{new}", logged=seen)


STALL_S = 150


def test_device_server_long_stall(procs):
    wd, img, sd, a, b, _ = hosts(procs)
    q, sock = vm_on_attachment(procs, b, 43, hotplug_timeout=STALL_S + 90)
    ev_a, ev_b = follow(a), follow(b)
    sd.proc.send_signal(signal.SIGSTOP)
    try:
        lost_a = ev_a.wait_event("DEVICE_SERVER_LOST", 60)["data"]
        lost_b = ev_b.wait_event("DEVICE_SERVER_LOST", 10)["data"]
        stats_lost = ntbctl_ok(a, "stats") and ntbctl_ok(b, "stats")
        shown = show(a)
        time.sleep(max(0, STALL_S - 30))
    finally:
        sd.proc.send_signal(signal.SIGCONT)
    t1 = time.monotonic()
    replugged = ev_b.wait_event("DEVICE_REPLUGGED", 120)["data"]
    t_replug = time.monotonic() - t1
    run = q.wait_done()
    q.stop()
    ver = h.verify_backing(img, run.data)
    replug = run.results.get("replug-wait", {})
    # A new VM on the same attachment.
    q2 = h.Qemu(procs, "probe,data", [h.VfioUserDevice(sock)], workdir=procs.tempdir(),
                params={"seed": 44, "data_mib": 8}).start()
    run2 = q2.wait_done()
    q2.stop()
    ver2 = h.verify_backing(img, run2.data)
    log = a.log()
    warned = "did not answer" in log and "no answer for" in log
    ev_a.close()
    ev_b.close()
    return result("device-server-long-stall",
                  lost_a.get("device") == "hosta/nvme0" and lost_b.get("device") == "hosta/nvme0"
                  and stats_lost and shown.get("device_server") == "lost"
                  and "no answer for" in (shown.get("device_server_loss") or "")
                  and "not answered" in (shown.get("last_stall") or "") and warned
                  and replugged.get("domain") == "vm1" and replug.get("status") == "PASS"
                  and len(ver) > 0 and all(v["ok"] for v in ver) and run2.ok
                  and len(ver2) > 0 and all(v["ok"] for v in ver2),
                  stall_s=STALL_S, replugged_s=f"{t_replug:.1f}",
                  loss=(shown.get("device_server_loss") or "-").replace(" ", "_")[:60],
                  guest=replug.get("status"), new_vm=run2.ok, warned=warned)


def fds_of(pid, what):
    """How many fds of @pid are @what (a part of what /proc shows: a memfd's name)."""
    n = 0
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            n += what in os.readlink(fd)
        except OSError:
            pass
    return n


def kill_lender_worker(a, b, timeout):
    """SIGKILL @a's lender worker; both hosts say the device is lost within @timeout s.
    (its pid, the events heard on a and on b, and both event connections)"""
    ev_a, ev_b = follow(a), follow(b)
    old = a.workers()
    os.kill(old[0], signal.SIGKILL)
    lost_a = ev_a.wait_event("DEVICE_SERVER_LOST", timeout)["data"]
    lost_b = ev_b.wait_event("DEVICE_SERVER_LOST", timeout)["data"]
    return old, lost_a, lost_b, ev_a, ev_b


def test_lender_worker_crash(procs):
    wd, img, sd, a, b, c = hosts(procs, third=True)
    q, _ = vm_on_attachment(procs, b, 45)
    held = fds_of(a.proc.pid, BAR_MEMFD)
    old, lost_a, lost_b, ev_a, ev_b = kill_lender_worker(a, b, 6)
    replugged = ev_b.wait_event("DEVICE_REPLUGGED", 60)["data"]
    run = q.wait_done()
    q.stop()
    ver = h.verify_backing(img, run.data)
    replug = run.results.get("replug-wait", {})
    new = a.workers()
    held_after = fds_of(a.proc.pid, BAR_MEMFD)
    # Returned, and lent to hostc at once: its VM reads the controller's identity.
    ctl = Control(b.control)
    try:
        ctl.execute("detach", device="hosta/nvme0")
        ctl.execute("return", device="hosta/nvme0")
    finally:
        ctl.close()
    ctl = Control(c.control)
    try:
        r = ctl.execute("attach", device="hosta/nvme0", domain="vm2")
    finally:
        ctl.close()
    q2 = h.Qemu(procs, "probe", [h.VfioUserDevice(r["socket"])], workdir=procs.tempdir()).start()
    run2 = q2.wait_done()
    q2.stop()
    probe = run2.results.get("probe", {})
    ev_a.close()
    ev_b.close()
    return result("lender-worker-crash",
                  lost_a.get("node") == "hostb" and lost_b.get("node") == "hosta"
                  and replugged.get("domain") == "vm1" and replug.get("status") == "PASS"
                  and len(ver) > 0 and all(v["ok"] for v in ver)
                  and len(new) == 1 and new != old and held >= 1 and held_after == held
                  and probe.get("status") == "PASS" and probe.get("serial") == SERIAL,
                  guest=replug.get("status"), why=replug.get("reason") or replug.get("err"),
                  workers=f"{old}->{new}",
                  bar_fds=f"{held}->{held_after}", second_holder=probe.get("status"))


def lender_stats(a):
    c = Control(a.control)
    try:
        return c.execute("query-stats", device="hosta/nvme0")["lent"][0]
    finally:
        c.close()


def heard(c, quiet_s):
    """Every event @c has heard, once none came for @quiet_s."""
    while True:
        c.sock.settimeout(quiet_s)
        try:
            c.events.append(c._line())
        except (socket.timeout, TimeoutError):
            return list(c.events)


def borrower_worker_crash(procs, name, irq_mode, adopted=False):
    wd, img, sd, a, b, _ = hosts(procs)
    qwd = procs.tempdir()
    ctl = Control(b.control)
    try:
        r = ctl.execute("attach", device="hosta/nvme0", domain="vm1", **{"irq-mode": irq_mode})
    finally:
        ctl.close()
    dev = h.VfioUserDevice(r["socket"], id="d0", bus="rp1")
    q = h.Qemu(procs, "io-survive,unplug-wait", [dev], root_port=True, workdir=qwd, timeout=400,
               params={"io_s": 25, "hotplug_timeout": 90, "check_timeout": 200,
                       "timeout": 350}).start()
    q.wait_line("VNREADY", "io", timeout=200)
    old = b.workers("vfio-ntb-borrower")
    if adopted:
        # B's daemon restarts under the guest's I/O: it adopts the worker, which keeps with
        # it again what its successor needs (and rings the relayed vectors it may have missed).
        b.kill()
        b.start()
        if not wait_for(lambda: "adopted worker" in b.log(), 10):
            raise h.Timeout("hostb did not adopt its worker")
        time.sleep(1)
    ev_a, ev_b = follow(a), follow(b)
    before = lender_stats(a)
    time.sleep(4)                       # rounds before the kill, to compare with
    os.kill(old[0], signal.SIGKILL)
    replaced = ev_b.wait_event("WORKER_REPLACED", 10)["data"]
    new = b.workers("vfio-ntb-borrower")
    shown = show(b)
    q.wait_line("VNREADY", "unplug", timeout=120)
    io = q.run.results.get("io-survive", {})
    after = lender_stats(a)
    resumed = "resumes its attachment" in a.log()
    # The VM lets go of the device: QEMU's unmaps and its goodbye reach the new worker.
    q.qmp.execute("device_del", {"id": "d0"})
    run = q.wait_done()
    q.stop()
    unplug = run.results.get("unplug-wait", {})
    ctl = Control(b.control)
    try:
        detached = ctl.execute("detach", device="hosta/nvme0")
    finally:
        ctl.close()
    wait_for(lambda: not b.workers("vfio-ntb-borrower"), 10)   # the stop is not instant
    left = b.workers("vfio-ntb-borrower")
    lender_heard = [e["event"] for e in heard(ev_a, 1.0)
                    if e["event"] in ("DEVICE_SERVER_LOST", "DETACHED", "FENCED")]
    ev_a.close()
    ev_b.close()
    stall = int(io.get("max_round_ms", 0)) - int(io.get("avg_round_ms", 0))
    if io.get("status") != "PASS":
        print("hostb's log:\n" + "\n".join(b.log().splitlines()[-40:]), file=sys.stderr)
        print("guest:\n" + "\n".join(x for _, x in run.lines[-30:]), file=sys.stderr)
    return result(name,
                  io.get("status") == "PASS" and replaced.get("device") == "hosta/nvme0"
                  and len(old) == 1 and len(new) == 1 and new != old
                  and unplug.get("status") == "PASS" and detached.get("changed") is True
                  and left == [] and not lender_heard and resumed
                  and shown.get("worker_replacements") == 1
                  and after["fences"] == before["fences"],
                  guest=io.get("status"), rounds=io.get("rounds"), errors=io.get("errors"),
                  stall_ms=stall, max_round_ms=io.get("max_round_ms"),
                  avg_round_ms=io.get("avg_round_ms"), max_config_ms=io.get("max_config_ms"),
                  same_function=io.get("same_function"), workers=f"{old}->{new}->{left}",
                  unplug=unplug.get("status"), lender_heard=len(lender_heard),
                  lender_fences=after["fences"] - before["fences"], resumed=resumed)


def test_borrower_worker_crash(procs):
    return borrower_worker_crash(procs, "borrower-worker-crash", "fd")


def test_adopted_borrower_worker_crash_relay(procs):
    """The same with relayed interrupts (the NTB's way: the lender rings doorbells, the worker
    signals the VM's eventfds, which it keeps with its daemon for its successor), for a worker
    that B's daemon adopted after a restart (not its child)."""
    return borrower_worker_crash(procs, "adopted-borrower-worker-crash-relay", "relay",
                                 adopted=True)


def test_borrower_worker_crash_loop(procs):
    # Here, not at the top: vfio_deaths (run inside the lender host by vfio_inner) imports
    # this file, and with vfio_inner imported from here at the top that group's first attach
    # found the IOMMU group busy.
    import vfio_inner as vi

    wd, img, sd, a, b, _ = hosts(procs)
    ctl = Control(b.control)
    try:
        r = ctl.execute("attach", device="hosta/nvme0", domain="vmq")
    finally:
        ctl.close()
    q = vi.qtest_qemu(procs, r["socket"])
    ident = vi.config_rw(q, 0x00)
    ev_b = follow(b)
    fences = lender_stats(a)["fences"]
    served = []
    for _ in range(3):
        os.kill(b.workers("vfio-ntb-borrower")[0], signal.SIGKILL)
        ev_b.wait_event("WORKER_REPLACED", 10)
        served.append(vi.config_rw(q, 0x00) == ident)
    os.kill(b.workers("vfio-ntb-borrower")[0], signal.SIGKILL)
    gave_up = wait_for(lambda: "died 4 times in 60 s" in b.log(), 10)
    gone = wait_for(lambda: not b.workers("vfio-ntb-borrower"), 10)
    fenced = wait_for(lambda: lender_stats(a)["fences"] > fences, 10)
    again = [e for e in heard(ev_b, 1.0) if e["event"] == "WORKER_REPLACED"]
    ev_b.close()
    q.kill()
    q.wait()
    return result("borrower-worker-crash-loop",
                  ident == SIMDEV_ID and len(served) == 3 and all(served)
                  and bool(gave_up) and bool(gone) and bool(fenced) and not again,
                  id=f"{ident:#010x}", served_after=served, gave_up=bool(gave_up),
                  no_worker=bool(gone), fenced=bool(fenced), replaced_again=len(again))


def main():
    return h.run_tests((test_device_server_restart, test_lender_worker_crash,
                        test_adopted_lender_worker_crash, test_borrower_worker_crash,
                        test_adopted_borrower_worker_crash_relay,
                        test_borrower_worker_crash_loop, test_device_server_long_stall),
                       sys.argv[1:])


if __name__ == "__main__":
    sys.exit(main())
