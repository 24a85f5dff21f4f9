"""Runs inside the lender host (lenderhost.py), as root, with real VFIO: lends its QEMU NVMe
through the `vfio` backend and checks what a consumer sees of it.  Prints RESULT lines.

- vfio-managed: `managed = yes` (lent with the control socket's `lend`): the NVMe, bound to
  the host's nvme driver, is refused while its namespace is an active swap area (the message
  names it); accepted once it is not, bound to vfio-pci, borrowed and read; given back to the
  nvme driver when unlent.  A function whose IOMMU group holds another bound to a host driver
  (two virtio-rng behind one PCIe-to-PCI bridge) is refused naming that one; an address the
  host does not have is refused.
- vfio-lend-qtest: the NVMe bound to vfio-pci is lent by hosta (`pci = ...`) and borrowed
  by hostb; a qtest QEMU (no guest CPU) with vfio-user-pci on hostb's socket reads the
  device's config space (vendor:device) and BAR0's CAP register through the whole chain.
  Both must equal what sysfs showed of the device before it was lent.
- vfio-dma-identify: the same consumer runs an NVMe Identify through the admin queue in its
  own RAM (registers through the chain, no interrupts: it polls the completion); the device
  DMAs the data there through VFIO's IOMMU mapping of the borrower's memory, and the serial
  number it returns is the one the lender host gave the NVMe.
- vfio-lender-restart: the lender's daemon is killed (SIGKILL) with the device in use; an
  Identify works while it is dead (the data path is the lender worker's, VFIO's and the
  IOMMU's), the daemon comes back, adopts its worker, still lends the device to the same
  holder, and the next Identify works too.
- vfio-rom: the NVMe's expansion ROM (lenderhost.option_rom) as the consumer sees it: the
  consumer's QEMU sizes the ROM BAR (the borrower keeps it, sized like the lender's ROM
  region) and serves its bytes, read through the chain from the function's ROM; the
  signature and the mark are there.
- vfio-msix: the consumer programs MSI-X vector 0 of the lent NVMe to write a known word into
  its RAM and runs an Identify again with the admin queue's interrupt: the device's MSI-X goes
  through VFIO_DEVICE_SET_IRQS straight to the consumer's eventfd, and the word lands.  No
  interrupt was relayed by the lender or the borrower.
- vfio-bar-mapped: every BAR access of the two above went through the borrower's mapping of
  the device's BAR (VFIO's own, exported through the fabric): none was forwarded by the
  borrower or served by the lender's backend.
- vfio-iommu-isolation: after detach (the consumer gone, the group let go), the device (driven through sysfs by this script, as a
  misbehaving device would act on its own) DMAs to the IOVAs the borrower had mapped: the
  lender host's IOMMU blocks it (a DMAR fault naming the device) and the borrower's memory
  there is unchanged.  (QEMU's nvme reports nothing of a blocked DMA: memory is the proof.)
- vfio-nvme-guest: a nested TCG guest (the test VM, Debian's stock kernel and nvme driver) on
  the same NVMe lent through VFIO passes the data check (its writes read back, and the lender
  host's disk file holds them); over its data phase nothing of ours served it: no vfio-user
  message from its QEMU, no access forwarded, no interrupt relayed, no fabric message.
- vfio-device-removed: in the same boot, while the nested guest reads from the device, the
  lender host removes the function (sysfs remove).  The kernel's device request becomes a
  revoke; the borrower asks the guest's QEMU (patched) to give the device back, the guest
  sees it go and keeps running, the removal completes and the lease is over; no daemon,
  worker or QEMU crashed.  A rescan brings the function back for what follows.
- vfio-device-request: while the NVMe is lent and in use, the lender host unbinds it from
  vfio-pci (the host wants it back).  The kernel's device request reaches the lender, whose
  daemon revokes the lease; once the consumer let go (it is stopped, as an unplug would close
  its fds), the unbind completes.  The function is bound to vfio-pci again afterwards.
- vfio-sriov-two-hosts: hosti lends an igb's physical function with `sriov-vfs = 2`: two
  virtual functions, each its own device (nic0-vf0, nic0-vf1, bound to vfio-pci for it).
  hostj borrows one and hostk the other, at once; each host's consumer sees a VF (8086:10ca)
  and reads its registers through the mapped BAR, no access served by software.
- vfio-lend-refusals: a function not bound to vfio-pci, and one that does not exist, are
  refused at attach with the reason, and the lease is given back.
- vfio-large-bar, vfio-gpu-display: see vfio_gpu.py; vfio-intx: see vfio_intx.py;
  vfio-lender-worker-crash: see vfio_deaths.py.
"""
import mmap
import os
import struct
import subprocess
import sys
import time
from pathlib import Path

import harness as h
from cluster import Daemon
from control import Control, ControlError
from lenderhost import ROM_MARK
import vfio_deaths
import vfio_gpu
import vfio_intx

NVME_ID = "0x1b36:0x0010"       # QEMU's NVMe controller
SERIAL = "VN-VFIO-01"           # lenderhost.NVME's
RAM_SIZE = 256 << 20            # the consumer's
DISK = "/tmp/share/nv0.img"     # the lender host's NVMe's disk (lenderhost.py), seen inside


def sysfs(bdf, name):
    return (Path("/sys/bus/pci/devices") / bdf / name).read_text().strip()


def find(vendor_device, pci_class=None):
    """The first function that is @vendor_device ("0x1b36:0x0010") and, when given, of
    class @pci_class ("0x038000")."""
    for d in sorted(Path("/sys/bus/pci/devices").iterdir()):
        if f"{sysfs(d.name, 'vendor')}:{sysfs(d.name, 'device')}" == vendor_device and \
                pci_class in (None, sysfs(d.name, "class")):
            return d.name
    raise h.HarnessError(f"no {vendor_device} {pci_class or ''} in the lender host")


def bar0_cap(bdf):
    """CAP (offset 0, 8 bytes) of the function's BAR0, read through sysfs before lending."""
    with open(f"/sys/bus/pci/devices/{bdf}/resource0", "r+b") as f:
        m = mmap.mmap(f.fileno(), 4096)
        try:
            lo, hi = struct.unpack_from("<II", m, 0)
        finally:
            m.close()
    return (hi << 32) | lo


def unbind(bdf):
    """No driver (the host's nvme holds BAR0 busy, which sysfs then will not map)."""
    dev = Path("/sys/bus/pci/devices") / bdf
    if (dev / "driver").exists():
        (dev / "driver" / "unbind").write_text(bdf)


def bind_vfio(bdf):
    """Bind @bdf to vfio-pci, its IOMMU group translated: the lender host boots with
    iommu=pt, under which a function no container holds would DMA untranslated; a "DMA"
    group blocks it (docs/operations.md says the same to operators)."""
    dev = Path("/sys/bus/pci/devices") / bdf
    (dev / "driver_override").write_text("vfio-pci")
    if (dev / "driver").exists():
        (dev / "driver" / "unbind").write_text(bdf)
    group = dev / "iommu_group" / "type"
    if group.read_text().strip() != "DMA":
        group.write_text("DMA")
    Path("/sys/bus/pci/drivers_probe").write_text(bdf)
    if not h.wait_for(lambda: (dev / "driver").exists() and
                      os.path.basename(os.readlink(dev / "driver")) == "vfio-pci", 10):
        raise h.HarnessError(f"{bdf} did not bind to vfio-pci")


def qtest_qemu(procs, socket, ram_size=RAM_SIZE):
    root = Path(h.stock_qemu()).read_text().split("R=", 1)[1].split("\n", 1)[0]
    dev = ('{"driver":"vfio-user-pci","id":"d0","bus":"pcie.0","addr":"0x2",'
           f'"socket":{{"type":"unix","path":"{socket}"}}}}')
    # -qtest-log: by default QEMU logs every qtest command and reply to its stderr, and
    # blocks once that pipe (read by nobody) holds 64 KiB.
    argv = [h.stock_qemu(), "-machine", "q35,memory-backend=mem", "-accel", "qtest", "-qtest",
            "stdio", "-qtest-log", "/dev/null",
            "-object", f"memory-backend-memfd,id=mem,size={ram_size},share=on",
            "-m", f"{ram_size >> 20}M",
            "-nodefaults", "-display", "none", "-device", dev]
    env = dict(os.environ, QEMU_MODULE_DIR=f"{root}/usr/lib/x86_64-linux-gnu/qemu")
    return procs.start("qemu-qtest", argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                       stderr=subprocess.PIPE, text=True, env=env)


def rom_view(q, length=0x110):
    """The first @length bytes of the consumer's expansion ROM, through its ROM BAR."""
    config_rw(q, 0x30, ROM_BAR | 1)                  # address, enable
    data = bytes.fromhex(h.qtest_command(q, f"read {ROM_BAR:#x} {length}")[1][2:])
    config_rw(q, 0x30, 0)
    return data


def consumer_view(q):
    """(config id, BAR0 CAP) as the consumer reads them: bus 0, device 2."""
    h.qtest_command(q, "outl 0xcf8 0x80001000")
    ident = int(h.qtest_command(q, "inl 0xcfc")[1], 16)
    h.qtest_command(q, "outl 0xcf8 0x80001010")         # BAR0
    h.qtest_command(q, "outl 0xcfc 0xfe000000")
    # COMMAND: memory, bus master, INTx off.  The commands below poll; an INTx would make
    # QEMU trap the BAR until the interrupt's end (how it emulates INTx without KVM), and
    # with it lender-restart's accesses while the lender's daemon is away.
    h.qtest_command(q, "outl 0xcf8 0x80001004")
    h.qtest_command(q, "outl 0xcfc 0x00000406")
    lo = int(h.qtest_command(q, "readl 0xfe000000")[1], 16)
    hi = int(h.qtest_command(q, "readl 0xfe000004")[1], 16)
    return ident, (hi << 32) | lo


# Where the consumer's NVMe admin queues and Identify buffer live in its guest RAM.
ASQ, ACQ, IDENTIFY = 0x100000, 0x101000, 0x102000
BAR = 0xfe000000
ROM_BAR = 0xfd000000
# Where the consumer's MSI-X vector 0 stores its message, and what it stores.
MSI_ADDR, MSI_DATA = 0x110000, 0x00c0ffee


def identify(q):
    """Identify Controller through the admin queue, as a driver would: registers through the
    chain, the command and its completion in guest RAM, the data DMAed there by the device
    through VFIO's IOMMU.  Returns (the completion's status, the serial number)."""
    def rd(off):
        return int(h.qtest_command(q, f"readl {BAR + off:#x}")[1], 16)

    def wr(off, v):
        h.qtest_command(q, f"writel {BAR + off:#x} {v:#x}")

    wr(0x14, 0)                                     # CC.EN = 0
    h.wait_for(lambda: rd(0x1c) & 1 == 0, 10)
    wr(0x24, 0x00010001)                            # AQA: 2-entry queues
    wr(0x28, ASQ), wr(0x2c, 0), wr(0x30, ACQ), wr(0x34, 0)
    wr(0x14, 0x00460001)                            # IOSQES 6, IOCQES 4, EN
    if not h.wait_for(lambda: rd(0x1c) & 1 == 1, 10):
        raise h.HarnessError(f"the NVMe did not get ready: CSTS {rd(0x1c):#x}")
    sqe = struct.pack("<IIQQQQIIIIII", 0x06 | (1 << 16), 0, 0, 0, IDENTIFY, 0, 1, 0, 0, 0,
                      0, 0)
    h.qtest_command(q, f"write {ASQ:#x} 64 0x{sqe.hex()}")
    wr(0x1000, 1)                                   # SQ0 tail
    def cqe():
        return bytes.fromhex(h.qtest_command(q, f"read {ACQ:#x} 16")[1][2:])
    if not h.wait_for(lambda: struct.unpack_from("<I", cqe(), 12)[0] & 0x10000, 10):
        raise h.HarnessError("no completion for Identify")
    status = struct.unpack_from("<I", cqe(), 12)[0] >> 17
    data = bytes.fromhex(h.qtest_command(q, f"read {IDENTIFY:#x} 64")[1][2:])
    return status, data[4:24].decode(errors="replace").strip()


def config_rw(q, off, value=None):
    """A dword of the consumer's config space (bus 0, device 2): read, or write @value."""
    h.qtest_command(q, f"outl 0xcf8 {0x80001000 | off:#x}")
    if value is None:
        return int(h.qtest_command(q, "inl 0xcfc")[1], 16)
    h.qtest_command(q, f"outl 0xcfc {value:#x}")
    return value


def find_cap(q, cap_id):
    """Where the consumer's config space has capability @cap_id, or 0."""
    cap = config_rw(q, 0x34) & 0xfc
    for _ in range(48):                        # the capability list, bounded
        if cap == 0 or (config_rw(q, cap) & 0xff) == cap_id:
            return cap
        cap = (config_rw(q, cap) >> 8) & 0xfc
    return 0


def msix_identify(q):
    """Identify again, its completion signalled by MSI-X vector 0, whose message is a store
    of MSI_DATA to MSI_ADDR in the consumer's RAM.  Returns (the word found there, status)."""
    cap = find_cap(q, 0x11)
    if cap == 0:
        raise h.HarnessError("the lent NVMe shows no MSI-X capability")
    table = config_rw(q, cap + 4)
    if table & 7 != 0:
        raise h.HarnessError(f"MSI-X table in BAR{table & 7}, not BAR0")
    entry = BAR + (table & ~7)
    h.qtest_command(q, f"writel {MSI_ADDR:#x} 0")
    for off, v in ((0, MSI_ADDR), (4, 0), (8, MSI_DATA), (12, 0)):   # unmasked
        h.qtest_command(q, f"writel {entry + off:#x} {v:#x}")
    config_rw(q, cap, config_rw(q, cap) | (1 << 31))      # MSI-X enable
    status, _ = identify(q)
    word = h.wait_for(lambda: int(h.qtest_command(q, f"readl {MSI_ADDR:#x}")[1], 16), 10)
    return word, status


def msi_identify(q):
    """Identify again, its completion signalled by MSI (a device with MSI and no MSI-X, as the
    simdev's --interrupts msi), whose message is a store of MSI_DATA to MSI_ADDR in the
    consumer's RAM.  Returns (the word found there, status)."""
    cap = find_cap(q, 0x05)
    if cap == 0:
        raise h.HarnessError("the lent device shows no MSI capability")
    wide = bool((config_rw(q, cap) >> 16) & 0x80)          # 64-bit addresses
    h.qtest_command(q, f"writel {MSI_ADDR:#x} 0")
    config_rw(q, cap + 4, MSI_ADDR)
    if wide:
        config_rw(q, cap + 8, 0)
    config_rw(q, cap + (12 if wide else 8), MSI_DATA)
    config_rw(q, cap, config_rw(q, cap) | (1 << 16))         # MSI enable, one vector
    status, _ = identify(q)
    word = h.wait_for(lambda: int(h.qtest_command(q, f"readl {MSI_ADDR:#x}")[1], 16), 10)
    return word, status


def memfd_of(pid, size):
    """An fd of ours onto process @pid's memfd of @size bytes (its RAM: QEMU names it
    after the backend's type, not its id), once it made it; it outlives the process."""
    def find():
        for fd in Path(f"/proc/{pid}/fd").iterdir():
            try:
                if os.readlink(fd).startswith("/memfd:") and os.stat(fd).st_size == size:
                    return os.open(fd, os.O_RDWR) + 1
            except OSError:
                continue
        return 0
    fd = h.wait_for(find, 10)
    if not fd:
        raise h.HarnessError(f"process {pid} has no memfd of {size} bytes")
    return fd - 1


def kmsg_open():
    """/dev/kmsg from now on (what the kernel logs after this call)."""
    fd = os.open("/dev/kmsg", os.O_RDONLY | os.O_NONBLOCK)
    os.lseek(fd, 0, os.SEEK_END)
    return fd


def kmsg_read(fd):
    lines = []
    while True:
        try:
            rec = os.read(fd, 8192)
        except BlockingIOError:
            return lines
        except OSError:            # EPIPE: records overwritten meanwhile
            continue
        lines.append(rec.decode(errors="replace").split(";", 1)[-1].strip())


def group_free(bdf):
    """True once nobody holds the function's VFIO group (its open is exclusive)."""
    group = os.path.basename(os.readlink(f"/sys/bus/pci/devices/{bdf}/iommu_group"))
    try:
        os.close(os.open(f"/dev/vfio/{group}", os.O_RDWR))
        return True
    except OSError:
        return False


def lender_worker_facts(a, bdf):
    """@a's lender worker for @bdf serves as the worker user (vfio-ntbd opened the function's
    IOMMU group for it: the group's node stays root's)."""
    import pwd
    [pid] = a.workers("vfio-ntb-lender")
    st = h.proc_status(pid)
    group = os.path.basename(os.readlink(f"/sys/bus/pci/devices/{bdf}/iommu_group"))
    node = os.stat(f"/dev/vfio/{group}")
    return {"uid": int(st["Uid"].split()[0]), "worker_user": pwd.getpwnam("vfio-ntb").pw_uid,
            "cap_eff": st["CapEff"], "no_new_privs": st["NoNewPrivs"],
            "holds_group": any(x.startswith(f"{pid}:") for x in group_holders(bdf)),
            "group_node": (node.st_uid, oct(node.st_mode & 0o777))}


def group_holders(bdf):
    """The processes that have the function's VFIO group open ("pid:name", ...)."""
    group = os.path.basename(os.readlink(f"/sys/bus/pci/devices/{bdf}/iommu_group"))
    held = []
    for proc in Path("/proc").iterdir():
        try:
            fds = [os.readlink(x) for x in (proc / "fd").iterdir()]
            if f"/dev/vfio/{group}" in fds:
                held.append(f"{proc.name}:{(proc / 'comm').read_text().strip()}")
        except OSError:
            continue
    return held


def rogue_dma(bdf, ram):
    """Drive the function through sysfs as the borrower's driver did: an Identify whose
    queues and buffer sit at the IOVAs the borrower had mapped (@ram: its memory).  Returns
    (the kernel's DMAR fault lines for the function, memory unchanged, CSTS)."""
    pattern = b"\xa5" * 4096
    sqe = struct.pack("<IIQQQQIIIIII", 0x06 | (1 << 16), 0, 0, 0, IDENTIFY, 0, 1, 0, 0, 0,
                      0, 0)
    m = mmap.mmap(ram, 0x103000)
    m[ASQ:ASQ + 64] = sqe
    m[ACQ:ACQ + 4096] = pattern
    m[IDENTIFY:IDENTIFY + 4096] = pattern
    dev = Path("/sys/bus/pci/devices") / bdf
    # vfio-pci suspends a function nobody holds (D3hot: no memory decoding); keep it awake.
    power = dev / "power" / "control"
    was = power.read_text().strip()
    power.write_text("on")
    kmsg = kmsg_open()
    with open(dev / "config", "r+b", buffering=0) as cfg, \
         open(dev / "resource0", "r+b") as res:
        bar = mmap.mmap(res.fileno(), 0x2000)

        def rd(off):
            return struct.unpack_from("<I", bar, off)[0]

        def wr(off, v):
            struct.pack_into("<I", bar, off, v)
        try:
            cfg.seek(4)
            cfg.write(struct.pack("<H", 0x0006))      # memory, bus master
            wr(0x14, 0)
            h.wait_for(lambda: rd(0x1c) & 1 == 0, 5)
            wr(0x24, 0x00010001)
            wr(0x28, ASQ), wr(0x2c, 0), wr(0x30, ACQ), wr(0x34, 0)
            wr(0x14, 0x00460001)
            h.wait_for(lambda: rd(0x1c) & 3 != 0, 5)  # ready (or failed)
            wr(0x1000, 1)
            faults = []
            want = f"[{bdf[5:]}]"           # 6.1 names it bus:device.function

            def seen():
                faults.extend(ln for ln in kmsg_read(kmsg) if "DMAR" in ln and want in ln)
                return faults
            h.wait_for(seen, 10)
            csts = rd(0x1c)
            wr(0x14, 0)
        finally:
            cfg.seek(4)
            cfg.write(struct.pack("<H", 0))
            bar.close()
            os.close(kmsg)
            power.write_text(was)
    unchanged = m[ACQ:ACQ + 4096] == pattern and m[IDENTIFY:IDENTIFY + 4096] == pattern
    m.close()
    return faults, unchanged, csts


def bar_forwarded(a, b):
    """BAR accesses that software of ours served: forwarded by the borrower, or read and
    written by the lender's backend (its region accesses less config's)."""
    lent, bor = a.stats()["lent"][0], b.stats()["borrowed"][0]
    return bor["region_forwarded"] + lent["region_rw"] - lent["config_rw"]


def lender_restart(a, q):
    """Kill the lender's daemon under a working consumer, Identify, restart it, Identify."""
    a.kill()
    try:
        dead = identify(q)
    except h.HarnessError as e:
        dead = (-1, str(e))
    a.start()
    ca = Control(a.control)

    def holder():
        x = [d for d in ca.execute("query-devices") if d["device"] == "hosta/nvme0"]
        return x[0]["borrower"] if x else None
    held = h.wait_for(lambda: holder() == "hostb", 10) and holder()
    try:
        back = identify(q)
    except h.HarnessError as e:
        back = (-1, str(e))
    return {"dead": dead, "holder": held or "-", "back": back}


def irqs_relayed(a, b):
    lent, bor = a.stats()["lent"][0], b.stats()["borrowed"][0]
    return lent["relayed_irqs"] + bor["relayed_irqs"]


def wait_listed(c, device, timeout=10):
    """Until @c's daemon lists @device (the lender's announcement came)."""
    return h.wait_for(lambda: any(x["device"] == device for x in c.execute("query-devices")),
                      timeout)


def lend_pair(procs, wd, fab, lender, borrower, bdf, lease_timeout_ms=3000, more=None):
    """@lender lends @bdf as nvme0 (`pci = ...`), and the @more lends ({name: {"pci": ...}});
    @borrower sees them.  (a, b, b's control)"""
    lends = {"nvme0": {"pci": bdf}, **(more or {})}
    a = Daemon(procs, wd, lender, fab, lends=lends, lease_timeout_ms=lease_timeout_ms).start()
    b = Daemon(procs, wd, borrower, fab, lease_timeout_ms=lease_timeout_ms).start()
    cb = Control(b.control)
    for name in lends:
        wait_listed(cb, f"{lender}/{name}")
    return a, b, cb


def driver_of(bdf):
    """The function's driver now ("" for none; a bind may be under way)."""
    try:
        return os.path.basename(os.readlink(Path("/sys/bus/pci/devices") / bdf / "driver"))
    except OSError:
        return ""


def lend_error(c, **args):
    try:
        c.execute("lend", allow=["*"], managed=True, **args)
        return None
    except ControlError as e:
        return e.desc


def test_managed(procs, wd, fab, bdf, shared):
    """@bdf: the NVMe, bound to nvme; @shared: two functions of one group."""
    a = Daemon(procs, wd, "hostm", fab).start()
    b = Daemon(procs, wd, "hostn", fab).start()
    ca, cb = Control(a.control), Control(b.control)
    # The host's nvme driver probes it at boot (slowly, under TCG).
    before = h.wait_for(lambda: driver_of(bdf), 60)
    disk = "/dev/" + next((Path("/sys/bus/pci/devices") / bdf / "nvme").glob("nvme*/nvme*n1")).name
    subprocess.run(["mkswap", disk], check=True, capture_output=True)
    subprocess.run(["swapon", disk], check=True, capture_output=True)
    try:
        in_use = lend_error(ca, name="m0", pci=bdf) or "accepted"
    finally:
        subprocess.run(["swapoff", disk], capture_output=True)
    group = lend_error(ca, name="m1", pci=shared[0]) or "accepted"
    absent = lend_error(ca, name="m2", pci="0000:00:1e.6") or "accepted"
    lent = lend_error(ca, name="m0", pci=bdf) or "accepted"
    bound = h.wait_for(lambda: driver_of(bdf) == "vfio-pci", 15)
    ident = 0
    if bound:
        wait_listed(cb, "hostm/m0")
        r = cb.execute("attach", device="hostm/m0", domain="vm-m")
        q = qtest_qemu(procs, r["socket"])
        try:
            ident, _ = consumer_view(q)
        finally:
            procs.stop(q)
        cb.execute("detach", device="hostm/m0")
        cb.execute("return", device="hostm/m0")
        h.wait_for(lambda: group_free(bdf), 15)
        ca.execute("unlend", name="m0")
    back = h.wait_for(lambda: driver_of(bdf) == before, 15)
    a.stop()
    b.stop()
    return h.result("vfio-managed",
                    before == "nvme" and "swap area in use" in in_use and
                    f"{shared[1]} (virtio-pci)" in group and "no PCI function" in absent and
                    lent == "accepted" and bool(bound) and ident == 0x00101b36 and bool(back),
                    driver_before=before or "-", in_use=in_use[-60:].replace(" ", "_"),
                    group=group[-70:].replace(" ", "_"), absent=absent[-40:].replace(" ", "_"),
                    bound_to_vfio=bool(bound), config_id=f"{ident:#010x}",
                    given_back=driver_of(bdf) or "-")


def test_lend(procs, wd, fab, bdf, cap):
    want_id = int(sysfs(bdf, "device"), 16) << 16 | int(sysfs(bdf, "vendor"), 16)
    # A lender may be gone this long before its borrower calls the device lost: under TCG
    # the restart below (an Identify meanwhile, then the daemon's start) takes seconds.
    a, b, cb = lend_pair(procs, wd, fab, "hosta", "hostb", bdf, lease_timeout_ms=60000)
    r = cb.execute("attach", device="hosta/nvme0", domain="vm0")
    q = qtest_qemu(procs, r["socket"])
    ram = -1
    try:
        ram = memfd_of(q.pid, RAM_SIZE)
        ident, got_cap = consumer_view(q)
        try:
            status, serial = identify(q)
        except h.HarnessError as e:
            status, serial = -1, str(e)
        forwarded = bar_forwarded(a, b)
        unpriv = lender_worker_facts(a, bdf)
        rom = rom_view(q)           # read through messages (after the count: no BAR)
        restart = lender_restart(a, q)
        try:
            msi_word, msi_status = msix_identify(q)
        except h.HarnessError as e:
            msi_word, msi_status = 0, str(e)
        relayed = irqs_relayed(a, b)
        cb.execute("detach", device="hosta/nvme0")
        cb.execute("return", device="hosta/nvme0")
        # On this one-machine fabric the consumer's QEMU holds the device's VFIO fd for
        # the BAR mapping (fabric.h) until it lets the device go; a qtest QEMU cannot
        # unplug it, so it is stopped (its memory stays, through @ram).
        procs.stop(q)
        free = h.wait_for(lambda: group_free(bdf), 15)
        faults, unchanged, csts = rogue_dma(bdf, ram) if free else ([], False, -1)
    finally:
        procs.stop(q)
        if ram >= 0:
            os.close(ram)
    a.stop()
    b.stop()
    ok = h.result("vfio-lend-qtest", ident == want_id and got_cap == cap,
                  config_id=f"{ident:#010x}", want_id=f"{want_id:#010x}",
                  cap=f"{got_cap:#018x}", sysfs_cap=f"{cap:#018x}")
    ok &= h.result("vfio-rom", rom[:3] == bytes([0x55, 0xAA, 8]) and
                   rom[0x100:0x100 + len(ROM_MARK)] == ROM_MARK,
                   head=rom[:4].hex(), mark=rom[0x100:0x10b].decode(errors="replace"))
    ok &= h.result("vfio-lender-restart", restart["dead"] == (0, SERIAL) and
                   restart["holder"] == "hostb" and restart["back"] == (0, SERIAL),
                   identify_while_dead=restart["dead"][0], holder_after=restart["holder"],
                   identify_after=restart["back"][0])
    ok &= h.result("vfio-msix", msi_word == MSI_DATA and msi_status == 0 and relayed == 0,
                   msi_word=f"{msi_word:#x}", status=str(msi_status).replace(" ", "_"),
                   relayed=relayed)
    ok &= h.result("vfio-bar-mapped", forwarded == 0, bar_accesses_forwarded=forwarded)
    # The Identify above DMAed through this worker's mappings: pinned with no CAP_IPC_LOCK.
    ok &= h.result("vfio-lender-unprivileged", unpriv["uid"] == unpriv["worker_user"]
                   and unpriv["cap_eff"] == "0" * 16 and unpriv["no_new_privs"] == "1"
                   and unpriv["holds_group"] and unpriv["group_node"] == (0, "0o600")
                   and status == 0, **unpriv)
    ok &= h.result("vfio-dma-identify", status == 0 and serial == SERIAL,
                   status=status, serial=serial.replace(" ", "_") or "-")
    return ok & h.result("vfio-iommu-isolation", free and bool(faults) and unchanged,
                         group_let_go=free, dmar_faults=len(faults), memory_unchanged=unchanged,
                         csts=f"{csts:#x}",
                         fault=(faults[0][-80:] if faults else "-").replace(" ", "_"))


def data_counters(a, b):
    """What software of ours did for the borrowed device (test_lending.py's, less the device
    server's own counters: here the device is hardware)."""
    sa, sb = a.stats(), b.stats()
    lent, bor = sa["lent"][0], sb["borrowed"][0]
    return {
        "vfio_user_messages": bor["vfio_user"]["messages"],
        "forwarded_mmio": bor["region_forwarded"] + lent["region_rw"] - lent["config_rw"],
        "forwarded_config": bor["config_forwarded"] + lent["config_rw"],
        "relayed_irqs": lent["relayed_irqs"] + bor["relayed_irqs"],
        "fabric_messages": (bor["fabric_requests"] + lent["requests"] +
                            sa["fabric"]["doorbells_sent"]),
    }


def held_by(c, device):
    """Who holds @device as @c's daemon lists it ("" for nobody)."""
    return next((x.get("borrower") or "" for x in c.execute("query-devices")
                 if x["device"] == device), "")


def remove_function(bdf):
    """The host removes the function (sysfs remove, as a hot-unplug or a failing card does);
    the write blocks until VFIO lets it go.  The process doing it."""
    return subprocess.Popen(["sh", "-c", f"echo 1 > /sys/bus/pci/devices/{bdf}/remove"])


def rescan(bdf):
    """The removed function back (its driver the host's own again), bound to vfio-pci."""
    Path("/sys/bus/pci/rescan").write_text("1")
    if not h.wait_for(lambda: (Path("/sys/bus/pci/devices") / bdf).exists(), 20):
        raise h.HarnessError(f"{bdf} did not come back after a rescan")
    bind_vfio(bdf)


def test_guest(procs, wd, fab, bdf, disk):
    """vfio-nvme-guest, vfio-gpu-display, then vfio-device-removed, in one boot of the nested
    guest (on the patched QEMU, which unplugs a device its server asks it to give back)."""
    gpu = find(vfio_gpu.DISPLAY_PCI_ID, vfio_gpu.DISPLAY_CLASS)
    bind_vfio(gpu)
    a, b, cb = lend_pair(procs, wd, fab, "hostg", "hosth", bdf, more={"gpu1": {"pci": gpu}})
    r = cb.execute("attach", device="hostg/nvme0", domain="vm-guest")
    rg = cb.execute("attach", device="hostg/gpu1", domain="vm-guest")
    q = h.Qemu(procs, "draw,probe,pause,data,pause,survive",
               [h.VfioUserDevice(r["socket"], bus="rp1"),
                h.VfioUserDevice(rg["socket"], id="g0")], root_port=True,
               params={"seed": 21, "pause_s": 3, "data_mib": 4, "lost_serial": SERIAL,
                       "keep_serial": "none", "hotplug_timeout": 120},
               workdir=procs.tempdir(), timeout=1500, qemu=h.patched_qemu()).start()
    remover = None
    display = {"size": "-", "rows_wrong": -1}
    try:
        drawn = q.wait_line("VNREADY", "draw")
        try:
            kv = dict(x.split("=", 1) for x in drawn.split()[1:] if "=" in x)
            display = vfio_gpu.display_check(int(kv["w"]), int(kv["h"]))
        except (h.HarnessError, OSError, KeyError, ValueError) as e:
            print(f"display: {e}", file=sys.stderr)
        q.wait_line("VNREADY", "pause")
        before = data_counters(a, b)
        q.wait_line("VNREADY", "pause")
        after = data_counters(a, b)
        q.wait_line("VNREADY", "survive")
        t0 = time.monotonic()
        remover = remove_function(bdf)
        try:
            q.wait_line("VNEVENT", "removed", timeout=180)
            remover.wait(60)
        except (h.HarnessError, subprocess.TimeoutExpired) as e:
            print(f"device removal: {e}", file=sys.stderr)
        removed_s = time.monotonic() - t0
        gone = remover.poll() == 0 and not (Path("/sys/bus/pci/devices") / bdf).exists()
        lease_over = h.wait_for(lambda: held_by(cb, "hostg/nvme0") == "", 20)
        alive = q.proc.poll() is None and a.proc.poll() is None and b.proc.poll() is None
        run = q.wait_done()
    finally:
        q.stop()
        if remover is not None and remover.poll() is None:
            remover.kill()
    for dev in ("hostg/nvme0", "hostg/gpu1"):
        for op in ("detach", "return"):
            try:
                cb.execute(op, device=dev)
            except ControlError:
                pass                # nvme0: the revoke ended both already
    a.stop()
    b.stop()
    rescan(bdf)
    ver = h.verify_backing(disk, run.data)
    d = {k: after[k] - before[k] for k in after}
    probe = run.results.get("probe", {})
    survive = run.results.get("survive", {})
    draw = run.results.get("draw", {})
    ok = h.result("vfio-gpu-display", draw.get("status") == "PASS" and
                  draw.get("driver") == "bochs-drm" and display["rows_wrong"] == 0,
                  guest_drew=draw.get("status"), driver=draw.get("driver"),
                  screen=display["size"], rows_wrong=display["rows_wrong"],
                  png=f"build/artifacts/{vfio_gpu.SCREEN}.png")
    ok &= h.result("vfio-nvme-guest", run.results.get("data", {}).get("status") == "PASS"
                  and probe.get("serial") == SERIAL and len(ver) > 0
                  and all(v["ok"] for v in ver) and all(v == 0 for v in d.values()),
                  serial=probe.get("serial"), regions=len(ver),
                  guest_up_s=round(run.t_boot, 1) if run.t_boot else "-", **d)
    return ok & h.result("vfio-device-removed",
                         survive.get("status") == "PASS" and gone and lease_over and alive,
                         guest_saw_removal=survive.get("status"),
                         guest_removed_ms=survive.get("removed_ms", "-"),
                         function_removed=gone, seconds=f"{removed_s:.1f}",
                         lease_ended=lease_over, nothing_crashed=alive)


def test_device_request(procs, wd, fab, bdf):
    a, b, cb = lend_pair(procs, wd, fab, "hoste", "hostf", bdf)
    ca = Control(a.control)
    r = cb.execute("attach", device="hoste/nvme0", domain="vm-req")
    q = qtest_qemu(procs, r["socket"])
    unbind = None
    try:
        ident, _ = consumer_view(q)
        # The host takes its function back: the write blocks until VFIO lets it go.
        unbind = subprocess.Popen(["sh", "-c", f"echo {bdf} > /sys/bus/pci/devices/{bdf}"
                                   "/driver/unbind"])

        def lent():
            return [x for x in ca.execute("query-devices")
                    if x["device"] == "hoste/nvme0"][0]["state"] != "available"
        revoked = h.wait_for(lambda: not lent(), 30)
        requests = a.stats()["lent"][0]["device_requests"] if revoked else 0
        still_waiting = unbind.poll() is None
    finally:
        procs.stop(q)
    try:
        unbind.wait(30)
        unbound = not (Path("/sys/bus/pci/devices") / bdf / "driver").exists()
    except subprocess.TimeoutExpired:
        unbind.kill()
        unbound = False
    alive = a.proc.poll() is None and b.proc.poll() is None
    a.stop()
    b.stop()
    bind_vfio(bdf)
    return h.result("vfio-device-request", ident != 0xffffffff and revoked and requests >= 1
                    and still_waiting and unbound and alive, revoked=revoked,
                    device_requests=requests, unbind_waited_for_consumer=still_waiting,
                    unbound=unbound, daemons_alive=alive)


IGB_ID, IGBVF_ID = "0x8086:0x10c9", 0x10ca8086


def test_sriov(procs, wd, fab):
    pf = find(IGB_ID)
    a = Daemon(procs, wd, "hosti", fab, lends={"nic0": {"pci": pf, "sriov-vfs": 2}}).start()
    b = Daemon(procs, wd, "hostj", fab).start()
    c = Daemon(procs, wd, "hostk", fab).start()
    ca, cb, cc = Control(a.control), Control(b.control), Control(c.control)
    wait_listed(cb, "hosti/nic0-vf0")
    wait_listed(cc, "hosti/nic0-vf1")
    r1 = cb.execute("attach", device="hosti/nic0-vf0", domain="vm-j")
    r2 = cc.execute("attach", device="hosti/nic0-vf1", domain="vm-k")
    q1, q2 = qtest_qemu(procs, r1["socket"]), qtest_qemu(procs, r2["socket"])
    try:
        (id1, _), (id2, _) = consumer_view(q1), consumer_view(q2)
        holders = {x["device"]: x["borrower"] for x in ca.execute("query-devices")}
        lent = a.stats()["lent"]
        forwarded = sum(x["region_rw"] - x["config_rw"] for x in lent)
    finally:
        procs.stop(q1)
        procs.stop(q2)
    vfs = sorted(x.name for x in (Path("/sys/bus/pci/devices") / pf).glob("virtfn*"))
    for cx, dev in ((cb, "hosti/nic0-vf0"), (cc, "hosti/nic0-vf1")):
        cx.execute("detach", device=dev)
        cx.execute("return", device=dev)
    a.stop()
    b.stop()
    c.stop()
    return h.result("vfio-sriov-two-hosts",
                    len(vfs) == 2 and id1 == IGBVF_ID and id2 == IGBVF_ID and
                    holders.get("hosti/nic0-vf0") == "hostj" and
                    holders.get("hosti/nic0-vf1") == "hostk" and forwarded == 0,
                    vfs=len(vfs), vf0_id=f"{id1:#010x}", vf1_id=f"{id2:#010x}",
                    vf0_holder=holders.get("hosti/nic0-vf0"),
                    vf1_holder=holders.get("hosti/nic0-vf1"), bar_accesses_forwarded=forwarded)


def test_refusals(procs, wd, fab, other):
    """@other: a function bound to no vfio-pci (the host's own)."""
    a = Daemon(procs, wd, "hostc", fab,
               lends={"unbound": {"pci": other}, "absent": {"pci": "0000:00:1e.7"}}).start()
    b = Daemon(procs, wd, "hostd", fab).start()
    cb = Control(b.control)
    h.wait_for(lambda: len([x for x in cb.execute("query-devices")
                            if x["device"].startswith("hostc/")]) == 2, 10)
    why = {}
    for name in ("unbound", "absent"):
        try:
            cb.execute("attach", device=f"hostc/{name}", domain=f"vm-{name}")
            why[name] = "attached"
        except ControlError as e:
            why[name] = e.desc
        try:
            cb.execute("return", device=f"hostc/{name}")
        except ControlError:
            pass
    free = all(x["state"] == "available" for x in cb.execute("query-devices")
               if x["device"].startswith("hostc/"))
    a.stop()
    b.stop()
    return h.result("vfio-lend-refusals",
                    "IOMMU group" in why["unbound"] and "vfio-pci" in why["unbound"] and
                    "no PCI function 0000:00:1e.7" in why["absent"] and free,
                    unbound=why["unbound"][-90:].replace(" ", "_"),
                    absent=why["absent"][-60:].replace(" ", "_"), available_after=free)


# The groups of checks, in the order they run (VN_VFIO_ONLY names some of them).
GROUPS = ("managed", "lend", "guest", "device-request", "sriov", "refusals", "large-bar",
          "intx", "worker-crash")


def main():
    only = set(sys.argv[sys.argv.index("--only") + 1].split(",")) if "--only" in sys.argv \
        else set(GROUPS)
    ok = True
    with h.Procs() as procs:
        try:
            bdf = find(NVME_ID)
            shared = sorted(str(x.name) for x in Path("/sys/bus/pci/devices").iterdir()
                            if sysfs(x.name, "vendor") == "0x1af4" and
                            sysfs(x.name, "device") == "0x1005")
            wd = procs.tempdir()
            fab = procs.tempdir("vn-fabric-")
            # First, while the host's nvme driver still has the NVMe.
            if "managed" in only:
                try:
                    ok &= test_managed(procs, wd, fab, bdf, shared)
                except (h.HarnessError, ControlError, TimeoutError, KeyError, OSError,
                        StopIteration, subprocess.CalledProcessError) as e:
                    ok = h.failed("vfio-managed", e)
            unbind(bdf)
            cap = bar0_cap(bdf)
            bind_vfio(bdf)
            # The host's own function to refuse: the host bridge (bound to no vfio-pci).
            other = "0000:00:00.0"
        except (h.HarnessError, OSError) as e:
            print(f"lender host: {e}", file=sys.stderr)
            h.result("vfio-lend-qtest", False, error=str(e)[:120])
            for name in ("vfio-managed", "vfio-rom", "vfio-lender-restart", "vfio-msix",
                         "vfio-bar-mapped", "vfio-lender-unprivileged", "vfio-dma-identify",
                         "vfio-iommu-isolation", "vfio-nvme-guest", "vfio-device-request", "vfio-sriov-two-hosts",
                         "vfio-lend-refusals", "vfio-large-bar", "vfio-device-removed",
                         "vfio-gpu-display", "vfio-intx", "vfio-lender-worker-crash"):
                h.result(name, False, error="setup failed")
            return 1
        tests = {"lend": lambda: test_lend(procs, wd, fab, bdf, cap),
                 "guest": lambda: test_guest(procs, wd, fab, bdf, Path(DISK)),
                 "device-request": lambda: test_device_request(procs, wd, fab, bdf),
                 "sriov": lambda: test_sriov(procs, wd, fab),
                 "refusals": lambda: test_refusals(procs, wd, fab, other),
                 "large-bar": lambda: vfio_gpu.test_large_bar(procs, wd, fab),
                 "intx": lambda: vfio_intx.test_intx(procs, wd, fab),
                 "worker-crash": lambda: vfio_deaths.test_worker_crash(procs, wd, fab, bdf)}
        for name in GROUPS[1:]:
            if name not in only:
                continue
            try:
                ok &= tests[name]()
            except (h.HarnessError, ControlError, TimeoutError, KeyError, OSError) as e:
                ok = h.failed("vfio", e)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
