"""A private libvirt daemon for e2e tests, and domains run by it (../shared/TESTBED.md).

    lv = Libvirtd(procs, "hostb", control=daemon.control).start()
    lv.virsh("define", xml_path)
    dom = Domain(lv, procs, "vm1", workdir)     # the guest's serial log, as harness.Qemu reads it
    lv.virsh("start", "vm1"); run = dom.wait_done()

libvirtd runs in its own mount namespace with a state directory bind-mounted over
/etc/libvirt, /run/libvirt, /var/lib/libvirt, /var/log/libvirt and /var/cache/libvirt, so the
host's libvirt configuration is never touched, and two instances can stand for two hosts.  Our
hook is installed as etc/hooks/qemu.d/vfio-ntb before the daemon starts, pointed at one node's
control socket (libvirt clears the environment of hooks, so the drop-in sets it).
"""
import re
import subprocess
import time
from pathlib import Path

import harness as h

HOOK = h.REPO / "build" / "vfio-ntb-libvirt-hook"

QEMU_CONF = """user = "root"
group = "root"
dynamic_ownership = 0
remember_owner = 0
security_driver = "none"
cgroup_controllers = [ ]
namespaces = [ ]
stdio_handler = "file"
"""
LIBVIRTD_CONF = """auth_unix_rw = "none"
unix_sock_rw_perms = "0770"
log_outputs = "3:stderr"
"""


def libvirtd_binary():
    if "libvirtd" not in h._cache:
        h._cache["libvirtd"] = h._script_output("testbed-libvirt")
    return h._cache["libvirtd"]


class Libvirtd:
    def __init__(self, procs, name, control):
        self.procs = procs
        self.name = name
        self.control = Path(control)
        self.state = procs.tempdir(f"vn-lv-{name}-")
        self.dirs = {"/etc/libvirt": self.state / "etc", "/run/libvirt": self.state / "run",
                     "/var/lib/libvirt": self.state / "lib",
                     "/var/log/libvirt": self.state / "log",
                     "/var/cache/libvirt": self.state / "cache"}
        self.uri = f"qemu:///system?socket={self.state / 'run' / 'libvirt-sock'}"
        self.log_path = self.state / "libvirtd.log"
        self.proc = None

    def _prepare(self):
        for d in self.dirs.values():
            d.mkdir(parents=True, exist_ok=True)
        etc = self.dirs["/etc/libvirt"]
        (etc / "qemu.conf").write_text(QEMU_CONF)
        (etc / "libvirtd.conf").write_text(LIBVIRTD_CONF)
        hooks = etc / "hooks" / "qemu.d"
        hooks.mkdir(parents=True, exist_ok=True)
        hook = hooks / "vfio-ntb"
        hook.write_text(f"#!/bin/sh\n# vfio-ntb's hook, talking to node {self.name}'s daemon\n"
                        f"VFIO_NTB_CONTROL={self.control} exec {HOOK} \"$@\"\n")
        hook.chmod(0o755)
        # libvirtd 9.0 looks the libvirt-qemu user up even with user="root".
        passwd = Path("/etc/passwd").read_text()
        group = Path("/etc/group").read_text()
        if "\nlibvirt-qemu:" not in "\n" + passwd:
            passwd += "libvirt-qemu:x:64055:64055:libvirt:/nonexistent:/usr/sbin/nologin\n"
        if "\nlibvirt-qemu:" not in "\n" + group:
            group += "libvirt-qemu:x:64055:\n"
        (self.state / "passwd").write_text(passwd)
        (self.state / "group").write_text(group)

    def start(self, timeout=60.0):
        binary = libvirtd_binary()
        self._prepare()
        # Mount points (empty directories) may be missing on a host without libvirt running.
        mounts = [f"mkdir -p {dst} && mount --bind {src} {dst}" for dst, src in self.dirs.items()]
        mounts += [f"mount --bind {self.state / 'passwd'} /etc/passwd",
                   f"mount --bind {self.state / 'group'} /etc/group"]
        # Its own pid file: /run/libvirtd.pid would be one per machine.
        script = " && ".join(mounts + [f"exec {binary} --pid-file {self.state / 'libvirtd.pid'}"])
        with open(self.log_path, "ab") as log:
            self.proc = self.procs.start(f"libvirtd-{self.name}",
                                         ["unshare", "--mount", "--propagation", "private",
                                          "sh", "-c", script], stdout=log, stderr=log)
        deadline = time.monotonic() + timeout
        while True:
            if self.proc.poll() is not None:
                raise h.HarnessError(f"libvirtd {self.name} exited ({self.proc.returncode}):\n"
                                     f"{h._tail(self.log())}")
            # Ready when a client gets an answer, not when the socket appears.
            if self.virsh("list", "--all", check=False, timeout=10).returncode == 0:
                return self
            if time.monotonic() > deadline:
                raise h.Timeout(f"libvirtd {self.name} not ready in {timeout} s\n"
                                f"{h._tail(self.log())}")
            time.sleep(0.2)

    def virsh(self, *args, check=True, timeout=60, input=None):
        p = subprocess.run(["virsh", "-c", self.uri, *[str(a) for a in args]],
                           capture_output=True, text=True, timeout=timeout, input=input)
        if check and p.returncode != 0:
            raise h.HarnessError(f"virsh {' '.join(map(str, args))}: {p.stderr.strip()}")
        return p

    def domains(self):
        out = self.virsh("list", "--name", check=False).stdout
        return [n for n in out.split() if n]

    def stop(self):
        """Destroy what still runs (libvirtd leaves domains running), then stop libvirtd."""
        if self.proc is None or self.proc.poll() is not None:
            return
        for name in self.domains():
            self.virsh("destroy", name, check=False)
        self.procs.stop(self.proc, timeout=15)

    def log(self):
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def qemu_log(self, domain):
        p = self.dirs["/var/log/libvirt"] / "qemu" / f"{domain}.log"
        return p.read_text(errors="replace") if p.exists() else ""


class _DomainProc:
    """What harness.Qemu needs of a process, for a domain libvirt runs."""

    def __init__(self, lv, name):
        self.lv, self.name, self.returncode = lv, name, None

    def poll(self):
        """0 once libvirt says the domain stopped (shut off, crashed, or gone when it was
        transient).  A virsh call that fails for another reason (libvirtd busy) says nothing:
        taking its empty answer for "stopped" ended waits while the guest still wrote."""
        if self.returncode is None:
            p = self.lv.virsh("domstate", self.name, check=False)
            st = p.stdout.strip()
            gone = p.returncode != 0 and "failed to get domain" in p.stderr
            if gone or (p.returncode == 0 and st in ("shut off", "crashed")):
                self.returncode = 0
        return self.returncode

    def wait(self, timeout=None):
        deadline = time.monotonic() + (timeout or 0)
        while self.poll() is None:
            if time.monotonic() > deadline:
                raise subprocess.TimeoutExpired(self.name, timeout)
            time.sleep(0.1)
        return self.returncode


def domain(lv, procs, name, workdir, checks, timeout=240.0):
    """A harness.Qemu that reads the serial log of libvirt's domain @name (started with
    virsh by the caller) instead of starting QEMU itself."""
    q = h.Qemu(procs, checks, workdir=workdir, timeout=timeout)
    q.proc = _DomainProc(lv, name)
    q.stderr_path = lv.dirs["/var/log/libvirt"] / "qemu" / f"{name}.log"
    q.t0 = time.monotonic()
    q.deadline = q.t0 + timeout
    q.serial_path.touch()
    return q


def domain_xml(name, serial_path, checks, params=None, snippets="", root_ports=2, mem_mib=512,
               emulator=None):
    """A TCG q35 domain that boots the test guest (TESTBED.md's recipe as libvirt XML).
    @snippets: what `ntbctl xml` printed (metadata, memoryBacking, qemu:commandline), placed
    where each belongs."""
    guest = h.testbed_guest()
    kernel = guest / "vmlinux" if (guest / "vmlinux").exists() else guest / "vmlinuz"
    p = {"checks": checks if isinstance(checks, str) else ",".join(checks), "timeout": 220}
    p.update(params or {})
    cmdline = "console=ttyS0 loglevel=4 panic=-1 " + " ".join(f"vn.{k}={v}" for k, v in p.items())
    meta, backing, cmd = _split_snippets(snippets)
    ports = "\n".join(f"    <controller type='pci' index='{i}' model='pcie-root-port'/>"
                      for i in range(1, root_ports + 1))
    return f"""<domain type='qemu' xmlns:qemu='http://libvirt.org/schemas/domain/qemu/1.0'>
  <name>{name}</name>
  <metadata>{meta}</metadata>
  <memory unit='MiB'>{mem_mib}</memory>
  {backing or "<memoryBacking><source type='memfd'/><access mode='shared'/></memoryBacking>"}
  <vcpu>1</vcpu>
  <os>
    <type arch='x86_64' machine='q35'>hvm</type>
    <kernel>{kernel}</kernel>
    <initrd>{guest / 'initrd.gz'}</initrd>
    <cmdline>{cmdline}</cmdline>
  </os>
  <features><acpi/></features>
  <cpu mode='custom' match='exact'><model fallback='allow'>qemu64</model></cpu>
  <on_poweroff>destroy</on_poweroff>
  <on_reboot>destroy</on_reboot>
  <on_crash>destroy</on_crash>
  <devices>
    <emulator>{emulator or h.testbed_qemu()}</emulator>
    <controller type='pci' index='0' model='pcie-root'/>
{ports}
    <controller type='usb' model='none'/>
    <serial type='file'><source path='{serial_path}'/><target port='0'/></serial>
    <memballoon model='none'/>
  </devices>
  {cmd}
</domain>
"""


def hosts_file(path, *hosts):
    """An ntbctl --hosts file: hosts are (node, control socket, libvirt URI)."""
    Path(path).write_text("\n".join(f"[{n}]\ncontrol = {c}\nlibvirt = {u}\n"
                                    for n, c, u in hosts))
    return path


def _split_snippets(text):
    """ntbctl xml prints three elements; pick them out by their start tags."""
    text = re.sub(r"<!--.*?-->", "", text, flags=re.S)   # comments name the elements too

    def grab(start, end):
        i = text.find(start)
        if i < 0:
            return ""
        j = text.find(end, i)
        return text[i:j + len(end)] if j >= 0 else ""
    return (grab("<vn:devices", "</vn:devices>"), grab("<memoryBacking", "</memoryBacking>"),
            grab("<qemu:commandline", "</qemu:commandline>"))

