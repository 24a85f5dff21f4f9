"""Benches of libvirt-managed devices (make bench): attach-to-ready and reassign.

Two nodes borrow from hosta, each with its own libvirtd and one running TCG domain whose guest
runs the plug-cycles check (it reports each time a controller comes up or goes away).

- attach-to-ready: `ntbctl attach DEV --domain vmA` (borrow, serve, device_add on a free root
  port) until the guest's nvme driver has the controller live with its disk; then
  `ntbctl detach --domain` (not timed).  p50_s over the rounds.
- reassign: `ntbctl reassign DEV --to HOST:DOMAIN`, alternating between vmA on hostb and vmB on
  hostc, until the target guest has the controller live.  p50_s over the rounds.

Times include the guest's 0.1 s polling step and TCG; compare runs, not machines.
"""
import json
import os
import statistics
import subprocess
import time

import harness as h
import libvirtd as lvt
from cluster import Daemon

ROUNDS = max(5, int(os.environ.get("VN_BENCH_ROUNDS", "3")))
NTBCTL = h.REPO / "build" / "ntbctl"
DEV = "hosta/nvme0"


def ntbctl(daemon, *args):
    p = subprocess.run([str(NTBCTL), "--socket", str(daemon.control), *map(str, args)],
                       capture_output=True, text=True, timeout=60)
    if p.returncode != 0:
        raise h.HarnessError(f"ntbctl {' '.join(map(str, args))}: {p.stderr.strip()}")
    return p


def cycling_domain(procs, lv, name, wd, rounds):
    serial = wd / f"{name}.serial"
    xml = wd / f"{name}.xml"
    xml.write_text(lvt.domain_xml(name, serial, "plug-cycles",
                                  params={"rounds": rounds, "hotplug_timeout": 120,
                                          "check_timeout": 900, "timeout": 1000}))
    lv.virsh("define", xml)
    q = lvt.domain(lv, procs, name, procs.tempdir(), "plug-cycles", timeout=1000)
    q.serial_path = serial
    lv.virsh("start", name)
    q.wait_line("VNREADY", "cycles")
    return q


def p50(values):
    return round(statistics.median(values), 3)


def run():
    with h.Procs() as procs:
        wd = procs.tempdir()
        fab = procs.tempdir("vn-fabric-")
        img = h.make_backing(wd / "a.img", 64)
        # MSI: stock QEMU aborts unplugging vfio-user devices with MSI-X (qemu-patches/0002).
        sd = h.Simdev(procs, wd / "d.sock", img, 64, serial="VN-BENCH",
                      extra_args=["--interrupts", "msi"]).start()
        Daemon(procs, wd, "hosta", fab, lends={"nvme0": sd.socket_path}).start()
        b = Daemon(procs, wd, "hostb", fab).start()
        c = Daemon(procs, wd, "hostc", fab).start()
        lvb = lvt.Libvirtd(procs, "hostb", b.control).start()
        lvc = lvt.Libvirtd(procs, "hostc", c.control).start()
        try:
            hosts = lvt.hosts_file(wd / "hosts.conf", ("hostb", b.control, lvb.uri),
                                   ("hostc", c.control, lvc.uri))
            qa = cycling_domain(procs, lvb, "vmA", wd, 2 * ROUNDS)
            qb = cycling_domain(procs, lvc, "vmB", wd, ROUNDS)
            # attach-to-ready: hot attach, guest ready, hot detach.
            att = []
            for i in range(1, ROUNDS + 1):
                t0 = time.monotonic()
                ntbctl(b, "attach", DEV, "--domain", "vmA", "--connect", lvb.uri)
                qa.wait_line("VNEVENT", f"added {i}", timeout=60)
                att.append(time.monotonic() - t0)
                ntbctl(b, "detach", DEV, "--domain", "vmA", "--connect", lvb.uri)
                qa.wait_line("VNEVENT", f"removed {i}", timeout=60)
            print(json.dumps({"bench": "attach-to-ready", "rounds": len(att), "p50_s": p50(att),
                              "max_s": round(max(att), 3)}), flush=True)
            # reassign: vmA holds it; move it to vmB and back, timing each move to ready.
            ntbctl(b, "attach", DEV, "--domain", "vmA", "--connect", lvb.uri)
            na = ROUNDS + 1
            qa.wait_line("VNEVENT", f"added {na}", timeout=60)
            moves, nb = [], 0
            for i in range(ROUNDS):
                to_b = i % 2 == 0
                t0 = time.monotonic()
                ntbctl(c, "reassign", DEV, "--to", "hostc:vmB" if to_b else "hostb:vmA",
                       "--hosts", hosts, "--connect", lvc.uri)
                if to_b:
                    nb += 1
                    qb.wait_line("VNEVENT", f"added {nb}", timeout=60)
                else:
                    na += 1
                    qa.wait_line("VNEVENT", f"added {na}", timeout=60)
                moves.append(time.monotonic() - t0)
            print(json.dumps({"bench": "reassign", "rounds": len(moves), "p50_s": p50(moves),
                              "max_s": round(max(moves), 3)}), flush=True)
        finally:
            lvb.stop()
            lvc.stop()

