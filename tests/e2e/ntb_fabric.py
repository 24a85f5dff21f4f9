"""The ntb fabric backend on Linux's NTB stack, in both NTB hosts of test_ntb.py (called by
ntb_inner.py once our module is loaded and no one holds the device): bench/fabric_rtt times
synchronous fabric requests from host a to host b over the `ntb` backend (our module's
/dev/vfio-ntb device: message rings through the simulated NTB's window, doorbells as MSI-X),
against the same requests over the `shm` backend between two processes of host a.  Rounds in
ABBA order (ntb shm | shm ntb); each ntb round starts a new session (both processes open the
device anew).  Prints FACT lines: fabric_rtt_ok, ntb_p50_us/shm_p50_us (the median of the
rounds' p50s) and each round's."""
import statistics
import subprocess
import tempfile
from pathlib import Path

RTT = Path(__file__).resolve().parents[2] / "build" / "bench" / "fabric_rtt"
SAMPLES = 100
ORDER = ("ntb", "shm", "shm", "ntb")


def _ask(backend, param):
    out = subprocess.run([str(RTT), "ask", backend, "a", "b", str(SAMPLES), param],
                         capture_output=True, text=True, timeout=600)
    if out.returncode != 0:
        raise RuntimeError(f"fabric_rtt ask {backend}: {out.stderr.strip()[-200:]}")
    return float(out.stdout.split('"p50_us": ')[1].split(",")[0])


def _serve(backend, param):
    return subprocess.Popen([str(RTT), "serve", backend, "b", param])


def _stop(proc):
    proc.terminate()
    if proc.wait(timeout=30) != 0:
        raise RuntimeError(f"fabric_rtt serve exited {proc.returncode}")


def run(role, bdf, barrier, fact):
    dev = f"/dev/vfio-ntb/{bdf}"
    p50 = {"ntb": [], "shm": []}
    for i, kind in enumerate(ORDER):
        if kind == "ntb":
            server = _serve("ntb", f"ports={dev}=a") if role == "b" else None
            barrier(role, f"rtt-{i}-serving")
            if role == "a":
                p50["ntb"].append(_ask("ntb", f"ports={dev}=b"))
            barrier(role, f"rtt-{i}-asked", timeout=900)
            if server is not None:
                _stop(server)
        elif role == "a":
            with tempfile.TemporaryDirectory(prefix="vn-rtt-") as d:
                server = _serve("shm", f"dir={d}")
                try:
                    p50["shm"].append(_ask("shm", f"dir={d}"))
                finally:
                    _stop(server)
        barrier(role, f"rtt-{i}-closed", timeout=900)
    if role == "a":
        fact(fabric_rtt_ok=True,
             ntb_p50_us=round(statistics.median(p50["ntb"]), 1),
             shm_p50_us=round(statistics.median(p50["shm"]), 1),
             ntb_rounds_us=",".join(map(str, p50["ntb"])),
             shm_rounds_us=",".join(map(str, p50["shm"])))
