"""Nodes of an emulated NTB cluster for e2e tests: vfio-ntbd processes on one shm fabric.

    fab = procs.tempdir("vn-fabric-")
    a = Daemon(procs, wd, "hosta", fab, lends={"nvme0": simdev.socket_path}).start()
    b = Daemon(procs, wd, "hostb", fab, borrows={"nvme0": ("hosta", wd / "vm.sock", "fd")})
    b.start(wait_sockets=True)
    b.stats()   # the daemon's counters (SIGUSR1 -> stats file)
"""
import json
import os
import signal
import subprocess
import time
from pathlib import Path

import harness as h

VFIO_NTBD = Path(os.environ.get("VN_NTBD", h.REPO / "build" / "vfio-ntbd"))


class Daemon:
    def __init__(self, procs, workdir, name, fabric_dir, lends=None, borrows=None,
                 fabric_params=None, verbose=False, allow=None, lease_timeout_ms=3000,
                 args=(), fabric="shm", persist=True, node_keys=None, domain=None, p2p=False):
        self.procs = procs
        self.name = name
        self.wd = Path(workdir)
        self.fabric = fabric                # "ntb": fabric_params name its ports
        self.fabric_dir = Path(fabric_dir) if fabric_dir is not None else None
        self.lends = dict(lends or {})
        self.borrows = dict(borrows or {})   # name -> (lender, socket, irq_mode)
        self.fabric_params = dict(fabric_params or {})
        self.verbose = verbose
        self.allow = dict(allow or {})      # lent device -> "hostb;hostc" (default "*")
        self.lease_timeout_ms = lease_timeout_ms
        self.persist = persist              # False: no state-dir (the README quickstart's)
        self.args = [str(a) for a in args]         # more of vfio-ntbd's options (--trace)
        self.node_keys = dict(node_keys or {})      # more [node] keys (qemu-user)
        self.domain = domain    # every borrow's domain (a name, or {device: name}); None: its own
        self.p2p = p2p          # every borrow takes part in its domain's compositions
        self.control = self.wd / f"{name}.control"
        self.state_dir = self.wd / f"{name}.state"
        self.run_dir = self.wd / f"{name}.run"
        self.conf = self.wd / f"{name}.conf"
        self.stats_path = self.wd / f"{name}.stats"
        self.log_path = self.wd / f"{name}.log"
        self.proc = None

    def config_text(self):
        lines = ["[node]", f"name = {self.name}", f"fabric = {self.fabric}",
                 f"stats-file = {self.stats_path}",
                 f"control-socket = {self.control}",
                 f"run-dir = {self.run_dir}", f"lease-timeout-ms = {self.lease_timeout_ms}"]
        if self.persist:
            lines.append(f"state-dir = {self.state_dir}")
        lines += [f"{k} = {v}" for k, v in self.node_keys.items()]
        if self.fabric == "shm":
            lines.append(f"fabric-dir = {self.fabric_dir}")
        if self.fabric_params:
            lines += ["", "[fabric]"] + [f"{k} = {v}" for k, v in self.fabric_params.items()]
        # A lend is a device server's socket, or {"pci": "DDDD:BB:DD.F"} (VFIO).
        for dev, where in self.lends.items():
            keys = where if isinstance(where, dict) else {"socket": where}
            lines += ["", f"[lend {dev}]"] + [f"{k} = {v}" for k, v in keys.items()]
            lines += [f"allow = {self.allow.get(dev, '*')}"]
        for dev, (lender, sock, mode) in self.borrows.items():
            lines += ["", f"[borrow {dev}]", f"lender = {lender}", f"socket = {sock}",
                      f"irq-mode = {mode}"]
            dom = self.domain.get(dev) if isinstance(self.domain, dict) else self.domain
            if dom:
                lines.append(f"domain = {dom}")
            if self.p2p:
                lines.append("p2p = yes")
        return "\n".join(lines) + "\n"

    def start(self, wait_sockets=False, timeout=20.0):
        self.conf.write_text(self.config_text())
        # A killed daemon leaves its control socket; the new one replaces it once it is up,
        # so the file's presence says nothing until it is gone.
        if self.control.exists():
            self.control.unlink()
        argv = [VFIO_NTBD, "--config", self.conf] + (["--verbose"] if self.verbose else []) + \
            self.args
        for _, (_, sock, _) in self.borrows.items():
            self.procs.track(Path(sock))
        with open(self.log_path, "ab") as log:
            self.proc = self.procs.start(f"vfio-ntbd-{self.name}", argv, stdout=log,
                                         stderr=subprocess.STDOUT)
        deadline = time.monotonic() + timeout
        waits = [self.control] + ([Path(s) for _, s, _ in self.borrows.values()]
                                  if wait_sockets else [])
        while not all(p.exists() for p in waits):
            if self.proc.poll() is not None:
                raise h.HarnessError(f"vfio-ntbd {self.name} exited ({self.proc.returncode}):\n"
                                     f"{self.log()[-3000:]}")
            if time.monotonic() > deadline:
                raise h.Timeout(f"vfio-ntbd {self.name}: {waits} not ready in {timeout} s\n"
                                f"{self.log()[-3000:]}")
            time.sleep(0.02)
        return self

    def stats(self, timeout=5.0):
        """Ask for the counters (SIGUSR1) and return them once the file is rewritten."""
        return read_stats_file(self.proc, self.stats_path, f"vfio-ntbd {self.name}", timeout)

    def kill(self, sig=signal.SIGKILL):
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(sig)
            self.proc.wait(10)

    def stop(self):
        if self.proc:
            self.procs.stop(self.proc)

    def log(self):
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def workers(self, binary="vfio-ntb-lender"):
        """The pids of this node's running worker processes (@binary): what ps shows an
        operator.  Only this daemon's (their ports in its run dir): a worker of an earlier
        test's node of the same name may still be on its way out."""
        return sorted(pid for pid, argv in live_processes()
                      if Path(argv[0].decode(errors="replace")).name == binary
                      and f"--node={self.name}".encode() in argv
                      and any(a.startswith(f"--port={self.run_dir}/".encode()) for a in argv))

    def spares(self):
        """The pids of this node's spare borrower workers (started ahead of need, waiting for
        a device: vfio-ntb-borrower --spare-fd ... --node=NAME --run-dir=ITS RUN DIR)."""
        return sorted(pid for pid, argv in live_processes()
                      if len(argv) > 3 and argv[1].startswith(b"--spare-fd=")
                      and f"--node={self.name}".encode() in argv
                      and f"--run-dir={self.run_dir}".encode() in argv)


def live_processes():
    """(pid, argv as bytes) of every process that is not a zombie."""
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            argv = (proc / "cmdline").read_bytes().split(b"\0")
            state = (proc / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            continue
        if state != "Z" and argv and argv[0]:
            yield int(proc.name), argv


def read_stats_file(proc, path, who, timeout=5.0):
    """Signal @proc (SIGUSR1) to write its counters to @path and return them.  The old file
    is removed first: the writers rename a new one into place, so the file's reappearance is
    the answer (an mtime comparison can miss a rewrite within one timestamp tick)."""
    path.unlink(missing_ok=True)
    proc.send_signal(signal.SIGUSR1)
    deadline = time.monotonic() + timeout
    while True:
        try:
            return json.loads(path.read_text())
        except (FileNotFoundError, json.JSONDecodeError):
            pass
        if time.monotonic() > deadline:
            raise h.Timeout(f"{who}: no stats in {timeout} s")
        time.sleep(0.01)


def simdev_stats(sd):
    """Ask vfio-ntb-simdev for its counters (SIGUSR1 -> its --stats-file)."""
    return read_stats_file(sd.proc, sd.socket_path.with_suffix(".stats"), "simdev")
