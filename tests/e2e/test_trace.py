#!/usr/bin/python3
"""End-to-end: following one request across processes and hosts by its trace.

hosta lends a vfio-ntb-simdev NVMe and is started with `--trace 'lender_*'` (its lender
worker inherits that); on hostb, which borrows it, `ntbctl trace 'borrower_*,fabric_send'`
switches tracing on in the running daemon.  hostb then attaches the device (its borrower
worker starts) and a qtest QEMU realizes it, which reads its config space through the chain.
What a user would check:

- trace-correlation: `ntbctl trace` answers with the events it turned on; each request the
  borrower sent carries a correlation id ("hostb:N") that appears in hostb's log (borrower
  worker: sent, answered) and in hosta's (lender worker: the request, and for a config
  access the device's read), for the ATTACH and for a trapped config read alike; events the
  patterns did not select (fabric_receive) are not in either log.
"""
import re
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import harness as h  # noqa: E402
from cluster import Daemon  # noqa: E402
from control import Control  # noqa: E402
from vfio_inner import qtest_qemu  # noqa: E402

EXPECTED_RESULTS = 1
NTBCTL = h.REPO / "build" / "ntbctl"
CORR = re.compile(r"request (hostb:\d+): (\w+)")


def main():
    with h.Procs() as procs:
        wd = procs.tempdir()
        fab = procs.tempdir("vn-fabric-")
        img = h.make_backing(wd / "disk.img", 64)
        sd = h.Simdev(procs, wd / "dev.sock", img, 64, serial="VN-TRACE-01").start()
        a = Daemon(procs, wd, "hosta", fab, lends={"nvme0": sd.socket_path},
                   args=["--trace", "lender_*"]).start()
        b = Daemon(procs, wd, "hostb", fab).start()
        cb = Control(b.control)
        h.wait_for(lambda: any(x["device"] == "hosta/nvme0" for x in cb.execute("query-devices")),
                   10)
        said = subprocess.run([NTBCTL, "--socket", b.control, "trace", "borrower_*,fabric_send"],
                              capture_output=True, text=True, timeout=30)
        r = cb.execute("attach", device="hosta/nvme0", domain="vm-trace")
        q = qtest_qemu(procs, r["socket"])
        try:
            h.qtest_command(q, "outl 0xcf8 0x80001000")
            ident = int(h.qtest_command(q, "inl 0xcfc")[1], 16)
        finally:
            procs.stop(q)
        cb.execute("detach", device="hosta/nvme0")
        cb.execute("return", device="hosta/nvme0")
        a.stop()
        b.stop()
        log_a, log_b = a.log(), b.log()
    sent = {m.group(1): m.group(2) for m in CORR.finditer(log_b)}
    seen_a = set(m.group(1) for m in CORR.finditer(log_a))
    attach = [c for c, t in sent.items() if t == "ATTACH"]
    config = [c for c, t in sent.items() if t == "REGION_RW"]
    followed = [c for c in config if re.search(rf"request {c}: device read of region 7 ", log_a)]
    return h.result("trace-correlation",
                    said.returncode == 0 and "borrower_request" in said.stdout and
                    attach != [] and attach[0] in seen_a and config != [] and
                    set(config) <= seen_a and followed != [] and
                    "fabric_receive" not in log_a + log_b and ident != 0xffffffff,
                    ntbctl_rc=said.returncode, requests_traced=len(sent),
                    attach_corr=attach[0] if attach else "-",
                    config_reads=len(config), on_lender=len(set(sent) & seen_a),
                    device_reads_followed=len(followed), config_id=f"{ident:#010x}")


if __name__ == "__main__":
    sys.exit(0 if main() else 1)
