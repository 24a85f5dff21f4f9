#!/usr/bin/python3
"""End-to-end: restarts, reloads, full disks and unfair control clients end in a state both
hosts agree on and the operator sees.  Two daemons on the shm fabric (hosta lends simulated
NVMe drives, hostb borrows), restarted as a package upgrade or an operator restarts them.

What a user would check: an idle lent device still works after the lender restarted three
times; a device dropped from the config while lent stays lent until returned, then goes, with
no worker process nobody knows of; a node without state-dir leaks no worker; both hosts agree
on a lease when a lender comes back after the lease timeout; a full state disk is said
("saved": false) and healed; a loss is told at warning level on both hosts; and clients that
hold, flood or garble the control socket do not lock ntbctl or a VM's trapped accesses out.
"""
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import harness as h  # noqa: E402
from harness import result, wait_for  # noqa: E402
from cluster import Daemon  # noqa: E402
from control import Control, ControlError  # noqa: E402
from vfio_user_probe import ConfigReader  # noqa: E402

# tests/run-checks counts a result this file did not print as failed.
EXPECTED_RESULTS = 7

NTBCTL = Path(os.environ.get("VN_NTBCTL", h.REPO / "build" / "ntbctl"))
LEASE_MS = 3000


class Pair:
    """hosta lends @devices (each a simulated NVMe drive), hostb borrows."""

    def __init__(self, procs, devices=("nvme0",), persist=True):
        self.procs = procs
        self.wd = procs.tempdir()
        self.fab = procs.tempdir("vn-fabric-")
        self.sd, self.img = {}, {}
        for i, dev in enumerate(devices):
            self.img[dev] = h.make_backing(self.wd / f"{dev}.img", 64)
            self.sd[dev] = h.Simdev(procs, self.wd / f"{dev}.sock", self.img[dev], 64,
                                    serial=f"VN-RESTART-{i:02d}").start()
        self.a = Daemon(procs, self.wd, "hosta", self.fab,
                        lends={d: s.socket_path for d, s in self.sd.items()},
                        lease_timeout_ms=LEASE_MS, persist=persist)
        self.b = Daemon(procs, self.wd, "hostb", self.fab, lease_timeout_ms=LEASE_MS,
                        persist=persist)
        self.a.start()
        self.b.start()
        self.wait_listed(devices)

    def ctl(self, d):
        return Control(d.control)

    def ask(self, d, cmd, **args):
        c = self.ctl(d)
        try:
            return c.execute(cmd, **args)
        finally:
            c.close()

    def wait_listed(self, devices, timeout=10):
        want = {f"hosta/{d}" for d in devices}
        ok = wait_for(lambda: want <= {x["device"] for x in self.ask(self.b, "query-devices")},
                      timeout)
        if not ok:
            raise h.HarnessError(f"hostb does not list {sorted(want)}")

    def restart(self, d, sig=signal.SIGTERM, gap_s=0.0):
        d.kill(sig)
        time.sleep(gap_s)
        d.start()

    def state(self, d, dev="hosta/nvme0"):
        return self.ask(d, "query-device", device=dev)


def guest(pair, sock, checks, seed, **params):
    return h.Qemu(pair.procs, checks, [h.VfioUserDevice(sock)],
                  params={"seed": seed, "data_mib": 8, **params},
                  workdir=pair.procs.tempdir()).start()


def data_passed(pair, run, dev="nvme0", want=1):
    datas = [line for _, line in run.lines if line.startswith("VNRESULT data ")]
    ver = h.verify_backing(pair.img[dev], run.data)
    return (run.ok and len(datas) >= want and all(" PASS" in x for x in datas)
            and all(v["ok"] for v in ver)), len(datas)


def test_idle_lender_restarts(procs):
    """Three restarts of the lender 40 s apart, its device never borrowed meanwhile: the
    device is lent as it was (the same worker, adopted each time), then a guest uses it."""
    p = Pair(procs)
    worker = p.a.workers()
    for _ in range(3):
        time.sleep(40)
        p.restart(p.a)
    p.wait_listed(["nvme0"])
    after = p.a.workers()
    r = p.ask(p.b, "attach", device="hosta/nvme0", domain="vm1")
    q = guest(p, r["socket"], "probe,data", 51)
    run = q.wait_done()
    q.stop()
    ok, datas = data_passed(p, run)
    gave_up = "did not come back" in p.a.log()
    p.ask(p.b, "detach", device="hosta/nvme0")
    p.ask(p.b, "return", device="hosta/nvme0")
    return result("idle-lender-restarts", ok and worker == after and len(worker) == 1
                  and not gave_up, data_checks=datas, workers_before=worker,
                  workers_after=after, worker_gave_up=gave_up)


def test_restart_config_drops_lent(procs):
    """hosta restarts with both of its devices gone from its config: nvme0, lent to hostb,
    stays lent with a warning and an event until hostb returns it, then is unlent; nvme1,
    idle, is not lent and its worker is gone.  Back in the config, both lend again."""
    p = Pair(procs, devices=("nvme0", "nvme1"))
    p.ask(p.b, "attach", device="hosta/nvme0", domain="vm2")
    lends = dict(p.a.lends)
    p.a.kill(signal.SIGTERM)
    p.a.lends = {}
    t_restart = time.time()
    p.a.start()
    follower = p.ctl(p.a)
    # The event came as the daemon started: asked for as one that reconnects asks.
    follower.execute("subscribe-events", since=int((t_restart - 1) * 1e6))
    kept = follower.wait_event("DEVICE_KEPT", 5)["data"]
    warned = any("WARNING" in ln.upper() and "no longer in the config" in ln
                 for ln in p.a.log().splitlines())
    lent = p.state(p.a).get("borrower") == "hostb"
    state = json.loads((p.a.state_dir / "state.json").read_text())
    named = sorted(w["pid"] for w in state.get("lender_workers", []))
    running = p.a.workers()
    # hostb gives it back: hosta lends it no more, and its worker goes.
    p.ask(p.b, "detach", device="hosta/nvme0")
    p.ask(p.b, "return", device="hosta/nvme0")
    gone = wait_for(lambda: "hosta/nvme0" not in
                    {x["device"] for x in p.ask(p.a, "query-devices")}, 10)
    no_workers = wait_for(lambda: not p.a.workers(), 10)
    left = p.a.workers()
    follower.close()
    # Back in the config: lent again, and borrowed.
    p.a.kill(signal.SIGTERM)
    p.a.lends = lends
    p.a.start()
    p.wait_listed(["nvme0", "nvme1"])
    again = p.ask(p.b, "borrow", device="hosta/nvme1")
    p.ask(p.b, "return", device="hosta/nvme1")
    return result("restart-config-drops-lent",
                  kept.get("device") == "nvme0" and kept.get("node") == "hostb" and warned
                  and lent and running == named and len(running) == 1 and bool(gone)
                  and bool(no_workers) and "lease" in again,
                  event=kept, warned=warned, still_lent=lent, workers=running,
                  state_names=named, unlent_after_return=bool(gone),
                  workers_after_return=left, borrow_after=bool(again))


def look_alike(procs, d, node, port):
    """A process that looks like a lender worker (its name and arguments) to whoever reads
    /proc: bash, running under that name with those arguments."""
    return procs.start(f"look-alike-{node}",
                       [str(d.wd / "vfio-ntb-lender"), "-c", "sleep 120; :",
                        f"--node={node}", f"--port={port}"], executable="/bin/bash")


def test_no_state_dir_restart(procs):
    """The quickstart's configs (no state-dir): a clean restart and a kill -9 restart leave
    one lender worker, the one the daemon speaks with.  Strays are told by node and run-dir,
    not by name alone: look-alikes of another node, or of this node's name in another run-dir,
    are left running; one in this node's run-dir is stopped."""
    p = Pair(procs, persist=False)
    other_dir = procs.tempdir()
    mine = look_alike(procs, p.a, "hosta", p.a.run_dir / "lend-x-port.sock")
    other_node = look_alike(procs, p.a, "hostz", p.a.run_dir / "lend-x-port.sock")
    other_run = look_alike(procs, p.a, "hosta", other_dir / "lend-x-port.sock")
    fakes = {mine.pid, other_node.pid, other_run.pid}

    def parent(pid):
        try:
            return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            return 0

    def real_workers():
        # Not a look-alike, nor the child bash forks for its sleep, which has the look-alike's
        # command line until it execs (make check counted one once: workers=[2, 1, 1]).
        return len([w for w in p.a.workers() if w not in fakes and parent(w) not in fakes])
    counts = [real_workers()]
    p.restart(p.a, signal.SIGTERM)
    p.wait_listed(["nvme0"])
    counts.append(real_workers())
    stopped = wait_for(lambda: mine.poll() is not None, 5)
    spared = other_node.poll() is None and other_run.poll() is None
    p.restart(p.a, signal.SIGKILL)
    p.wait_listed(["nvme0"])
    counts.append(real_workers())
    got = p.ask(p.b, "borrow", device="hosta/nvme0")
    p.ask(p.b, "return", device="hosta/nvme0")
    return result("no-state-dir-restart",
                  counts == [1, 1, 1] and "lease" in got and bool(stopped) and spared,
                  workers=counts, borrow=bool(got), look_alike_stopped=bool(stopped),
                  others_spared=spared)


def test_lender_back_after_timeout(procs):
    """kill -9 the lender while hostb's VM uses its drive; back after twice the lease
    timeout.  hostb says the device was lost; within 5 s of the link coming up both hosts
    agree (held again, here), and the VM's data checks pass."""
    p = Pair(procs)
    r = p.ask(p.b, "attach", device="hosta/nvme0", domain="vm3")
    q = guest(p, r["socket"], "probe,data,pause,data", 53, pause_s=14)
    q.wait_line("VNREADY", "pause")
    p.a.kill(signal.SIGKILL)
    lost = wait_for(lambda: p.state(p.b).get("lost"), 2 * LEASE_MS / 1000 + 2)
    time.sleep(max(0, 2 * LEASE_MS / 1000 - LEASE_MS / 1000))
    p.a.start()
    t0 = time.monotonic()

    def agreed():
        sa, sb = p.state(p.a), p.state(p.b)
        held = sa.get("borrower") == "hostb" and not sb.get("lost")
        ended = sa.get("state") == "available" and sb.get("state") == "available"
        return "held" if held else "ended" if ended else None
    verdict = wait_for(agreed, 5)
    took = time.monotonic() - t0
    run = q.wait_done()
    q.stop()
    ok, datas = data_passed(p, run, want=2)
    loss = p.state(p.b).get("last_loss", "")
    # The worker forwards again (it answered all-ones while the lender was lost).
    returns = p.ask(p.b, "query-stats", device="hosta/nvme0")["borrowed"][0]["lender_returns"]
    p.ask(p.b, "detach", device="hosta/nvme0")
    p.ask(p.b, "return", device="hosta/nvme0")
    return result("lender-back-after-timeout",
                  bool(lost) and verdict == "held" and ok and "did not come back" in loss
                  and returns == 1,
                  lost=bool(lost), verdict=verdict, worker_back=returns, agreed_s=f"{took:.1f}", data_checks=datas,
                  last_loss=json.dumps(loss))


def test_warnings_tell_the_story(procs):
    """hostb's daemon dies and is back only after the lease timeout: hosta fences the guest's
    device.  Every step is a warning: on hosta the link going down, the lease orphaned, then
    ended and the device fenced; on hostb, once back, the device lost (and `show` says so)."""
    p = Pair(procs)
    p.ask(p.b, "attach", device="hosta/nvme0", domain="vm4")
    p.b.kill(signal.SIGKILL)
    freed = wait_for(lambda: p.state(p.a).get("state") == "available", LEASE_MS / 1000 + 10)
    p.b.start()
    told = wait_for(lambda: p.state(p.b).get("last_loss"), 10)
    warn_a = [ln for ln in p.a.log().splitlines() if "WARNING" in ln]
    warn_b = [ln for ln in p.b.log().splitlines() if "WARNING" in ln]
    steps_a = {"link down": "link to hostb down", "orphaned": "link went down; lease",
               "ended": "ends (", "fenced": "fenced ("}
    steps_b = {"lost": "hosta/nvme0 lost:"}
    missing = [k for k, s in steps_a.items() if not any(s in ln for ln in warn_a)] + \
        [k for k, s in steps_b.items() if not any(s in ln for ln in warn_b)]
    return result("warnings-tell-the-story", bool(freed) and bool(told) and not missing,
                  fenced=bool(freed), last_loss=json.dumps(told or ""), missing=missing)


def test_disk_full_attach(procs):
    """hostb's state-dir on a full file system: attach answers "saved": false and ntbctl
    warns and exits 0; once there is room the daemon saves by itself, and a restart keeps the
    lease."""
    p = Pair(procs)
    mnt = procs.tempdir("vn-full-")
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(mnt)], check=True)
    try:
        p.b.kill(signal.SIGTERM)
        p.b.state_dir = mnt / "state"
        p.b.start()
        p.wait_listed(["nvme0"])
        filler = mnt / "filler"
        subprocess.run(["dd", "if=/dev/zero", f"of={filler}", "bs=4k"],
                       stderr=subprocess.DEVNULL, check=False)
        cli = subprocess.run([NTBCTL, "--socket", p.b.control, "--json", "attach", "hosta/nvme0",
                              "--domain", "vm5", "--serve-only"], capture_output=True, text=True, timeout=30)
        answer = (json.loads(cli.stdout) if cli.stdout.strip() else {}).get("return", {})
        warned = "could not save" in cli.stderr
        stats = p.ask(p.b, "query-stats")
        filler.unlink()
        saved = wait_for(lambda: p.ask(p.b, "query-stats").get("state_saved"), 5)
        p.restart(p.b, signal.SIGKILL)
        kept = wait_for(lambda: p.state(p.b).get("attached_to") == "vm5", 5)
        held = p.state(p.a).get("borrower") == "hostb"
        p.ask(p.b, "detach", device="hosta/nvme0")
        p.ask(p.b, "return", device="hosta/nvme0")
        p.b.kill(signal.SIGTERM)
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)
    return result("disk-full-attach",
                  cli.returncode == 0 and answer.get("saved") is False and warned
                  and stats.get("state_save_errors", 0) > 0 and bool(saved) and bool(kept)
                  and held,
                  exit=cli.returncode, saved_answer=answer.get("saved"), warned=warned,
                  save_errors=stats.get("state_save_errors"), saved_later=bool(saved),
                  kept_after_restart=bool(kept), lender_agrees=held)


def ntbctl_list_ok(d):
    """`ntbctl list` answers within a second (its own timeout says so: exit 0)."""
    cli = subprocess.run([NTBCTL, "--socket", d.control, "--timeout-ms", "1000", "list"],
                         capture_output=True, text=True, timeout=20)
    return cli.returncode == 0


def test_control_socket_abuse(procs):
    """64 clients that hold their connections, then a stream of clients that ask for much and
    never read, then NUL lines: `ntbctl list` keeps answering (within its 1 s timeout), a
    VM's trapped config reads (forwarded through hostb's daemon) never stall, and every line
    gets an answer or a close."""
    p = Pair(procs)
    r = p.ask(p.b, "attach", device="hosta/nvme0", domain="vm6")
    reader = ConfigReader(r["socket"])

    def forwarded():
        return p.ask(p.b, "query-stats", device="hosta/nvme0")["borrowed"][0]["config_forwarded"]
    before = forwarded()
    quiet = sorted(reader.read_many(200))
    held = [socket.socket(socket.AF_UNIX) for _ in range(64)]
    for s in held:
        s.connect(str(p.b.control))
    list_held = ntbctl_list_ok(p.b)
    stop = threading.Event()

    def flood():
        while not stop.is_set():
            s = socket.socket(socket.AF_UNIX)
            try:
                s.connect(str(p.b.control))
                s.setblocking(False)
                for _ in range(2000):
                    s.send(b'{"execute":"query-stats"}\n')
            except OSError:
                pass
            time.sleep(0.05)
            s.close()
    floods = [threading.Thread(target=flood, daemon=True) for _ in range(4)]
    for t in floods:
        t.start()
    time.sleep(1)
    list_flood = all(ntbctl_list_ok(p.b) for _ in range(3))
    busy = sorted(reader.read_many(200))
    stop.set()
    through_lender = forwarded() - before
    for t in floods:
        t.join()
    for s in held:
        s.close()
    c = p.ctl(p.b)
    nul = c.raw(b"\0{\"execute\":\"query-devices\"}\n")
    c.close()
    reader.sock.close()
    p.ask(p.b, "detach", device="hosta/nvme0")
    p.ask(p.b, "return", device="hosta/nvme0")
    q50, b50, bmax = quiet[len(quiet) // 2], busy[len(busy) // 2], busy[-1]
    return result("control-socket-abuse",
                  list_held and list_flood and "error" in nul and bmax < 1.0
                  and through_lender >= 400,
                  list_with_64_held=list_held, list_under_flood=list_flood,
                  nul_answer=nul.get("error", {}).get("class"),
                  config_read_quiet_us=int(q50 * 1e6), config_read_busy_us=int(b50 * 1e6),
                  config_read_busy_max_ms=int(bmax * 1e3), forwarded=through_lender,
                  busy_over_quiet=f"{b50 / q50:.2f}")


def main():
    ok = True
    tests = (test_restart_config_drops_lent, test_no_state_dir_restart,
             test_lender_back_after_timeout, test_warnings_tell_the_story, test_disk_full_attach,
             test_control_socket_abuse, test_idle_lender_restarts)
    names = {test_restart_config_drops_lent: "restart-config-drops-lent",
             test_no_state_dir_restart: "no-state-dir-restart",
             test_lender_back_after_timeout: "lender-back-after-timeout",
             test_warnings_tell_the_story: "warnings-tell-the-story",
             test_disk_full_attach: "disk-full-attach",
             test_control_socket_abuse: "control-socket-abuse",
             test_idle_lender_restarts: "idle-lender-restarts"}
    only = set(sys.argv[1:])
    for test in tests:
        if only and names[test] not in only:
            continue
        with h.Procs() as procs:
            try:
                ok &= test(procs)
            except (h.HarnessError, ControlError, TimeoutError, KeyError, ConnectionError,
                    OSError, subprocess.SubprocessError) as e:
                ok = h.failed(names[test], e)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
