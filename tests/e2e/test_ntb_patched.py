#!/usr/bin/python3
"""test_ntb.py again with both hosts on the patched QEMU (qemu-patches/), whose windows the
simulated NTB maps where they reach the peer's RAM (0008) and which answers its peer-to-peer
accesses in the specification's layout (0009): Linux's NTB clients, our module, the `ntb`
fabric, a device lent over it, the BAR guard, the fence, a host that takes another's name
and a lender lost, each as test_ntb.py checks it (its results, named patched-NAME).  ntb_perf's
copy goes through a mapped window here (tens to hundreds of MB/s against a few trapped).

And one result of its own, ntb-guest-data: a guest of host b's (TCG inside TCG) whose
unmodified nvme driver runs the data check on host a's NVMe, lent over `fabric = ntb`
(ntb_guest.py): the data verified in the guest and on host a's disk, and over the data
phase no BAR access forwarded or served by software of ours and no fabric request."""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import harness as h  # noqa: E402
import test_ntb  # noqa: E402

EXPECTED_RESULTS = 12
TIMEOUT_S = 2100

if __name__ == "__main__":
    h.RESULT_PREFIX = "patched-"
    test_ntb.PATCHED = True
    test_ntb.GUEST_DATA = True
    sys.exit(0 if test_ntb.main() else 1)
