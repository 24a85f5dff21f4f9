#!/usr/bin/python3
"""make demo: show vfio-ntb doing its job.

Three hosts on an emulated NTB fabric (processes on this machine sharing memory).  Host A
lends a simulated NVMe controller; the operator, with ntbctl on host B, lists the cluster,
attaches the drive to a VM on B, and a Linux guest (QEMU, TCG) uses it with its stock nvme
driver.  The counters show that while the guest moved its data no software of ours was in
the path; then the drive is returned and is available again.  Last, with libvirt on hosts B
and C: a domain on B that declares the drive in its XML gets it when it starts, and one
`ntbctl reassign` moves it into a running domain on C, whose guest uses it while B's keeps
running.  Then a real PCI function: in a VM with an IOMMU and Linux VFIO (the lender host),
host A lends its NVMe with `managed = yes` and host B's consumer drives it through the mapped
BAR, DMA through the IOMMU and MSI-X; the drive goes back to the host's nvme driver after.
"""
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import harness as h  # noqa: E402
import libvirtd as lvt  # noqa: E402
from cluster import Daemon, simdev_stats  # noqa: E402
from lenderhost import LenderHost  # noqa: E402

NTBCTL = str(h.REPO / "build" / "ntbctl")


def say(text=""):
    print(text, flush=True)


def ntbctl(node, *args):
    """Run ntbctl against @node's daemon, show the command and its output."""
    say(f"   $ ntbctl {' '.join(args)}      # on {node.name}")
    out = subprocess.run([NTBCTL, "--socket", str(node.control), *args], capture_output=True,
                         text=True, timeout=30)
    for line in (out.stdout + out.stderr).rstrip().splitlines():
        say(f"     {line}")
    if out.returncode != 0:
        raise h.HarnessError(f"ntbctl {' '.join(args)} exited {out.returncode}")
    return out.stdout


def counters(a, b, sd):
    sa, sb, dev = a.stats(), b.stats(), simdev_stats(sd)
    lent, bor = sa["lent"][0], sb["borrowed"][0]
    return {
        "MMIO forwarded": bor["region_forwarded"] + lent["region_rw"] - lent["config_rw"],
        "config forwarded": bor["config_forwarded"],
        "interrupts relayed": lent["relayed_irqs"],
        "fabric messages": bor["fabric_requests"] + lent["requests"],
        "device interrupts": dev["irqs_signalled"],
    }


def main():
    with h.Procs() as procs:
        wd = procs.tempdir("vn-demo-")
        fab = procs.tempdir("vn-fabric-")
        img = h.make_backing(wd / "nvme.img", 256)
        say("== vfio-ntb demo: a VM on host B uses an NVMe drive that lives in host A ==")
        say("1. host A runs a simulated NVMe controller (vfio-ntb-simdev, 256 MiB);")
        say("   vfio-ntbd runs on hosts A, B and C; A lends the drive to B and C")
        # MSI, not MSI-X: stock QEMU aborts hot-unplugging a vfio-user device with MSI-X
        # (fixed by qemu-patches/0002), and step 9 unplugs it from a running VM.
        sd = h.Simdev(procs, wd / "nvme0-device.sock", img, 256, serial="VN-DEMO-0001",
                      extra_args=["--stats-file", str(wd / "nvme0-device.stats"),
                                  "--interrupts", "msi"]).start()
        a = Daemon(procs, wd, "hosta", fab, lends={"nvme0": sd.socket_path},
                   allow={"nvme0": "hostb;hostc"}).start()
        b = Daemon(procs, wd, "hostb", fab).start()
        c = Daemon(procs, wd, "hostc", fab).start()
        time.sleep(1.5)   # one announcement round
        say("2. the operator looks at the cluster from host B")
        ntbctl(b, "nodes")
        ntbctl(b, "list")
        say("3. and attaches hosta/nvme0 to VM vm1 on host B (this borrows it: a lease)")
        ntbctl(b, "attach", "hosta/nvme0", "--domain", "vm1", "--serve-only")
        sock = b.run_dir / "vm1-hosta-nvme0.sock"
        say("4. QEMU on host B starts vm1 with -device vfio-user-pci on that socket")
        q = h.Qemu(procs, "probe,pause,data,pause", [h.VfioUserDevice(sock)],
                   params={"seed": 2026, "pause_s": 2}, workdir=wd).start()
        q.wait_line("VNREADY", "pause")
        before = counters(a, b, sd)
        p = q.run.results.get("probe", {})
        say(f"   the guest's nvme driver bound {p.get('bdf')} class {p.get('class')}: "
            f"'{p.get('model', '').replace('_', ' ')}', serial {p.get('serial')}, "
            f"{int(p.get('size_sectors', 0)) * 512 >> 20} MiB")
        q.wait_line("VNREADY", "pause")
        after = counters(a, b, sd)
        run = q.wait_done()
        q.stop()
        d = run.results.get("data", {})
        say(f"5. the guest wrote, read back and compared random data: {d.get('status')}")
        say(f"   O_DIRECT 4 KiB write {d.get('write_4k_mbps')} MB/s, read "
            f"{d.get('read_4k_mbps')} MB/s; 1 MiB write {d.get('write_1m_mbps')} MB/s, read "
            f"{d.get('read_1m_mbps')} MB/s (TCG, no KVM)")
        ver = h.verify_backing(img, run.data)
        good = [v for v in ver if not v["superseded"] and v["ok"]]
        say(f"   after power-off host A's backing file holds the guest's data: "
            f"{len(good)}/{len([v for v in ver if not v['superseded']])} regions match")
        say("6. counters over the guest's data phase (after - before):")
        for k in before:
            say(f"   {k:20} {after[k] - before[k]}")
        say("   -> doorbells went through the mapped BAR window, data through guest memory")
        say("      exported to host A, interrupts straight to the VM's eventfds.")
        say("7. the VM is gone: detach and return the drive; it is available again")
        ntbctl(b, "detach", "hosta/nvme0")
        ntbctl(b, "return", "hosta/nvme0")
        listing = ntbctl(b, "list")
        ok = (run.ok and len(good) > 0 and "available" in listing and
              all(after[k] == before[k] for k in before if k != "device interrupts"))
        ok &= libvirt_part(procs, wd, a, b, c)
        ok &= vfio_part(procs)
        say("demo: " + ("OK" if ok else "FAILED"))
        return 0 if ok else 1


def libvirt_part(procs, wd, a, b, c):
    say("8. libvirt: hosts B and C each run libvirtd with vfio-ntb's hook")
    lvb = lvt.Libvirtd(procs, "hostb", b.control).start()
    lvc = lvt.Libvirtd(procs, "hostc", c.control).start()
    try:
        hosts = lvt.hosts_file(wd / "hosts.conf", ("hostb", b.control, lvb.uri),
                               ("hostc", c.control, lvc.uri))
        say("   domain web1 on host B declares the drive; ntbctl prints what to put in its XML")
        snip = ntbctl(b, "xml", "hosta/nvme0", "--alias", "ntb0", "--bus", "pci.1")
        x1 = wd / "web1.xml"
        x1.write_text(lvt.domain_xml("web1", wd / "web1.serial", "probe,unplug-wait,pause",
                                     params={"pause_s": 60, "hotplug_timeout": 60},
                                     snippets=snip))
        lvb.virsh("define", x1)
        q1 = lvt.domain(lvb, procs, "web1", procs.tempdir(), "probe")
        q1.serial_path = wd / "web1.serial"
        say("   $ virsh start web1      # on hostb: the hook borrows and attaches the drive")
        lvb.virsh("start", "web1")
        q1.wait_line("VNREADY", "unplug")
        p = q1.run.results.get("probe", {})
        say(f"   web1's guest has it: {p.get('status')} serial {p.get('serial')}")
        say("   domain batch1 runs on host C, without the drive")
        x2 = wd / "batch1.xml"
        x2.write_text(lvt.domain_xml("batch1", wd / "batch1.serial", "plug-wait,pause",
                                     params={"pause_s": 60, "hotplug_timeout": 60}))
        lvc.virsh("define", x2)
        q2 = lvt.domain(lvc, procs, "batch1", procs.tempdir(), "plug-wait")
        q2.serial_path = wd / "batch1.serial"
        lvc.virsh("start", "batch1")
        q2.wait_line("VNREADY", "plug")
        say("9. one command moves the drive from web1 (host B) to batch1 (host C), live; with")
        say("   --config the domains' definitions follow (web1 can restart without it)")
        ntbctl(c, "reassign", "hosta/nvme0", "--to", "hostc:batch1", "--hosts", str(hosts),
               "--connect", lvc.uri, "--config")
        q2.wait_line("VNREADY", "pause", timeout=120)
        pw = q2.run.results.get("plug-wait", {})
        q1.wait_line("VNEVENT", "removed", timeout=30)
        web1_up = "web1" in lvb.domains()
        say(f"   batch1's guest got it in {pw.get('added_ms')} ms and wrote, read back and "
            f"compared 4 MiB: {pw.get('status')}; web1 still running: {web1_up}")
        lvc.virsh("destroy", "batch1")
        back = wait_for_state(a, "available")
        say(f"   batch1 destroyed: the hook returned the drive ({'available' if back else '?'})")
        return pw.get("status") == "PASS" and web1_up and back
    finally:
        lvb.stop()
        lvc.stop()


def vfio_part(procs):
    say("10. a real PCI function through Linux VFIO, in a VM with an IOMMU (both hosts in it)")
    lh = LenderHost(procs, "demo_vfio.py")
    lines = lh.run()
    for ln in lines:
        if ln.startswith("   ") or ln.startswith("VFIO-DEMO"):
            say(ln)
    return "VFIO-DEMO OK" in lines


def wait_for_state(a, state, timeout=15):
    from control import Control
    ctl = Control(a.control)
    return h.wait_for(lambda: ctl.execute("query-device", device="hosta/nvme0")["state"] ==
                      state, timeout)


if __name__ == "__main__":
    try:
        sys.exit(main())
    except h.HarnessError as e:
        print(f"demo: {e}", file=sys.stderr)
        sys.exit(1)
