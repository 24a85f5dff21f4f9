#!/usr/bin/python3
"""End-to-end: a device lent over the emulated NTB fabric.

Node A (vfio-ntbd) lends a vfio-ntb-simdev NVMe; node B (vfio-ntbd) borrows it and serves it
to a TCG guest through QEMU's stock vfio-user-pci.  What a user would check:
- the guest passes the data checks and A's backing file holds the data;
- no software in the data path: over the guest's data phase, forwarded MMIO, forwarded config
  accesses, relayed interrupts and fabric messages are all 0 in fd-passing mode; in relay mode
  every device interrupt is relayed once;
- QEMU killed: the lender unmaps DMA, disables interrupts and resets the device within 1 s,
  and a new VM can use the device;
- lender killed mid-I/O: the borrower reports the loss within 1 s and the VM keeps running;
- the device server stalled (SIGSTOP) past the lender's device timeout during guest I/O: the
  I/O completes and verifies, later device commands (a reset) get their own answers, and the
  stall is logged and shown by `ntbctl show` on the lending host;
- a guest behind its own IOMMU (intel-iommu): the data checks pass and verify on A's backing,
  the driver's unmaps were answered without the lender and its maps of the same pages taken
  back from the lingering ones (borrower.h), none refused, none missed;
- a device whose BAR the lender cannot map (simdev --trap-bars): every register access is
  forwarded and the borrower posts the writes (borrower-int.h); the guest's data checks pass
  with thousands of posted writes and none failed, and each of a run of writes is seen by
  the read that follows it (a posted write is never overtaken).
"""
import json
import signal
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import harness as h  # noqa: E402
import vfio_user_probe as probe  # noqa: E402
from harness import result, wait_for  # noqa: E402
from cluster import Daemon, simdev_stats  # noqa: E402
from control import Control  # noqa: E402

# tests/run-checks counts a result this file did not print as failed.
EXPECTED_RESULTS = 15


def cluster(procs, mode, size_mib=256, simdev_args=(), **daemon_args):
    wd = procs.tempdir()
    fab = procs.tempdir("vn-fabric-")
    img = h.make_backing(wd / "disk.img", size_mib)
    sd = h.Simdev(procs, wd / "dev.sock", img, size_mib, serial="VN-LENT-0001",
                  extra_args=["--stats-file", str(wd / "dev.stats"), *simdev_args]).start()
    a = Daemon(procs, wd, "hosta", fab, lends={"nvme0": sd.socket_path}, **daemon_args).start()
    b = Daemon(procs, wd, "hostb", fab, borrows={"nvme0": ("hosta", wd / "vm-nvme0.sock", mode)},
               **daemon_args).start(wait_sockets=True)
    return wd, img, sd, a, b


def counters(a, b, sd):
    sa, sb, sdv = a.stats(), b.stats(), simdev_stats(sd)
    lent = sa["lent"][0]
    bor = sb["borrowed"][0]
    vu = bor["vfio_user"]
    return {
        # The first hop: what QEMU asks of the borrower's own vfio-user server, including
        # the trapped accesses it answers itself from the BAR's window.
        "borrower_vfio_user_messages": vu["messages"],
        "borrower_region_accesses": vu["region_reads"] + vu["region_writes"],
        "forwarded_mmio": bor["region_forwarded"] + lent["region_rw"] - lent["config_rw"],
        "forwarded_config": bor["config_forwarded"] + lent["config_rw"],
        "relayed_irqs_lender": lent["relayed_irqs"],
        "relayed_irqs_borrower": bor["relayed_irqs"],
        # The device's own fabric traffic: lending requests both ways and doorbells.  The
        # daemons' once-a-second announcements share the link but carry no I/O; they are
        # reported apart (control_plane_messages) so the claim stays honest.
        "fabric_messages": (bor["fabric_requests"] + lent["requests"] +
                            sa["fabric"]["doorbells_sent"]),
        "control_plane_messages": (sa["fabric"]["msgs_sent"] + sa["fabric"]["msgs_received"] +
                                   sb["fabric"]["msgs_sent"] + sb["fabric"]["msgs_received"]),
        "fabric_doorbells": sa["fabric"]["doorbells_sent"],
        "device_interrupts": sdv["irqs_signalled"],
        "device_messages": sdv["messages"],
    }


def data_phase(procs, mode):
    """Boot a guest on B's socket; read the counters around its data check."""
    wd, img, sd, a, b = cluster(procs, mode)
    q = h.Qemu(procs, "probe,pause,data,pause", [h.VfioUserDevice(b.borrows["nvme0"][1])],
               params={"seed": 99, "pause_s": 3}, workdir=wd).start()
    q.wait_line("VNREADY", "pause")
    before = counters(a, b, sd)
    q.wait_line("VNREADY", "pause")
    after = counters(a, b, sd)
    run = q.wait_done()
    q.stop()
    ver = h.verify_backing(img, run.data)
    delta = {k: after[k] - before[k] for k in after}
    return run, ver, delta, b


def test_fd_mode(procs):
    run, ver, d, b = data_phase(procs, "fd")
    print(json.dumps({"test": "zero-software-data-path", "irq_mode": "fd", **d}), flush=True)
    probe = run.results.get("probe", {})
    ok = result("lending-fd-data", run.results.get("data", {}).get("status") == "PASS"
                and probe.get("serial") == "VN-LENT-0001" and len(ver) > 0
                and all(v["ok"] for v in ver), serial=probe.get("serial"),
                regions=len(ver), write_4k_mbps=run.results.get("data", {}).get("write_4k_mbps"))
    zero = ("borrower_vfio_user_messages", "borrower_region_accesses", "forwarded_mmio",
            "forwarded_config", "relayed_irqs_lender", "relayed_irqs_borrower",
            "fabric_messages", "device_messages")
    ok &= result("zero-software-data-path", d["device_interrupts"] > 1000
                 and all(d[k] == 0 for k in zero),
                 **{k: d[k] for k in zero + ("device_interrupts",)})
    return ok


def test_viommu_data(procs):
    wd, img, sd, a, b = cluster(procs, "fd")
    q = h.Qemu(procs, "probe,data,pause", [h.VIommu(), h.VfioUserDevice(b.borrows["nvme0"][1])],
               params={"seed": 41, "pause_s": 3}, workdir=wd,
               append_extra=h.VIommu.GUEST_APPEND).start()
    q.wait_line("VNREADY", "pause")
    bor = b.stats()["borrowed"][0]  # while its QEMU runs
    run = q.wait_done()
    q.stop()
    ver = h.verify_backing(img, run.data)
    # What QEMU said about its DMA maps and unmaps: nothing (a guest's IOMMU unmaps its whole
    # space in chunks at shutdown, and an unmap of nothing is no error, as with type1).
    said = [line.strip() for line in q.stderr_path.read_text(errors="replace").splitlines()
            if "dma" in line.lower() or "error reply" in line]
    keys = ("dma_maps", "dma_maps_here", "dma_unmaps_here", "dma_maps_refused", "unmaps_missed")
    return result("lending-viommu-data", run.results.get("data", {}).get("status") == "PASS"
                  and len(ver) > 0 and all(v["ok"] for v in ver)
                  and bor["dma_maps_here"] > 0 and bor["dma_unmaps_here"] > 0
                  and bor["dma_maps_refused"] == 0 and bor["unmaps_missed"] == 0 and not said,
                  regions=len(ver), qemu_dma_errors=len(said),
                  first=(said[0] if said else "-").replace(" ", "_")[:120],
                  **{k: bor[k] for k in keys})


def test_relay_mode(procs):
    run, ver, d, b = data_phase(procs, "relay")
    print(json.dumps({"test": "relay-data-path", "irq_mode": "relay", **d}), flush=True)
    ok = result("lending-relay-data", run.results.get("data", {}).get("status") == "PASS"
                and len(ver) > 0 and all(v["ok"] for v in ver), regions=len(ver))
    ok &= result("relay-interrupts-equal-completions",
                 d["device_interrupts"] > 1000
                 and d["relayed_irqs_lender"] == d["device_interrupts"]
                 and d["relayed_irqs_borrower"] == d["fabric_doorbells"]
                 and d["forwarded_mmio"] == 0 and d["forwarded_config"] == 0,
                 device=d["device_interrupts"], relayed=d["relayed_irqs_lender"],
                 doorbells=d["fabric_doorbells"], borrower=d["relayed_irqs_borrower"])
    return ok


def test_qemu_killed_then_new_vm(procs):
    wd, img, sd, a, b = cluster(procs, "fd")
    sock = b.borrows["nvme0"][1]
    q = h.Qemu(procs, "probe,data", [h.VfioUserDevice(sock)], params={"seed": 5},
               workdir=wd).start()
    q.wait_line("VNINFO", "data region=")           # mid-I/O
    live = simdev_stats(sd)
    assert live["dma_mappings_now"] > 0 and live["irq_vectors_armed"] > 0
    t0 = time.monotonic()
    q.proc.send_signal(signal.SIGKILL)

    def fenced_now():
        st = simdev_stats(sd)
        return (st if st["dma_mappings_now"] == 0 and st["irq_vectors_armed"] == 0
                and st["resets"] > live["resets"] else None)
    fenced = wait_for(fenced_now, 5.0)
    t_fence = time.monotonic() - t0
    # The fence as the device saw it: no DMA mapping, no interrupt eventfd, a reset.
    ok = result("qemu-killed-dma-unmapped", bool(fenced) and t_fence <= 1.0,
                seconds=f"{t_fence:.2f}", irq_vectors=(fenced or {}).get("irq_vectors_armed"),
                resets=(fenced or {}).get("resets"))
    q.stop()
    q2 = h.Qemu(procs, "probe,data", [h.VfioUserDevice(sock)], params={"seed": 6},
                workdir=procs.tempdir()).start()
    run = q2.wait_done()
    q2.stop()
    ver = h.verify_backing(img, run.data)
    ok &= result("new-vm-after-kill", run.ok and all(v["ok"] for v in ver) and len(ver) > 0,
                 regions=len(ver))
    return ok


def test_reset_and_hotplug(procs):
    """The guest's PCI reset (FLR, turned into a RESET of the lent device) and a hot-unplug +
    re-plug on a pcie-root-port, over the lending path.  The simdev offers MSI here: stock
    QEMU aborts hot-unplugging any vfio-user-pci device with MSI-X (docs/lending.md)."""
    wd, img, sd, a, b = cluster(procs, "fd", size_mib=128, simdev_args=["--interrupts", "msi"])
    dev = h.VfioUserDevice(b.borrows["nvme0"][1], bus="rp1")
    q = h.Qemu(procs, "probe,reset,hotplug-wait", [dev], params={"seed": 12, "data_mib": 8},
               root_port=True, workdir=wd).start()
    t = h.hotplug_cycle(q, dev)
    run = q.wait_done()
    q.stop()
    ver = h.verify_backing(img, run.data)
    resets = a.stats()["lent"][0]["resets"]
    ok = result("lending-reset", run.results.get("reset", {}).get("status") == "PASS"
                and resets >= 1, method=run.results.get("reset", {}).get("method"),
                lender_resets=resets)
    return ok & result("lending-hotplug", run.results.get("hotplug-wait", {}).get("status")
                       == "PASS" and len(ver) > 0 and all(v["ok"] for v in ver),
                       deleted_s=f"{t['device_deleted_s']:.2f}",
                       readded_s=f"{t['guest_added_s']:.2f}")


def test_lender_killed(procs):
    wd, img, sd, a, b = cluster(procs, "fd")
    q = h.Qemu(procs, "probe,data", [h.VfioUserDevice(b.borrows["nvme0"][1])],
               params={"seed": 8}, workdir=wd).start()
    q.wait_line("VNINFO", "data region=")
    t0 = time.monotonic()
    a.kill()
    # The lender's daemon may be restarting (its lender worker keeps the data path): the
    # borrower gives it lease-timeout-ms (3 s here) before the device is lost.
    lost = wait_for(lambda: b.stats()["borrowed"][0]["lender_lost"], 8.0)
    t_lost = time.monotonic() - t0
    alive = q.proc.poll() is None
    # The lender worker kept the data path after its daemon died, so a guest may finish its
    # data check meanwhile and power off: a clean end (exit 0, VNDONE, data PASS) is not a
    # crash either.
    finished = False
    if not alive:
        try:
            run = q.wait_done(timeout=10)
            finished = q.proc.returncode == 0 and run.results.get("data", {}).get("status") \
                == "PASS"
        except h.HarnessError as e:   # it died without its guest's VNDONE
            print(e, file=sys.stderr)
    q.stop()
    return result("lender-killed-link-down", bool(lost) and 2.5 <= t_lost <= 5.5
                  and (alive or finished), seconds=f"{t_lost:.2f}", lease_timeout_s=3,
                  vm_still_running=alive, guest_finished_cleanly=finished)


STALL_S = 4.5   # longer than the lender's 3 s for one device command


def test_device_server_stall(procs):
    """The device server stops answering (SIGSTOP, not dead) for longer than the lender's
    device timeout while the guest reads config space and does I/O, then goes on."""
    wd, img, sd, a, b = cluster(procs, "fd", lease_timeout_ms=20000)
    q = h.Qemu(procs, "probe,stall,reset", [h.VfioUserDevice(b.borrows["nvme0"][1])],
               params={"seed": 31}, workdir=wd).start()
    q.wait_line("VNREADY", "stall")
    sd.proc.send_signal(signal.SIGSTOP)
    try:
        time.sleep(STALL_S)
    finally:
        sd.proc.send_signal(signal.SIGCONT)
    run = q.wait_done()
    q.stop()
    ver = h.verify_backing(img, run.data)
    stall = run.results.get("stall", {})
    # The I/O was in flight across the stall: it took at least the stall's length.
    ok = result("device-server-stall-io", stall.get("status") == "PASS" and len(ver) > 0
                and all(v["ok"] for v in ver) and int(stall.get("io_ms", 0)) >= STALL_S * 1000,
                io_ms=stall.get("io_ms"), regions=len(ver))
    lent = a.stats()["lent"][0]
    reset = run.results.get("reset", {})
    ok &= result("device-server-stall-commands-in-step",
                 reset.get("status") == "PASS" and lent["resets"] >= 1
                 and lent["device_timeouts"] >= 1 and lent["device_late_replies"] >= 1,
                 reset=reset.get("status"), timeouts=lent["device_timeouts"],
                 late=lent["device_late_replies"])
    ctl = Control(a.control)
    try:
        shown = ctl.execute("query-device", device="hosta/nvme0")
    finally:
        ctl.close()
    logged = "did not answer" in a.log() and "late answer was dropped" in a.log()
    return ok & result("device-server-stall-shown",
                       shown.get("device_server") == "answering" and logged
                       and "answered after" in (shown.get("last_stall") or ""),
                       device_server=shown.get("device_server"), logged=logged,
                       last_stall=(shown.get("last_stall") or "-").replace(" ", "_")[:80])


def test_trapped_bars(procs):
    wd, img, sd, a, b = cluster(procs, "fd", simdev_args=["--trap-bars"])
    sock = b.borrows["nvme0"][1]
    q = h.Qemu(procs, "probe,data", [h.VfioUserDevice(sock)],
               params={"seed": 41, "data_mib": 16}, workdir=wd).start()
    run = q.wait_done()
    q.stop()
    ver = h.verify_backing(img, run.data)
    bor = b.stats()["borrowed"][0]
    ok = result("posted-writes-guest-data", run.results.get("data", {}).get("status") == "PASS"
                and len(ver) > 0 and all(v["ok"] for v in ver) and bor["posted_writes"] > 1000
                and bor["posted_write_failures"] == 0,
                regions=len(ver), posted_writes=bor["posted_writes"],
                failed=bor["posted_write_failures"], forwarded=bor["region_forwarded"])
    # The guest's QEMU is gone: a client of our own writes the admin queue's address (the
    # controller is disabled now) and reads it back at once, again and again.
    wait_for(lambda: not b.stats()["borrowed"][0]["client_connected"], 10)
    posted_before = b.stats()["borrowed"][0]["posted_writes"]
    wrong = []
    with probe.ConfigReader(sock) as r:
        for k in range(1, 301):
            want = (k << 12).to_bytes(4, "little")
            r.write_region(probe.BAR0, 0x28, want)
            got = r.read_region(probe.BAR0, 0x28)
            if got != want:
                wrong.append(f"{k}:{got.hex()}")
    posted = b.stats()["borrowed"][0]["posted_writes"] - posted_before
    return ok & result("posted-writes-ordered", not wrong and posted >= 300, writes=300,
                       posted=posted, overtaken=len(wrong), first=wrong[0] if wrong else "-")


def main():
    ok = True
    for test in (test_fd_mode, test_viommu_data, test_relay_mode, test_qemu_killed_then_new_vm,
                 test_reset_and_hotplug, test_lender_killed, test_device_server_stall,
                 test_trapped_bars):
        with h.Procs() as procs:
            try:
                ok &= test(procs)
            except (h.HarnessError, AssertionError, KeyError, IndexError) as e:
                ok = h.failed(test.__name__, e)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
