"""The lender host: a TCG VM with an IOMMU (intel-iommu, interrupt remapping) in which Linux
VFIO is real, for the lender's `vfio` backend (tests/lender-host/init, scripts/testbed-guest
--lender-host).

It sees this machine's root read-only (so the build, python3 and the testbed's QEMU run there
unchanged, at the same paths) and a directory of the test's read-write at /tmp/share.  The
test names a Python file of tests/e2e to run inside as root; its RESULT lines are the test's.

    lh = LenderHost(procs, "vfio_inner.py", devices=[NVME])
    lines = lh.run()            # the inner script's output, after the VM powered off

While it runs, the inner script may ask the machine outside for what only the lender host's
QEMU can do (ask_outside(): a screendump of one of its displays), through two files of the
share.
"""
import json
import os
import re
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
# A second QEMU NVMe with a 16 MiB Controller Memory Buffer (BAR2), a peer-to-peer target
# (docs/p2p.md; tests/e2e/p2p_vfio_inner.py).
P2P_CMB_NVME = "nvme,serial=VN-VFIO-CMB,drive=nv1,cmb_size_mb=16"
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
# A display GPU: its VRAM (BAR0) is what the lender host's QEMU shows on its console, which
# the outside screendumps by this id (ask_outside).
DISPLAY_ID = "gpu1"
DISPLAY = f"bochs-display,id={DISPLAY_ID}"
# A function with INTx only (conventional PCI, no MSI or MSI-X capability): QEMU's e1000.
# No option ROM: the consumer does not need one, and the testbed's root has none for it.
E1000 = "e1000,romfile="


# The share as the lender host sees it, and the files of a request to the outside.
INSIDE_SHARE = Path("/tmp/share")
REQUEST, ANSWER = "outside-request.json", "outside-answer.json"


def ask_outside(request, timeout=60.0):
    """From inside the lender host: have the outside do @request ({"screendump": FILE,
    "device": QDEV-ID, "format": "ppm"|"png"}; FILE lands in the share).  Returns the
    answer's dict; HarnessError when it says why not or does not come."""
    (INSIDE_SHARE / ANSWER).unlink(missing_ok=True)
    tmp = INSIDE_SHARE / (REQUEST + ".tmp")
    tmp.write_text(json.dumps(request))
    tmp.rename(INSIDE_SHARE / REQUEST)
    if not h.wait_for(lambda: (INSIDE_SHARE / ANSWER).exists(), timeout):
        raise h.HarnessError(f"the outside did not answer {request}")
    answer = json.loads((INSIDE_SHARE / ANSWER).read_text())
    if "error" in answer:
        raise h.HarnessError(f"the outside refused {request}: {answer['error']}")
    return answer


def lender_host_image(flavor="lender-host"):
    """The kernel and initramfs of @flavor: "lender-host" (tests/lender-host/init) or
    "systemd-host" (tests/systemd-host/init: systemd as PID 1 on an overlay of the machine's
    root, for the installed units)."""
    if flavor not in h._cache:
        h._cache[flavor] = Path(h._script_output("testbed-guest", f"--{flavor}"))
    return h._cache[flavor]


class LenderHost:
    """One such VM.  Several may run at once and share one directory (@share), each with a
    @role: the script in the share then runs the inner script with `--role ROLE`, whose
    output is inner-ROLE.log.  @raw_devices are -device arguments taken as they are (JSON);
    @memfd gives the VM shareable RAM (what a vfio-user device in it needs)."""

    def __init__(self, procs, inner, args=(), devices=(NVME,), objects=(), mem_mib=1536,
                 timeout=300.0, share=None, role=None, raw_devices=(), memfd=False,
                 flavor="lender-host", qemu=None):
        self.procs = procs
        self.qemu = qemu                    # None: Debian's (h.stock_qemu())
        self.inner = inner
        self.args = [str(a) for a in args]
        self.devices = list(devices)
        self.raw_devices = list(raw_devices)
        self.objects = list(objects)        # -object arguments (the devices' backends)
        self.mem_mib = mem_mib
        self.memfd = memfd
        self.flavor = flavor
        self.timeout = timeout
        self.share = share or procs.tempdir("vn-lender-host-")
        self.role = role
        self.out = self.share / (f"inner-{role}.log" if role else "inner.log")
        self.qmp_path = procs.tempdir("vn-lender-qmp-") / "qmp.sock"
        self.console = ""
        self.proc = None

    def _argv(self):
        img = lender_host_image(self.flavor)
        kernel = img / "vmlinux" if (img / "vmlinux").exists() else img / "vmlinuz"
        machine = "q35,kernel-irqchip=split" + (",memory-backend=mem" if self.memfd else "")
        argv = [self.qemu or h.stock_qemu(), "-machine", machine, "-accel", "tcg",
                "-m", str(self.mem_mib), "-smp", "1", "-nographic", "-no-reboot",
                "-qmp", f"unix:{self.qmp_path},server=on,wait=off",
                "-kernel", str(kernel), "-initrd", str(img / "initrd.gz"),
                "-append", f"console=ttyS0 quiet panic=-1 intel_iommu=on iommu=pt "
                           f"vn.timeout={int(self.timeout) - 20}"
                           + (f" vn.role={self.role}" if self.role else ""),
                "-device", "intel-iommu,intremap=on,caching-mode=on",
                "-fsdev", "local,id=hr,path=/,security_model=none,readonly=on",
                "-device", "virtio-9p-pci,fsdev=hr,mount_tag=hostroot",
                "-fsdev", f"local,id=sh,path={self.share},security_model=none",
                "-device", "virtio-9p-pci,fsdev=sh,mount_tag=share"]
        if self.qemu is not None:
            argv += ["-nic", "none"]        # the patched QEMU ships no NIC option ROMs
        if self.memfd:
            argv += ["-object", f"memory-backend-memfd,id=mem,size={self.mem_mib}M,share=on"]
        # Each drive=nvN a device names (lenderhost.NVME's nv0, P2P_CMB_NVME's nv1) is a disk
        # of 64 MiB in the share, nvN.img.
        for drive in sorted({m for d in self.devices for m in re.findall(r"drive=(nv\d+)", d)}):
            disk = h.make_backing(self.share / f"{drive}.img", 64)
            argv += ["-drive", f"if=none,id={drive},file={disk},format=raw"]
        if any("drive=nv0" in d for d in self.devices):
            (self.share / "nvme.rom").write_bytes(option_rom())
        for o in self.objects:
            argv += ["-object", o.format(share=self.share)]
        for d in self.devices:
            argv += ["-device", d.format(share=self.share)]
        for d in self.raw_devices:
            argv += ["-device", d]
        # VN_QEMU_TRACE=PATTERN,...: a developer's look at what this host's QEMU does (its
        # trace events, in the share's qemu-ROLE.log).
        if os.environ.get("VN_QEMU_TRACE"):
            for t in os.environ["VN_QEMU_TRACE"].split(","):
                argv += ["-trace", t]
            argv += ["-D", str(self.share / f"qemu-{self.role or 'host'}.log")]
        return argv

    def run(self):
        """Boot, run the inner script, power off; its output's lines.  HarnessError when the
        host did not come up or the script did not finish."""
        self.start()
        return self.finish()

    def start(self):
        """Boot it; the inner script runs at once (finish() waits for it)."""
        if Path("/tmp") in h.REPO.parents:
            # The VM sees the machine's root with a tmpfs of its own on /tmp.
            raise h.HarnessError(f"the checkout ({h.REPO}) is under /tmp, which the lender "
                                 "host VM does not see: clone it elsewhere")
        # With a role, the one script of a shared directory picks its own line.
        role = "$(sed -n 's/.* vn[.]role=\\([a-z0-9]*\\).*/\\1/p' /proc/cmdline)"
        out = f"/tmp/share/inner-{role}.log" if self.role else "/tmp/share/inner.log"
        script = (f"cd {h._shquote(str(h.REPO / 'tests' / 'e2e'))} && "
                  f"python3 {h._shquote(self.inner)} "
                  + " ".join(h._shquote(a) for a in self.args) +
                  (f" --role {role}" if self.role else "") + f" >{out} 2>&1\n")
        (self.share / "script.sh").write_text(script)
        self.t0 = time.monotonic()
        self.log = self.qmp_path.parent / "console.log"
        with open(self.log, "wb") as f:
            self.proc = self.procs.start(f"lender-host{'-' + self.role if self.role else ''}",
                                         self._argv(), stdin=subprocess.DEVNULL, stdout=f,
                                         stderr=subprocess.STDOUT)

    def finish(self):
        """Wait until it powered off (serving what the inner script asks of the outside);
        the inner script's output's lines."""
        p = self.proc
        try:
            while p.poll() is None:
                if time.monotonic() - self.t0 > self.timeout:
                    raise TimeoutError(f"the lender host ran past {self.timeout:.0f} s")
                self._serve_request(p)
                time.sleep(0.2)
        finally:
            self.procs.stop(p)
            self.console = self.log.read_text(errors="replace")
            self.log.unlink(missing_ok=True)
        self.seconds = time.monotonic() - self.t0
        fails = [ln for ln in self.console.splitlines() if ln.startswith("VNHOST fail")]
        if "VNHOST up" not in self.console:
            raise h.HarnessError(f"the lender host did not come up: {fails or ''}\n"
                                 f"{h._tail(self.console)}")
        if "VNHOST done" not in self.console:
            raise h.HarnessError(f"the lender host's script did not finish: {fails}\n"
                                 f"{h._tail(self.out.read_text() if self.out.exists() else '')}")
        return self.out.read_text(errors="replace").splitlines() if self.out.exists() else []

    def _serve_request(self, p):
        """Answer the inner script's request to the outside (ask_outside), if it made one.
        It is the test's own script, but a request is still checked: a file name only, a
        known format."""
        req = self.share / REQUEST
        if not req.exists():
            return
        try:
            r = json.loads(req.read_text())
            name = str(r["screendump"])
            fmt = r.get("format", "ppm")
            if "/" in name or name.startswith(".") or fmt not in ("ppm", "png"):
                raise ValueError(f"bad screendump request {r}")
            qmp = h.QMP(self.qmp_path, timeout=10, alive=lambda: p.poll() is None)
            try:
                args = {"filename": str(self.share / name), "format": fmt}
                if r.get("device"):
                    args["device"] = str(r["device"])
                qmp.execute("screendump", args)
            finally:
                qmp.close()
            answer = {"file": name}
        except (OSError, ValueError, KeyError, h.HarnessError) as e:
            answer = {"error": str(e)}
        req.unlink(missing_ok=True)
        tmp = self.share / (ANSWER + ".tmp")
        tmp.write_text(json.dumps(answer))
        tmp.rename(self.share / ANSWER)
