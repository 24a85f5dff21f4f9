"""Runs inside each of the two NTB hosts of test_ntb_mapped.py (lenderhost.LenderHost VMs on
the patched QEMU, joined by vfio-ntb-ntbsim), as root.  Prints `FACT key=value` lines.

What each host does, in order:
- binds ntb_hw_epf (the NTB function in an IOMMU "DMA" domain) and runs ntb_tool as
  test_ntb does (ntb_inner.tool): link, scratchpads, doorbells, and 4 KiB written through
  each host's window into the buffer the other allocated, read back through the window and
  found in the buffer: with the windows mapped, all of it with no message;
- the simulated NTB's counters after it: each host's QEMU was handed its window
  (window_maps) and took it back when the buffer went (window_traps), and no window is
  mapped any more;
- ntb_perf (host a copies into b's buffer), in ABBA rounds: mapped (16 MiB), trapped (the
  outside turns mapping off, ntbsim's SIGUSR2, and waits until both QEMUs did it; 2 MiB, at a
  few MB/s), trapped, mapped; the trapped window accesses counted over each round;
- a memcpy in host a's own RAM of the same size, the bandwidth a window onto RAM would have
  at best here.
"""
import json
import subprocess
import sys
import time
from pathlib import Path

import ntb_inner
from ntb_inner import SHARE, barrier, fact, insmod, rmmod, wait_path, write

PERF_ORDER = 24       # the buffer: 16 MiB; a mapped run copies all of it
TRAPPED_ORDER = 21    # a trapped run 2 MiB (at a few MB/s)
CHUNK_ORDER = 16      # 64 KiB chunks
MEMCPY_ROUNDS = 4


def ask_outside(name, timeout=30):
    """Ask the test outside for something (a file NAME-request in the share) and wait for its
    answer (NAME-done)."""
    done = SHARE / f"{name}-done"
    done.unlink(missing_ok=True)
    (SHARE / f"{name}-request").write_text("")
    deadline = time.monotonic() + timeout
    while not done.exists():
        if time.monotonic() > deadline:
            raise TimeoutError(f"the outside did not answer {name}")
        time.sleep(0.1)
    return done.read_text()


def counters(name):
    """Both ports' counters now (port0: host a's function, port1: host b's)."""
    return json.loads(ask_outside(f"stats-{name}"))


def perf_once(d):
    """One ntb_perf run: its MB/s (0 when it printed none)."""
    out = ntb_inner.perf_run(d, timeout=600)
    rate = [ln for ln in out.splitlines() if "MBytes/s" in ln]
    if not rate:
        return 0.0
    # "  <tx> ... <n> MBytes/s": the number before the unit.
    words = rate[0].replace("(", " ").replace(")", " ").split()
    return float(words[words.index("MBytes/s") - 1])


def perf(role, mods, bdf):
    insmod(mods, "ntb_perf", f"total_order={PERF_ORDER}", f"chunk_order={CHUNK_ORDER}",
           f"max_mw_size={1 << PERF_ORDER}")
    d = Path("/sys/kernel/debug/ntb_perf") / bdf
    wait_path(d / "run")
    barrier(role, "perf-loaded")
    if role == "a":
        rounds = []
        for mapped in (True, False, False, True):
            if mapped != (counters("before")["mapping"]):
                ask_outside("toggle-mapping")
            write(Path("/sys/module/ntb_perf/parameters/total_order"),
                  str(PERF_ORDER if mapped else TRAPPED_ORDER))
            before = counters("perf-before")["port0"]
            rate = perf_once(d)
            after = counters("perf-after")["port0"]
            rounds.append({"mapped": mapped, "mb_s": rate,
                           "trapped_writes": after["window_writes"] - before["window_writes"]})
        fact(perf_rounds=json.dumps(rounds, separators=(",", ":")))
        mapped = [r["mb_s"] for r in rounds if r["mapped"]]
        trapped = [r["mb_s"] for r in rounds if not r["mapped"]]
        fact(perf_mapped_mb_s=round(sum(mapped) / len(mapped), 1),
             perf_trapped_mb_s=round(sum(trapped) / len(trapped), 2),
             perf_mapped_trapped_writes=sum(r["trapped_writes"] for r in rounds if r["mapped"]),
             perf_trapped_trapped_writes=min(r["trapped_writes"] for r in rounds
                                             if not r["mapped"]))
        fact(memcpy_mb_s=memcpy_rate(1 << PERF_ORDER))
    barrier(role, "perf-done", timeout=900)
    rmmod("ntb_perf")


def memcpy_rate(size):
    """MB/s of a copy of @size bytes between two buffers of this host's RAM (the best a window
    onto RAM could do here: the same vCPU, the same TCG)."""
    src, dst = bytearray(b"\x5a" * size), bytearray(size)
    t0 = time.monotonic()
    for _ in range(MEMCPY_ROUNDS):
        dst[:] = src
    return round(size * MEMCPY_ROUNDS / (time.monotonic() - t0) / 1e6, 1)


def main():
    args = ntb_inner.arguments()
    role, mods = args.role, args.modules
    try:
        bdf = ntb_inner.find_ntb()
        ntb_inner.setup(mods, bdf)
        ntb_inner.tool(role, mods, bdf)
        if role == "a":
            c = counters("after-tool")
            for p, name in (("port0", "a"), ("port1", "b")):
                fact(**{f"maps_{name}": c[p]["window_maps"], f"traps_{name}": c[p]["window_traps"],
                        f"mapped_now_{name}": c[p]["windows_mapped"],
                        f"tool_trapped_{name}": c[p]["window_reads"] + c[p]["window_writes"]})
        barrier(role, "counted")
        perf(role, mods, bdf)
    except (OSError, RuntimeError, TimeoutError, KeyError, ValueError,
            subprocess.SubprocessError) as e:
        fact(error=f"{type(e).__name__}:{str(e)[:400]}")
        return 1
    fact(done=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
