"""Runs inside each of the two NTB hosts of test_ntb.py (lenderhost.LenderHost VMs joined by
vfio-ntb-ntbsim), as root, with Linux's NTB modules built from Debian's source
(scripts/build-ntb-modules).  The two hosts pace each other through files in their shared
directory (barrier()).  Prints `FACT key=value` lines that test_ntb.py turns into results.

What each host does, in order:
- binds Linux's unmodified ntb_hw_epf to its NTB function (the IOMMU group translated: a
  "DMA" domain, so what the peer's window reaches goes through this host's IOMMU);
- ntb_tool: enables the link and waits for it; writes a scratchpad of the peer's and reads
  the one the peer wrote of its own; rings the peer's doorbell and waits for its own;
  allocates an inbound window buffer (the translation of the peer's window), writes 4 KiB
  through its own outbound window into the peer's buffer, reads back through the window what
  it wrote, and finds in its own buffer what the peer wrote;
- ntb_pingpong: doorbells and scratchpads bounced between the hosts, counted;
- ntb_perf: host a measures a copy through its window into b's memory (b serves it);
- our module, vfio_ntb: see ntb_kmod.py; then the ntb fabric backend over it
  (ntb_fabric.py), a device lent over that backend (ntb_lend.py), with --guest-data a guest
  of host b's on that device (ntb_guest.py), a host that takes the
  name of one that is down, refused (ntb_impersonate.py), and the lend again, which ends
  with host a's VM killed under the borrower.
"""
import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

import ntb_fabric
import ntb_guest
import ntb_impersonate
import ntb_kmod
import ntb_lend
import ntb_restart

SHARE = Path("/tmp/share")
# ntb_hw_epf's maps: mx8 (one or two windows), j721e (three: test_ntb_bar.py).
NTB_IDS = (("0x1957", "0x0809"), ("0x104c", "0xb00d"))
PATTERN_LEN = 4096
INBOUND = 65536


def fact(**kv):
    print("FACT " + " ".join(f"{k}={str(v).replace(' ', '_')}" for k, v in kv.items()),
          flush=True)


def barrier(role, name, timeout=180.0, waiting=None):
    """Say we reached @name and wait for the other host to have reached it too (calling
    @waiting, when given, at each look)."""
    other = "b" if role == "a" else "a"
    (SHARE / f"sync-{name}-{role}").write_text(str(time.time()))
    deadline = time.monotonic() + timeout
    while not (SHARE / f"sync-{name}-{other}").exists():
        if time.monotonic() > deadline:
            raise TimeoutError(f"host {other} did not reach {name}")
        if waiting is not None:
            waiting()
        time.sleep(0.1)


def write(path, text, timeout=60.0):
    """Write @text to a debugfs file; a write that blocks (an event) gets @timeout s."""
    subprocess.run(["sh", "-c", f"printf '%s' '{text}' > {path}"], check=True, timeout=timeout)


def read(path):
    return Path(path).read_text().strip()


def find_ntb():
    for d in sorted(Path("/sys/bus/pci/devices").iterdir()):
        if ((d / "vendor").read_text().strip(), (d / "device").read_text().strip()) in NTB_IDS:
            return d.name
    raise RuntimeError("no NTB function (1957:0809 or 104c:b00d) in this host")


def insmod(mods, name, *params):
    subprocess.run(["insmod", str(mods / f"{name}.ko"), *params], check=True)


def rmmod(name):
    subprocess.run(["rmmod", name], check=True)


def wait_path(path, timeout=30.0):
    deadline = time.monotonic() + timeout
    while not Path(path).exists():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{path} did not appear")
        time.sleep(0.1)


def setup(mods, bdf):
    dev = Path("/sys/bus/pci/devices") / bdf
    group = dev / "iommu_group" / "type"
    if group.read_text().strip() != "DMA":
        group.write_text("DMA")
    insmod(mods, "ntb")
    insmod(mods, "ntb_hw_epf")
    wait_path(dev / "driver")
    fact(driver=os.path.basename(os.readlink(dev / "driver")),
         iommu_domain=group.read_text().strip())
    subprocess.run(["mount", "-t", "debugfs", "none", "/sys/kernel/debug"], check=False)


def tool(role, mods, bdf):
    other = "b" if role == "a" else "a"
    insmod(mods, "ntb_tool")
    d = Path("/sys/kernel/debug/ntb_tool") / bdf
    wait_path(d / "link")
    t0 = time.monotonic()
    write(d / "link", "Y")
    write(d / "peer0" / "link_event", "Y", timeout=120)
    fact(link_up_s=round(time.monotonic() - t0, 2))
    barrier(role, "linked")

    # Scratchpads: ours to the peer's, the peer's to ours.
    mark = {"a": 0xa11ce001, "b": 0xb0b0b002}
    write(d / "peer0" / "spad0", hex(mark[role]))
    barrier(role, "spad")
    got = int(read(d / "spad0"), 0)
    fact(spad_ok=got == mark[other], spad=hex(got))

    # Doorbells: a rings b's bit 0, then b rings a's bit 1.
    bit = {"a": 0x2, "b": 0x1}
    if role == "a":
        write(d / "peer_db", "s 0x1")
    else:
        write(d / "db_event", "0x1", timeout=30)
        write(d / "peer_db", "s 0x2")
    if role == "a":
        write(d / "db_event", "0x2", timeout=30)
    got = int(read(d / "db"), 0)
    fact(doorbell_ok=got == bit[role], db=hex(got))
    write(d / "db", f"c {hex(got)}")
    barrier(role, "doorbell")

    # Windows: our inbound buffer (the peer's window lands there), then our outbound window.
    write(d / "peer0" / "mw_trans0", str(INBOUND))
    fact(inbound=read(d / "peer0" / "mw_trans0").splitlines()[1:3])
    barrier(role, "inbound")
    write(d / "peer0" / "peer_mw_trans0", f"0:{INBOUND}")
    pattern = role.encode() * 16 + os.urandom(PATTERN_LEN - 16)
    (SHARE / f"pattern-{role}").write_bytes(pattern)
    t0 = time.monotonic()
    # (ntb_tool's files cannot seek: one open to write, one to read back.)
    with open(d / "peer0" / "peer_mw0", "wb", buffering=0) as f:
        f.write(pattern)
    t_write = time.monotonic() - t0
    with open(d / "peer0" / "peer_mw0", "rb", buffering=0) as f:
        back = f.read(PATTERN_LEN)
    fact(window_write_s=round(t_write, 2), window_readback_ok=back == pattern)
    barrier(role, "written")
    with open(d / "peer0" / "mw0", "rb") as f:
        inbound = f.read(PATTERN_LEN)
    fact(window_inbound_ok=inbound == (SHARE / f"pattern-{other}").read_bytes())
    barrier(role, "tool-done")
    write(d / "peer0" / "peer_mw_trans0", "0:0")
    write(d / "peer0" / "mw_trans0", "0")
    rmmod("ntb_tool")


def pingpong(role, mods, bdf):
    insmod(mods, "ntb_pingpong", "delay_ms=100")
    count = Path("/sys/kernel/debug/ntb_pingpong") / bdf / "count"
    wait_path(count)
    deadline = time.monotonic() + 60
    n = 0
    while time.monotonic() < deadline:
        n = int(read(count))
        if n >= 10:
            break
        time.sleep(0.5)
    fact(pingpong_count=n)
    barrier(role, "pingpong")
    rmmod("ntb_pingpong")


def perf_run(d, timeout=300):
    """One ntb_perf run through its debugfs directory @d: what it printed.  It needs the
    peer's buffer, set up over the scratchpads: retried until it is."""
    out = ""
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        try:
            write(d / "run", "0", timeout=timeout)
            out = read(d / "run")
            if "MBytes/s" in out:
                break
        except subprocess.CalledProcessError:
            pass
        time.sleep(1)
    return out


def perf(role, mods, bdf):
    # 64 KiB in 4 KiB chunks: every store crosses a trapped window under TCG.
    insmod(mods, "ntb_perf", "total_order=16", "chunk_order=12", "max_mw_size=1048576")
    d = Path("/sys/kernel/debug/ntb_perf") / bdf
    wait_path(d / "run")
    barrier(role, "perf-loaded")
    if role == "a":
        out = perf_run(d)
        rate = [ln for ln in out.splitlines() if "MBytes/s" in ln]
        fact(perf_ok=bool(rate), perf=rate[0].strip() if rate else out[-80:])
    barrier(role, "perf-done", timeout=600)
    rmmod("ntb_perf")


def arguments():
    """An inner script's command line: .role, .modules (the modules' directory) and
    .guest_data."""
    ap = argparse.ArgumentParser()
    ap.add_argument("--role", choices=("a", "b"), required=True)
    ap.add_argument("--guest-data", action="store_true",
                    help="after the lend, a guest of host b's uses the lent NVMe (ntb_guest.py)")
    ap.add_argument("--guest-only", action="store_true",
                    help="only that guest (a quicker run while changing it)")
    ap.add_argument("--modules", required=True, type=Path)
    return ap.parse_args()


def main():
    args = arguments()
    role, mods = args.role, args.modules
    try:
        bdf = find_ntb()
        setup(mods, bdf)
        if args.guest_only:
            ntb_kmod.load(mods, bdf)
            ntb_guest.run(role, bdf, barrier, fact)
            fact(done=True)
            return 0
        tool(role, mods, bdf)
        pingpong(role, mods, bdf)
        perf(role, mods, bdf)
        fd = ntb_kmod.run(role, mods, bdf, barrier, SHARE, fact)
        # The device is the fabric backend's now (one opener), then the kill's; both hosts
        # saw the link up before either closes it.
        barrier(role, "kmod-before-fabric")
        os.close(fd)
        ntb_fabric.run(role, bdf, barrier, fact)
        ntb_fabric.daemons(role, bdf, barrier, fact)
        ntb_lend.run(role, bdf, barrier, fact)
        ntb_restart.run(role, bdf, barrier, fact)
        if args.guest_data:
            ntb_guest.run(role, bdf, barrier, fact)
        ntb_impersonate.run(role, bdf, barrier, fact)
        ntb_lend.peer_lost(role, bdf, barrier, fact)
    except (OSError, RuntimeError, TimeoutError, subprocess.SubprocessError) as e:
        fact(error=f"{type(e).__name__}:{str(e)[:400]}")
        return 1
    fact(done=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
