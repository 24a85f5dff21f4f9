#!/usr/bin/python3
"""End-to-end test harness: boots the test guest in QEMU (TCG) against NVMe devices and
reads back what the guest's /init (tests/guest/init) reports on the serial console.

Standard library only, so it runs on a fresh machine with Debian's python3.

Library:
    with Procs() as procs:
        q = Qemu(procs, checks="probe,data", devices=[VfioUserDevice("/run/x.sock")])
        q.start()
        run = q.wait_done()            # -> Run: results, data regions, events, timings
        verify_backing("disk.img", run.data)

CLI (see `harness.py -h`):
    builtin-smoke     probe,data,reset against QEMU's built-in nvme; verifies the backing file
    hotplug           hot-unplug/replug of the built-in nvme on a pcie-root-port through QMP
    simdev-smoke      the same checks against build/vfio-ntb-simdev over vfio-user

Every process started here is killed and every temp dir removed on exit, exceptions,
KeyboardInterrupt and SIGTERM; every wait has a bound (TCG is slow: a run defaults to 300 s).
"""

import argparse
import atexit
import hashlib
import json
import os
import re
import select
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

# QEMU prints this when a BAR offered as mmap-able could not be mapped; it then traps every
# access silently, which would hide the whole point of the shared-memory BAR.
MMAP_FALLBACK = "Failed to mmap"


class HarnessError(Exception):
    pass


class Timeout(HarnessError):
    pass


# --------------------------------------------------------------------------------------------
# Processes and temporary files


class Procs:
    """Owns every child process and temp path of a test; tears all of them down on exit.

    Children run in their own session so a terminal's Ctrl-C reaches only us, and we can
    signal a child's whole process group (a wrapper script and what it started)."""

    _live = []  # instances not yet cleaned up, for the atexit/signal path

    def __init__(self, term_timeout=5.0):
        self.term_timeout = term_timeout
        self.procs = []  # (name, Popen)
        self.paths = []
        Procs._live.append(self)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.cleanup()
        return False

    def start(self, name, argv, **kw):
        kw.setdefault("stdin", subprocess.DEVNULL)
        p = subprocess.Popen([str(a) for a in argv], start_new_session=True, **kw)
        self.procs.append((name, p))
        return p

    def stop(self, p, timeout=None):
        """SIGTERM the process group, SIGKILL after a bound; returns the exit status."""
        timeout = self.term_timeout if timeout is None else timeout
        if p.poll() is None:
            _killpg(p, signal.SIGTERM)
            try:
                p.wait(timeout)
            except subprocess.TimeoutExpired:
                _killpg(p, signal.SIGKILL)
                try:
                    p.wait(timeout)
                except subprocess.TimeoutExpired:
                    print(f"harness: pid {p.pid} survived SIGKILL", file=sys.stderr)
        # Stragglers in the group (e.g. a child a server forked) die with it.
        _killpg(p, signal.SIGKILL)
        return p.returncode

    def tempdir(self, prefix="vn-e2e-"):
        # Short paths: a UNIX socket path must fit in 108 bytes.
        d = Path(tempfile.mkdtemp(prefix=prefix, dir=os.environ.get("VN_TMP", "/tmp")))
        # Passable, not listable: as /run/vfio-ntb, so the worker user reaches its port.
        d.chmod(0o711)
        self.paths.append(d)
        return d

    def track(self, path):
        self.paths.append(Path(path))
        return path

    def cleanup(self):
        for _name, p in reversed(self.procs):
            self.stop(p)
        self.procs.clear()
        for path in reversed(self.paths):
            if path.is_dir() and not path.is_symlink():
                shutil.rmtree(path, ignore_errors=True)
            else:
                try:
                    path.unlink()
                except FileNotFoundError:
                    pass
        self.paths.clear()
        if self in Procs._live:
            Procs._live.remove(self)


def _killpg(p, sig):
    try:
        os.killpg(p.pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


@atexit.register
def _cleanup_all():
    for procs in list(Procs._live):
        procs.cleanup()


def _on_signal(signum, _frame):
    # Turn SIGTERM/SIGHUP into an exception so `with` blocks and finally clauses run.
    raise SystemExit(128 + signum)


for _sig in (signal.SIGTERM, signal.SIGHUP):
    signal.signal(_sig, _on_signal)


# --------------------------------------------------------------------------------------------
# Testbed pieces


def _script_output(script, *args):
    out = subprocess.run([str(REPO / "scripts" / script), *args], check=True,
                         stdout=subprocess.PIPE, text=True, timeout=3600).stdout.strip()
    if not out:
        raise HarnessError(f"scripts/{script} printed nothing")
    return out


_cache = {}


def stock_qemu():
    """Debian's QEMU >= 10.1 as it ships (scripts/testbed-qemu)."""
    if "qemu" not in _cache:
        _cache["qemu"] = _script_output("testbed-qemu")
    return _cache["qemu"]


def patched_qemu():
    """QEMU built from Debian's source with qemu-patches/series (scripts/build-qemu)."""
    if "patched" not in _cache:
        # VN_PATCHED_QEMU: a binary of your own (e.g. a QEMU tree you are changing).
        _cache["patched"] = (os.environ.get("VN_PATCHED_QEMU") or
                             _script_output("build-qemu", "--print-path"))
    return _cache["patched"]


def testbed_qemu():
    """The QEMU tests run by default: VN_QEMU=stock (default) or patched."""
    kind = os.environ.get("VN_QEMU", "stock")
    if kind not in ("stock", "patched"):
        raise HarnessError(f"VN_QEMU must be stock or patched, not {kind!r}")
    return patched_qemu() if kind == "patched" else stock_qemu()


def testbed_guest(flavor=None):
    """The test guest's directory; flavor "p2p": forky's kernel with CONFIG_PCI_P2PDMA."""
    key = f"guest-{flavor}" if flavor else "guest"
    if key not in _cache:
        _cache[key] = Path(_script_output("testbed-guest", *([f"--{flavor}"] if flavor else [])))
    return _cache[key]


def testbed_qemu_img():
    # testbed-qemu's wrapper qemu-RECIPE has a sibling qemu-img-RECIPE.
    q = Path(stock_qemu())
    sib = q.with_name(q.name.replace("qemu-", "qemu-img-", 1))
    return str(sib) if sib.exists() else shutil.which("qemu-img")


def make_backing(path, size_mib):
    """A sparse raw image of size_mib MiB (contents read as zeros)."""
    with open(path, "wb") as f:
        f.truncate(size_mib * 1024 * 1024)
    return path


# --------------------------------------------------------------------------------------------
# Devices


class VIommu:
    """The guest's own IOMMU (intel-iommu; caching-mode: QEMU tells a vfio-user device of each
    map the guest makes), given before the devices it translates for; the guest needs
    intel_iommu=on (GUEST_APPEND)."""

    GUEST_APPEND = "intel_iommu=on"

    def qemu_args(self):
        return ["-device", "intel-iommu,caching-mode=on"]


class VfioUserDevice:
    """A vfio-user-pci client device.  QEMU accepts it only in JSON form."""

    def __init__(self, socket_path, id="d0", bus=None, props=None):
        """props: more of the device's properties ({"x-msg-timeout": 60000})."""
        self.socket_path, self.id, self.bus = str(socket_path), id, bus
        self.props = dict(props or {})

    def qmp_args(self):
        a = {"driver": "vfio-user-pci", "id": self.id,
             "socket": {"type": "unix", "path": self.socket_path}, **self.props}
        if self.bus:
            a["bus"] = self.bus
        return a

    def qemu_args(self):
        return ["-device", json.dumps(self.qmp_args())]


class PcieSwitch:
    """An emulated PCIe switch (x3130 upstream port behind root port rp0, downstream ports
    dn0..dnN-1): devices behind one switch may DMA to each other's BARs (Linux's P2PDMA
    allows peers under one switch; q35's host bridge is not on its whitelist)."""

    def __init__(self, ports=2):
        self.ports = ports

    def qemu_args(self):
        a = ["-device", "pcie-root-port,id=rp0,bus=pcie.0,chassis=1,slot=1",
             "-device", "x3130-upstream,id=up0,bus=rp0"]
        for i in range(self.ports):
            a += ["-device", f"xio3130-downstream,id=dn{i},bus=up0,chassis={2 + i},slot=0"]
        return a


class BuiltinNvme:
    """QEMU's emulated NVMe over a raw file, for comparisons and for testing the guest side.

    The image is a -blockdev node, not a -drive: a legacy -drive is deleted together with its
    device on unplug, and hot-plug tests must add the device back onto the same image."""

    def __init__(self, image, id="d0", serial="VN-BUILTIN", bus=None):
        self.image, self.id, self.serial, self.bus = str(image), id, serial, bus
        self.node = f"{id}-img"

    def qmp_args(self):
        a = {"driver": "nvme", "id": self.id, "serial": self.serial, "drive": self.node}
        if self.bus:
            a["bus"] = self.bus
        return a

    def qemu_args(self):
        blk = {"driver": "raw", "node-name": self.node,
               "file": {"driver": "file", "filename": self.image}}
        return ["-blockdev", json.dumps(blk), "-device", json.dumps(self.qmp_args())]


# --------------------------------------------------------------------------------------------
# QMP


class QMPError(HarnessError):
    pass


class QMP:
    """Minimal QMP client: greeting, capabilities negotiation, commands, events."""

    def __init__(self, path, timeout=30.0, alive=None):
        """alive(): false once the QEMU process is gone, so connecting fails fast."""
        deadline = time.monotonic() + timeout
        while True:
            self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                self.sock.connect(str(path))
                break
            except (FileNotFoundError, ConnectionRefusedError):
                self.sock.close()
                if alive is not None and not alive():
                    raise QMPError("QEMU exited before its QMP socket was up") from None
                if time.monotonic() > deadline:
                    raise Timeout(f"QMP socket {path} not reachable in {timeout} s") from None
                time.sleep(0.05)
        self.buf = b""
        self.events = []
        greeting = self._recv(deadline)
        if "QMP" not in greeting:
            raise QMPError(f"unexpected QMP greeting {greeting}")
        self.execute("qmp_capabilities", timeout=timeout)

    def close(self):
        self.sock.close()

    def _recv(self, deadline):
        while b"\n" not in self.buf:
            left = deadline - time.monotonic()
            if left <= 0:
                raise Timeout("QMP: no answer in time")
            self.sock.settimeout(left)
            try:
                chunk = self.sock.recv(65536)
            except socket.timeout:
                raise Timeout("QMP: no answer in time") from None
            except OSError as e:
                raise QMPError(f"QMP connection lost: {e}") from None
            if not chunk:
                raise QMPError("QMP connection closed")
            self.buf += chunk
        line, self.buf = self.buf.split(b"\n", 1)
        return json.loads(line)

    def execute(self, cmd, args=None, timeout=30.0):
        msg = {"execute": cmd}
        if args is not None:
            msg["arguments"] = args
        try:
            self.sock.sendall(json.dumps(msg).encode() + b"\n")
        except OSError as e:
            raise QMPError(f"QMP connection lost: {e}") from None
        deadline = time.monotonic() + timeout
        while True:
            r = self._recv(deadline)
            if "event" in r:
                self.events.append(r)
            elif "error" in r:
                raise QMPError(f"{cmd}: {r['error'].get('class')}: {r['error'].get('desc')}")
            elif "return" in r:
                return r["return"]

    def wait_event(self, name, timeout=30.0, match=None):
        """Return (and consume) the first event `name` for which match(data) is true."""
        deadline = time.monotonic() + timeout
        while True:
            for i, ev in enumerate(self.events):
                if ev["event"] == name and (match is None or match(ev.get("data", {}))):
                    return self.events.pop(i)
            r = self._recv(deadline)
            if "event" in r:
                self.events.append(r)


# --------------------------------------------------------------------------------------------
# Serial console protocol (tests/guest/init)


_LINE = re.compile(r"(VNRESULT|VNDATA|VNDONE|VNREADY|VNEVENT|VNINFO)\b ?(.*)")


def _kv(words):
    d = {}
    for w in words:
        k, sep, v = w.partition("=")
        if sep:
            d[k] = v
    return d


class Run:
    """What a guest reported; lines in order with the host time (s since QEMU start) seen."""

    def __init__(self):
        self.results = {}  # check -> {"status": PASS|FAIL, **kv} (the last, if repeated)
        self.result_list = []  # (check, {"status": ..., **kv}) in order
        self.data = []  # (offset, length, md5)
        self.done = None  # {"passed": N, "failed": M}
        self.events = []  # (t, kind, text) for VNREADY/VNEVENT
        self.info = []  # (t, text)
        self.lines = []  # (t, raw line) of every VN line
        self.t_boot = None  # host time of the guest's first line (init started)
        self.t_exit = None
        self.exit_status = None

    def feed(self, t, raw):
        m = _LINE.search(raw)
        if not m:
            return None
        kind, rest = m.group(1), m.group(2).strip()
        words = rest.split()
        self.lines.append((t, f"{kind} {rest}"))
        if self.t_boot is None:
            self.t_boot = t
        if kind == "VNRESULT" and len(words) >= 2:
            self.results[words[0]] = {"status": words[1], **_kv(words[2:])}
            self.result_list.append((words[0], self.results[words[0]]))
        elif kind == "VNDATA" and len(words) == 3:
            self.data.append((int(words[0]), int(words[1]), words[2]))
        elif kind == "VNDONE":
            self.done = {k: int(v) for k, v in _kv(words).items() if v.isdigit()}
        elif kind in ("VNREADY", "VNEVENT"):
            self.events.append((t, kind, rest))
        else:
            self.info.append((t, rest))
        return kind, rest

    @property
    def ok(self):
        return (self.done is not None and self.done.get("failed", 1) == 0 and self.result_list
                and all(r["status"] == "PASS" for _c, r in self.result_list))


# --------------------------------------------------------------------------------------------
# QEMU


class Qemu:
    """The known-good test VM of TESTBED.md around the test guest.

    checks: guest checks (vn.checks); params: more vn.* parameters ({"seed": 7});
    devices: VfioUserDevice/BuiltinNvme; root_port: add pcie-root-port rp1 (hot-plug needs it;
    devices placed there need bus="rp1")."""

    def __init__(self, procs, checks, devices=(), params=None, root_port=False, timeout=300.0,
                 workdir=None, memory_mib=512, kernel=None, echo=False, extra_args=(),
                 append_extra="", qemu=None, hugepages=False, guest=None):
        """qemu: the binary (default testbed_qemu(): VN_QEMU picks stock or patched);
        hugepages: guest RAM in 2 MiB huge pages (the host must have them free)."""
        self.procs = procs
        self.qemu = qemu
        self.checks = checks if isinstance(checks, str) else ",".join(checks)
        self.devices = list(devices)
        self.params = dict(params or {})
        self.root_port = root_port
        self.timeout = timeout
        self.workdir = Path(workdir) if workdir else procs.tempdir("vn-qemu-")
        self.memory_mib = memory_mib
        self.kernel = kernel
        self.echo = echo
        self.extra_args = list(extra_args)
        self.append_extra = append_extra
        self.hugepages = hugepages
        self.guest = guest                  # testbed_guest()'s flavor ("p2p"), or None
        self.serial_path = self.workdir / "serial.log"
        self.stderr_path = self.workdir / "qemu.err"
        self.qmp_path = self.workdir / "qmp.sock"
        self.proc = None
        self.qmp = None
        self.run = Run()
        self._serial_pos = 0
        self._partial = b""

    def argv(self):
        guest = testbed_guest(self.guest)
        kernel = self.kernel or (guest / "vmlinux" if (guest / "vmlinux").exists()
                                 else guest / "vmlinuz")
        params = {"checks": self.checks, "timeout": max(30, int(self.timeout) - 20)}
        params.update(self.params)
        append = "console=ttyS0 loglevel=4 panic=-1 " + " ".join(
            f"vn.{k}={v}" for k, v in params.items())
        if self.append_extra:
            append += " " + self.append_extra
        m = self.memory_mib
        a = [self.qemu or testbed_qemu(),
             "-machine", "q35,accel=tcg,memory-backend=mem", "-cpu", "max", "-smp", "1",
             "-m", f"{m}M",
             # vfio-user needs guest RAM in a shareable fd (DMA_MAP passes it to the server).
             "-object", f"memory-backend-memfd,id=mem,size={m}M,share=on" +
             (",hugetlb=on,hugetlbsize=2M" if self.hugepages else ""),
             "-nodefaults", "-nographic", "-no-reboot",
             "-serial", f"file:{self.serial_path}",
             "-qmp", f"unix:{self.qmp_path},server=on,wait=off",
             "-kernel", str(kernel), "-initrd", str(guest / "initrd.gz"),
             "-append", append]
        if self.root_port:
            a += ["-device", "pcie-root-port,id=rp1,slot=1,chassis=1"]
        for d in self.devices:
            a += d.qemu_args()
        return a + self.extra_args

    def start(self):
        argv = self.argv()
        (self.workdir / "qemu.cmd").write_text(" ".join(_shquote(x) for x in argv) + "\n")
        self.serial_path.touch()
        self.t0 = time.monotonic()
        self.deadline = self.t0 + self.timeout
        with open(self.stderr_path, "wb") as err:
            self.proc = self.procs.start("qemu", argv, stdout=subprocess.DEVNULL, stderr=err)
        try:
            self.qmp = QMP(self.qmp_path, timeout=min(60.0, self.timeout),
                           alive=lambda: self.proc.poll() is None)
        except HarnessError as e:
            try:
                self.proc.wait(2)  # QEMU usually is on its way out: let its stderr complete
            except subprocess.TimeoutExpired:
                pass
            raise HarnessError(f"QEMU did not come up: {e}\n{self.diagnostics()}") from None
        return self

    def _left(self, timeout=None):
        left = self.deadline - time.monotonic()
        if timeout is not None:
            left = min(left, timeout)
        return left

    def poll(self):
        """Read new serial output; return the new (kind, rest) protocol lines."""
        new = []
        with open(self.serial_path, "rb") as f:
            f.seek(self._serial_pos)
            chunk = f.read()
        self._serial_pos += len(chunk)
        data = self._partial + chunk
        *lines, self._partial = data.split(b"\n")
        t = time.monotonic() - self.t0
        for raw in lines:
            text = raw.decode("utf-8", "replace").replace("\r", "")
            if self.echo:
                print(f"[{t:7.2f}] {text}", file=sys.stderr)
            r = self.run.feed(t, text)
            if r:
                new.append(r)
        self.check_stderr()
        if self.proc.poll() is not None and self.run.exit_status is None:
            self.run.exit_status = self.proc.returncode
            self.run.t_exit = t
        return new

    def check_stderr(self):
        try:
            err = self.stderr_path.read_text(errors="replace")
        except FileNotFoundError:
            return
        if MMAP_FALLBACK in err:
            raise HarnessError(f"QEMU could not mmap a BAR and fell back to trapped access:\n"
                               f"{_tail(err)}")

    def wait_line(self, kind, text=None, timeout=None):
        """Wait for a protocol line of `kind` (e.g. VNREADY) whose text starts with `text`."""
        seen = len(self.run.lines)
        while True:
            self.poll()
            for _t, line in self.run.lines[seen:]:
                k, _, rest = line.partition(" ")
                if k == kind and (text is None or rest.startswith(text)):
                    return rest
            seen = len(self.run.lines)
            if self.proc.poll() is not None:
                self.poll()
                raise HarnessError(f"QEMU exited ({self.proc.returncode}) before {kind} {text or ''}"
                                   f"\n{self.diagnostics()}")
            if self._left(timeout) <= 0:
                raise Timeout(f"no {kind} {text or ''} in time\n{self.diagnostics()}")
            time.sleep(0.05)

    def wait_done(self, timeout=None):
        """Wait for VNDONE and QEMU's exit (the guest powers off); return the Run."""
        while self.run.done is None or self.proc.poll() is None:
            self.poll()
            if self.proc.poll() is not None and self.run.done is None:
                # The serial log may lag the exit we were told of (libvirt's domain state
                # comes from another process): give the last bytes a moment to arrive.
                read = self._serial_pos
                deadline = time.monotonic() + 3.0
                while self.run.done is None and time.monotonic() < deadline:
                    self.poll()
                    time.sleep(0.1)
                if self.run.done is not None:
                    print(f"note: VNDONE arrived after the exit was seen (serial log grew "
                          f"from {read} to {self._serial_pos} bytes)", file=sys.stderr)
                    continue
                raise HarnessError(f"QEMU exited ({self.proc.returncode}) without VNDONE "
                                   f"(serial log read to byte {self._serial_pos})\n"
                                   f"{self.diagnostics()}")
            if self.run.done is not None and self.proc.poll() is None:
                # Power-off follows VNDONE within a second; allow a little slack.
                try:
                    self.proc.wait(min(10.0, max(0.1, self._left(timeout))))
                except subprocess.TimeoutExpired:
                    raise Timeout("guest said VNDONE but QEMU did not exit") from None
                continue
            if self._left(timeout) <= 0:
                raise Timeout(f"guest did not finish in {self.timeout} s\n{self.diagnostics()}")
            time.sleep(0.1)
        self.poll()
        return self.run

    def stop(self):
        if self.qmp:
            self.qmp.close()
            self.qmp = None
        if self.proc:
            self.procs.stop(self.proc)

    def diagnostics(self):
        serial = self.serial_path.read_text(errors="replace") if self.serial_path.exists() else ""
        err = self.stderr_path.read_text(errors="replace") if self.stderr_path.exists() else ""
        return (f"--- serial (tail; {len(serial.encode())} bytes) ---\n{_tail(serial)}\n"
                f"--- qemu stderr (tail) ---\n{_tail(err)}")


def _tail(s, n=25):
    return "\n".join(s.rstrip("\n").splitlines()[-n:])


def _shquote(s):
    s = str(s)
    return s if re.fullmatch(r"[\w@%+=:,./-]+", s) else "'" + s.replace("'", "'\\''") + "'"


def qtest_command(q, cmd, timeout=30.0, events=None):
    """One qtest command; returns its OK line's words.  A reply may be one line of tens of
    MB (b64read): it is read in large pieces and looked at once a piece ends a line.
    QEMU's own lines around the reply (`IRQ raise N` once `irq_intercept_in` is on) go to
    the list @events when one is given."""
    q.stdin.write(cmd + "\n")
    q.stdin.flush()
    buf = bytearray()
    deadline = time.monotonic() + timeout
    while True:
        left = deadline - time.monotonic()
        if left <= 0 or not select.select([q.stdout], [], [], left)[0]:
            raise Timeout(f"qtest: no answer to {cmd!r}")
        chunk = os.read(q.stdout.fileno(), 1 << 20)
        if not chunk:
            raise HarnessError(f"qtest: QEMU closed its stdout after {cmd!r}")
        buf += chunk
        if b"\n" not in chunk:
            continue
        lines = buf.decode(errors="replace").splitlines()
        for line in lines:
            if line.startswith(("OK", "FAIL", "ERR")):
                if events is not None:      # before the reply or after it, whole lines
                    whole = lines if buf.endswith(b"\n") else lines[:-1]
                    events.extend(x for x in whole if x.startswith("IRQ "))
                if not line.startswith("OK"):
                    raise HarnessError(f"qtest: {cmd!r}: {line}")
                return line.split()


def hotplug_cycle(q, dev, timeout=60.0):
    """Drive the guest's hotplug-wait check: on VNREADY remove `dev` through QMP, wait for
    DEVICE_DELETED and the guest's VNEVENT removed, add it back, wait for VNEVENT added.
    Returns timings in seconds."""
    q.wait_line("VNREADY", "hotplug", timeout=q._left())
    t = {}
    t0 = time.monotonic()
    q.qmp.execute("device_del", {"id": dev.id})
    q.qmp.wait_event("DEVICE_DELETED", timeout=timeout,
                     match=lambda d: d.get("device") == dev.id)
    t["device_deleted_s"] = time.monotonic() - t0
    q.wait_line("VNEVENT", "removed", timeout=timeout)
    t["guest_removed_s"] = time.monotonic() - t0
    t1 = time.monotonic()
    q.qmp.execute("device_add", dev.qmp_args())
    q.wait_line("VNEVENT", "added", timeout=timeout)
    t["guest_added_s"] = time.monotonic() - t1
    return t


# --------------------------------------------------------------------------------------------
# Test helpers shared by tests/e2e/test_*.py


# A test run again under other conditions (test_ntb_patched.py) names its results apart.
RESULT_PREFIX = ""


def result(name, ok, **detail):
    """Print the line tests/run-checks counts: RESULT <name> PASS|FAIL key=value..."""
    kv = " ".join(f"{k}={v}" for k, v in detail.items())
    print(f"RESULT {RESULT_PREFIX}{name} {'PASS' if ok else 'FAIL'} {kv}".rstrip(), flush=True)
    return ok


def failed(name, e):
    """A test that raised: its whole error on stderr, and a FAIL line whose detail is the
    error's first line (CI keeps only the tail of the output, where tests/run-checks repeats
    the FAIL lines).  Returns False, for ok &= ..."""
    print(f"{name}: {type(e).__name__}: {e}", file=sys.stderr)
    first = str(e).strip().splitlines()[0] if str(e).strip() else ""
    return result(name, False, error=f"{type(e).__name__}: {first}"[:200])


def run_tests(tests, argv):
    """Run each of @tests (functions test_NAME(procs) -> ok) with its own Procs, or only those
    whose NAME (with '-' for '_') @argv names; one that raises is a FAIL of its own and the
    rest still run.  The exit status: 0 when every one passed."""
    def name(t):
        return t.__name__.replace("test_", "", 1).replace("_", "-")
    ok = True
    for test in [t for t in tests if name(t) in argv] or tests:
        with Procs() as procs:
            try:
                ok &= test(procs)
            except Exception as e:  # noqa: BLE001 - one test's failure must not hide the rest
                ok &= failed(name(test), e)
    return 0 if ok else 1


def proc_status(pid):
    """/proc/PID/status as a dict (Uid, CapEff, NoNewPrivs, Seccomp...)."""
    fields = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        fields[key] = value.strip()
    return fields


def wait_for(pred, timeout):
    """Poll pred() until it is truthy or timeout seconds pass; return its last value."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        v = pred()
        if v:
            return v
        time.sleep(0.02)
    return pred()


# --------------------------------------------------------------------------------------------
# Backing-file verification


def verify_backing(path, regions):
    """Compare the md5 of each VNDATA region with the same bytes of the backing file.

    A region overlapped by a later one is reported as superseded, not checked: the later write
    owns those bytes.  Returns a list of dicts; all(r["ok"]) is the verdict."""
    out = []
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        for i, (off, length, md5) in enumerate(regions):
            later = regions[i + 1:]
            if any(o < off + length and off < o + n for o, n, _ in later):
                out.append({"offset": off, "length": length, "expected": md5,
                            "actual": None, "ok": True, "superseded": True})
                continue
            h = hashlib.md5()
            if off + length > size:
                actual = f"beyond-eof(size={size})"
            else:
                f.seek(off)
                left = length
                while left:
                    b = f.read(min(left, 1 << 20))
                    if not b:
                        break
                    h.update(b)
                    left -= len(b)
                actual = h.hexdigest()
            out.append({"offset": off, "length": length, "expected": md5, "actual": actual,
                        "ok": actual == md5, "superseded": False})
    return out


# --------------------------------------------------------------------------------------------
# The simulated device (build/vfio-ntb-simdev)


class Simdev:
    """build/vfio-ntb-simdev serving one vfio-user socket."""

    def __init__(self, procs, socket_path, backing, size_mib, serial=None, binary=None,
                 log_path=None, extra_args=()):
        self.procs = procs
        self.binary = Path(binary or os.environ.get("VN_SIMDEV", REPO / "build" / "vfio-ntb-simdev"))
        self.socket_path = Path(socket_path)
        self.backing = Path(backing)
        self.size_mib = size_mib
        self.serial = serial
        self.log_path = Path(log_path or self.socket_path.with_suffix(".log"))
        self.extra_args = list(extra_args)
        self.proc = None

    def start(self, timeout=15.0):
        if not os.access(self.binary, os.X_OK):
            raise HarnessError(f"{self.binary} is missing: build it first")
        argv = [self.binary, "--socket", self.socket_path, "--backing", self.backing,
                "--size-mib", self.size_mib]
        if self.serial:
            argv += ["--serial", self.serial]
        argv += self.extra_args
        self.procs.track(self.socket_path)
        with open(self.log_path, "wb") as log:
            self.proc = self.procs.start("simdev", argv, stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + timeout
        while not self.socket_path.exists():
            if self.proc.poll() is not None:
                raise HarnessError(f"simdev exited ({self.proc.returncode}) before creating "
                                   f"{self.socket_path}:\n{_tail(self.log_text())}")
            if time.monotonic() > deadline:
                raise Timeout(f"simdev did not create {self.socket_path} in {timeout} s")
            time.sleep(0.02)
        return self

    def stop(self):
        if self.proc:
            return self.procs.stop(self.proc)

    def log_text(self):
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""


# --------------------------------------------------------------------------------------------
# CLI


def report(run, verification=None, extra=None):
    """Print results; return True when everything passed."""
    ok = run.ok
    boot = f"{run.t_boot:.1f} s" if run.t_boot is not None else "?"
    total = f"{run.t_exit:.1f} s" if run.t_exit is not None else "?"
    print(f"boot to init: {boot}, whole run: {total}")
    for t, text in run.info:
        if text.startswith(("check=", "modules", "boot", "bench", "data")):
            print(f"  [{t:6.1f}] {text}")
    for check, r in run.result_list:
        kv = " ".join(f"{k}={v}" for k, v in r.items() if k != "status")
        print(f"{r['status']:4} {check}: {kv}")
    print(f"done: {run.done}")
    if verification is not None:
        checked = [v for v in verification if not v["superseded"]]
        bad = [v for v in checked if not v["ok"]]
        print(f"backing file: {len(checked)} regions checked, "
              f"{len(verification) - len(checked)} superseded, {len(bad)} bad")
        for v in bad:
            print(f"  BAD region {v['offset']}+{v['length']}: guest {v['expected']} "
                  f"file {v['actual']}")
        if not checked or bad:
            ok = False
    for k, v in (extra or {}).items():
        print(f"{k}: {v}")
    print("RESULT:", "PASS" if ok else "FAIL")
    return ok


def _common(ap):
    ap.add_argument("--timeout", type=float, default=300.0, help="bound of the whole run (s)")
    ap.add_argument("--size-mib", type=int, default=256, help="backing file size")
    ap.add_argument("--seed", type=int, default=None)
    ap.add_argument("--param", action="append", default=[], metavar="K=V",
                    help="more guest parameters (vn.K=V), e.g. data_mib=16")
    ap.add_argument("--kernel", help="boot this kernel instead of the cached vmlinux")
    ap.add_argument("--append", default="", help="more kernel command line")
    ap.add_argument("--keep", action="store_true", help="keep the work dir (logs)")
    ap.add_argument("-v", "--verbose", action="store_true", help="echo the serial console")


def _params(args):
    p = {"seed": args.seed if args.seed is not None else int.from_bytes(os.urandom(2), "little")}
    p.update(dict(kv.split("=", 1) for kv in args.param))
    return p


def _workdir(procs, args):
    if args.keep:
        d = Path(tempfile.mkdtemp(prefix="vn-e2e-", dir=os.environ.get("VN_TMP", "/tmp")))
        print(f"work dir (kept): {d}", file=sys.stderr)
        return d
    return procs.tempdir()


def cmd_builtin_smoke(args):
    with Procs() as procs:
        wd = _workdir(procs, args)
        img = make_backing(wd / "disk.img", args.size_mib)
        dev = BuiltinNvme(img, serial="VN-BUILTIN-1", bus="rp1" if args.root_port else None)
        q = Qemu(procs, args.checks, [dev], params=_params(args), root_port=args.root_port,
                 timeout=args.timeout, workdir=wd, kernel=args.kernel, echo=args.verbose,
                 append_extra=args.append).start()
        run = q.wait_done()
        q.stop()
        return report(run, verify_backing(img, run.data) if run.data else None)


def cmd_hotplug(args):
    with Procs() as procs:
        wd = _workdir(procs, args)
        img = make_backing(wd / "disk.img", args.size_mib)
        dev = BuiltinNvme(img, serial="VN-HOTPLUG-1", bus="rp1")
        q = Qemu(procs, "probe,hotplug-wait", [dev], params=_params(args), root_port=True,
                 timeout=args.timeout, workdir=wd, kernel=args.kernel, echo=args.verbose,
                 append_extra=args.append).start()
        timings = hotplug_cycle(q, dev)
        run = q.wait_done()
        q.stop()
        return report(run, verify_backing(img, run.data),
                      {k: f"{v:.2f} s" for k, v in timings.items()})


def cmd_simdev_smoke(args):
    with Procs() as procs:
        wd = _workdir(procs, args)
        img = make_backing(wd / "disk.img", args.size_mib)
        sd = Simdev(procs, wd / "nvme.sock", img, args.size_mib, serial="VN-SIMDEV-1",
                    extra_args=args.simdev_arg).start()
        dev = VfioUserDevice(sd.socket_path, bus="rp1" if args.hotplug else None)
        checks = args.checks + (",hotplug-wait" if args.hotplug else "")
        q = Qemu(procs, checks, [dev], params=_params(args), root_port=args.hotplug,
                 timeout=args.timeout, workdir=wd, kernel=args.kernel, echo=args.verbose,
                 append_extra=args.append).start()
        extra = {}
        if args.hotplug:
            extra = {k: f"{v:.2f} s" for k, v in hotplug_cycle(q, dev).items()}
        run = q.wait_done()
        q.stop()
        sd.stop()
        return report(run, verify_backing(img, run.data) if run.data else None, extra)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("builtin-smoke", help="guest checks against QEMU's built-in nvme")
    p.add_argument("--checks", default="probe,data,reset")
    p.add_argument("--root-port", action="store_true", help="place it on a pcie-root-port")
    _common(p)
    p.set_defaults(func=cmd_builtin_smoke)
    p = sub.add_parser("hotplug", help="QMP hot-unplug/replug of the built-in nvme")
    _common(p)
    p.set_defaults(func=cmd_hotplug)
    p = sub.add_parser("simdev-smoke", help="guest checks against build/vfio-ntb-simdev")
    p.add_argument("--checks", default="probe,data,reset")
    p.add_argument("--hotplug", action="store_true", help="also hot-unplug/replug it")
    p.add_argument("--simdev-arg", action="append", default=[], metavar="ARG",
                   help="one more argument for vfio-ntb-simdev, e.g. --simdev-arg=--interrupts=msi")
    _common(p)
    p.set_defaults(func=cmd_simdev_smoke)
    args = ap.parse_args(argv)
    # A shell without job control starts background jobs with SIGINT ignored; we still want
    # an interrupt to tear the VM down.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        return 0 if args.func(args) else 1
    except HarnessError as e:
        print(f"harness: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("harness: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
