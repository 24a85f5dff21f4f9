#!/usr/bin/python3
"""End-to-end: what each patch in qemu-patches/ changes, shown on the patched QEMU
(scripts/build-qemu) and, where stock Debian QEMU can run the same scene, on stock too.

A "*-patched" result asserts what a user gets with the patch; a "*-stock" result asserts that
stock QEMU still has the problem the patch fixes (if one fails, upstream fixed it: drop the
patch).  What a user would check:
- a vfio-user device with MSI-X can be hot-unplugged and plugged again (stock: QEMU aborts);
- `ntbctl revoke` takes a borrowed device out of a running VM through the device request
  alone (no QMP), the guest's driver letting go cleanly before the fence (stock: no request);
- a device server killed mid-I/O fails only its device: QMP reports it, the guest sees it
  removed, the VM and its other NVMe keep working (stock: the VM dies or hangs); the same
  with the lender of a borrowed device killed;
- `migrate` with a vfio-user device is refused naming the device, and allowed again once the
  device is unplugged (stock: "completed", without the device);
- QEMU's own NVMe model served by QEMU's x-remote vfio-user server, lent through the fabric to
  a guest that passes the data checks (stock Debian QEMU has no x-remote server at all).
"""
import json
import signal
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
EXPECTED_RESULTS = 12

KINDS = ("patched", "stock")


def qemu_for(kind):
    return h.patched_qemu() if kind == "patched" else h.stock_qemu()


def qemu_died(q, timeout):
    """True if QEMU exits within timeout seconds."""
    try:
        q.proc.wait(timeout)
        return True
    except subprocess.TimeoutExpired:
        return False


def stderr_of(q):
    return q.stderr_path.read_text(errors="replace") if q.stderr_path.exists() else ""


# ---- 0002: hot-unplug of a device with MSI-X ----------------------------------------------


def test_msix_unplug(procs, kind):
    wd = procs.tempdir()
    img = h.make_backing(wd / "disk.img", 64)
    sd = h.Simdev(procs, wd / "nvme.sock", img, 64, serial="VN-MSIX").start()   # MSI-X
    dev = h.VfioUserDevice(sd.socket_path, bus="rp1")
    q = h.Qemu(procs, "probe,hotplug-wait", [dev], params={"seed": 5}, root_port=True,
               workdir=wd, qemu=qemu_for(kind), timeout=180).start()
    if kind == "stock":
        q.wait_line("VNREADY", "hotplug")
        q.qmp.execute("device_del", {"id": dev.id})
        died = qemu_died(q, 20)
        err = stderr_of(q)
        q.stop()
        return result("msix-unplug-stock", died and "Assertion" in err,
                      qemu_died=died, assertion="Assertion" in err)
    t = h.hotplug_cycle(q, dev)
    run = q.wait_done()
    q.stop()
    hp = run.results.get("hotplug-wait", {})
    ver = h.verify_backing(img, run.data)
    return result("msix-unplug-patched", hp.get("status") == "PASS" and run.exit_status == 0
                  and len(ver) > 0 and all(v["ok"] for v in ver),
                  deleted_s=f"{t['device_deleted_s']:.2f}", readded_s=f"{t['guest_added_s']:.2f}")


# ---- 0003: revoke through the device request -------------------------------------------------


def lending_pair(procs, wd, sock, allow="hostb"):
    fab = procs.tempdir("vn-fabric-")
    a = Daemon(procs, wd, "hosta", fab, lends={"nvme0": sock}, allow={"nvme0": allow}).start()
    b = Daemon(procs, wd, "hostb", fab).start()
    ca, cb = Control(a.control), Control(b.control)
    wait_for(lambda: any(d["device"] == "hosta/nvme0" for d in cb.execute("query-devices")), 10)
    return a, b, ca, cb


def test_revoke_by_device_request(procs, kind):
    wd = procs.tempdir()
    img = h.make_backing(wd / "disk.img", 64)
    sd = h.Simdev(procs, wd / "nvme.sock", img, 64, serial="VN-REQ").start()
    a, b, ca, cb = lending_pair(procs, wd, sd.socket_path)
    # No QMP socket given to the daemon: the device request is the only way to unplug.
    r = cb.execute("attach", device="hosta/nvme0", domain="vm1")
    dev = h.VfioUserDevice(r["socket"], bus="rp1")
    q = h.Qemu(procs, "probe,unplug-wait", [dev], params={"hotplug_timeout": 20},
               root_port=True, workdir=wd, qemu=qemu_for(kind), timeout=120).start()
    q.wait_line("VNREADY", "unplug")
    t0 = time.monotonic()
    ans = ca.execute("revoke", device="hosta/nvme0", **{"grace-ms": 8000})
    took = time.monotonic() - t0
    if kind == "stock":
        # Nothing asks the guest: the device stays in the VM (fenced) after the lease ends.
        removed = True
        try:
            q.wait_line("VNEVENT", "removed", timeout=5)
        except h.HarnessError:   # the time ran out, or the guest gave up and powered off
            removed = False
        q.stop()
        return result("revoke-device-request-stock", not removed and ans == {"forced": False}
                      and "device request" not in b.log(), guest_removed=removed,
                      revoke_s=f"{took:.2f}")
    removed_s = None
    try:
        q.wait_line("VNEVENT", "removed", timeout=20)
        removed_s = time.monotonic() - t0
    except h.Timeout:
        pass
    run = q.wait_done(timeout=60)
    q.stop()
    uw = run.results.get("unplug-wait", {})
    state = ca.execute("query-device", device="hosta/nvme0")["state"]
    return result("revoke-device-request-patched",
                  ans == {"forced": False} and removed_s is not None and took < 8
                  and uw.get("status") == "PASS" and uw.get("kernel_errors") == "0"
                  and "asked the VM vm1 to release hosta/nvme0 (device request)" in b.log()
                  and "the VM released hosta/nvme0" in b.log() and state == "available",
                  revoke_s=f"{took:.2f}", guest_removed_s=f"{removed_s or -1:.2f}",
                  kernel_errors=uw.get("kernel_errors"), forced=ans.get("forced"), state=state)


# ---- 0005: a server that resets the connection ------------------------------------------------


def test_server_reset(procs, kind):
    """A vfio-user server that closes its socket with QEMU's message unread (a reset): QEMU
    must refuse the device, not abort.  Deterministic: the server reads nothing."""
    import socket
    import threading
    wd = procs.tempdir()
    path = wd / "reset.sock"
    srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    srv.bind(str(path))
    srv.listen(1)

    def serve():
        try:
            conn, _ = srv.accept()
            time.sleep(0.5)            # QEMU's VERSION is in our receive queue now
            conn.close()               # unread data: the kernel sends a reset
        except OSError:
            pass
    t = threading.Thread(target=serve, daemon=True)
    t.start()
    q = h.Qemu(procs, "pause", [], params={"pause_s": 60}, root_port=True, workdir=wd,
               qemu=qemu_for(kind), timeout=120).start()
    q.wait_line("VNREADY", "pause")
    refused = ""
    try:
        q.qmp.execute("device_add", h.VfioUserDevice(path, id="rst", bus="rp1").qmp_args())
    except h.HarnessError as e:
        refused = str(e)
    died = qemu_died(q, 5)
    q.stop()
    srv.close()
    if kind == "stock":
        return result("server-reset-stock", died and "Assertion" in stderr_of(q), qemu_died=died)
    return result("server-reset-patched", not died and "device_add" in refused,
                  refused=json.dumps(refused[-100:]))


# ---- 0006: the device's server lost mid-I/O ------------------------------------------------


def survive_vm(procs, wd, lost_dev, kind, keep_img):
    keep = h.BuiltinNvme(keep_img, id="keep", serial="VN-KEEP")
    return h.Qemu(procs, "survive", [lost_dev, keep],
                  params={"lost_serial": "VN-LOST", "keep_serial": "VN-KEEP",
                          # stock never removes it: do not wait long for that
                          "hotplug_timeout": 40 if kind == "patched" else 15},
                  root_port=True, workdir=wd, qemu=qemu_for(kind), timeout=150).start()


def test_server_lost(procs, kind):
    wd = procs.tempdir()
    img = h.make_backing(wd / "lost.img", 64)
    keep_img = h.make_backing(wd / "keep.img", 64)
    sd = h.Simdev(procs, wd / "nvme.sock", img, 64, serial="VN-LOST").start()
    dev = h.VfioUserDevice(sd.socket_path, id="lost", bus="rp1")
    q = survive_vm(procs, wd, dev, kind, keep_img)
    q.wait_line("VNREADY", "survive")
    t0 = time.monotonic()
    sd.proc.send_signal(signal.SIGKILL)
    if kind == "stock":
        # The VM aborts at the next DMA map change, or the guest never sees the device go.
        survived = True
        try:
            run = q.wait_done(timeout=60)
            survived = run.results.get("survive", {}).get("status") == "PASS"
        except h.HarnessError:
            survived = False
        q.stop()
        return result("server-lost-stock", not survived, vm_and_guest_survived=survived)
    ev = q.qmp.wait_event("VFIO_USER_SERVER_LOST", timeout=20)
    ev_s = time.monotonic() - t0
    q.qmp.wait_event("DEVICE_DELETED", timeout=40, match=lambda d: d.get("device") == "lost")
    run = q.wait_done(timeout=90)
    q.stop()
    sv = run.results.get("survive", {})
    ver = h.verify_backing(keep_img, run.data)
    data = ev.get("data", {})
    return result("server-lost-patched", sv.get("status") == "PASS" and sv.get("keep") == "ok"
                  and run.exit_status == 0 and data.get("device-id") == "lost"
                  and data.get("socket") == str(sd.socket_path)
                  and len(ver) > 0 and all(v["ok"] for v in ver),
                  event_s=f"{ev_s:.2f}", guest_removed_ms=sv.get("removed_ms"))


def test_lender_lost(procs, kind):
    """The product on the patched QEMU: the lender's daemon dies mid-I/O; the borrower's
    worker asks QEMU to unplug the dead device, and the VM and its other NVMe carry on."""
    wd = procs.tempdir()
    img = h.make_backing(wd / "lost.img", 64)
    keep_img = h.make_backing(wd / "keep.img", 64)
    sd = h.Simdev(procs, wd / "nvme.sock", img, 64, serial="VN-LOST").start()
    a, b, ca, cb = lending_pair(procs, wd, sd.socket_path)
    r = cb.execute("attach", device="hosta/nvme0", domain="vm1")
    dev = h.VfioUserDevice(r["socket"], id="lost", bus="rp1")
    q = survive_vm(procs, wd, dev, kind, keep_img)
    q.wait_line("VNREADY", "survive")
    t0 = time.monotonic()
    a.kill()
    q.qmp.wait_event("DEVICE_DELETED", timeout=60, match=lambda d: d.get("device") == "lost")
    gone_s = time.monotonic() - t0
    run = q.wait_done(timeout=90)
    q.stop()
    sv = run.results.get("survive", {})
    dev_state = cb.execute("query-device", device="hosta/nvme0")
    return result("lender-lost-patched", sv.get("status") == "PASS" and sv.get("keep") == "ok"
                  and run.exit_status == 0 and "device request" in b.log(),
                  unplugged_s=f"{gone_s:.2f}", guest_removed_ms=sv.get("removed_ms"),
                  state=dev_state.get("state"))


# ---- 0004: migration blocker -----------------------------------------------------------------


def migration_status(q):
    return q.qmp.execute("query-migrate").get("status")


def test_migration_blocked(procs, kind):
    wd = procs.tempdir()
    img = h.make_backing(wd / "disk.img", 16)
    sd = h.Simdev(procs, wd / "nvme.sock", img, 16, serial="VN-MIG").start()
    dev = h.VfioUserDevice(sd.socket_path, id="mig0", bus="rp1")
    q = h.Qemu(procs, "probe,pause", [dev], params={"pause_s": 90}, root_port=True,
               workdir=wd, qemu=qemu_for(kind), timeout=150).start()
    q.wait_line("VNREADY", "pause")
    uri = f"file:{wd / 'migration.bin'}"
    if kind == "stock":
        q.qmp.execute("migrate", {"uri": uri})
        st = wait_for(lambda: migration_status(q) in ("completed", "failed") and
                      migration_status(q), 60)
        q.stop()
        return result("migration-blocked-stock", st == "completed", status=st)
    refused = ""
    try:
        q.qmp.execute("migrate", {"uri": uri})
    except h.QMPError as e:
        refused = str(e)
    named = "mig0" in refused and "does not support migration" in refused
    # Unplugged, the device no longer holds migration back.
    q.qmp.execute("device_del", {"id": "mig0"})
    q.qmp.wait_event("DEVICE_DELETED", timeout=40, match=lambda d: d.get("device") == "mig0")
    q.qmp.execute("migrate", {"uri": uri})
    st = wait_for(lambda: migration_status(q) in ("completed", "failed") and
                  migration_status(q), 60)
    q.stop()
    return result("migration-blocked-patched", named and st == "completed",
                  refused=json.dumps(refused[:120]), after_unplug=st)


# ---- 0007: QEMU's x-remote NVMe as a lent device ----------------------------------------------


def start_xremote(procs, wd, img, serial):
    sock = wd / "xremote.sock"
    procs.track(sock)
    obj = {"qom-type": "x-vfio-user-server", "id": "vfu0",
           "socket": {"type": "unix", "path": str(sock)}, "device": "xnvme"}
    argv = [h.patched_qemu(), "-machine", "x-remote,vfio-user=on,auto-shutdown=off",
            "-nodefaults", "-display", "none", "-monitor", "none", "-serial", "none",
            "-device", f"nvme,id=xnvme,serial={serial},drive=xd0",
            "-drive", f"id=xd0,if=none,file={img},format=raw,cache=none",
            "-object", json.dumps(obj)]
    log = open(wd / "xremote.log", "wb")
    p = procs.start("x-remote", argv, stdout=log, stderr=log)
    if not wait_for(lambda: sock.exists() or p.poll() is not None, 30) or p.poll() is not None:
        raise h.HarnessError("x-remote did not come up:\n" +
                             (wd / "xremote.log").read_text(errors="replace")[-2000:])
    return p, sock


def test_xremote_interop(procs, kind):
    wd = procs.tempdir()
    img = h.make_backing(wd / "x.img", 256)
    _, sock = start_xremote(procs, wd, img, "VN-XREMOTE")
    a, b, ca, cb = lending_pair(procs, wd, sock)
    r = cb.execute("attach", device="hosta/nvme0", domain="vm1")
    q = h.Qemu(procs, "probe,data", [h.VfioUserDevice(r["socket"])], params={"seed": 99},
               workdir=wd, qemu=qemu_for(kind), timeout=240).start()
    run = q.wait_done()
    q.stop()
    probe = run.results.get("probe", {})
    data = run.results.get("data", {})
    ver = h.verify_backing(img, run.data)
    checked = [v for v in ver if not v["superseded"]]
    return result(f"xremote-lent-{kind}-client", probe.get("status") == "PASS"
                  and probe.get("serial") == "VN-XREMOTE" and data.get("status") == "PASS"
                  and len(checked) >= 4 and all(v["ok"] for v in checked),
                  model=probe.get("model"), serial=probe.get("serial"),
                  write_4k_mbps=data.get("write_4k_mbps"), read_1m_mbps=data.get("read_1m_mbps"))


TESTS = [
    (test_msix_unplug, KINDS),
    (test_revoke_by_device_request, KINDS),
    (test_server_reset, KINDS),
    (test_server_lost, KINDS),
    (test_lender_lost, ("patched",)),
    (test_migration_blocked, KINDS),
    (test_xremote_interop, ("stock",)),   # the patched server; a stock client is the proof
]


def main(argv):
    only = set(argv[1:])
    ok = True
    for test, kinds in TESTS:
        for kind in kinds:
            name = f"{test.__name__}[{kind}]"
            if only and test.__name__ not in only and name not in only:
                continue
            with h.Procs() as procs:
                try:
                    ok &= test(procs, kind)
                except h.HarnessError as e:
                    ok = h.failed(name, e)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv))
