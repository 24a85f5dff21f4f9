#!/usr/bin/python3
"""End-to-end: the Prometheus metrics a node_exporter textfile collector would serve.

hosta lends a simulated NVMe device, hostb borrows it and serves it on a vfio-user socket, and
a client makes config accesses through it (build/bench/forwarded_access, a vfio-user client
like QEMU).  Both daemons write [node] metrics-file every 200 ms.  What an operator would
check: the files parse with the Prometheus client's own parser, mode 0644, no temporary file
left; their values are the ones `ntbctl --json stats` shows; the lease's state is reported on
both sides (the lender's naming the holder and its VM) and follows a return; the file says when a daemon stopped; the stats file (SIGUSR1)
carries a timestamp; `ntbctl stats` says what it counts and that the data path is not
among it; and the shipped alert rules pass `promtool check rules`, and fire the device-lost
alert (and only then) on series a borrower really wrote while its lender was gone.
"""
import datetime
import json
import os
import re
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

import yaml
from prometheus_client.parser import text_string_to_metric_families

sys.path.insert(0, str(Path(__file__).resolve().parent))
import harness as h  # noqa: E402
from harness import result, wait_for  # noqa: E402
from cluster import Daemon  # noqa: E402
from control import Control, ControlError  # noqa: E402

# tests/run-checks counts a result this file did not print as failed.
EXPECTED_RESULTS = 8

DEV = "hosta/nvme0"
ALERTS = h.REPO / "systemd" / "vfio-ntb-alerts.yml"
INTERVAL_MS = 200
ACCESSES = 300          # config reads the client makes through the borrower


class MetricsDaemon(Daemon):
    """A cluster.Daemon whose [node] also names a metrics file."""

    def __init__(self, *args, **kw):
        super().__init__(*args, **kw)
        self.metrics = self.wd / f"{self.name}.prom"

    def config_text(self):
        return super().config_text().replace(
            "[node]\n", f"[node]\nmetrics-file = {self.metrics}\n"
            f"metrics-interval-ms = {INTERVAL_MS}\n", 1)


def parse(path):
    """{(sample name, ((label, value), ...)): value} and the families, by the real parser."""
    fams = list(text_string_to_metric_families(path.read_text()))
    samples = {}
    for f in fams:
        for s in f.samples:
            key = (s.name, tuple(sorted(s.labels.items())))
            if key in samples:
                raise ValueError(f"{path.name}: {key} twice")
            samples[key] = s.value
    return fams, samples


def value(samples, name, **labels):
    return samples.get((name, tuple(sorted(labels.items()))))


def stamp(path):
    try:
        return value(parse(path)[1], "vfio_ntb_metrics_timestamp_seconds",
                     node=path.stem) or 0
    except (OSError, ValueError):
        return 0


def fresh(d, after):
    """The metrics of @d once a file written after @after (Unix time) is there."""
    if not wait_for(lambda: stamp(d.metrics) > after, 5):
        raise h.Timeout(f"{d.metrics}: not rewritten within 5 s")
    return parse(d.metrics)


def ntbctl(d, *args):
    p = subprocess.run([str(h.REPO / "build" / "ntbctl"), "--socket", str(d.control), *args],
                       capture_output=True, text=True, timeout=30)
    return p.returncode, p.stdout, p.stderr


def ntbctl_stats(d):
    """`ntbctl --json stats`: the daemon's answer (in "return" once --json has an envelope)."""
    rc, out, err = ntbctl(d, "--json", "stats")
    if rc != 0:
        raise h.HarnessError(f"ntbctl stats on {d.name}: {rc} {err.strip()}")
    j = json.loads(out)
    return j["return"] if isinstance(j, dict) and "return" in j else j


def test_file(a, b):
    """Both files parse with prometheus_client's parser; every family has HELP and TYPE,
    counters end in _total; mode 0644, no temporary file beside them."""
    bad = []
    for d in (a, b):
        fams, samples = fresh(d, 0)
        mode = stat.S_IMODE(os.stat(d.metrics).st_mode)
        if mode != 0o644:
            bad.append(f"{d.name}:mode {oct(mode)}")
        if Path(f"{d.metrics}.tmp").exists():
            bad.append(f"{d.name}:tmp left")
        text = d.metrics.read_text()
        for f in fams:
            full = f.name + ("_total" if f.type == "counter" else "")
            if not full.startswith("vfio_ntb_") or f.type not in ("counter", "gauge") \
                    or f"# HELP {full} " not in text or f"# TYPE {full} {f.type}\n" not in text:
                bad.append(f"{d.name}:{full}:{f.type}")
            if any(s.labels.get("node") != d.name for s in f.samples):
                bad.append(f"{d.name}:{full}:node label")
        if value(samples, "vfio_ntb_up", node=d.name) != 1:
            bad.append(f"{d.name}:up")
    return result("metrics-file-parses", not bad, families=len(parse(a.metrics)[0]),
                  samples=len(parse(b.metrics)[1]), problems=";".join(bad)[:300] or "none")


# query-stats member -> (metric, extra labels); the lender's "bar" is region_rw - config_rw.
LENDER = [("config_rw", "vfio_ntb_forwarded_accesses_total", {"space": "config"}),
          ("requests", "vfio_ntb_lender_requests_total", {}),
          ("relayed_irqs", "vfio_ntb_relayed_interrupts_total", {}),
          ("dma_maps", "vfio_ntb_dma_maps_total", {}),
          ("resets", "vfio_ntb_device_resets_total", {}),
          ("fences", "vfio_ntb_fences_total", {})]
BORROWER = [("config_forwarded", "vfio_ntb_forwarded_accesses_total", {"space": "config"}),
            ("region_forwarded", "vfio_ntb_forwarded_accesses_total", {"space": "bar"}),
            ("config_virtualized", "vfio_ntb_config_virtualized_total", {}),
            ("fabric_requests", "vfio_ntb_lender_requests_total", {}),
            ("dma_maps", "vfio_ntb_dma_maps_total", {}),
            ("dma_maps_refused", "vfio_ntb_dma_maps_refused_total", {}),
            ("dma_maps_here", "vfio_ntb_dma_here_total", {"op": "map"}),
            ("dma_unmaps_here", "vfio_ntb_dma_here_total", {"op": "unmap"}),
            ("dma_lingering", "vfio_ntb_dma_lingering", {}),
            ("relayed_irqs", "vfio_ntb_relayed_interrupts_total", {}),
            ("posted_writes", "vfio_ntb_posted_writes_total", {}),
            ("posted_write_failures", "vfio_ntb_posted_write_failures_total", {})]
FABRIC = [("msgs_sent", "vfio_ntb_fabric_messages_sent_total"),
          ("msgs_received", "vfio_ntb_fabric_messages_received_total"),
          ("bad_messages", "vfio_ntb_fabric_bad_messages_total"),
          ("requests_held", "vfio_ntb_fabric_requests_held_total")]


def compare(d, role, before, samples, after):
    """Mismatches between @d's metrics and its `ntbctl --json stats` taken just before and
    just after the file was written: a device's counters (quiet now) exactly, the fabric's
    (heartbeats go on) between the two."""
    bad = []
    side = "lent" if role == "lender" else "borrowed"
    st0, st1 = before[side][0], after[side][0]
    if st0 != st1:
        return [f"{d.name}: the device's counters moved while quiet"]
    pairs = [(st0.get(k), m, x) for k, m, x in (LENDER if role == "lender" else BORROWER)]
    if role == "lender":
        pairs.append((st0["region_rw"] - st0["config_rw"], "vfio_ntb_forwarded_accesses_total",
                      {"space": "bar"}))
    for want, metric, extra in pairs:
        got = value(samples, metric, node=d.name, device=DEV, role=role, **extra)
        if want is None or got != want:
            bad.append(f"{d.name}:{metric}{extra}={got}!={want}")
    for key, metric in FABRIC:
        got = value(samples, metric, node=d.name)
        if got is None or not before["fabric"][key] <= got <= after["fabric"][key]:
            bad.append(f"{d.name}:{metric}={got} not in {before['fabric'][key]}.."
                       f"{after['fabric'][key]}")
    return bad


def test_values(a, b):
    """The counters in the files are the ones `ntbctl --json stats` shows, on both sides of
    the lease, and the client's config reads are among them."""
    bad, seen = [], {}
    for d, role in ((a, "lender"), (b, "borrower")):
        for _ in range(5):
            before = ntbctl_stats(d)
            _, samples = fresh(d, time.time())
            after = ntbctl_stats(d)
            problems = compare(d, role, before, samples, after)
            if not problems:
                break
            time.sleep(0.3)
        bad += problems
        seen[role] = value(samples, "vfio_ntb_forwarded_accesses_total", node=d.name,
                           device=DEV, role=role, space="config")
    return result("metrics-match-ntbctl-stats", not bad and all(
        (v or 0) >= ACCESSES for v in seen.values()),
        lender_config_accesses=seen.get("lender"), borrower_config_accesses=seen.get("borrower"),
        problems=";".join(bad)[:400] or "none")


def lease_state(d, role, state, **more):
    _, samples = fresh(d, time.time())
    return value(samples, "vfio_ntb_lease_state", node=d.name, device=DEV, role=role, state=state,
                 **more)


def test_lease_state(a, b):
    """The borrowed device's lease is reported by the borrower (held, attached) and the lender
    (held), and a return shows on the lender (free) and takes it off the borrower's file."""
    _, sb = fresh(b, time.time())
    borrower_held = value(sb, "vfio_ntb_lease_state", node="hostb", device=DEV, role="borrower",
                          state="held")
    borrower_lost = value(sb, "vfio_ntb_lease_state", node="hostb", device=DEV, role="borrower",
                          state="lost")
    attached = value(sb, "vfio_ntb_attached", node="hostb", device=DEV, role="borrower")
    # On the lender, which VM on which host has it: one query, and `ntbctl list`.
    lender_held = wait_for(lambda: lease_state(a, "lender", "held", borrower="hostb",
                                               domain="vm1"), 5)
    listed = [x for x in Control(a.control).execute("query-devices") if x["device"] == DEV]
    lender_lists = listed[0].get("attached_to") if listed else None
    link = value(sb, "vfio_ntb_peer_link_up", node="hostb", peer="hosta")
    Control(b.control).execute("detach", device=DEV)
    Control(b.control).execute("return", device=DEV)
    freed = wait_for(lambda: lease_state(a, "lender", "free") == 1, 5)
    _, sb = fresh(b, time.time())
    gone = not any(dict(k[1]).get("device") == DEV for k in sb)
    return result("metrics-lease-state", borrower_held == 1 and borrower_lost == 0
                  and attached == 1 and lender_held == 1 and link == 1 and bool(freed) and gone
                  and lender_lists == "vm1",
                  borrower_held=borrower_held, attached=attached, lender_held=lender_held,
                  lender_lists_domain=lender_lists,
                  peer_link_up=link, lender_free_after_return=bool(freed),
                  borrower_lists_after_return=not gone)


def test_rewritten(a):
    """Rewritten every metrics-interval-ms: the timestamp advances by about that much."""
    t0 = stamp(a.metrics)
    time.sleep(1.0)
    t1 = stamp(a.metrics)
    return result("metrics-rewritten", 0.4 <= t1 - t0 <= 1.6 and abs(time.time() - t1) < 2,
                  advanced_s=f"{t1 - t0:.2f}", interval_ms=INTERVAL_MS)


def test_exit(b):
    """A daemon stopping writes its file once more, saying so (vfio_ntb_up 0)."""
    b.kill(signal.SIGTERM)
    _, samples = parse(b.metrics)
    up = value(samples, "vfio_ntb_up", node="hostb")
    return result("metrics-at-exit", up == 0 and b.proc.returncode == 0, up=up,
                  exit_code=b.proc.returncode)


def test_stats_file_timestamp(a):
    """The stats file (SIGUSR1) says when its counters were read."""
    st = a.stats()
    ts = st.get("timestamp")
    try:
        when = datetime.datetime.fromisoformat(ts.replace("Z", "+00:00"))
        age = abs(datetime.datetime.now(datetime.timezone.utc) - when).total_seconds()
    except (AttributeError, ValueError):
        age = None
    return result("stats-file-timestamp", age is not None and age < 5 and ts.endswith("Z"),
                  timestamp=ts, age_s=age)


def test_ntbctl_stats_says(a):
    """`ntbctl stats` says plainly that the data path is not counted, and what is."""
    rc, out, _ = ntbctl(a, "stats")
    low = " ".join(out.lower().split())
    ok = rc == 0 and "never passes through vfio-ntb" in low and "not counted" in low \
        and "dma" in low and "counted:" in low and "config_rw" in out
    return result("ntbctl-stats-says-what-is-counted", ok, exit_code=rc,
                  text=out.strip().splitlines()[-1][:120] if out.strip() else "")


def promtool_series(samples):
    """Samples as promtool's input_series: each value held for ten minutes."""
    out = []
    for (name, labels), v in sorted(samples.items()):
        text = ",".join(f'{k}="{val}"' for k, val in labels)
        out.append({"series": f"{name}{{{text}}}", "values": f"{v!r}x10"})
    return out


def expected_alert(rule, labels):
    """What promtool must see: the series' labels and the rule's, its annotations rendered."""
    labels = {**labels, **rule.get("labels", {})}

    def render(t):
        return re.sub(r"\{\{\s*\$labels\.(\w+)\s*\}\}", lambda m: labels.get(m.group(1), ""), t)
    return {"exp_labels": labels,
            "exp_annotations": {k: render(v) for k, v in rule.get("annotations", {}).items()}}


def test_alert_rules(procs):
    """The shipped rules file passes `promtool check rules`; `promtool test rules` fires
    VfioNtbDeviceLost on the metrics hoste wrote while its lender hostc was gone (kill -9,
    past the lease timeout), and not on those it wrote before."""
    promtool = subprocess.run([str(h.REPO / "scripts" / "get-promtool")], capture_output=True,
                              text=True, timeout=300)
    if promtool.returncode != 0:
        raise h.HarnessError(f"get-promtool: {promtool.stderr.strip()}")
    tool = promtool.stdout.strip()
    check = subprocess.run([tool, "check", "rules", str(ALERTS)], capture_output=True, text=True,
                           timeout=60)
    wd = procs.tempdir()
    fab = procs.tempdir("vn-fabric-")
    sd = h.Simdev(procs, wd / "c.sock", h.make_backing(wd / "c.img", 16), 16).start()
    c = MetricsDaemon(procs, wd, "hostc", fab, lends={"nvme0": sd.socket_path},
                      lease_timeout_ms=1000).start()
    e = MetricsDaemon(procs, wd, "hoste", fab, lease_timeout_ms=1000).start()
    wait_for(lambda: len(Control(e.control).execute("query-devices")) == 1, 5)
    Control(e.control).execute("borrow", device="hostc/nvme0")
    lost = dict(node="hoste", device="hostc/nvme0", role="borrower", state="lost")
    _, healthy = fresh(e, time.time())
    c.kill(signal.SIGKILL)
    gone = wait_for(lambda: value(fresh(e, time.time())[1], "vfio_ntb_lease_state", **lost) == 1,
                    10)
    _, during = parse(e.metrics)
    rules = yaml.safe_load(ALERTS.read_text())
    rule = next(r for g in rules["groups"] for r in g["rules"]
                if r.get("alert") == "VfioNtbDeviceLost")
    spec = {"rule_files": [str(ALERTS)], "evaluation_interval": "1m", "tests": [
        {"interval": "1m", "input_series": promtool_series(during),
         "alert_rule_test": [{"eval_time": "5m", "alertname": "VfioNtbDeviceLost",
                              "exp_alerts": [expected_alert(rule, lost)]}]},
        {"interval": "1m", "input_series": promtool_series(healthy),
         "alert_rule_test": [{"eval_time": "5m", "alertname": "VfioNtbDeviceLost",
                              "exp_alerts": []}]}]}
    tests = wd / "alert-tests.yml"
    tests.write_text(json.dumps(spec, indent=1))   # JSON is YAML
    run = subprocess.run([tool, "test", "rules", str(tests)], capture_output=True, text=True,
                         timeout=60)
    if run.returncode != 0:
        print(run.stdout[-3000:], run.stderr[-2000:], file=sys.stderr)
    return result("alert-rules", check.returncode == 0 and bool(gone) and run.returncode == 0,
                  check=check.stdout.strip().splitlines()[-1:] or check.stderr.strip()[:120],
                  lost_series=bool(gone), series=len(during), test_exit=run.returncode)


def main():
    ok = True
    with h.Procs() as procs:
        try:
            wd = procs.tempdir()
            fab = procs.tempdir("vn-fabric-")
            sd = h.Simdev(procs, wd / "dev.sock", h.make_backing(wd / "a.img", 16), 16,
                          serial="VN-METRICS-01").start()
            direct = h.Simdev(procs, wd / "direct.sock", h.make_backing(wd / "d.img", 16),
                              16).start()
            a = MetricsDaemon(procs, wd, "hosta", fab, lends={"nvme0": sd.socket_path}).start()
            b = MetricsDaemon(procs, wd, "hostb", fab).start()
            wait_for(lambda: len(Control(b.control).execute("query-devices")) == 1, 5)
            r = Control(b.control).execute("attach", device=DEV, domain="vm1")
            p = subprocess.run([str(h.REPO / "build" / "bench" / "forwarded_access"),
                                r["socket"], str(direct.socket_path), "1", str(ACCESSES)],
                               capture_output=True, text=True, timeout=60)
            if p.returncode != 0:
                raise h.HarnessError(f"forwarded_access: {p.returncode} {p.stderr.strip()}")
            time.sleep(0.5)                 # the client's goodbye settles
        except (h.HarnessError, ControlError, OSError) as e:
            print(f"setup: {e}", file=sys.stderr)
            return 1
        tests = ((test_file, (a, b)), (test_values, (a, b)), (test_lease_state, (a, b)),
                 (test_rewritten, (a,)), (test_stats_file_timestamp, (a,)),
                 (test_ntbctl_stats_says, (a,)), (test_exit, (b,)), (test_alert_rules, (procs,)))
        for test, args in tests:
            try:
                ok &= test(*args)
            except (h.HarnessError, ControlError, OSError, ValueError, KeyError,
                    IndexError, StopIteration, subprocess.SubprocessError) as e:
                ok = h.failed(test.__name__, e)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
