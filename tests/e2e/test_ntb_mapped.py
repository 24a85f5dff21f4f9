#!/usr/bin/python3
"""The simulated NTB's windows mapped by the hosts' QEMUs (qemu-patches 0008, docs/ntb.md):
two TCG VMs on the patched QEMU joined by vfio-ntb-ntbsim, Linux's ntb_hw_epf and its
clients in each (ntb_mapped_inner.py says what each host does).  What a user would check:

- ntb-window-mapped: ntb_tool's 4 KiB through each host's window lands in the buffer the
  other host allocated and reads back through the window, with no window access trapped (a
  message to ntbsim) on either side; each host's QEMU was handed its window and took it back
  when the other host freed its buffer (and no window is left mapped).
- ntb-window-bw: ntb_perf through host a's window into host b's memory, mapped and trapped
  (ntbsim's SIGUSR2 between rounds, ABBA), in one boot: every mapped round copied with no
  access trapped, every trapped one through ntbsim.  Its rates, against a memcpy in host a's
  own RAM (`ratio`), are the bench line ntb-window-bw, left in
  build/artifacts/ntb-window-bw.json for bench/run-bench (the test asserts no timing).
"""
import json
import os
import shutil
import signal
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import harness as h  # noqa: E402
from lenderhost import LenderHost  # noqa: E402
from test_ntb import device, hosts_facts, model_log, start_ntbsim  # noqa: E402

EXPECTED_RESULTS = 2
# Two TCG VMs at once; tests/run-checks reads this.
TIMEOUT_S = 900
WINDOW_MIB = 4


def stats_now(sim, stats):
    stats.unlink(missing_ok=True)
    os.kill(sim.pid, signal.SIGUSR1)
    if not h.wait_for(stats.exists, 5):
        return None
    time.sleep(0.1)                             # written whole
    return json.loads(stats.read_text())


def serve(share, sim, stats):
    """The hosts' requests (ntb_mapped_inner.ask_outside): the counters now, or mapping
    turned on or off (answered once ntbsim says it is)."""
    for req in share.glob("*-request"):
        name = req.name[:-len("-request")]
        answer = ""
        if name.startswith("stats-"):
            answer = json.dumps(stats_now(sim, stats))
        elif name == "toggle-mapping":
            # Done once ntbsim says so and both QEMUs have done what it asked of them.
            was = (stats_now(sim, stats) or {}).get("mapping")
            os.kill(sim.pid, signal.SIGUSR2)

            def settled():
                s = stats_now(sim, stats) or {}
                return s.get("mapping") == (not was) and all(
                    s.get(p, {}).get("window_asks_unanswered", 1) == 0 for p in ("port0", "port1"))
            h.wait_for(settled, 10)
        req.unlink(missing_ok=True)
        tmp = share / f".{name}-done"
        tmp.write_text(answer)
        tmp.rename(share / f"{name}-done")


def main():
    with h.Procs() as procs:
        try:
            mods = h._script_output("build-ntb-modules")
            qemu = h.patched_qemu()
        except Exception as e:          # noqa: BLE001 (any failure is this test's)
            h.failed("ntb-window-mapped", e)
            return h.failed("ntb-window-bw", e)
        share = procs.tempdir("vn-ntbmap-share-")
        run = procs.tempdir("vn-ntbmap-")
        stats = run / "stats.json"
        sim = start_ntbsim(procs, run, 1, WINDOW_MIB)
        if sim is None:
            h.result("ntb-window-mapped", False, error="ntbsim did not listen")
            return h.result("ntb-window-bw", False, error="ntbsim did not listen")
        hosts = {r: LenderHost(procs, "ntb_mapped_inner.py", args=("--modules", mods),
                               devices=(), share=share, role=r,
                               raw_devices=[device(run / f"p{i}")], memfd=True, mem_mib=768,
                               timeout=TIMEOUT_S - 60, qemu=qemu)
                 for i, r in enumerate("ab")}
        for lh in hosts.values():
            lh.start()
        deadline = time.monotonic() + TIMEOUT_S - 30
        while time.monotonic() < deadline and \
                any(lh.proc.poll() is None for lh in hosts.values()):
            serve(share, sim, stats)
            time.sleep(0.1)
        seen = hosts_facts(hosts)
        procs.stop(sim)
        logs = h.REPO / "build" / "artifacts" / "ntb-mapped-logs"
        logs.mkdir(parents=True, exist_ok=True)
        for f in [run / "ntbsim.log", *share.glob("inner-*.log")]:
            if f.exists():
                shutil.copy(f, logs / f.name)
        if any("error" in s for s in seen.values()):
            model_log(run / "ntbsim.log")
    a, b = seen["a"], seen["b"]

    def num(key, d=a):
        try:
            return float(d.get(key))
        except (TypeError, ValueError):
            return None

    both = (lambda key: a.get(key) == "True" and b.get(key) == "True")
    ok = h.result(
        "ntb-window-mapped",
        both("window_readback_ok") and both("window_inbound_ok") and
        num("maps_a") is not None and num("maps_a") >= 1 and num("maps_b") >= 1 and
        num("traps_a") >= 1 and num("traps_b") >= 1 and
        num("mapped_now_a") == 0 and num("mapped_now_b") == 0 and
        num("tool_trapped_a") == 0 and num("tool_trapped_b") == 0,
        readback=f"{a.get('window_readback_ok')},{b.get('window_readback_ok')}",
        inbound=f"{a.get('window_inbound_ok')},{b.get('window_inbound_ok')}",
        maps=f"{a.get('maps_a')},{a.get('maps_b')}", traps=f"{a.get('traps_a')},{a.get('traps_b')}",
        mapped_after=f"{a.get('mapped_now_a')},{a.get('mapped_now_b')}",
        trapped_accesses=f"{a.get('tool_trapped_a')},{a.get('tool_trapped_b')}",
        error=a.get("error") or b.get("error") or "-")
    mapped, trapped, memcpy = num("perf_mapped_mb_s"), num("perf_trapped_mb_s"), num("memcpy_mb_s")
    good = mapped is not None and trapped is not None and memcpy is not None and trapped > 0 \
        and memcpy > 0
    if good:
        line = {"bench": "ntb-window-bw", "mapped_mb_s": mapped, "trapped_mb_s": trapped,
                "memcpy_mb_s": memcpy, "ratio": round(mapped / memcpy, 3),
                "mapped_over_trapped": round(mapped / trapped, 1),
                "rounds": json.loads(a.get("perf_rounds", "[]")),
                "where": "two TCG VMs on the patched QEMU joined by vfio-ntb-ntbsim: ntb_perf "
                         "through host a's window, mapped and trapped (ABBA), against a memcpy "
                         "in host a's RAM"}
        art = h.REPO / "build" / "artifacts"
        art.mkdir(parents=True, exist_ok=True)
        (art / "ntb-window-bw.json").write_text(json.dumps(line) + "\n")
    # What it checks is where the copy went (tests assert no timings): the mapped rounds
    # copied with no access trapped, the trapped ones through ntbsim; the rates are the bench
    # line's.
    return ok & h.result(
        "ntb-window-bw",
        good and mapped > 0 and num("perf_mapped_trapped_writes") == 0 and
        num("perf_trapped_trapped_writes") > 0,
        mapped_mb_s=mapped, trapped_mb_s=trapped, memcpy_mb_s=memcpy,
        ratio=round(mapped / memcpy, 3) if good else None,
        trapped_in_mapped_rounds=a.get("perf_mapped_trapped_writes"),
        trapped_in_trapped_rounds=a.get("perf_trapped_trapped_writes"),
        error=a.get("error") or b.get("error") or "-")


if __name__ == "__main__":
    sys.exit(0 if main() else 1)
