"""Control-plane benches of vfio-ntbd clusters, for bench/run-bench (one JSON line each).

- borrow-latency: how long a VM waits for a borrowed device.  Two nodes on one shm fabric,
  hosta lends a simdev, hostb borrows it.  A sample is hostb's `attach` (borrow + the lender's
  ATTACH to the device server + hostb's vfio-user server) from sending the request until the
  returned socket accepts a connection, i.e. until QEMU could start.  `detach` + `return`
  follow, untimed.  SAMPLES samples (env VN_BENCH_BORROW_SAMPLES, default 100, at least 50)
  after one untimed warm-up (which also leaves hostb its spare worker, daemon/spare.h).  The
  goal is p99 <= 10 ms; reported, not asserted.  An attach that fails is counted
  (failed_attaches, first_failure) and left out of the samples.
- scale-64x8: NODES daemons (env VN_BENCH_SCALE_NODES, default 64) on one fabric, each lending
  DEVICES devices (VN_BENCH_SCALE_DEVICES, default 8).  The nvme0 of the first ATTACHED nodes
  (VN_BENCH_SCALE_ATTACHED, default 4) is a real simdev, attached by the next node before the
  storm, so borrower workers exist (attached, worker_rss_kib; each of those hosts keeps a
  spare worker too: spare_workers, spare_rss_kib); the other devices' servers do
  not exist: borrow and return never reach a device server (only attach does), so the
  cluster's own cost is measured.  converge_s: from the first daemon's start until every node
  lists every device as reachable; then each daemon's VmRSS (goal <= 16 MiB, reported only)
  and what the idle cluster costs in CPU (idle_cpu_pct, all daemons, % of one core); then a
  storm of OPS borrow/return operations (VN_BENCH_SCALE_OPS, default 1000) from THREADS
  concurrent clients (VN_BENCH_SCALE_THREADS, default 8), each a random node borrowing a
  random device of another node (never an attached one) and returning it.  Latencies are
  reported by outcome: storm_borrow_* (granted borrows; storm_borrow_p99_ms, goal <= 50 ms),
  storm_refused_* (refused borrows: DeviceBusy when two clients wanted the same device, a
  valid outcome, counted in busy_refusals; other refusals by kind in storm_errors) and
  storm_return_*, each with its count (_n), p50 and p99.  lent_after_storm: devices other
  than the attached ones still lent once the storm is over and the cluster had LENT_WAIT_S
  to settle (a leak when not 0).
- scale-128x8: the same with twice NODES daemons (128 by default), so that how the cost
  grows with the cluster is on record (converge_s, max_rss_kib, idle_cpu_pct, storm p99).
"""
import json
import os
import random
import socket
import statistics
import threading
import time

import harness as h
from cluster import Daemon
from control import Control, ControlError

SAMPLES = max(50, int(os.environ.get("VN_BENCH_BORROW_SAMPLES", "100")))
# Attaches that may fail (each noted) before the bench gives up.
MAX_FAILED_ATTACHES = 5
NODES = int(os.environ.get("VN_BENCH_SCALE_NODES", "64"))
DEVICES = int(os.environ.get("VN_BENCH_SCALE_DEVICES", "8"))
OPS = int(os.environ.get("VN_BENCH_SCALE_OPS", "1000"))
THREADS = int(os.environ.get("VN_BENCH_SCALE_THREADS", "8"))
CONVERGE_TIMEOUT_S = float(os.environ.get("VN_BENCH_SCALE_CONVERGE_S", "120"))
IDLE_S = 5.0
LENT_WAIT_S = 15.0
STORM_TIMEOUT_S = float(os.environ.get("VN_BENCH_SCALE_STORM_S", "300"))
# Nodes whose nvme0 is a real simdev, attached (a borrower worker each) by the next node
# before the storm; the storm leaves those devices alone.
ATTACHED = int(os.environ.get("VN_BENCH_SCALE_ATTACHED", "4"))


def percentile(values, p):
    """Nearest-rank percentile: a value that was measured, never an interpolation."""
    s = sorted(values)
    return s[max(0, min(len(s) - 1, -(-len(s) * p // 100) - 1))]


def ms(seconds):
    return round(seconds * 1000, 3)


def wait_for(pred, timeout, what, step=0.02):
    deadline = time.monotonic() + timeout
    while True:
        v = pred()
        if v:
            return v
        if time.monotonic() > deadline:
            raise h.Timeout(f"{what}: not within {timeout} s")
        time.sleep(step)


def connectable(path):
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        s.connect(str(path))
        return True
    except (FileNotFoundError, ConnectionRefusedError):
        return False
    finally:
        s.close()


def cpu_s(pid):
    """User + system CPU seconds of a process so far."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def our_pids(marker, binary, spares=False):
    """Pids of processes running @binary (a file name) whose command line mentions @marker
    (a path of this run's, e.g. the daemons' work directory, where their ports are): workers
    are started by vfio-ntbd, not by the harness, so they are found in /proc.  With @spares,
    only the spare borrower workers (started ahead of need, waiting: --spare-fd), else only
    the others."""
    pids = []
    for p in os.listdir("/proc"):
        if not p.isdigit():
            continue
        try:
            with open(f"/proc/{p}/cmdline", "rb") as f:
                argv = f.read().split(b"\0")
        except OSError:
            continue
        spare = len(argv) > 1 and argv[1].startswith(b"--spare-fd=")
        if argv and os.path.basename(argv[0]).decode(errors="replace") == binary and \
                any(str(marker).encode() in a for a in argv) and spare == spares:
            pids.append(int(p))
    return pids


def rss_kib(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise h.HarnessError(f"pid {pid}: no VmRSS")


# --------------------------------------------------------------------------------------------
# borrow-latency


def borrow_latency():
    with h.Procs() as procs:
        wd = procs.tempdir()
        sd = h.Simdev(procs, wd / "dev.sock", h.make_backing(wd / "a.img", 16), 16,
                      serial="VN-BENCH-BORROW").start()
        fab = procs.tempdir("vn-fabric-")
        a = Daemon(procs, wd, "hosta", fab, lends={"nvme0": sd.socket_path}).start()
        b = Daemon(procs, wd, "hostb", fab).start()
        try:
            lat, failed = _borrow_samples(b)
        except (h.HarnessError, ControlError, OSError) as e:
            raise h.HarnessError(f"borrow-latency: {type(e).__name__}: {e}\n"
                                 f"--- hosta ---\n{a.log()[-1500:]}\n"
                                 f"--- hostb ---\n{b.log()[-1500:]}") from None
        print(json.dumps({"bench": "borrow-latency", "samples": len(lat),
                          "p50_ms": ms(statistics.median(lat)),
                          "p99_ms": ms(percentile(lat, 99)), "max_ms": ms(max(lat)),
                          "min_ms": ms(min(lat)), "goal_p99_ms": 10,
                          "failed_attaches": failed["count"],
                          "first_failure": failed["first"]}), flush=True)


def _borrow_samples(b, dev="hosta/nvme0"):
    """SAMPLES latencies (s), and the attaches that failed: {"count", "first"}."""
    ctl = Control(b.control)
    failed = {"count": 0, "first": None}
    # The link comes up on a heartbeat; no sample should include that second.
    wait_for(lambda: any(d["device"] == dev and d["state"] == "available"
                         for d in ctl.execute("query-devices")), 10, f"{b.name} sees {dev}")

    def sample():
        t0 = time.perf_counter()
        try:
            path = ctl.execute("attach", device=dev, domain="vm1")["socket"]
        except ControlError as e:
            # A failed attach is a finding, not the end of the bench: note it, give the
            # lease back (the borrow half may have worked), go on.  Too many end it.
            failed["count"] += 1
            failed["first"] = failed["first"] or (f"after {ms(time.perf_counter() - t0)} ms: "
                                                  f"{e}")[:200]
            if failed["count"] > MAX_FAILED_ATTACHES:
                raise
            try:
                ctl.execute("return", device=dev)
            except ControlError:
                pass
            return None
        # The reply comes once the server listens; the check keeps that promise honest.
        wait_for(lambda: connectable(path), 5, f"{path} accepting", step=0.0005)
        took = time.perf_counter() - t0
        # Detach ends the lender's session with the simdev (it serves one client at a
        # time), so every sample starts from a device nobody holds.
        ctl.execute("detach", device=dev)
        ctl.execute("return", device=dev)
        return took

    sample()   # warm-up: the first connection to the simdev, the first windows
    lat = []
    while len(lat) < SAMPLES:
        t = sample()
        if t is not None:
            lat.append(t)
    ctl.close()
    return lat, failed


# --------------------------------------------------------------------------------------------
# scale-64x8


def node_name(i):
    return f"node{i:02d}"


def reachable(ctl):
    return sum(1 for d in ctl.execute("query-devices") if d["state"] != "unreachable")


def start_cluster(procs, wd, fab, nodes):
    """Start @nodes daemons one after another (each waits for its control socket), so the
    two cores are not all spent on process start-up while the first ones link up."""
    daemons = []
    for i in range(nodes):
        name = node_name(i)
        # Sockets nobody serves: borrow/return never connect to them.
        lends = {f"nvme{j}": wd / f"absent-{i}-{j}.sock" for j in range(DEVICES)}
        if i < ATTACHED:
            sd = h.Simdev(procs, wd / f"sim-{i}.sock", h.make_backing(wd / f"sim-{i}.img", 16),
                          16, serial=f"VN-SCALE-{i}").start()
            lends["nvme0"] = sd.socket_path
        # A long lease timeout: a daemon starved of CPU for a beat must not lose leases.
        daemons.append(Daemon(procs, wd, name, fab, lends=lends, lease_timeout_ms=60000)
                       .start(timeout=30))
    return daemons


def converge(daemons, t0):
    """Poll until every node lists every node's DEVICES devices as reachable; the seconds
    since t0."""
    want = len(daemons) * DEVICES
    ctls = [Control(d.control, timeout=30) for d in daemons]
    pending = set(range(len(daemons)))
    deadline = t0 + CONVERGE_TIMEOUT_S
    seen = {}
    while True:
        for i in sorted(pending):
            seen[i] = reachable(ctls[i])
            if seen[i] == want:
                pending.discard(i)
        if not pending:
            took = time.monotonic() - t0
            # A node counted early could have lost a link since: all at once, or go on.
            pending = {i for i in range(len(daemons)) if reachable(ctls[i]) != want}
            if not pending:
                break
        if time.monotonic() > deadline:
            short = {daemons[i].name: seen[i] for i in sorted(pending)[:8]}
            raise h.Timeout(f"scale: {len(pending)} nodes do not see {want} devices after "
                            f"{CONVERGE_TIMEOUT_S} s (e.g. {short})")
        time.sleep(0.25)
    for c in ctls:
        c.close()
    return took


def attach_some(daemons):
    """Node i+1 attaches node i's simdev-backed nvme0 (i < ATTACHED): a borrower worker each,
    serving a socket.  Returns how many."""
    n = min(ATTACHED, len(daemons) - 1)
    for i in range(n):
        ctl = Control(daemons[i + 1].control, timeout=30)
        path = ctl.execute("attach", device=f"{node_name(i)}/nvme0", domain=f"vm{i}")["socket"]
        ctl.close()
        wait_for(lambda: connectable(path), 10, f"{path} accepting")
    return n


def storm(daemons):
    """OPS borrow/return operations from THREADS clients; returns the counters."""
    lock = threading.Lock()
    # latencies (s) by outcome: a granted borrow, a refused borrow, a return
    out = {"lat": {"borrow": [], "refused": [], "return": []}, "busy": 0, "errors": {},
           "why": {}, "done": 0}
    deadline = time.monotonic() + STORM_TIMEOUT_S
    names = [d.name for d in daemons]

    def count_error(key, text):
        out["errors"][key] = out["errors"].get(key, 0) + 1
        # The first of each kind, to say what went wrong.
        out["why"].setdefault(key, text[:200])

    def op(ctls, node, cmd, device):
        """One timed operation; the error class or None."""
        try:
            # Connecting (and the greeting) is not part of an operation.
            if node not in ctls:
                ctls[node] = Control(daemons[names.index(node)].control, timeout=30)
        except OSError as e:
            with lock:
                out["done"] += 1   # untimed, but counted: a dead daemon must end the storm
                count_error(f"connect:{type(e).__name__}", f"{node}: {e}")
            return type(e).__name__
        t0 = time.perf_counter()
        try:
            ctls[node].execute(cmd, device=device)
            klass = None
        except ControlError as e:
            klass, why = e.klass, e.desc
        except OSError as e:
            # A timed-out or dropped connection is out of step: start a new one.
            ctls.pop(node).close()
            klass, why = type(e).__name__, str(e)
        took = time.perf_counter() - t0
        with lock:
            kind = cmd if cmd == "return" else ("borrow" if klass is None else "refused")
            out["lat"][kind].append(took)
            out["done"] += 1
            if klass == "DeviceBusy" and cmd == "borrow":
                out["busy"] += 1
            elif klass is not None:
                count_error(f"{cmd}:{klass}", f"{node} {cmd} {device} after {ms(took)} ms: "
                                              f"{why}")
        return klass

    def worker(seed):
        rng = random.Random(seed)   # seeded: every run asks for the same operations
        ctls = {}
        try:
            while True:
                with lock:
                    if out["done"] >= OPS or time.monotonic() > deadline:
                        return
                borrower, lender = rng.sample(names, 2)
                # the attached nvme0s stay with their VMs
                first = 1 if names.index(lender) < ATTACHED else 0
                device = f"{lender}/nvme{rng.randrange(first, DEVICES)}"
                if op(ctls, borrower, "borrow", device) is None:
                    op(ctls, borrower, "return", device)
        finally:
            for c in ctls.values():
                c.close()

    t0 = time.monotonic()
    ts = [threading.Thread(target=worker, args=(1000 + i,), daemon=True) for i in range(THREADS)]
    for t in ts:
        t.start()
    for t in ts:
        t.join(max(1.0, deadline - time.monotonic() + 60))
    out["seconds"] = time.monotonic() - t0
    out["timed_out"] = out["done"] < OPS
    return out


def scale(nodes=NODES, name="scale-64x8"):
    with h.Procs() as procs:
        wd = procs.tempdir()
        fab = procs.tempdir("vn-fabric-")
        daemons = []
        try:
            _scale(procs, wd, fab, daemons, nodes, name)
        except (h.HarnessError, ControlError, OSError) as e:
            dead = [d.name for d in daemons if d.proc.poll() is not None]
            log = daemons[0].log()[-1500:] if daemons else ""
            raise h.HarnessError(f"{name}: {type(e).__name__}: {e}; daemons exited: "
                                 f"{dead or 'none'}\n--- first daemon's log ---\n{log}") from None


def _scale(procs, wd, fab, daemons, nodes, name):
    t0 = time.monotonic()
    daemons += start_cluster(procs, wd, fab, nodes)
    start_s = time.monotonic() - t0
    converge_s = converge(daemons, t0)
    rss = [rss_kib(d.proc.pid) for d in daemons]
    # What an idle cluster costs (heartbeats: every node announces to every other each
    # second), in % of one core for all daemons together.
    c0 = sum(cpu_s(d.proc.pid) for d in daemons)
    time.sleep(IDLE_S)
    idle_pct = (sum(cpu_s(d.proc.pid) for d in daemons) - c0) / IDLE_S * 100
    attached = attach_some(daemons)
    workers = our_pids(wd, "vfio-ntb-borrower")
    if len(workers) != attached:
        raise h.HarnessError(f"scale: {attached} devices attached, {len(workers)} workers")
    worker_rss = max((rss_kib(p) for p in workers), default=0)
    # Each host that attached keeps a spare worker (daemon/spare.h): what one costs.
    spares = our_pids(wd, "vfio-ntb-borrower", spares=True)
    spare_rss = max((rss_kib(p) for p in spares), default=0)
    s = storm(daemons)
    rss_after = [rss_kib(d.proc.pid) for d in daemons]
    # Every pair returned what it borrowed, so nothing should stay lent.  A borrow that timed
    # out may still have been granted: the borrower's next announcements end such a lease.
    # Wait for that (bounded); what is left is a leak.
    ctl = Control(daemons[0].control, timeout=30)
    t_end = time.monotonic()
    while True:
        lent = [d["device"] for d in ctl.execute("query-devices") if d["state"] == "lent" and
                not (d["device"].endswith("/nvme0") and
                     d["device"].split("/")[0] in {node_name(i) for i in range(attached)})]
        if not lent or time.monotonic() - t_end > LENT_WAIT_S:
            break
        time.sleep(0.5)
    settle_s = time.monotonic() - t_end
    ctl.close()
    stats = {}
    for kind, lat in s["lat"].items():
        stats[f"storm_{kind}_n"] = len(lat)
        stats[f"storm_{kind}_p50_ms"] = ms(statistics.median(lat)) if lat else None
        stats[f"storm_{kind}_p99_ms"] = ms(percentile(lat, 99)) if lat else None
    every = [x for lat in s["lat"].values() for x in lat] or [0.0]
    print(json.dumps({
        "bench": name, "nodes": nodes, "devices_per_node": DEVICES,
        "start_s": round(start_s, 2), "converge_s": round(converge_s, 2),
        "max_rss_kib": max(rss), "mean_rss_kib": round(statistics.mean(rss)),
        "max_rss_after_storm_kib": max(rss_after), "goal_rss_kib": 16384,
        "idle_cpu_pct": round(idle_pct, 1), "attached": attached,
        "worker_rss_kib": worker_rss,
        "spare_workers": len(spares), "spare_rss_kib": spare_rss,
        "storm_ops": s["done"], "storm_threads": THREADS, "storm_s": round(s["seconds"], 2),
        **stats, "goal_storm_borrow_p99_ms": 50,
        "storm_max_ms": ms(max(every)), "busy_refusals": s["busy"],
        "storm_errors": s["errors"], "storm_error_samples": s["why"],
        "storm_timed_out": s["timed_out"], "lent_after_storm": len(lent),
        "lent_settle_s": round(settle_s, 2),
        "daemons_exited": [d.name for d in daemons if d.proc.poll() is not None],
    }), flush=True)
