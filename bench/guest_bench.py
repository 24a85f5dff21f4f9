"""Benches with a guest (bench/run-bench runs them): the test VM's `bench` check (sequential
O_DIRECT dd, 4 KiB and 1 MiB, write then read, tests/guest/init) on different devices.

Every A/B comparison runs its rounds in ABBA order (A B, B A, A B, ...; ROUNDS rounds, env
VN_BENCH_ROUNDS, default 3, made even), one fresh VM per side per round, and reports each
round's values and "spread": max/min of the per-round A/B ratios (1.0 = every round agreed).
TCG timings drift, so only ratios mean much.

CPU figures: utime + stime from /proc/PID/stat of the host processes named, read when the guest
prints "VNEVENT bench-start" and again at "VNEVENT bench-end bytes=N" (the data phase only: no
boot, no probe, no test-data generation), divided by the GiB the guest moved (N / 2^30).  The
harness sees those lines through the serial log, polled every 50 ms, so each window is up to
that much wider than the phase.
"""
import json
import os
import statistics
import subprocess
import time
from pathlib import Path

import harness as h
from cluster import Daemon
from cluster_bench import cpu_s, our_pids

REPO = h.REPO
ROUNDS = int(os.environ.get("VN_BENCH_ROUNDS", "3"))
AB_ROUNDS = max(2, ROUNDS + ROUNDS % 2)
MIB = int(os.environ.get("VN_BENCH_MIB", "32"))
FIELDS = ("write_4k_mbps", "read_4k_mbps", "write_1m_mbps", "read_1m_mbps")
GIB = float(1 << 30)


def qemu_root():
    """The testbed's QEMU root (the stock QEMU wrapper of scripts/testbed-qemu names it)."""
    if os.environ.get("VN_QEMU_ROOT"):
        return Path(os.environ["VN_QEMU_ROOT"])
    for line in Path(h.stock_qemu()).read_text().splitlines():
        if line.startswith("R="):
            return Path(line[2:].strip().strip('"'))
    raise h.HarnessError("cannot find the testbed's QEMU root in its wrapper")


def root_tool(name):
    """argv prefix running @name from the QEMU root through that root's own loader, as the
    testbed's wrappers do."""
    r = qemu_root()
    return [str(r / "usr/lib64/ld-linux-x86-64.so.2"), "--library-path",
            str(r / "usr/lib/x86_64-linux-gnu"), str(r / "usr/bin" / name)]


class NbdDisk:
    """A virtio-blk disk on an NBD export: the device a user without vfio-ntb would give a
    guest for a remote disk."""

    def __init__(self, socket_path, export="disk0", id="d0"):
        self.socket_path, self.export, self.id = str(socket_path), export, id

    def qemu_args(self):
        blk = {"driver": "nbd", "node-name": f"{self.id}-nbd", "export": self.export,
               "server": {"type": "unix", "path": self.socket_path}}
        dev = {"driver": "virtio-blk-pci", "id": self.id, "drive": f"{self.id}-nbd"}
        return ["-blockdev", json.dumps(blk), "-device", json.dumps(dev)]


def start_nbd(procs, wd, img):
    """qemu-storage-daemon serving @img over NBD on a UNIX socket; returns (proc, socket)."""
    sock = wd / "nbd.sock"
    argv = root_tool("qemu-storage-daemon") + [
        "--blockdev", json.dumps({"driver": "file", "node-name": "file0", "filename": str(img)}),
        "--blockdev", json.dumps({"driver": "raw", "node-name": "disk0", "file": "file0"}),
        "--nbd-server", json.dumps({"addr": {"type": "unix", "path": str(sock)}}),
        "--export", json.dumps({"type": "nbd", "id": "exp0", "node-name": "disk0",
                                "name": "disk0", "writable": True})]
    procs.track(sock)
    with open(wd / "nbd.log", "wb") as log:
        p = procs.start("qemu-storage-daemon", argv, stdout=log, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 15
    while not sock.exists():
        if p.poll() is not None or time.monotonic() > deadline:
            raise h.HarnessError("qemu-storage-daemon did not start:\n" +
                                 (wd / "nbd.log").read_text(errors="replace")[-1500:])
        time.sleep(0.02)
    return p, sock


def borrower_requests(daemon):
    """The requests @daemon's borrower workers sent their lenders so far (its stats file)."""
    return sum(x["fabric_requests"] for x in daemon.stats().get("borrowed", []))


def guest_run(kind, mib=MIB, rounds=1):
    """One VM running the bench check on a device of @kind ("simdev": vfio-ntb-simdev through
    QEMU's vfio-user-pci; "builtin": QEMU's nvme; "lending": the simdev lent by one vfio-ntbd
    and borrowed by another over the shm fabric, fd interrupts; "lending-viommu": the same
    behind the guest's own IOMMU (intel-iommu, the guest's driver maps each I/O's buffers);
    "nbd": virtio-blk on qemu-storage-daemon's NBD export).  Returns {"mbps": {field: MB/s},
    "bytes": N, "cpu_s": {group: CPU s over the data phase}, "fabric_requests": the borrower's
    requests to its lender over the data phase (lending kinds)}."""
    with h.Procs() as procs:
        wd = procs.tempdir()
        img = h.make_backing(wd / "disk.img", mib * 2)
        groups = {}
        params = {"bench_mib": mib, "rounds": rounds}
        devices, append, b = [], "", None
        if kind == "lending-viommu":
            devices, append = [h.VIommu()], h.VIommu.GUEST_APPEND
        if kind in ("simdev", "lending", "lending-viommu"):
            sd = h.Simdev(procs, wd / "nvme.sock", img, mib * 2, serial="VN-BENCH").start()
            groups["simdev"] = lambda: [sd.proc.pid]
            dev = h.VfioUserDevice(sd.socket_path)
            if kind.startswith("lending"):
                fab = procs.tempdir("vn-fabric-")
                a = Daemon(procs, wd, "hosta", fab, lends={"nvme0": sd.socket_path}).start()
                b = Daemon(procs, wd, "hostb", fab,
                           borrows={"nvme0": ("hosta", wd / "vm.sock", "fd")}
                           ).start(wait_sockets=True)
                dev = h.VfioUserDevice(b.borrows["nvme0"][1])
                groups["vfio_ntb"] = lambda: [a.proc.pid, b.proc.pid] + \
                    our_pids(wd, "vfio-ntb-borrower")
        elif kind == "builtin":
            dev = h.BuiltinNvme(img, serial="VN-BENCH")
        elif kind == "nbd":
            p, sock = start_nbd(procs, wd, img)
            groups["nbd"] = lambda: [p.pid]
            dev = NbdDisk(sock)
            params["bench_disk"] = "vda"
        else:
            raise ValueError(kind)
        q = h.Qemu(procs, "bench", devices + [dev], params=params, workdir=wd,
                   append_extra=append).start()
        q.wait_line("VNEVENT", "bench-start")
        pids = {g: f() for g, f in groups.items()}
        c0 = {g: sum(cpu_s(p) for p in ps) for g, ps in pids.items()}
        f0 = borrower_requests(b) if b is not None else 0
        end = q.wait_line("VNEVENT", "bench-end")
        c1 = {g: sum(cpu_s(p) for p in ps) for g, ps in pids.items()}
        f1 = borrower_requests(b) if b is not None else 0
        run = q.wait_done()
        q.stop()
        r = run.results.get("bench", {})
        if r.get("status") != "PASS":
            raise h.HarnessError(f"guest bench on {kind} failed: {r}")
        nbytes = int(end.split("bytes=")[1].split()[0])
        # one round: each field is one value
        return {"mbps": {f: float(r[f]) for f in FIELDS}, "bytes": nbytes,
                "cpu_s": {g: c1[g] - c0[g] for g in groups}, "fabric_requests": f1 - f0,
                "processes": {g: len(ps) for g, ps in pids.items()}}


def abba(a, b, rounds=AB_ROUNDS, **kw):
    """Rounds of guest_run(a) and guest_run(b) in ABBA order: ({a: [...], b: [...]}, order)."""
    runs, order = {a: [], b: []}, []
    for i in range(rounds):
        for kind in ((a, b) if i % 2 == 0 else (b, a)):
            runs[kind].append(guest_run(kind, **kw))
        order.append(a if i % 2 == 0 else b)
    return runs, order


def compare(runs, a, b, order, names=None):
    """Per-round and overall A/B throughput ratios: (fields for the JSON line).  @names
    renames the kinds in the output ({"lending": "vfio_ntb"})."""
    nm = dict(names or {})
    na, nb = nm.get(a, a), nm.get(b, b)
    per_round = []
    for i, (ra, rb) in enumerate(zip(runs[a], runs[b])):
        ratios = {f: ra["mbps"][f] / rb["mbps"][f] for f in FIELDS}
        per_round.append({"first": nm.get(order[i], order[i]), f"{na}_mbps": ra["mbps"],
                          f"{nb}_mbps": rb["mbps"],
                          "ratio": round(statistics.geometric_mean(ratios.values()), 3)})
    med = {k: {f: statistics.median(r["mbps"][f] for r in runs[k]) for f in FIELDS}
           for k in (a, b)}
    ratios = {f: round(med[a][f] / med[b][f], 3) for f in FIELDS}
    rr = [x["ratio"] for x in per_round]
    return {"order": "ABBA", "mib": MIB,
            # one number: the geometric mean of the four per-pattern ratios of the medians
            "throughput_ratio": round(statistics.geometric_mean(ratios.values()), 3),
            "ratios": ratios, f"{na}_mbps": med[a], f"{nb}_mbps": med[b], "rounds": per_round,
            "spread": round(max(rr) / min(rr), 3),
            "spread_is": "max/min of the per-round ratios (geometric means of 4 patterns)"}


def simdev_vs_builtin():
    """vfio-ntb-simdev through QEMU's stock vfio-user-pci against QEMU's built-in nvme."""
    runs, order = abba("simdev", "builtin")
    print(json.dumps({"bench": "simdev-vs-builtin", **compare(runs, "simdev", "builtin",
                                                              order)}), flush=True)


def setup_lending_path():
    """A setup check, not a comparison of two paths: the guest's I/O through the lending path
    (lender and borrower vfio-ntbd, shm fabric, fd interrupts) against the same simdev
    attached directly.  On shm in fd mode the borrower hands QEMU the device's own BAR memfd
    and the device maps guest RAM's own memfd, so the data path is the same kernel objects
    and the ratio is 1.0 by construction; it says the lending path is set up (no trapped
    BARs, no relayed interrupts), nothing about an NTB's cost (see forwarded-access and
    irq-relay for that)."""
    runs, order = abba("lending", "simdev")
    c = compare(runs, "lending", "simdev", order)
    print(json.dumps({"bench": "setup-lending-path",
                      "path_ok": 0.8 <= c["throughput_ratio"] <= 1.25, **c}), flush=True)


def per_gib(runs, group):
    vals = [r["cpu_s"][group] / (r["bytes"] / GIB) for r in runs]
    return round(statistics.median(vals), 4), [round(v, 4) for v in vals]


def host_cpu():
    """CPU of vfio-ntb's own processes (both vfio-ntbd and the borrower worker) per GiB the
    guest moved on the lending path, during the data phase only; the simdev (the stand-in for
    the hardware, which on a real host is the device itself) is reported apart.  Goal: 0 in
    steady state (mapped BARs, direct DMA, fd interrupts: nothing of ours on the data path)."""
    runs = [guest_run("lending") for _ in range(max(1, ROUNDS // 2))]
    v, vr = per_gib(runs, "vfio_ntb")
    s, sr = per_gib(runs, "simdev")
    print(json.dumps({"bench": "host-cpu", "cpu_s_per_gib": v, "rounds": vr, "goal": 0,
                      "simdev_cpu_s_per_gib": s, "simdev_rounds": sr,
                      "gib_per_round": round(runs[0]["bytes"] / GIB, 3),
                      # one clock tick of /proc/PID/stat, per GiB moved in a round
                      "resolution_s_per_gib": round(1 / os.sysconf("SC_CLK_TCK") /
                                                    (runs[0]["bytes"] / GIB), 4),
                      "processes": runs[0]["processes"],
                      "window": "VNEVENT bench-start .. bench-end (data phase only)"}),
          flush=True)


def vs_nbd():
    """What a user without vfio-ntb would pick for a remote disk: the same kind of backing file
    served over NBD by qemu-storage-daemon (the testbed's QEMU) to a virtio-blk disk, against
    the guest on the lent simulated NVMe.  Guest throughput (4 KiB and 1 MiB) and the serving
    side's CPU per GiB over the data phase: the NBD server's, and vfio-ntb's own processes'
    (the simdev, which does the file I/O that the NBD server does itself, is reported
    apart).  throughput_ratio is vfio-ntb/nbd."""
    runs, order = abba("lending", "nbd")
    c = compare(runs, "lending", "nbd", order, names={"lending": "vfio_ntb"})
    v, _ = per_gib(runs["lending"], "vfio_ntb")
    s, _ = per_gib(runs["lending"], "simdev")
    n, _ = per_gib(runs["nbd"], "nbd")
    print(json.dumps({"bench": "vs-nbd", **c, "nbd_cpu_s_per_gib": n,
                      "vfio_ntb_cpu_s_per_gib": v, "simdev_cpu_s_per_gib": s}), flush=True)


VIOMMU_MIB = int(os.environ.get("VN_BENCH_VIOMMU_MIB", "8"))


def viommu_io():
    """The secure setup: the guest's own IOMMU (intel-iommu) in front of the lent device, so
    the guest's driver maps and unmaps each I/O's buffers and QEMU tells the borrower of each
    (DMA_MAP / DMA_UNMAP), against the same guest without it.  ratio: throughput with it over
    without (geometric mean of the four patterns, goal >= 0.8); fabric_requests_per_mib: the
    borrower's requests to its lender per MiB the guest moved in the data phase (a map of a
    page that does not linger at the lender is one, and each run of lingering pages unmapped
    there: borrower.h)."""
    runs, order = abba("lending-viommu", "lending", mib=VIOMMU_MIB)
    c = compare(runs, "lending-viommu", "lending", order,
                names={"lending-viommu": "viommu", "lending": "plain"})

    def per_mib(kind):
        return round(statistics.median(r["fabric_requests"] / (r["bytes"] / (1 << 20))
                                       for r in runs[kind]), 2)

    print(json.dumps({"bench": "viommu-io", "ratio": c.pop("throughput_ratio"), "goal": 0.8,
                      "fabric_requests_per_mib": per_mib("lending-viommu"),
                      "plain_fabric_requests_per_mib": per_mib("lending"), **c,
                      "mib": VIOMMU_MIB}), flush=True)
