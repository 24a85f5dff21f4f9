"""Benches of the lending data path without a guest (bench/run-bench runs them).

Each starts vfio-ntb-simdev, a lending and a borrowing vfio-ntbd on a fresh shm fabric and runs
a C program from bench/ against the borrower's socket and a reference socket in one process,
rounds in ABBA order (bench/bench-stats.h).  forwarded-access and irq-relay run once per
crossing delay in CROSSING_DELAYS (env VN_BENCH_CROSSING_NS, default "0,400": the shm
fabric's crossing-delay-ns, a sender-side spin before every fabric message and doorbell,
fabric/shm.h), one JSON line each.
"""
import json
import os
import subprocess

import harness as h
from cluster import Daemon

REPO = h.REPO
ROUNDS = int(os.environ.get("VN_BENCH_ROUNDS", "3"))
CROSSING_DELAYS = [int(x) for x in os.environ.get("VN_BENCH_CROSSING_NS", "0,400").split(",")]
# ABBA needs an even number of rounds to be balanced.
AB_ROUNDS = max(2, ROUNDS + ROUNDS % 2)


def tool(name, *args, timeout=600):
    out = subprocess.run([str(REPO / "build" / "bench" / name)] + [str(a) for a in args],
                         capture_output=True, text=True, timeout=timeout)
    if out.returncode != 0:
        raise h.HarnessError(f"{name}: {out.stderr.strip()[-300:]}")
    return json.loads(out.stdout)


def lending_rig(procs, wd, devices, delay_ns=0, simdev_args=()):
    """Simdevs lent by hosta and borrowed by hostb.  @devices: {name: irq_mode}.  Returns
    ({name: simdev}, {name: borrower socket})."""
    fab = procs.tempdir("vn-fabric-")
    params = {"crossing-delay-ns": delay_ns} if delay_ns else {}
    sds = {}
    for name in devices:
        sds[name] = h.Simdev(procs, wd / f"{name}.sock", h.make_backing(wd / f"{name}.img", 16),
                             16, serial=f"VN-{name}", extra_args=simdev_args).start()
    Daemon(procs, wd, "hosta", fab, fabric_params=params,
           lends={n: sd.socket_path for n, sd in sds.items()}).start()
    b = Daemon(procs, wd, "hostb", fab, fabric_params=params,
               borrows={n: ("hosta", wd / f"vm-{n}.sock", mode)
                        for n, mode in devices.items()}).start(wait_sockets=True)
    return sds, {n: b.borrows[n][1] for n in devices}


def forwarded_access():
    """Round trip of a trapped access (4-byte REGION_READ of config offset 0) through the
    QEMU-facing borrower -> fabric -> lender -> device server, against the same access straight
    to a device server of its own (the same simdev binary), in one process, ABBA."""
    for delay in CROSSING_DELAYS:
        with h.Procs() as procs:
            wd = procs.tempdir()
            _, socks = lending_rig(procs, wd, {"nvme0": "fd"}, delay)
            direct = h.Simdev(procs, wd / "direct.sock", h.make_backing(wd / "d.img", 16),
                              16).start()
            r = tool("forwarded_access", socks["nvme0"], direct.socket_path, AB_ROUNDS, 2000)
        print(json.dumps({"bench": "forwarded-access", "crossing_delay_ns": delay, **r}),
              flush=True)


def forwarded_write():
    """A trapped BAR write (4-byte REGION_WRITE to BAR0, simdev --trap-bars) through the
    borrower, which posts it, against the same write straight to a device server of its own
    (also trapped), ABBA; each side's last write read back through it at the end (the tool
    fails when a posted write was lost or overtaken).  Goal: ratio <= 1.2."""
    for delay in CROSSING_DELAYS:
        with h.Procs() as procs:
            wd = procs.tempdir()
            _, socks = lending_rig(procs, wd, {"nvme0": "fd"}, delay, ["--trap-bars"])
            direct = h.Simdev(procs, wd / "direct.sock", h.make_backing(wd / "d.img", 16), 16,
                              extra_args=["--trap-bars"]).start()
            r = tool("forwarded_access", "--write", socks["nvme0"], direct.socket_path,
                     AB_ROUNDS, 2000)
        print(json.dumps({"bench": "forwarded-write", "crossing_delay_ns": delay,
                          "goal_ratio": 1.2, **r}), flush=True)


def attach_map():
    """Mapping a 4 GiB q35 guest's memory sections through the borrower at attach: the maps
    sent together as QEMU sends a memory transaction's (the borrower passes them on to the
    lender without waiting between them) against one map and its reply at a time, ABBA
    (bench/attach_map.c)."""
    with h.Procs() as procs:
        wd = procs.tempdir()
        _, socks = lending_rig(procs, wd, {"nvme0": "fd"})
        r = tool("attach_map", socks["nvme0"], AB_ROUNDS, 10)
    print(json.dumps({"bench": "attach-map", **r}), flush=True)


def irq_relay():
    """Device signal to VM eventfd: two simdevs lent to one borrowing daemon, one attached with
    relay interrupts, one with fd interrupts; build/bench/irq_latency (see its comment for the
    exact interval: completion entry seen in guest RAM -> eventfd read returns, for a Keep
    Alive admin command) against both, ABBA."""
    for delay in CROSSING_DELAYS:
        with h.Procs() as procs:
            wd = procs.tempdir()
            _, socks = lending_rig(procs, wd, {"relay0": "relay", "fd0": "fd"}, delay)
            r = tool("irq_latency", socks["relay0"], socks["fd0"], AB_ROUNDS, 1000)
        rel, fd = r["a"], r["b"]
        ratios = [a / max(b, 1) for a, b in zip(rel["round_signal_p50_ns"],
                                                fd["round_signal_p50_ns"])]
        print(json.dumps({
            "bench": "irq-relay", "crossing_delay_ns": delay,
            "interval": "NVMe Keep Alive completion entry visible in guest RAM -> VM eventfd "
                        "read returns (rtt: SQ doorbell store -> eventfd read returns)",
            "order": "ABBA", "samples_per_round": r["samples_per_round"],
            "relay_p50_ns": rel["signal_p50_ns"], "relay_p99_ns": rel["signal_p99_ns"],
            "fd_p50_ns": fd["signal_p50_ns"], "fd_p99_ns": fd["signal_p99_ns"],
            "relay_rtt_p50_ns": rel["rtt_p50_ns"], "fd_rtt_p50_ns": fd["rtt_p50_ns"],
            "rounds": [{"first": "relay" if i % 2 == 0 else "fd", "relay_p50_ns": a,
                        "fd_p50_ns": b} for i, (a, b) in enumerate(
                            zip(rel["round_signal_p50_ns"], fd["round_signal_p50_ns"]))],
            "spread": round(max(ratios) / min(ratios), 3) if min(ratios) > 0 else None,
            "spread_is": "max/min of per-round relay/fd p50 ratios",
        }), flush=True)


def setup_mmio_mapped():
    """A setup check, not a comparison: BAR0 loads through the borrower's mapping cost what
    loads of the device server's own mapping cost, i.e. the borrower hands QEMU a mapping and
    puts nothing in the MMIO path.  On the shm fabric in fd mode the borrower's window is the
    device's own memfd, so the ratio is 1.0 by construction when the mapping is set up."""
    tool_path = REPO / "build" / "bench" / "mmio_latency"
    with h.Procs() as procs:
        wd = procs.tempdir()
        _, socks = lending_rig(procs, wd, {"nvme0": "fd"})
        direct = h.Simdev(procs, wd / "direct.sock", h.make_backing(wd / "d.img", 16),
                          16).start()
        res = {"direct": [], "borrower": []}
        for i in range(AB_ROUNDS):
            order = [("borrower", socks["nvme0"]), ("direct", direct.socket_path)]
            for kind, sock in (order if i % 2 == 0 else order[::-1]):
                out = subprocess.run([str(tool_path), str(sock)], capture_output=True,
                                     text=True, timeout=120)
                if out.returncode != 0:
                    raise h.HarnessError(f"mmio_latency {kind}: {out.stderr.strip()}")
                res[kind].append(json.loads(out.stdout)["p50_ns"])
    ratios = [b / d for b, d in zip(res["borrower"], res["direct"])]
    print(json.dumps({"bench": "setup-mmio-mapped", "order": "ABBA",
                      "mapped": all(0.5 < x < 2.0 for x in ratios),
                      "borrower_p50_ns": res["borrower"], "direct_p50_ns": res["direct"],
                      "load_ratio": round(sorted(ratios)[len(ratios) // 2], 3),
                      "spread": round(max(ratios) / min(ratios), 3),
                      "spread_is": "max/min of per-round borrower/direct ratios"}), flush=True)
