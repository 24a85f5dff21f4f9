"""Runs inside the lender host (lenderhost.py), as root, with real VFIO: placement 3 of
docs/p2p.md with two PCI functions lent through the `vfio` backend.  Prints one RESULT line.

- p2p-same-lender: the lender host's two QEMU NVMe controllers, bound to vfio-pci, are lent
  by hosta (`pci = ...`); hostb attaches both to one domain with p2p; a qtest QEMU (no guest
  CPU) is that domain, with both devices.  It places the second one's CMB (BAR2) and has the
  first read its disk into it (an NVMe Read whose data pointer is the CMB's address): the
  first device DMAs through its VFIO IOMMU mapping straight into the second device's BAR, in
  the lender host, and the CMB holds what the disk holds.  Over the Read no lending request,
  forwarded access or fabric message of ours ran; hosta's DMA table maps the CMB's range to
  its own node (hosta: the transfer never left the host).
"""
import os
import struct
import subprocess
import sys
from pathlib import Path

import harness as h
from cluster import Daemon
from control import Control
from vfio_inner import NVME_ID, bind_vfio, sysfs, unbind, wait_listed

RAM_SIZE = 256 << 20
DISK = "/tmp/share/nv0.img"          # the disk NVMe's (lenderhost.NVME)
BAR_DISK, BAR_CMB_REGS, CMB = 0xfe000000, 0xfd000000, 0xe0000000
ASQ, ACQ, IOSQ, IOCQ = 0x100000, 0x101000, 0x102000, 0x103000
PATTERN = bytes((i * 7 + 3) & 0xff for i in range(4096))


def nvme_functions():
    """(the disk's BDF, the CMB's BDF): QEMU NVMe functions, the one with a BAR2 the CMB's."""
    disk = cmb = None
    for dev in sorted(Path("/sys/bus/pci/devices").iterdir()):
        if f"{sysfs(dev.name, 'vendor')}:{sysfs(dev.name, 'device')}" != NVME_ID:
            continue
        bar2 = (dev / "resource").read_text().splitlines()[2].split()
        if int(bar2[1], 16) > int(bar2[0], 16):
            cmb = dev.name
        else:
            disk = dev.name
    if disk is None or cmb is None:
        raise h.HarnessError(f"want two QEMU NVMe functions, one with a CMB: {disk}, {cmb}")
    return disk, cmb


def consumer(procs, sockets):
    """A qtest QEMU with the two vfio-user devices at bus 0 devices 2 and 3."""
    root = Path(h.stock_qemu()).read_text().split("R=", 1)[1].split("\n", 1)[0]
    argv = [h.stock_qemu(), "-machine", "q35,memory-backend=mem", "-accel", "qtest", "-qtest",
            "stdio", "-qtest-log", "/dev/null",
            "-object", f"memory-backend-memfd,id=mem,size={RAM_SIZE},share=on",
            "-m", f"{RAM_SIZE >> 20}M", "-nodefaults", "-display", "none"]
    for i, sock in enumerate(sockets):
        argv += ["-device", '{"driver":"vfio-user-pci","id":"d%d","bus":"pcie.0",'
                 '"addr":"0x%x","socket":{"type":"unix","path":"%s"}}' % (i, 2 + i, sock)]
    env = dict(os.environ, QEMU_MODULE_DIR=f"{root}/usr/lib/x86_64-linux-gnu/qemu")
    return procs.start("qemu-qtest", argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                       stderr=subprocess.PIPE, text=True, env=env)


def cfg(q, dev, off, value):
    h.qtest_command(q, f"outl 0xcf8 {0x80000000 | (dev << 11) | off:#x}")
    h.qtest_command(q, f"outl 0xcfc {value:#x}")


class Nvme:
    """Just enough of an NVMe driver, over qtest, polling: an admin queue and one I/O queue
    pair of two entries each in the consumer's RAM."""

    def __init__(self, q, bar):
        self.q, self.bar, self.tail = q, bar, {0: 0, 1: 0}

    def rd(self, off):
        return int(h.qtest_command(self.q, f"readl {self.bar + off:#x}")[1], 16)

    def wr(self, off, v):
        h.qtest_command(self.q, f"writel {self.bar + off:#x} {v:#x}")

    def enable(self):
        self.wr(0x14, 0)
        h.wait_for(lambda: self.rd(0x1c) & 1 == 0, 10)
        self.wr(0x24, 0x00010001)
        self.wr(0x28, ASQ), self.wr(0x2c, 0), self.wr(0x30, ACQ), self.wr(0x34, 0)
        self.wr(0x14, 0x00460001)
        if not h.wait_for(lambda: self.rd(0x1c) & 1 == 1, 10):
            raise h.HarnessError(f"the NVMe did not get ready: CSTS {self.rd(0x1c):#x}")

    def command(self, qid, sq, cq, opcode, nsid=0, prp1=0, cdw10=0, cdw11=0, cdw12=0):
        """One command, its completion polled; the status field."""
        slot = self.tail[qid]
        sqe = struct.pack("<IIQQQQIIIIII", opcode | (slot << 16), nsid, 0, 0, prp1, 0, cdw10,
                          cdw11, cdw12, 0, 0, 0)
        h.qtest_command(self.q, f"write {sq + 64 * slot:#x} 64 0x{sqe.hex()}")
        h.qtest_command(self.q, f"write {cq + 16 * slot:#x} 16 0x{bytes(16).hex()}")
        self.tail[qid] = (slot + 1) % 2
        self.wr(0x1000 + 8 * qid, self.tail[qid])

        def cqe():
            return bytes.fromhex(h.qtest_command(self.q, f"read {cq + 16 * slot:#x} 16")[1][2:])
        if not h.wait_for(lambda: struct.unpack_from("<I", cqe(), 12)[0] & 0x10000, 10):
            raise h.HarnessError(f"no completion for opcode {opcode:#x}")
        self.wr(0x1004 + 8 * qid, self.tail[qid])              # CQ head
        return struct.unpack_from("<I", cqe(), 12)[0] >> 17

    def io_queues(self):
        for opcode, base, cdw11 in ((0x05, IOCQ, 1), (0x01, IOSQ, (1 << 16) | 1)):
            status = self.command(0, ASQ, ACQ, opcode, prp1=base, cdw10=(1 << 16) | 1,
                                  cdw11=cdw11)
            if status != 0:
                raise h.HarnessError(f"creating an I/O queue (opcode {opcode:#x}): {status:#x}")


def lender_counters(a):
    lent = {x["device"]: x for x in a.stats()["lent"]}
    return lent["nvme0"], lent["nvme1"]


def test_same_lender(procs):
    disk, cmb = nvme_functions()
    for bdf in (disk, cmb):
        unbind(bdf)
        bind_vfio(bdf)
    wd = procs.tempdir()
    fab = procs.tempdir("vn-fabric-")
    a = Daemon(procs, wd, "hosta", fab,
               lends={"nvme0": {"pci": disk}, "nvme1": {"pci": cmb}}).start()
    b = Daemon(procs, wd, "hostb", fab).start()
    cb = Control(b.control)
    for name in ("nvme0", "nvme1"):
        wait_listed(cb, f"hosta/{name}")
    socks = [cb.execute("attach", device=f"hosta/{n}", domain="vm-p2p", p2p=True)["socket"]
             for n in ("nvme0", "nvme1")]
    with open(DISK, "r+b") as f:
        f.write(PATTERN)
        f.flush()
        os.fsync(f.fileno())
    q = consumer(procs, socks)
    try:
        cfg(q, 3, 0x10, BAR_CMB_REGS), cfg(q, 3, 0x14, 0)
        cfg(q, 3, 0x18, CMB), cfg(q, 3, 0x1c, 0)
        cfg(q, 3, 0x04, 0x406)
        cfg(q, 2, 0x10, BAR_DISK), cfg(q, 2, 0x14, 0)
        cfg(q, 2, 0x04, 0x406)
        placed = h.wait_for(lambda: lender_counters(a)[0].get("p2p_mappings"), 20) or []
        nv = Nvme(q, BAR_DISK)
        nv.enable()
        nv.io_queues()
        before = [dict(x) for x in lender_counters(a)]
        fb = b.stats()["fabric"]
        # Read 8 blocks of 512 bytes from LBA 0 into the CMB.
        status = nv.command(1, IOSQ, IOCQ, 0x02, nsid=1, prp1=CMB, cdw12=7)
        after = lender_counters(a)
        fa = b.stats()["fabric"]
        got = bytes.fromhex(h.qtest_command(q, f"read {CMB:#x} 4096")[1][2:])
    finally:
        q.kill()
        q.wait()
    for n in ("nvme0", "nvme1"):
        cb.execute("detach", device=f"hosta/{n}")
        cb.execute("return", device=f"hosta/{n}")
    a.stop()
    b.stop()
    requests = sum(after[i]["requests"] - before[i]["requests"] for i in (0, 1))
    forwarded = sum(after[i]["region_rw"] - before[i]["region_rw"] for i in (0, 1))
    messages = fa["msgs_sent"] - fb["msgs_sent"]
    to_self = [m for m in placed if m.get("peer") == "hosta"]
    return h.result("p2p-same-lender", status == 0 and got == PATTERN and len(to_self) > 0
                    and requests == 0 and forwarded == 0,
                    status=status, cmb_holds_disk=got == PATTERN, mappings_to_hosta=len(to_self),
                    lending_requests=requests, forwarded=forwarded, borrower_messages=messages)


def main():
    with h.Procs() as procs:
        try:
            return 0 if test_same_lender(procs) else 1
        except (h.HarnessError, OSError, KeyError, TimeoutError) as e:
            h.failed("p2p-same-lender", e)
            return 1


if __name__ == "__main__":
    sys.exit(main())
