#!/usr/bin/python3
"""End-to-end with a real libvirt daemon (bookworm's libvirtd 9.0 driving the testbed's QEMU):
domains that declare borrowed devices in their XML (docs/libvirt.md).

What a user would check: `ntbctl xml` prints what a domain needs and `ntbctl xml --check`
accepts it; `virsh start` of such a domain borrows and attaches the device through our hook, and
its guest passes the data checks on the lent NVMe; when the domain goes, the lease is returned
and the device is available again; a start that cannot get its devices is refused with a
message saying why and leaves no lease and no half-attached device behind (malformed metadata,
an unknown device, a device already lent, an access-list refusal); a migration is refused;
the hook given unexpected arguments says so.
"""
import os
import re
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import harness as h  # noqa: E402
import libvirtd as lvt  # noqa: E402
from harness import result, wait_for  # noqa: E402
from cluster import Daemon  # noqa: E402
from control import Control, ControlError  # noqa: E402

# tests/run-checks counts a result this file did not print as failed.
EXPECTED_RESULTS = 19

NTBCTL = h.REPO / "build" / "ntbctl"


def ntbctl(daemon, *args):
    return subprocess.run([str(NTBCTL), "--socket", str(daemon.control), *map(str, args)],
                          capture_output=True, text=True, timeout=30)


class Site:
    """hosta lends nvme0 (to hostb) and nvme1 (to hostc only); hostb runs libvirt."""

    def __init__(self, procs):
        self.procs = procs
        self.wd = procs.tempdir()
        fab = procs.tempdir("vn-fabric-")
        self.img = h.make_backing(self.wd / "a.img", 64)
        # MSI: stock QEMU aborts unplugging a vfio-user device with MSI-X (qemu-patches/0002).
        self.sd0 = h.Simdev(procs, self.wd / "d0.sock", self.img, 64, serial="VN-LV-0",
                            extra_args=["--interrupts", "msi"]).start()
        self.sd1 = h.Simdev(procs, self.wd / "d1.sock", h.make_backing(self.wd / "b.img", 16),
                            16, serial="VN-LV-1").start()
        self.a = Daemon(procs, self.wd, "hosta", fab,
                        lends={"nvme0": self.sd0.socket_path, "nvme1": self.sd1.socket_path},
                        allow={"nvme0": "hostb;hostc", "nvme1": "hostc"}).start()
        self.b = Daemon(procs, self.wd, "hostb", fab).start()
        self.c = Daemon(procs, self.wd, "hostc", fab).start()
        self.d = Daemon(procs, self.wd, "hostd", fab).start()   # on no access list
        self.ca, self.cb, self.cc = (Control(d.control) for d in (self.a, self.b, self.c))
        wait_for(lambda: len(self.cb.execute("query-devices")) == 2, 10)
        self.lv = lvt.Libvirtd(procs, "hostb", self.b.control).start()

    def state(self, dev="hosta/nvme0"):
        return self.ca.execute("query-device", device=dev)["state"]

    def held_by_hostb(self):
        return [d["device"] for d in self.cb.execute("query-devices") if d["borrower"] == "hostb"]

    def define(self, name, checks, snippets, params=None, emulator=None):
        serial = self.wd / f"{name}.serial"
        xml = lvt.domain_xml(name, serial, checks, params=params, snippets=snippets,
                             emulator=emulator)
        path = self.wd / f"{name}.xml"
        path.write_text(xml)
        self.lv.virsh("define", path)
        q = lvt.domain(self.lv, self.procs, name, self.procs.tempdir(), checks)
        q.serial_path = serial
        return path, q


def snippets(site, dev, alias="ntb0", bus="pci.1"):
    p = ntbctl(site.b, "xml", dev, "--alias", alias, "--bus", bus)
    if p.returncode != 0:
        raise h.HarnessError(f"ntbctl xml {dev}: {p.stderr}")
    return p.stdout


def test_start_use_destroy(site):
    path, q = site.define("vm1", "probe,data", snippets(site, "hosta/nvme0"), {"seed": 31})
    chk = ntbctl(site.b, "xml", "--check", path)
    ok = result("ntbctl-xml-check", chk.returncode == 0 and "hosta/nvme0 as ntb0" in chk.stdout,
                output=chk.stdout.strip().splitlines()[0] if chk.stdout else chk.stderr.strip())
    site.lv.virsh("start", "vm1")
    attached = site.state() == "lent" and site.held_by_hostb() == ["hosta/nvme0"]
    # What libvirtd restarting does: the hook's reconnect finds the device still served.
    rc = subprocess.run([str(lvt.HOOK), "vm1", "reconnect", "begin", "-"],
                        input=site.lv.virsh("dumpxml", "vm1").stdout, capture_output=True,
                        text=True, timeout=30,
                        env={"VFIO_NTB_CONTROL": str(site.b.control), "PATH": "/usr/bin:/bin"})
    ok &= result("hook-reconnect-keeps-served", rc.returncode == 0 and rc.stderr == ""
                 and site.held_by_hostb() == ["hosta/nvme0"],
                 message=rc.stderr.strip().splitlines()[-1:])
    run = q.wait_done()
    # The guest powered off: libvirt ran release/end, which returned the device.
    returned = wait_for(lambda: site.state() == "available", 15)
    ver = h.verify_backing(site.img, run.data)
    ok &= result("libvirt-start-data-destroy", run.results.get("probe", {}).get("status") ==
                 "PASS" and run.results.get("data", {}).get("status") == "PASS" and attached
                 and len(ver) >= 4 and all(v["ok"] for v in ver) and bool(returned)
                 and site.held_by_hostb() == [],
                 serial=run.results.get("probe", {}).get("serial"), attached_at_start=attached,
                 returned=bool(returned))
    site.lv.virsh("undefine", "vm1")
    return ok


def refused(site, name, snip, expect, checks="probe"):
    """Define a domain and start it: the start must fail naming why, leaving nothing held."""
    path, _ = site.define(name, checks, snip)
    p = site.lv.virsh("start", name, check=False)
    running = name in site.lv.domains()
    site.lv.virsh("destroy", name, check=False)
    site.lv.virsh("undefine", name, check=False)
    return (p.returncode != 0 and expect in p.stderr and not running
            and site.held_by_hostb() == []), p.stderr.strip().splitlines()[-1:]


def test_refusals(site):
    ok = True
    good = snippets(site, "hosta/nvme0")
    bad_meta = good.replace("alias='ntb0'", "alias='0bad'")
    cases = [
        ("malformed-metadata", bad_meta, "alias"),
        # (ntbctl xml refuses a device nobody lends: the XML is the good one, edited)
        ("unknown-device", good.replace("hosta/nvme0", "hosta/nope")
         .replace("hosta-nvme0", "hosta-nope").replace("ntb0", "ntbx"),
         "hosta/nope"),
        ("access-list", snippets(site, "hosta/nvme1", alias="ntb1"), "hosta/nvme1"),
    ]
    for n, (what, snip, expect) in enumerate(cases):
        good_start, msg = refused(site, f"bad{n}", snip, expect)
        ok &= result(f"libvirt-refuses-{what}", good_start and site.state() == "available",
                     message=msg)
    # Already lent: hostc holds nvme0.
    site.cc.execute("borrow", device="hosta/nvme0")
    good_start, msg = refused(site, "busy", good, "hosta/nvme0")
    site.cc.execute("return", device="hosta/nvme0")
    ok &= result("libvirt-refuses-device-already-lent", good_start, message=msg)
    # Two devices, the second refused: the first goes back too (nothing half-attached).
    two = snippets(site, "hosta/nvme0") + snippets(site, "hosta/nvme1", alias="ntb1",
                                                   bus="pci.2")
    two = _merge_two(two)
    good_start, msg = refused(site, "half", two, "hosta/nvme1")
    sockets = list((site.b.run_dir).glob("*.sock"))
    ok &= result("libvirt-refusal-leaves-nothing", good_start and site.state() == "available"
                 and sockets == [], message=msg, sockets_left=len(sockets))
    return ok


def _merge_two(text):
    """Two `ntbctl xml` outputs -> one set of snippets (both devices in one metadata block,
    both -device args in one commandline)."""
    meta, _, cmd = lvt._split_snippets(text)
    second = text[text.rfind("<metadata>"):]
    meta2, _, cmd2 = lvt._split_snippets(second)
    dev2 = meta2[meta2.find("<vn:device "):meta2.find("</vn:devices>")]
    args2 = cmd2[cmd2.find("<qemu:arg"):cmd2.find("</qemu:commandline>")]
    meta = meta.replace("</vn:devices>", dev2 + "</vn:devices>")
    cmd = cmd.replace("</qemu:commandline>", args2 + "</qemu:commandline>")
    return meta + "\n<memoryBacking><source type='memfd'/><access mode='shared'/></memoryBacking>\n" + cmd


def declared_devices(site, lv, name):
    """How many devices domain @name's persistent definition declares, as `ntbctl xml
    --check` counts them (None when the check fails)."""
    f = site.wd / f"{name}-inactive.xml"
    f.write_text(lv.virsh("dumpxml", "--inactive", name).stdout)
    chk = ntbctl(site.b, "xml", "--check", f)
    m = re.search(r"declares (\d+) vfio-ntb device", chk.stdout)
    return int(m.group(1)) if chk.returncode == 0 and m else None


def test_hot_attach_detach(site):
    """ntbctl attach/detach --domain on a running domain: hot-plug on a free root port, the
    guest uses it, then unplug (the guest lets go), and the lease goes back.  The domain runs
    the patched QEMU, so the unplug goes through the device request (test_reassign's stock
    QEMU takes the device_del path)."""
    _, q = site.define("vm2", "plug-wait,unplug-wait", "", {"hotplug_timeout": 60},
                       emulator=h.patched_qemu())
    site.lv.virsh("start", "vm2")
    q.wait_line("VNREADY", "plug")
    t0 = time.monotonic()
    att = ntbctl(site.b, "attach", "hosta/nvme0", "--domain", "vm2", "--connect", site.lv.uri,
                 "--config")
    q.wait_line("VNEVENT", "added", timeout=60)
    ready_s = time.monotonic() - t0
    declared = [declared_devices(site, site.lv, "vm2")]
    q.wait_line("VNREADY", "unplug", timeout=90)
    det = ntbctl(site.b, "detach", "hosta/nvme0", "--domain", "vm2", "--connect", site.lv.uri,
                 "--config")
    declared.append(declared_devices(site, site.lv, "vm2"))
    run = q.wait_done(timeout=90)
    site.lv.virsh("undefine", "vm2", check=False)
    pw, uw = run.results.get("plug-wait", {}), run.results.get("unplug-wait", {})
    return result("libvirt-hot-attach-detach", att.returncode == 0 and det.returncode == 0
                  and "plugged into hostb:vm2" in att.stdout and "returned by hostb" in det.stdout
                  and "(device request)" in det.stdout and declared == [1, 0]
                  and pw.get("status") == "PASS" and pw.get("serial") == "VN-LV-0"
                  and uw.get("status") == "PASS" and uw.get("kernel_errors") == "0"
                  and site.state() == "available",
                  attach_to_ready_s=f"{ready_s:.2f}", removed_ms=uw.get("removed_ms"),
                  declared_after_attach_detach=declared,
                  attach=att.stdout.strip().splitlines()[-1:] or att.stderr.strip(),
                  detach=det.stdout.strip().splitlines()[:1] or det.stderr.strip())


def test_reassign(site):
    """A device declared by vm3 (on hostb) moves to vm4 on hostc with one ntbctl reassign:
    vm4's guest passes the data checks while vm3 keeps running; destroying vm4 returns it."""
    lvc = lvt.Libvirtd(site.procs, "hostc", site.c.control).start()
    # hostd shares hostc's libvirt here; its daemon is on no access list, so a reassign to it
    # fails after the source let go and must roll back.
    hosts = lvt.hosts_file(site.wd / "hosts.conf", ("hostb", site.b.control, site.lv.uri),
                           ("hostc", site.c.control, lvc.uri), ("hostd", site.d.control, lvc.uri))
    try:
        _, q3 = site.define("vm3", "probe,unplug-wait,pause", snippets(site, "hosta/nvme0"),
                            {"pause_s": 120, "hotplug_timeout": 90})
        site.lv.virsh("start", "vm3")
        q3.wait_line("VNREADY", "unplug")
        serial4 = site.wd / "vm4.serial"
        x4 = site.wd / "vm4.xml"
        x4.write_text(lvt.domain_xml("vm4", serial4, "plug-wait,data,pause",
                                     params={"data_mib": 16, "seed": 44, "pause_s": 120,
                                             "hotplug_timeout": 90}))
        lvc.virsh("define", x4)
        q4 = lvt.domain(lvc, site.procs, "vm4", site.procs.tempdir(), "plug-wait,data,pause")
        q4.serial_path = serial4
        lvc.virsh("start", "vm4")
        q4.wait_line("VNREADY", "plug")
        t0 = time.monotonic()
        p = ntbctl(site.c, "reassign", "hosta/nvme0", "--to", "hostc:vm4", "--hosts", hosts,
                   "--connect", lvc.uri, "--config")
        took = time.monotonic() - t0
        print(p.stdout + p.stderr, file=sys.stderr)
        # --config: the definitions follow, so vm3 can start again while vm4 has the device.
        defs = {"vm3": declared_devices(site, site.lv, "vm3"),
                "vm4": declared_devices(site, lvc, "vm4")}
        q3.wait_line("VNRESULT", "unplug-wait", timeout=30)
        q4.wait_line("VNREADY", "pause", timeout=180)
        vm3_running = "vm3" in site.lv.domains()
        held = [d["borrower"] for d in site.ca.execute("query-devices")
                if d["device"] == "hosta/nvme0"]
        # A reassign that fails half-way puts the device back where it was.
        rb = ntbctl(site.c, "reassign", "hosta/nvme0", "--to", "hostd:vm4", "--hosts", hosts,
                    "--connect", lvc.uri)
        back = [d["borrower"] for d in site.ca.execute("query-devices")
                if d["device"] == "hosta/nvme0"]
        plugged = ntbctl(site.c, "show", "hosta/nvme0", "--json").stdout
        ok_rb = result("libvirt-reassign-rolls-back", rb.returncode != 0
                       and "rolled back to hostc:vm4" in rb.stderr and back == ["hostc"]
                       and '"attached_to":"vm4"' in plugged.replace(" ", ""),
                       message=rb.stderr.strip().splitlines()[-1:])
        lvc.virsh("destroy", "vm4")
        returned = wait_for(lambda: site.state() == "available", 15)
        run4 = q4.run
        ver = h.verify_backing(site.img, run4.data)
        ok = result("libvirt-reassign", p.returncode == 0 and "done" in p.stdout and vm3_running
                    and "unplugged from hostb:vm3 (device_del)" in p.stdout
                    and held == ["hostc"] and run4.results.get("plug-wait", {}).get("status")
                    == "PASS" and run4.results.get("data", {}).get("status") == "PASS"
                    and len(ver) > 0 and all(v["ok"] for v in ver)
                    and q3.run.results.get("unplug-wait", {}).get("status") == "PASS",
                    reassign_s=f"{took:.2f}", vm3_kept_running=vm3_running, holder=held)
        ok &= ok_rb
        ok &= result("libvirt-destroy-returns", bool(returned) and site.held_by_hostb() == [],
                     state=site.state())
        # vm4 now declares the device: starting it again borrows it (the hook), as it would
        # after a host reboot.
        lvc.virsh("start", "vm4")
        at_start = site.cc.execute("query-device", device="hosta/nvme0")
        lvc.virsh("destroy", "vm4")
        ok &= result("libvirt-reassign-config",
                     "removed from hostb:vm3's configuration" in p.stdout
                     and "declared in hostc:vm4's configuration" in p.stdout
                     and defs == {"vm3": 0, "vm4": 1}
                     and at_start.get("borrower") == "hostc"
                     and at_start.get("attached_to") == "vm4"
                     and bool(wait_for(lambda: site.state() == "available", 15)),
                     declared=defs,
                     attached_at_start=at_start.get("attached_to"))
        # scripts/vfio-ntb-rebalance: a list of moves (here one: back into vm3, still running).
        reb = subprocess.run([str(h.REPO / "scripts" / "vfio-ntb-rebalance"), "--socket",
                              str(site.b.control), "--hosts", str(hosts), "--connect",
                              site.lv.uri], input="# rebalance\nhosta/nvme0 hostb:vm3\n",
                             capture_output=True, text=True, timeout=120,
                             env={**os.environ, "NTBCTL": str(NTBCTL)})
        shown = site.cb.execute("query-device", device="hosta/nvme0")
        ok &= result("rebalance-script", reb.returncode == 0 and "1 move(s) done" in reb.stdout
                     and shown.get("attached_to") == "vm3",
                     output=reb.stdout.strip().splitlines()[-1:] or reb.stderr.strip())
        site.lv.virsh("destroy", "vm3", check=False)
        ok &= result("libvirt-destroy-returns-hot-plugged",
                     bool(wait_for(lambda: site.state() == "available", 15)), state=site.state())
        for lv, name in ((site.lv, "vm3"), (lvc, "vm4")):
            lv.virsh("undefine", name, check=False)
        return ok
    finally:
        lvc.stop()


def test_hook_arguments(site):
    """The hook as libvirt runs it, with what libvirt should never send and a migration."""
    xml = lvt.domain_xml("vm9", site.wd / "vm9.serial", "probe",
                         snippets=snippets(site, "hosta/nvme0", alias="ntb9"))
    env = {"VFIO_NTB_CONTROL": str(site.b.control), "PATH": "/usr/bin:/bin"}

    def hook(*args, stdin=xml):
        return subprocess.run([str(lvt.HOOK), *args], input=stdin, capture_output=True,
                              text=True, env=env, timeout=30)
    few = hook("vm9", "prepare")
    mig = hook("vm9", "migrate", "begin", "-")
    other = hook("vm8", "prepare", "begin", "-")
    garbage = hook("vm9", "release", "end", "-", stdin="<domain><name>vm9</name>")
    ok = result("hook-unexpected-arguments", few.returncode != 0 and
                "expected NAME OP SUBOP EXTRA" in few.stderr and other.returncode != 0
                and "XML of domain vm9" in other.stderr and site.held_by_hostb() == [],
                message=few.stderr.strip())
    ok &= result("hook-refuses-migration", mig.returncode != 0 and "cannot migrate" in
                 mig.stderr, message=mig.stderr.strip())
    ok &= result("hook-release-logs-bad-xml", garbage.returncode == 0 and
                 "does not parse" in garbage.stderr, message=garbage.stderr.strip())
    # A domain's XML names the socket: the daemon creates it only in its run-dir.
    bad = 0
    for sock in ("/tmp/elsewhere.sock", f"{site.b.run_dir}/../x.sock",
                 f"{site.b.run_dir}/sub/x.sock", f"{site.b.run_dir}/x.txt"):
        try:
            site.cb.execute("attach", device="hosta/nvme0", domain="vm9", socket=sock)
        except ControlError as e:
            bad += e.klass == "InvalidParameter"
    ok &= result("attach-socket-confined-to-run-dir", bad == 4 and site.held_by_hostb() == [],
                 refused=bad)
    return ok


def main():
    ok = True
    with h.Procs() as procs:
        try:
            site = Site(procs)
            try:
                for test in (test_start_use_destroy, test_refusals, test_hook_arguments,
                             test_hot_attach_detach, test_reassign):
                    try:
                        ok &= test(site)
                    except h.HarnessError as e:
                        ok = h.failed(test.__name__, e)
            finally:
                site.lv.stop()
        except h.HarnessError as e:
            ok = h.failed("libvirt-site", e)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
