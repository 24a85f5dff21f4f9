"""The ntb fabric backend on Linux's NTB stack, in both NTB hosts of test_ntb.py (called by
ntb_inner.py once our module is loaded and no one holds the device): bench/fabric_rtt times
synchronous fabric requests from host a to host b over the `ntb` backend (our module's
/dev/vfio-ntb device: message rings through the simulated NTB's window, doorbells as MSI-X),
against the same requests over the `shm` backend between two processes of host a.  Rounds in
ABBA order (ntb shm | shm ntb); each ntb round starts a new session (both processes open the
device anew).  Prints FACT lines: fabric_rtt_ok, ntb_window_ok, shm_window_ok, ntb_p50_us/shm_p50_us (the median of the
rounds' p50s) and each round's."""
import json
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

BUILD = Path(__file__).resolve().parents[2] / "build"
RTT = BUILD / "bench" / "fabric_rtt"
SAMPLES = 100
ORDER = ("ntb", "shm", "shm", "ntb")


def _ask(backend, param):
    """The p50 in us and whether b's segment crossed the window both ways."""
    out = subprocess.run([str(RTT), "ask", backend, "a", "b", str(SAMPLES), param],
                         capture_output=True, text=True, timeout=600)
    if out.returncode != 0:
        raise RuntimeError(f"fabric_rtt ask {backend}: {out.stderr.strip()[-200:]}")
    got = json.loads(out.stdout)
    return float(got["p50_us"]), bool(got["window_ok"])


def _serve(backend, param):
    return subprocess.Popen([str(RTT), "serve", backend, "b", "a", param])


def _stop(proc):
    proc.terminate()
    if proc.wait(timeout=30) != 0:
        raise RuntimeError(f"fabric_rtt serve exited {proc.returncode}")


def run(role, bdf, barrier, fact):
    dev = f"/dev/vfio-ntb/{bdf}"
    p50 = {"ntb": [], "shm": []}
    window = {"ntb": [], "shm": []}
    for i, kind in enumerate(ORDER):
        if kind == "ntb":
            server = _serve("ntb", f"ports={dev}=a") if role == "b" else None
            barrier(role, f"rtt-{i}-serving")
            if role == "a":
                us, ok = _ask("ntb", f"ports={dev}=b")
                p50["ntb"].append(us)
                window["ntb"].append(ok)
            barrier(role, f"rtt-{i}-asked", timeout=900)
            if server is not None:
                _stop(server)
        elif role == "a":
            with tempfile.TemporaryDirectory(prefix="vn-rtt-") as d:
                server = _serve("shm", f"dir={d}")
                try:
                    us, ok = _ask("shm", f"dir={d}")
                    p50["shm"].append(us)
                    window["shm"].append(ok)
                finally:
                    _stop(server)
        barrier(role, f"rtt-{i}-closed", timeout=900)
    if role == "a":
        fact(fabric_rtt_ok=True, ntb_window_ok=all(window["ntb"]),
             shm_window_ok=all(window["shm"]),
             ntb_p50_us=round(statistics.median(p50["ntb"]), 1),
             shm_p50_us=round(statistics.median(p50["shm"]), 1),
             ntb_rounds_us=",".join(map(str, p50["ntb"])),
             shm_rounds_us=",".join(map(str, p50["shm"])))


def daemons(role, bdf, barrier, fact):
    """vfio-ntbd on the ntb fabric: each host's daemon sees the other's link up."""
    me, peer = ("hosta", "hostb") if role == "a" else ("hostb", "hosta")
    with tempfile.TemporaryDirectory(prefix="vn-ntbd-") as d:
        conf = Path(d) / "vfio-ntbd.conf"
        sock = Path(d) / "control.sock"
        conf.write_text(f"[node]\nname = {me}\nfabric = ntb\ncontrol-socket = {sock}\n"
                        f"run-dir = {d}/run\n[fabric]\nports = /dev/vfio-ntb/{bdf}={peer}\n")
        barrier(role, "daemon-start")
        t0 = time.monotonic()
        daemon = subprocess.Popen([str(BUILD / "vfio-ntbd"), "--config", str(conf)],
                                  stderr=open(Path(d) / "daemon.log", "wb"))
        seen = None
        try:
            while seen is None and time.monotonic() - t0 < 60 and daemon.poll() is None:
                out = subprocess.run([str(BUILD / "ntbctl"), "--socket", str(sock), "--json",
                                      "nodes"], capture_output=True, text=True, timeout=30)
                nodes = json.loads(out.stdout)["return"] if out.returncode == 0 else []
                if any(n.get("node") == peer and n.get("link") == "up" for n in nodes):
                    seen = time.monotonic() - t0
                time.sleep(0.1)
            fact(daemon_link_ok=seen is not None,
                 daemon_link_s=round(seen, 2) if seen is not None else "none")
            barrier(role, "daemon-linked", timeout=300)
        finally:
            daemon.terminate()
            daemon.wait(timeout=30)
        barrier(role, "daemon-stopped", timeout=300)
