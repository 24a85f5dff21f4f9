#!/usr/bin/python3
"""End-to-end: vfio-ntbd as an operator and systemd run it.

--check-config on good and bad files (exit 0 or 2, the message names FILE:LINE and the value,
nothing created); a [fabric] error at start is exit 2 (a config error, which the unit does not
restart), not 1; Type=notify: the test is systemd's notify socket, waits for READY=1 and runs
`ntbctl nodes` at once (it must succeed), and sees STATUS=; SIGHUP adds a [lend] that
`ntbctl list` then shows, between RELOADING=1 and READY=1; a bad file on SIGHUP changes
nothing and is logged with --check-config's message; a device lent at run time (`lend`)
survives a reload, and a lent device the config drops stays lent; [node] log-level = info
shows info lines a default daemon does not, and --log-level warning hushes the notices.
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
from cluster import Daemon, VFIO_NTBD  # noqa: E402
from control import Control, ControlError  # noqa: E402

# tests/run-checks counts a result this file did not print as failed.
EXPECTED_RESULTS = 15

NTBCTL = h.REPO / "build" / "ntbctl"


def ntbctl(d, *args):
    p = subprocess.run([str(NTBCTL), "--socket", str(d.control), *args], capture_output=True,
                       text=True, timeout=30)
    return p.returncode, p.stdout, p.stderr


def check_config(path):
    p = subprocess.run([str(VFIO_NTBD), "--check-config", str(path)], capture_output=True,
                       text=True, timeout=30)
    return p.returncode, p.stdout, p.stderr


class Notify:
    """systemd's side of sd_notify: a datagram socket named by NOTIFY_SOCKET."""

    def __init__(self, path):
        self.path = str(path)
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(self.path)
        self.seen = []  # every datagram, as lists of lines, in order

    def wait(self, line, timeout=20.0, after=0):
        """Index in self.seen of the first datagram from @after on that has @line."""
        deadline = time.monotonic() + timeout
        while True:
            for i in range(after, len(self.seen)):
                if line in self.seen[i]:
                    return i
            left = deadline - time.monotonic()
            if left <= 0:
                raise h.Timeout(f"no {line} on the notify socket in {timeout} s: {self.seen}")
            self.sock.settimeout(left)
            try:
                self.seen.append(self.sock.recv(4096).decode().split("\n"))
            except socket.timeout:
                pass

    def statuses(self):
        return [x[len("STATUS="):] for dg in self.seen for x in dg if x.startswith("STATUS=")]


def start_notified(procs, d, notify):
    """Start @d as systemd would with Type=notify: NOTIFY_SOCKET set, and nothing waited for
    but READY=1 (not the control socket's file, as Daemon.start does)."""
    d.conf.write_text(d.config_text())
    env = dict(os.environ, NOTIFY_SOCKET=notify.path)
    log = open(d.log_path, "ab")
    d.proc = procs.start(f"vfio-ntbd-{d.name}", [VFIO_NTBD, "--config", d.conf, *d.args],
                         stdout=log, stderr=subprocess.STDOUT, env=env)
    log.close()
    return d


# ---- --check-config -------------------------------------------------------------------------

def test_check_config(procs):
    wd = procs.tempdir()
    d = Daemon(procs, wd, "hosta", wd / "fabric", lends={"nvme0": wd / "dev.sock"})
    good = wd / "good.conf"
    good.write_text(d.config_text())
    rc, out, err = check_config(good)
    made = [p.name for p in wd.iterdir() if p.name != "good.conf"]
    ok = result("check-config-good", rc == 0 and "OK" in out and "hosta" in out and not err,
                rc=rc, out=out.strip()[:100])
    ok &= result("check-config-creates-nothing", not made, made=made)

    base = d.config_text()
    bad = {
        # name: (text, the offending line's text (its last occurrence), what the message shows)
        "dup-group": (base + "[lend nvme0]\n", "[lend nvme0]", "[lend nvme0] again"),
        "dup-key": (base.replace("name = hosta\n", "name = hostx\nname = hosty\n"),
                    "name = hosty", 'name = "hosty"'),
        "inline-comment": (base.replace("allow = *", "allow = *  # everyone"), "# everyone",
                           '"# everyone"'),
        "fabric-dir": (base + "\n[fabric]\ndir = /elsewhere\n", "dir = /elsewhere",
                       '"/elsewhere"'),
        "fabric-param": (base + "\n[fabric]\nmax-windows = 0\n", "max-windows = 0",
                         'max-windows = "0"'),
    }
    bad_ok = []
    for name, (text, needle, what) in bad.items():
        path = wd / f"{name}.conf"
        path.write_text(text)
        line = [i + 1 for i, t in enumerate(text.splitlines()) if needle in t][-1]
        rc, out, err = check_config(path)
        at = f"{path}:{line}:"
        good_one = rc == 2 and at in err and what in err and not out
        if not good_one:
            print(f"{name}: rc={rc} out={out!r} err={err!r} want {at} {what}", file=sys.stderr)
        bad_ok.append(good_one)
    made = [p.name for p in wd.iterdir() if not p.name.endswith(".conf")]
    return ok & result("check-config-bad", all(bad_ok) and not made,
                       files=len(bad), refused_at_line=sum(bad_ok), made=made)


def test_start_fabric_error(procs):
    wd = procs.tempdir()
    d = Daemon(procs, wd, "hosta", wd / "fabric", fabric_params={"max-windows": "0"})
    d.conf.write_text(d.config_text())
    p = subprocess.run([str(VFIO_NTBD), "--config", str(d.conf)], capture_output=True,
                       text=True, timeout=30)
    line = next(i + 1 for i, t in enumerate(d.config_text().splitlines()) if "max-windows" in t)
    return result("start-fabric-error-exit-2", p.returncode == 2
                  and f"{d.conf}:{line}:" in p.stderr and not d.control.exists()
                  and not (wd / "fabric").exists(),
                  rc=p.returncode, err=p.stderr.strip()[:120])


# ---- Type=notify and reload -----------------------------------------------------------------

def test_notify_and_reload(procs):
    wd = procs.tempdir()
    fab = procs.tempdir("vn-fabric-")
    sds = {n: h.Simdev(procs, wd / f"{n}.sock", h.make_backing(wd / f"{n}.img", 16), 16).start()
           for n in ("nvme0", "nvme1")}
    a = Daemon(procs, wd, "hosta", fab, lends={"nvme0": sds["nvme0"].socket_path},
               allow={"nvme0": "hostb"})
    notify = Notify(wd / "notify.sock")
    start_notified(procs, a, notify)
    notify.wait("READY=1")
    # at once, as `systemctl start vfio-ntbd && ntbctl nodes` would
    rc, out, err = ntbctl(a, "nodes")
    ok = result("notify-ready-then-nodes", rc == 0 and "hosta" in out, rc=rc,
                err=err.strip()[:100])
    b = Daemon(procs, wd, "hostb", fab).start()
    wait_for(lambda: _drain(notify) or any("1 node up" in s for s in notify.statuses()), 5)
    ok &= result("notify-status", any(s.startswith("lending 1") for s in notify.statuses())
                 and any("1 node up" in s for s in notify.statuses()),
                 statuses=notify.statuses()[-2:])

    # SIGHUP adds nvme1
    a.lends["nvme1"] = sds["nvme1"].socket_path
    a.conf.write_text(a.config_text())
    mark = len(notify.seen)
    a.proc.send_signal(signal.SIGHUP)
    r = notify.wait("RELOADING=1", after=mark)
    notify.wait("READY=1", after=r + 1)
    rc, out, _ = ntbctl(a, "list")
    ok &= result("reload-adds-lend", rc == 0 and "hosta/nvme1" in out and a.proc.poll() is None,
                 rc=rc, listed="hosta/nvme1" in out)

    # a bad file: nothing changes, the log says what --check-config says
    good_text = a.config_text()
    a.conf.write_text(good_text.replace("[lend nvme1]", "[lend nvme2]") + "[fabric]\nwindows = 8\n")
    _, _, check_err = check_config(a.conf)
    mark = len(notify.seen)
    a.proc.send_signal(signal.SIGHUP)
    r = notify.wait("RELOADING=1", after=mark)
    notify.wait("READY=1", after=r + 1)
    rc, out, _ = ntbctl(a, "list")
    msg = check_err.strip().removeprefix("vfio-ntbd: ")
    ok &= result("reload-bad-file-changes-nothing",
                 rc == 0 and "hosta/nvme1" in out and "hosta/nvme2" not in out and msg != ""
                 and wait_for(lambda: msg in a.log(), 3) and a.proc.poll() is None,
                 logged=msg in a.log(), message=msg[:80])

    # a device lent at run time survives; a lent one the config drops stays (warned)
    c = Control(a.control)
    c.execute("lend", name="rt0", socket=str(sds["nvme1"].socket_path), allow=["*"])
    wait_for(lambda: any(x["device"] == "hosta/nvme0"
                         for x in Control(b.control).execute("query-devices")), 7)
    Control(b.control).execute("borrow", device="hosta/nvme0")
    del a.lends["nvme0"]
    a.conf.write_text(a.config_text())
    mark = len(notify.seen)
    a.proc.send_signal(signal.SIGHUP)
    r = notify.wait("RELOADING=1", after=mark)
    notify.wait("READY=1", after=r + 1)
    rc, out, _ = ntbctl(a, "list")
    st = c.execute("query-device", device="hosta/nvme0")
    ok &= result("reload-keeps-runtime-lend", rc == 0 and "hosta/rt0" in out
                 and "hosta/nvme1" in out, listed=out.split()[:12])
    warned = wait_for(lambda: "nvme0 is no longer in the config, but it is lent to hostb"
                      in a.log(), 3)
    ok &= result("reload-keeps-lent-device", st.get("state") == "lent"
                 and st.get("borrower") == "hostb" and bool(warned),
                 state=st.get("state"), warned=bool(warned))
    try:
        Control(b.control).execute("return", device="hosta/nvme0")
    except ControlError:
        pass
    ok &= _reload_answered(a, c, sds)
    # STOPPING=1 on SIGTERM, and a clean exit
    mark = len(notify.seen)
    a.proc.send_signal(signal.SIGTERM)
    notify.wait("STOPPING=1", after=mark, timeout=10)
    a.proc.wait(10)
    return ok & result("notify-stopping", a.proc.returncode == 0, rc=a.proc.returncode)


def _reload_answered(a, c, sds):
    """vfio-ntbd --reload (the unit's ExecReload=) returns once the daemon applied the file,
    saying what changed, and fails when the daemon refuses it."""
    a.lends["nvme2"] = sds["nvme0"].socket_path
    a.conf.write_text(a.config_text())
    r = subprocess.run([str(VFIO_NTBD), "--reload", str(a.conf)], capture_output=True,
                       text=True, timeout=90)
    rc, out, _ = ntbctl(a, "list")  # at once: the reload is done when --reload returns
    ok = result("reload-answered", r.returncode == 0 and "1 lent device added" in r.stdout
                and "hosta/nvme2" in out, rc=r.returncode, said=r.stdout.strip()[-90:],
                listed="hosta/nvme2" in out)
    # the daemon's own refusal (a file the daemon reads is never the client's word)
    a.conf.write_text(a.config_text() + "[lend bad]\nsocket = relative.sock\n")
    try:
        c.execute("reload")
        refused = ""
    except ControlError as e:
        refused = str(e)
    r = subprocess.run([str(VFIO_NTBD), "--reload", str(a.conf)], capture_output=True,
                       text=True, timeout=90)
    a.conf.write_text(a.config_text())
    nobody = a.conf.with_name("nobody.conf")  # a good file, but no daemon on its socket
    nobody.write_text(a.config_text().replace(str(a.control), f"{a.control}.none"))
    gone = subprocess.run([str(VFIO_NTBD), "--reload", str(nobody)], capture_output=True,
                          text=True, timeout=90)
    rc, out, _ = ntbctl(a, "list")
    return ok & result("reload-refused-answered",
                       "nothing changed" in refused and "relative.sock" not in out
                       and "hosta/nvme2" in out and r.returncode == 2
                       and "nothing changed" in r.stderr and gone.returncode == 1 and ".none" in gone.stderr,
                       refused=refused[:90], client_rc=r.returncode, no_file_rc=gone.returncode)


def _drain(notify):
    """Read what came on the notify socket without waiting; False (for wait_for)."""
    notify.sock.setblocking(False)
    try:
        while True:
            notify.seen.append(notify.sock.recv(4096).decode().split("\n"))
    except BlockingIOError:
        return False


class InfoDaemon(Daemon):
    """A daemon whose config says [node] log-level = info."""

    def config_text(self):
        return super().config_text().replace("[node]\n", "[node]\nlog-level = info\n", 1)


def test_log_level(procs):
    wd = procs.tempdir()
    fab = procs.tempdir("vn-fabric-")
    quiet = Daemon(procs, wd, "hostq", fab).start()
    loud = InfoDaemon(procs, wd, "hostl", fab).start()
    # the fabric's g_info on attaching, and on links: info, not notice
    seen = wait_for(lambda: "attached to the shm fabric" in loud.log()
                    and "link to hostq up" in loud.log(), 5)
    ok = result("log-level-info", bool(seen) and "attached to the shm fabric" not in quiet.log(),
                loud=bool(seen), quiet_clean="attached to" not in quiet.log())
    # --log-level warning: not even the notices ("up on fabric"), over the config's info
    hushed = InfoDaemon(procs, wd, "hosth", fab, args=["--log-level", "warning"]).start()
    wait_for(lambda: "link to hosth up" in loud.log(), 5)
    return ok & result("log-level-warning", "link to hosth up" in loud.log()
                       and hushed.log().strip() == "", hushed_log=hushed.log()[:80])


def main():
    ok = True
    with h.Procs() as procs:
        for test in (test_check_config, test_start_fabric_error, test_notify_and_reload,
                     test_log_level):
            try:
                ok &= test(procs)
            except (h.HarnessError, ControlError, TimeoutError, KeyError, ConnectionError,
                    OSError, StopIteration) as e:
                ok = h.failed(test.__name__, e)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
