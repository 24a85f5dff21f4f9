#!/usr/bin/python3
"""End-to-end: ntbctl as an operator and their scripts use it, against real daemons on the
emulated fabric (hosta lends a simulated NVMe, hostb borrows, hostc lends at run time).

What must hold: typos fail with the exit code of their class and change nothing (stats and
xml of a device nobody lends, attach to a domain libvirt does not run); actions say whether
they changed anything (--json "changed") and repeating one is safe; a repeated attach with
other options is refused; every --json answer is the versioned envelope, errors included;
lend/unlend from the CLI; `ntbctl events --json` streams what happened, in order; list and
nodes show the attached domain, last seen and versions, and a lease's time left while its
holder is down (degraded, then lost, on the borrower).
"""
import json
import os
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
EXPECTED_RESULTS = 8

DEV = "hosta/nvme0"
NTBCTL = str(h.REPO / "build" / "ntbctl")
# No libvirt answers here: an attach without --serve-only must be refused by that.
NO_LIBVIRT = dict(os.environ, LIBVIRT_DEFAULT_URI="qemu:///system?socket=/nonexistent/sock")


def ntbctl(node, *args):
    p = subprocess.run([NTBCTL, "--socket", str(node.control), *args], capture_output=True,
                       text=True, timeout=30, env=NO_LIBVIRT)
    return p.returncode, p.stdout, p.stderr


def jctl(node, *args):
    """ntbctl --json: (exit code, the parsed envelope or None)."""
    rc, out, _ = ntbctl(node, "--json", *args)
    try:
        return rc, json.loads(out)
    except json.JSONDecodeError:
        return rc, None


def envelope_ok(env, command):
    return (isinstance(env, dict) and env.get("schema") == 1 and env.get("command") == command
            and (("return" in env and isinstance(env.get("changed"), bool))
                 or set(env.get("error", {})) == {"class", "desc"}))


def device_state(node):
    return Control(node.control).execute("query-device", device=DEV)


def test_typos(a, b):
    """Each of the issue's typos fails with its class's exit code and changes nothing."""
    bad = []
    for args, want, cls in ((("stats", "hosta/nvme1"), 4, "DeviceNotFound"),
                            (("xml", "hosta/nvme9"), 4, "DeviceNotFound"),
                            (("show", "hosta/nvme9"), 4, "DeviceNotFound"),
                            (("return", "hosta/nvme9"), 4, "DeviceNotFound"),
                            (("detach", "hostz/nvme0"), 4, "DeviceNotFound"),
                            (("stats", DEV), 7, "NotBorrowed"),
                            (("attach", DEV, "--domain", "vm-1"), 10, "LibvirtError"),
                            (("revoke", DEV), 2, "InvalidParameter"),
                            (("attach", DEV, "--domain", "vm1", "--grace-ms", "1"), 2,
                             "UsageError"),
                            (("frobnicate",), 2, "UsageError")):
        rc, env = jctl(b, *args)
        got = (env or {}).get("error", {}).get("class")
        if rc != want or got != cls or not envelope_ok(env, args[0] if rc != 2 or
                                                       args[0] != "frobnicate" else None):
            bad.append(f"{' '.join(args)}:{rc}:{got}")
    st = device_state(b)
    return result("ntbctl-typos-fail", not bad and st["state"] == "available",
                  failures=";".join(bad)[:300] or "none", state=st["state"])


def test_changed_and_repeats(a, b):
    """attach/detach/return report "changed"; repeating one is safe (exit 0, changed false);
    a repeated attach with other options is refused (6) and keeps what is in place."""
    steps = []

    def step(name, args, want_rc, want_changed=None):
        rc, env = jctl(b, *args)
        changed = (env or {}).get("changed")
        ok = rc == want_rc and envelope_ok(env, args[0]) and \
            (want_changed is None or changed is want_changed)
        steps.append(f"{name}:{rc}:{changed}" + ("" if ok else ":BAD"))
        return env if ok else None

    served = step("attach", ("attach", DEV, "--domain", "vm1", "--serve-only"), 0, True)
    step("attach-again", ("attach", DEV, "--domain", "vm1", "--serve-only"), 0, False)
    step("attach-other-qmp", ("attach", DEV, "--domain", "vm1", "--qmp", "/run/x/qmp.sock",
                              "--qdev-id", "ntb0"), 6)
    step("attach-other-vm", ("attach", DEV, "--domain", "vm2", "--serve-only"), 6)
    rc, env = jctl(b, "list")
    listed = next((d for d in (env or {}).get("return", []) if d["device"] == DEV), {})
    step("detach", ("detach", DEV), 0, True)
    step("detach-again", ("detach", DEV), 0, False)
    step("return", ("return", DEV), 0, True)
    step("return-again", ("return", DEV), 0, False)
    sock = (served or {}).get("return", {}).get("socket", "")
    _, text, _ = ntbctl(b, "return", DEV)
    ok = (all(not s.endswith(":BAD") for s in steps) and sock.endswith("vm1-hosta-nvme0.sock")
          and listed.get("attached_to") == "vm1" and listed.get("state") == "lent"
          and "nothing to return" in text and device_state(b)["state"] == "available")
    return result("ntbctl-changed-and-repeats", ok, steps=",".join(steps),
                  attached_to=listed.get("attached_to"))


def test_lend_unlend(a, b, c, wd):
    """ntbctl lend/unlend on hostc: the cluster sees the device, then not."""
    sd = h.Simdev(a.procs, wd / "c-dev.sock", h.make_backing(wd / "c.img", 16), 16).start()
    rc1, env1 = jctl(c, "lend", "ssd1", "--device-socket", str(sd.socket_path), "--allow", "hostb")
    seen = wait_for(lambda: any(d["device"] == "hostc/ssd1" for d in
                                Control(b.control).execute("query-devices")), 7)
    rc_busy = None
    if seen:
        Control(b.control).execute("borrow", device="hostc/ssd1")
        rc_busy, _ = jctl(c, "unlend", "ssd1")
        Control(b.control).execute("return", device="hostc/ssd1")
    rc2, env2 = jctl(c, "unlend", "ssd1")
    gone = not any(d["device"] == "hostc/ssd1" for d in Control(c.control).execute("query-devices"))
    rc3, _ = jctl(c, "unlend", "ssd1")
    sd.stop()
    return result("ntbctl-lend-unlend", rc1 == 0 and (env1 or {}).get("changed") is True and seen
                  and rc_busy == 6 and rc2 == 0 and gone and rc3 == 4,
                  lend=rc1, seen=seen, unlend_busy=rc_busy, unlend=rc2, unlend_again=rc3)


def test_events(a, b):
    """ntbctl events --json on hostb sees the lease granted, the attach and the detach, in
    order, one JSON object per line with an RFC 3339 timestamp."""
    log = b.wd / "events.jsonl"
    with open(log, "w") as out:
        p = subprocess.Popen([NTBCTL, "--socket", str(b.control), "--json", "events"],
                             stdout=out, stderr=subprocess.DEVNULL)
        try:
            time.sleep(0.5)     # subscribed before anything happens
            jctl(b, "attach", DEV, "--domain", "vm3", "--serve-only")
            jctl(b, "detach", DEV)
            jctl(b, "return", DEV)
            wait_for(lambda: log.read_text().count("\n") >= 3, 5)
        finally:
            p.terminate()
            p.wait(10)
    events = []
    for line in log.read_text().splitlines():
        try:
            events.append(json.loads(line))
        except json.JSONDecodeError:
            events.append({"event": "UNPARSED"})
    names = [e.get("event") for e in events if e.get("data", {}).get("device") == DEV]
    well_formed = all(e.get("schema") == 1 and str(e.get("timestamp", "")).endswith("Z")
                      for e in events)
    attached = next((e for e in events if e.get("event") == "ATTACHED"), {})
    return result("ntbctl-events", names[:3] == ["LEASE_GRANTED", "ATTACHED", "DETACHED"]
                  and well_formed and attached.get("data", {}).get("domain") == "vm3",
                  events=",".join(map(str, names)))


def test_nodes_and_version(a, b):
    rc, env = jctl(b, "nodes")
    nodes = {n["node"]: n for n in (env or {}).get("return", [])}
    other = nodes.get("hosta", {})
    rc_v, out_v, _ = ntbctl(b, "version")
    return result("ntbctl-nodes-and-version",
                  rc == 0 and other.get("version") == "0.1.0"
                  and isinstance(other.get("last_seen_ms"), int)
                  and 0 <= other["last_seen_ms"] < 60000
                  and nodes.get("hostb", {}).get("link") == "self"
                  and rc_v == 0 and out_v == f"ntbctl 0.1.0\nvfio-ntbd 0.1.0 (node hostb, "
                  f"{b.control})\n", last_seen_ms=other.get("last_seen_ms"))


def test_top(a, b):
    """ntbctl top: frames (not a terminal: one block each) listing the attached device; an
    unknown device exits 4."""
    jctl(b, "attach", DEV, "--domain", "vm5", "--serve-only")
    rc, out, _ = ntbctl(b, "top", "--count", "2", "--interval-ms", "200")
    rc_bad, _, err = ntbctl(b, "top", "hosta/nvme9", "--count", "1")
    jctl(b, "detach", DEV)
    jctl(b, "return", DEV)
    return result("ntbctl-top", rc == 0 and out.count(DEV) >= 2 and rc_bad == 4,
                  rc=rc, frames_with_device=out.count(DEV), unknown=rc_bad)


def test_help(b):
    rc, out, _ = ntbctl(b, "help", "lend")
    rc2, out2, _ = ntbctl(b, "lend", "--help")
    return result("ntbctl-help", rc == 0 and out == out2 and "--device-socket PATH" in out
                  and "example:\n  ntbctl lend " in out and "--domain" not in out)


def test_list_while_down(a, b):
    """ntbctl list shows the time left on a lease whose holder is down (on the lender), and a
    held device whose lender is down as degraded, then lost (on the borrower)."""
    jctl(b, "attach", DEV, "--domain", "vm4", "--serve-only")
    b.kill()

    def entry(node):
        rc, env = jctl(node, "list")
        return next((d for d in (env or {}).get("return", []) if d["device"] == DEV), {})

    orphaned = wait_for(lambda: isinstance(entry(a).get("expires_in_ms"), int), 10)
    left = entry(a).get("expires_in_ms")
    _, text, _ = ntbctl(a, "list")
    b.start()
    claimed = wait_for(lambda: entry(a).get("expires_in_ms") is None
                       and entry(a).get("borrower") == "hostb", 10)
    a.kill()
    degraded = wait_for(lambda: entry(b).get("state") == "degraded", 10)
    lost = wait_for(lambda: entry(b).get("state") == "lost", 10)
    return result("ntbctl-list-while-down", orphaned and left is not None and 0 <= left <= 3000
                  and "holder down, ends in" in text and claimed and degraded and lost,
                  expires_in_ms=left, degraded=degraded, lost=lost)


def main():
    ok = True
    with h.Procs() as procs:
        wd = procs.tempdir()
        fab = procs.tempdir("vn-fabric-")
        sd = h.Simdev(procs, wd / "dev.sock", h.make_backing(wd / "a.img", 16), 16).start()
        try:
            a = Daemon(procs, wd, "hosta", fab, lends={"nvme0": sd.socket_path},
                       allow={"nvme0": "hostb"}).start()
            b = Daemon(procs, wd, "hostb", fab).start()
            c = Daemon(procs, wd, "hostc", fab).start()
            wait_for(lambda: all(len(Control(d.control).execute("query-devices")) == 1
                                 for d in (a, b, c)), 10)
        except h.HarnessError as e:
            print(f"cluster: {e}", file=sys.stderr)
            return 1
        for test in (lambda: test_typos(a, b), lambda: test_changed_and_repeats(a, b),
                     lambda: test_lend_unlend(a, b, c, wd), lambda: test_events(a, b),
                     lambda: test_nodes_and_version(a, b), lambda: test_top(a, b),
                     lambda: test_help(b),
                     lambda: test_list_while_down(a, b)):
            try:
                ok &= test()
            except (h.HarnessError, TimeoutError, KeyError, ConnectionError) as e:
                ok = h.failed("test_ntbctl", e)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
