#!/usr/bin/python3
"""The vfio_ntb kernel module's own suite (tests/kmod/kmod-selftest.c), in one TCG VM
(lenderhost.LenderHost: Debian's kernel, an IOMMU, VFIO) where tests/kmod/ntb_mock.ko plays
the NTB hardware on QEMU's ivshmem-plain (its BAR 2, a 16 MiB file of the share, is the two
outbound windows) and a pci-testdev gives a BAR to export through sysfs and through VFIO.
kmod_inner.py loads ntb, ntb_mock and vfio_ntb there and runs the suite; its cases are
this test's results, each checked against the module's contract (vfio_ntb_uapi.h):

- kmod-window-revoke: after VN_NTB_MW_REVOKE, a process holding an old window file cannot
  map it (ENODEV), one holding a mapping of it dies of SIGBUS and never sees the next
  target's bytes (written through a new file), the device's own mapping made before faults
  too; new mappings of the device and the new file read the next target.
- kmod-refusals: reserved fields, unknown flags, short argsz, bad indexes and sizes, the
  removed ioctls 13 and 16, a window file's ioctls, a BAR mapped through sysfs, each refused
  with its errno; a BAR mapped through VFIO taken and cleared.
- kmod-window-span: two windows as one file (VN_NTB_MW_SPAN_FD), in the order asked (1, 0):
  each window's bytes at its place, writes landing in the right window; a revoke of either
  kills the file (mapping SIGBUS, mmap ENODEV), a span without it lives on; malformed spans
  (no window, too many, one twice, a bad chunk, flags, reserved, argsz) are EINVAL.
- kmod-bar-revoke: a window onto a BAR mapped through VFIO loses its translation the moment
  VFIO takes the BAR away (memory decode cleared through VFIO's config region), and when
  the exporter unmaps it, in the kernel (the mock holds none; MW_INFO's in_size reads 0);
  MW_CLEAR still releases it; decode on again, a new export is translated again.
- kmod-accounting: exports are charged to the caller's locked memory (VmLck) against
  RLIMIT_MEMLOCK without CAP_IPC_LOCK, and uncharged at MW_CLEAR and at close.
- kmod-release: closing the device clears every translation, masks the doorbells again and
  disables the link (read in the mock's debugfs).
- kmod-doorbell-trigger: an eventfd that rings the peer's doorbell in the kernel
  (VN_NTB_PEER_DB_EVENTFD; the mock's peer doorbells are ours): a signal rings it and leaves
  no count to read; two bits, none, one beyond the device's, a file that is no eventfd and a
  removal of nothing are refused; removed, and once the device closed, a signal rings
  nothing; set, removed and replaced 5,000 times and the device closed under a thread that
  signals it without pause, with no complaint in the kernel log.
- kmod-keep: a state kept for the next owner (VN_NTB_KEEP): after the close, translations,
  link, doorbell eventfds and triggers work on with no owner; the next open says it took it
  over and finds its stash and buffer as they were; RESET tears it down; a keep nobody takes
  over is torn down by itself; a close without a keep of its own tears down; too long a
  keep, too large a stash, a reserved field and too small a buffer are refused.
- kmod-map-races: >= 10,000 iterations of threads mapping, revoking, clearing and the mock
  removed (PCI unbind) and bound again under them; no mapping reads after its target went;
  then vfio_ntb unloads and the kernel log has no BUG, WARNING or Oops.
- kmod-selftest: the suite's own count (passed=N failed=N).

VN_KMOD_SELFTEST_ARGS: more arguments of the suite's, for a developer (e.g. "--case
kmod-map-races --iterations 2000"); the logs are left in build/artifacts/kmod-logs.
"""
import os
import shutil
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import harness as h  # noqa: E402
from lenderhost import LenderHost  # noqa: E402

EXPECTED_RESULTS = 10
# One TCG boot; the races case is bounded by the suite's --max-seconds (420 s).
TIMEOUT_S = 900
CASES = ("kmod-window-revoke", "kmod-refusals", "kmod-window-span", "kmod-bar-revoke",
         "kmod-accounting", "kmod-release", "kmod-doorbell-trigger", "kmod-keep", "kmod-map-races",
         "kmod-selftest")
SELFTEST = h.REPO / "build" / "kmod-selftest"
NTB_MEM = "memory-backend-file,id=ntbmem,size=16M,share=on,mem-path={share}/ntbmem"


def main():
    t0 = time.monotonic()
    seen = {}
    error = share = None
    with h.Procs() as procs:
        try:
            if not SELFTEST.exists():
                raise h.HarnessError(f"{SELFTEST} is not built (make all)")
            mods = Path(h._script_output("build-ntb-modules"))
            if not (mods / "test" / "ntb_mock.ko").exists():
                raise h.HarnessError(f"{mods} has no test/ntb_mock.ko")
            share = procs.tempdir("vn-kmod-")
            lh = LenderHost(procs, "kmod_inner.py",
                            args=("--modules", mods, "--selftest", SELFTEST, "--suite-args",
                                  os.environ.get("VN_KMOD_SELFTEST_ARGS", ""),
                                  "--suite-timeout", os.environ.get("VN_KMOD_SUITE_TIMEOUT", 600)),
                            devices=("ivshmem-plain,memdev=ntbmem", "pci-testdev"),
                            objects=(NTB_MEM,), share=share, mem_mib=1024, timeout=840)
            lines = lh.run()
        except Exception as e:          # noqa: BLE001 (any failure is this test's)
            print(f"test_kmod: {type(e).__name__}: {e}", file=sys.stderr)
            first = str(e).strip().splitlines()[0] if str(e).strip() else ""
            error = f"{type(e).__name__}: {first}"
            lines = []
        # For a person: the VM's kernel log and the suite's output.
        if share is not None:
            logs = h.REPO / "build" / "artifacts" / "kmod-logs"
            logs.mkdir(parents=True, exist_ok=True)
            for f in (share / "kmod-dmesg.log", share / "inner.log"):
                if f.exists():
                    shutil.copy(f, logs / f.name)
    vm_s = round(time.monotonic() - t0, 1)
    ok = True
    for ln in lines:
        parts = ln.split()
        if len(parts) >= 3 and parts[0] == "RESULT" and parts[1] in CASES:
            if parts[1] == "kmod-selftest":
                ln += f" vm_s={vm_s}"
            seen[parts[1]] = parts[2] == "PASS"
            print(ln, flush=True)
        elif ln.strip():
            print(f"  {ln}", file=sys.stderr)
    for name in CASES:
        if name not in seen:
            seen[name] = h.result(name, False, error=(error or "no result from the suite")[:200])
        ok &= seen[name]
    return ok


if __name__ == "__main__":
    sys.exit(0 if main() else 1)
