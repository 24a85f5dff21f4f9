#!/usr/bin/python3
"""make demo: show vfio-ntb doing its job.

Three hosts on an emulated NTB fabric (processes on this machine sharing memory).  Host A
lends a simulated NVMe controller; the operator, with ntbctl on host B, lists the cluster,
attaches the drive to a VM on B, and a Linux guest (QEMU, TCG) uses it with its stock nvme
driver.  The counters show that while the guest moved its data no software of ours was in
the path; then the drive is returned and is available again.
"""
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import harness as h  # noqa: E402
from cluster import Daemon, simdev_stats  # noqa: E402

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
        sd = h.Simdev(procs, wd / "nvme0-device.sock", img, 256, serial="VN-DEMO-0001",
                      extra_args=["--stats-file", str(wd / "nvme0-device.stats")]).start()
        a = Daemon(procs, wd, "hosta", fab, lends={"nvme0": sd.socket_path},
                   allow={"nvme0": "hostb;hostc"}).start()
        b = Daemon(procs, wd, "hostb", fab).start()
        Daemon(procs, wd, "hostc", fab).start()
        time.sleep(1.5)   # one announcement round
        say("2. the operator looks at the cluster from host B")
        ntbctl(b, "nodes")
        ntbctl(b, "list")
        say("3. and attaches hosta/nvme0 to VM vm1 on host B (this borrows it: a lease)")
        ntbctl(b, "attach", "hosta/nvme0", "--domain", "vm1")
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
        say("demo: " + ("OK" if ok else "FAILED"))
        return 0 if ok else 1


if __name__ == "__main__":
    try:
        sys.exit(main())
    except h.HarnessError as e:
        print(f"demo: {e}", file=sys.stderr)
        sys.exit(1)
