"""Runs inside test_kmod.py's VM (lenderhost.LenderHost: a TCG VM with an IOMMU, this
machine's root as a chroot), as root: the vfio_ntb module's own suite, build/kmod-selftest
(tests/kmod/kmod-selftest.c), over mock NTB hardware (tests/kmod/ntb_mock.ko) on the VM's
ivshmem-plain.

    kmod_inner.py --modules DIR --selftest PATH [--suite-args "ARG..."]

DIR is scripts/build-ntb-modules' output for the VM's kernel: ntb.ko, vfio_ntb.ko and
test/ntb_mock.ko.  The ivshmem's IOMMU group is made a DMA domain first (what the module maps
for the NTB's DMA device must be contiguous behind the IOMMU), then ntb, ntb_mock and vfio_ntb
are loaded and the suite runs.  Its RESULT lines are passed through, followed by
`RESULT kmod-selftest PASS|FAIL passed=N failed=N` (the suite's own count).  The kernel log
of the run is left in the share (kmod-dmesg.log) for a person.
"""
import argparse
import os
import re
import subprocess
import sys
import threading
import time
from pathlib import Path

SHARE = Path("/tmp/share")
PCI = Path("/sys/bus/pci/devices")
MOCK_ID = ("0x1af4", "0x1110")          # ivshmem
TESTDEV_ID = ("0x1b36", "0x0005")       # pci-testdev
# The VFIO modules the lender host's init loads (scripts/testbed-guest --lender-host).
VFIO = ("vfio", "vfio_iommu_type1", "vfio_pci")
SUITE_TIMEOUT_S = 600


def say(name, ok, **kv):
    print(f"RESULT {name} {'PASS' if ok else 'FAIL'} " +
          " ".join(f"{k}={str(v).replace(' ', '_')}" for k, v in kv.items()), flush=True)


def find(ident):
    for d in sorted(PCI.iterdir()):
        if ((d / "vendor").read_text().strip(), (d / "device").read_text().strip()) == ident:
            return d.name
    return None


def wait_path(path, timeout):
    deadline = time.monotonic() + timeout
    while not Path(path).exists():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{path} did not appear in {timeout} s")
        time.sleep(0.05)


def setup(mods):
    """The mock under vfio_ntb; the mock's and the pci-testdev's PCI names."""
    bdf, testdev = find(MOCK_ID), find(TESTDEV_ID)
    if not bdf or not testdev:
        raise RuntimeError(f"no ivshmem ({bdf}) or pci-testdev ({testdev}) in the VM")
    missing = [m for m in VFIO if not Path(f"/sys/module/{m}").exists()]
    if missing:
        raise RuntimeError(f"VFIO modules not loaded by the VM's init: {missing}")
    group = PCI / bdf / "iommu_group" / "type"
    if group.read_text().strip() != "DMA":
        group.write_text("DMA")
    subprocess.run(["mount", "-t", "debugfs", "none", "/sys/kernel/debug"], check=False,
                   stderr=subprocess.DEVNULL)
    for ko in ("ntb.ko", "test/ntb_mock.ko", "vfio_ntb.ko"):
        subprocess.run(["insmod", str(mods / ko)], check=True)
    wait_path(f"/dev/vfio-ntb/{bdf}", 30)
    wait_path(f"/sys/kernel/debug/ntb_mock/{bdf}/trans", 5)
    return bdf, testdev


def save_dmesg():
    log = subprocess.run(["dmesg"], capture_output=True, text=True).stdout
    (SHARE / "kmod-dmesg.log").write_text(log)


def watchdog(p, t0, done, suite_timeout):
    """The kernel log into the share every 15 s (a hang loses the VM's end); a suite still
    running after @suite_timeout s is reported with the kernel's blocked tasks (sysrq w) and
    this script ends, for the VM to power off."""
    while not done.wait(15):
        save_dmesg()
        if time.monotonic() - t0 > suite_timeout:
            Path("/proc/sysrq-trigger").write_text("w")
            time.sleep(1)
            save_dmesg()
            say("kmod-selftest", False, error=f"the suite hung ({suite_timeout} s; blocked "
                "tasks in kmod-dmesg.log)")
            p.kill()
            os._exit(0)


def run_suite(selftest, bdf, testdev, extra, suite_timeout):
    """The suite's RESULT lines through, its own count after them."""
    t0 = time.monotonic()
    p = subprocess.Popen([str(selftest), "--bdf", bdf, "--testdev", testdev, *extra],
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    done = threading.Event()
    threading.Thread(target=watchdog, args=(p, t0, done, suite_timeout), daemon=True).start()
    summary = None
    for line in p.stdout:
        line = line.rstrip("\n")
        if line.startswith("RESULT "):
            print(line, flush=True)
        else:
            print(f"  {line}", file=sys.stderr, flush=True)
        m = re.match(r"kmod-selftest: (\d+) passed, (\d+) failed$", line)
        if m:
            summary = tuple(int(x) for x in m.groups())
    rc = p.wait()
    done.set()
    passed, failed = summary or (0, 0)
    say("kmod-selftest", summary is not None and failed == 0 and passed > 0 and rc == 0,
        passed=passed, failed=failed, rc=rc, suite_s=round(time.monotonic() - t0, 1))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--modules", required=True, type=Path)
    ap.add_argument("--selftest", required=True, type=Path)
    ap.add_argument("--suite-args", default="", help="more arguments of the suite's")
    ap.add_argument("--suite-timeout", default=SUITE_TIMEOUT_S, type=int)
    a = ap.parse_args()
    try:
        bdf, testdev = setup(a.modules)
        print(f"  mock {bdf}, pci-testdev {testdev}", file=sys.stderr, flush=True)
        run_suite(a.selftest, bdf, testdev, a.suite_args.split(), a.suite_timeout)
    except (OSError, RuntimeError, subprocess.SubprocessError) as e:
        say("kmod-selftest", False, error=f"{type(e).__name__}: {e}"[:200])
    finally:
        save_dmesg()


if __name__ == "__main__":
    main()
