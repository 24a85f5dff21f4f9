"""The lender host: a TCG VM with an IOMMU (intel-iommu, interrupt remapping) in which Linux
VFIO is real, for the lender's `vfio` backend (tests/lender-host/init, scripts/testbed-guest
--lender-host).

It sees this machine's root read-only (so the build, python3 and the testbed's QEMU run there
unchanged, at the same paths) and a directory of the test's read-write at /tmp/share.  The
test names a Python file of tests/e2e to run inside as root; its RESULT lines are the test's.

    lh = LenderHost(procs, "vfio_inner.py", devices=[NVME])
    lines = lh.run()            # the inner script's output, after the VM powered off
"""
import struct
import subprocess
import time
from pathlib import Path

import harness as h

# An NVMe controller of QEMU's own for the lender host to lend (its disk is a sparse file),
# with an expansion ROM (ROM's bytes below; "{share}" is the host's shared directory).
NVME = "nvme,serial=VN-VFIO-01,drive=nv0,romfile={share}/nvme.rom"
ROM_MARK = b"VN-ROM-0001"


def option_rom():
    """4 KiB: the 0x55 0xAA signature, its size in 512-byte blocks, a far return at the init
    entry, a PCI data structure ("PCIR": Linux's pci_map_rom, and so VFIO, sees no ROM
    without one) and ROM_MARK at 0x100.  The structure names vendor:device ffff:ffff and EFI
    code, so firmware (SeaBIOS in a nested guest) skips the image rather than run it."""
    rom = bytearray(4096)
    rom[0:4] = bytes([0x55, 0xAA, 4096 // 512, 0xCB])
    rom[0x18:0x1a] = struct.pack("<H", 0x1c)
    rom[0x1c:0x1c + 0x18] = (b"PCIR" + struct.pack("<HHHHB", 0xffff, 0xffff, 0, 0x18, 0) +
                             bytes(3) + struct.pack("<HHBB", 4096 // 512, 0, 3, 0x80) + bytes(2))
    rom[0x100:0x100 + len(ROM_MARK)] = ROM_MARK
    return bytes(rom)
# Two functions in one IOMMU group (behind a PCIe-to-PCI bridge), bound to the host's
# virtio-pci driver: what `managed = yes` must refuse to take half of.
SHARED_GROUP = ("pcie-pci-bridge,id=br1", "virtio-rng-pci,bus=br1,addr=0x1",
                "virtio-rng-pci,bus=br1,addr=0x2")
# An SR-IOV NIC (QEMU's igb: up to 7 VFs, at devfn PF + 0x80 + 2k, so slot 0x18 on).
IGB = "igb,addr=0x8"
# GPU memory's stand-in: ivshmem-plain, whose BAR2 (64-bit, prefetchable) is its memory
# backend, 1 GiB, a file of the share (so the test reads what the device holds).
GPU_MEM = "memory-backend-file,id=gpumem,size=1G,share=on,mem-path={share}/gpumem"
IVSHMEM = "ivshmem-plain,memdev=gpumem"


def lender_host_image():
    if "lender-host" not in h._cache:
        h._cache["lender-host"] = Path(h._script_output("testbed-guest", "--lender-host"))
    return h._cache["lender-host"]


class LenderHost:
    def __init__(self, procs, inner, args=(), devices=(NVME,), objects=(), mem_mib=1536,
                 timeout=300.0):
        self.procs = procs
        self.inner = inner
        self.args = [str(a) for a in args]
        self.devices = list(devices)
        self.objects = list(objects)        # -object arguments (the devices' backends)
        self.mem_mib = mem_mib
        self.timeout = timeout
        self.share = procs.tempdir("vn-lender-host-")
        self.console = ""

    def _argv(self):
        img = lender_host_image()
        kernel = img / "vmlinux" if (img / "vmlinux").exists() else img / "vmlinuz"
        disk = h.make_backing(self.share / "nv0.img", 64)
        argv = [h.stock_qemu(), "-machine", "q35,kernel-irqchip=split", "-accel", "tcg",
                "-m", str(self.mem_mib), "-smp", "1", "-nographic", "-no-reboot",
                "-kernel", str(kernel), "-initrd", str(img / "initrd.gz"),
                "-append", f"console=ttyS0 quiet panic=-1 intel_iommu=on iommu=pt "
                           f"vn.timeout={int(self.timeout) - 20}",
                "-device", "intel-iommu,intremap=on,caching-mode=on",
                "-drive", f"if=none,id=nv0,file={disk},format=raw",
                "-fsdev", "local,id=hr,path=/,security_model=none,readonly=on",
                "-device", "virtio-9p-pci,fsdev=hr,mount_tag=hostroot",
                "-fsdev", f"local,id=sh,path={self.share},security_model=none",
                "-device", "virtio-9p-pci,fsdev=sh,mount_tag=share"]
        (self.share / "nvme.rom").write_bytes(option_rom())
        for o in self.objects:
            argv += ["-object", o.format(share=self.share)]
        for d in self.devices:
            argv += ["-device", d.format(share=self.share)]
        return argv

    def run(self):
        """Boot, run the inner script, power off; its output's lines.  HarnessError when the
        host did not come up or the script did not finish."""
        out = self.share / "inner.log"
        script = (f"cd {h._shquote(str(h.REPO / 'tests' / 'e2e'))} && "
                  f"python3 {h._shquote(self.inner)} "
                  + " ".join(h._shquote(a) for a in self.args) +
                  " >/tmp/share/inner.log 2>&1\n")
        (self.share / "script.sh").write_text(script)
        t0 = time.monotonic()
        p = subprocess.run(self._argv(), stdin=subprocess.DEVNULL, capture_output=True,
                           text=True, errors="replace", timeout=self.timeout)
        self.console = p.stdout + p.stderr
        self.seconds = time.monotonic() - t0
        fails = [ln for ln in self.console.splitlines() if ln.startswith("VNHOST fail")]
        if "VNHOST up" not in self.console:
            raise h.HarnessError(f"the lender host did not come up: {fails or ''}\n"
                                 f"{h._tail(self.console)}")
        if "VNHOST done" not in self.console:
            raise h.HarnessError(f"the lender host's script did not finish: {fails}\n"
                                 f"{h._tail(out.read_text() if out.exists() else '')}")
        return out.read_text(errors="replace").splitlines() if out.exists() else []
