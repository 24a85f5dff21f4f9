#!/usr/bin/python3
"""End-to-end: what a local process that is not a worker can do to a worker's port.

Node A (vfio-ntbd) lends a vfio-ntb-simdev NVMe; node B borrows it for a qtest consumer
(QEMU's stock vfio-user-pci, no guest CPU) that passes the Identify check.  What an operator
would check:
- port-takeover-refused: a root process connects to B's borrower worker's port and to A's
  lender worker's port (each worker is connected: its daemon made its connection) and says
  HELLO with a made-up secret: both connections are closed with no answer, both daemons log
  it, and the consumer's Identify still passes through the same workers.  Then B's daemon
  and its worker die (SIGKILL) and another process takes the worker's pid (and carries the
  worker's binary name in its command line, as `vfio-ntbd` checks): when B starts again it
  adopts that pid, but the process does not know the worker's secret, so its HELLO gets no
  answer and its connection is closed; B says the worker is gone and detaches the device,
  and A fences it (the lease is not left with a process nobody started).
- workers-unprivileged: A's lender worker (a device server's) serves as the worker user
  with no capabilities and no_new_privs (the daemon dials the device server for it), and
  B's borrower worker serves as the worker user (vfio-ntb, which
  scripts/install-deps and the package create), with no capabilities, no_new_privs and its
  seccomp filter (/proc/PID/status: Uid, CapEff 0, NoNewPrivs 1, Seccomp 2), and the
  consumer's Identify passes through it; after B's daemon is killed and started again the
  same worker, unprivileged, dials its port again and is adopted, and Identify passes
  again.  A worker made to try a system call its filter lacks (VN_TEST_SANDBOX_VIOLATION, a
  test's hook) is killed by the filter (SIGSYS), B says so and does not start another, and
  the device is detached.  (Every other e2e suite runs its borrower workers the same way.)
  B is configured with a QEMU user (qemu-user = nobody): the device's socket is that user's,
  mode 600; a process of another unprivileged user (daemon) cannot connect (EACCES), one of
  the QEMU user can.
- seccomp: what a borrower worker does while it serves, under its filter (Seccomp 2): the
  consumer's Identify and an Identify signalled by MSI; the lender's daemon killed and
  started again, then Identify again through the same worker; a second worker with its
  interrupts relayed as fabric doorbells, its MSI Identify; no worker killed by its
  filter.  The filter's rules are in one file (vfio-ntb/borrower/sandbox.c), the only one
  of the tree that adds any.
"""
import errno
import os
import signal
import socket
import struct
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import harness as h  # noqa: E402
from harness import result, wait_for  # noqa: E402
from control import Control  # noqa: E402
from test_deaths import SERIAL, hosts, lender_stats  # noqa: E402
import vfio_inner as vi  # noqa: E402

# tests/run-checks counts a result this file did not print as failed.
EXPECTED_RESULTS = 3

HELLO = 1                     # fabric/host.h: VN_HOST_HELLO
SECRET_LEN = 32               # VN_HOST_SECRET_LEN
HDR = struct.Struct("<IiQQQ32s")   # VnHostHdr: op, status, seq, arg, arg2, peer


def hello(secret):
    """A HELLO record as a worker sends it (fabric/record.h: a 4-byte length first)."""
    rec = HDR.pack(HELLO, 0, 1, 0, 0, b"") + secret
    return struct.pack("<I", len(rec)) + rec


def knock(path, secret=b"\0" * SECRET_LEN, timeout=5.0):
    """Connect to a port's socket, say HELLO with @secret: what came back before the port
    closed the connection (b"" for nothing), or None when it kept it open."""
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        s.connect(str(path))
        try:
            s.sendall(hello(secret))
        except (BrokenPipeError, ConnectionResetError):
            return b""                  # closed before it even read
        s.settimeout(timeout)
        got = b""
        while True:
            try:
                chunk = s.recv(4096)
            except ConnectionResetError:
                return got
            except socket.timeout:
                return None
            if not chunk:
                return got
            got += chunk
    finally:
        s.close()


IMPOSTOR = """
import socket, struct, sys, time
path, out = sys.argv[1], sys.argv[2]
rec = struct.pack("<IiQQQ32s", 1, 0, 1, 0, 0, b"") + b"\\x5a" * 32
for _ in range(300):
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        s.connect(path)
    except OSError:
        s.close()
        time.sleep(0.05)
        continue
    s.settimeout(10)
    try:
        s.sendall(struct.pack("<I", len(rec)) + rec)
        got = s.recv(4096)
    except OSError:
        got = b""
    open(out, "w").write("answered" if got else "closed")
    break
time.sleep(30)
"""


def impostor_with_pid(procs, pid, argv_tail, tries=20):
    """A process whose pid is @pid (the kernel's next pid set through ns_last_pid, as root),
    or None when another process took it first each time."""
    for _ in range(tries):
        with open("/proc/sys/kernel/ns_last_pid", "w") as f:
            f.write(str(pid - 1))
        # argv[0] the worker's binary name: what vfio-ntbd looks for in /proc/PID/cmdline.
        p = procs.start("impostor", ["vfio-ntb-borrower", "-c", IMPOSTOR, *argv_tail],
                        executable=sys.executable)
        if p.pid == pid:
            return p
        p.kill()
        p.wait()
        time.sleep(0.01)
    return None


def attached_to(d, device="hosta/nvme0"):
    c = Control(d.control)
    try:
        return next(x for x in c.execute("query-devices")
                    if x["device"] == device).get("attached_to")
    finally:
        c.close()


def connect_as(user, path):
    """Connect to the UNIX socket @path as @user (a child that drops to it): 0, or the errno
    the connection failed with."""
    import pwd
    pw = pwd.getpwnam(user)
    pid = os.fork()
    if pid == 0:
        try:
            os.setgroups([])
            os.setresgid(pw.pw_gid, pw.pw_gid, pw.pw_gid)
            os.setresuid(pw.pw_uid, pw.pw_uid, pw.pw_uid)
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            s.connect(str(path))
            s.close()
            os._exit(0)
        except OSError as e:
            os._exit(e.errno or 1)
        except BaseException:       # noqa: BLE001 - a child never returns into the test
            os._exit(255)
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status)


def lent_to_consumer(procs, domain, qemu_user=None):
    """hosta lends nvme0, hostb attaches it for a qtest consumer that runs Identify:
    (workdir, a, b, b's control, the consumer, Identify's (status, serial), b's worker).
    With @qemu_user, hostb gives the device's socket to that user ([node] qemu-user), and
    what the socket let whom do is b.socket_facts."""
    wd, _img, _sd, a, b, _ = hosts(procs)
    if qemu_user is not None:
        b.node_keys["qemu-user"] = qemu_user
        b.kill()
        b.start()
    cb = Control(b.control)
    r = cb.execute("attach", device="hosta/nvme0", domain=domain)
    if qemu_user is not None:
        st = os.stat(r["socket"])
        b.socket_facts = {"owner": st.st_uid, "mode": oct(st.st_mode & 0o777),
                          "other_user": connect_as("daemon", r["socket"]),
                          "qemu_user": connect_as(qemu_user, r["socket"])}
    q = vi.qtest_qemu(procs, r["socket"])
    vi.consumer_view(q)
    before = vi.identify(q)
    [worker] = b.workers("vfio-ntb-borrower")
    return wd, a, b, cb, q, before, worker


def test_port_takeover_refused(procs):
    wd, a, b, cb, q, before, worker = lent_to_consumer(procs, "vm-sec")
    [bport] = b.run_dir.glob("*-port.sock")
    aport = a.run_dir / "lend-nvme0-port.sock"
    # Root, connecting while each worker is connected.
    knocked = {"borrower": knock(bport), "lender": knock(aport)}
    logged = (wait_for(lambda: "refused a connection" in b.log(), 5) and
              wait_for(lambda: "refused a connection" in a.log(), 5))
    after = vi.identify(q)
    same_worker = b.workers("vfio-ntb-borrower") == [worker]

    # The worker's pid, taken by another process while B was away.
    fences = lender_stats(a)["fences"]
    b.kill()
    os.kill(worker, signal.SIGKILL)
    wait_for(lambda: not Path(f"/proc/{worker}").exists(), 5)
    said = wd / "impostor.said"
    imp = impostor_with_pid(procs, worker, [str(bport), str(said)])
    b.start()
    heard = wait_for(lambda: said.exists(), 20)
    answer = said.read_text() if heard else "nothing"
    refused = wait_for(lambda: "does not know its secret" in b.log(), 10)
    detached = wait_for(lambda: attached_to(b) is None, 10)
    fenced = wait_for(lambda: lender_stats(a)["fences"] > fences, 15)
    if not refused:
        print(b.log()[-3000:], file=sys.stderr)
    if imp is not None:
        procs.stop(imp)
    q.kill()
    q.wait()
    cb.close()
    return result("port-takeover-refused",
                  before == (0, SERIAL) and knocked == {"borrower": b"", "lender": b""}
                  and bool(logged) and after == (0, SERIAL) and same_worker
                  and imp is not None and answer == "closed" and bool(refused)
                  and bool(detached) and bool(fenced),
                  identify_before=before[0], knocked={k: v is not None and len(v)
                                                      for k, v in knocked.items()},
                  logged=bool(logged), identify_after=after[0], same_worker=same_worker,
                  pid_taken=imp is not None, impostor=answer, refused=bool(refused),
                  detached=bool(detached), fenced=bool(fenced))


WORKER_USER = "vfio-ntb"
# The user QEMU would run as ([node] qemu-user): any unprivileged user of every Debian host
# (libvirt's libvirt-qemu is not on a host without libvirt's daemon).
QEMU_USER = "nobody"


def test_workers_unprivileged(procs):
    import pwd
    uid = pwd.getpwnam(WORKER_USER).pw_uid     # KeyError: scripts/install-deps makes it
    _wd, a, b, cb, q, before, worker = lent_to_consumer(procs, "vm-unpriv", QEMU_USER)
    sock = b.socket_facts
    socket_ok = (sock["owner"] == pwd.getpwnam(QEMU_USER).pw_uid and sock["mode"] == "0o600"
                 and sock["other_user"] == errno.EACCES and sock["qemu_user"] == 0)
    st = h.proc_status(worker)
    sandboxed = (st["Uid"].split() == [str(uid)] * 4 and st["CapEff"] == "0" * 16
                 and st["NoNewPrivs"] == "1" and st["Seccomp"] == "2")
    # The lender's worker too (a device server's: the daemon dials for it).
    [lender_worker] = a.workers("vfio-ntb-lender")
    lst = h.proc_status(lender_worker)
    lender_unprivileged = (lst["Uid"].split() == [str(uid)] * 4 and lst["CapEff"] == "0" * 16
                           and lst["NoNewPrivs"] == "1")
    # B away and back: the worker, unprivileged, dials its port again.
    cb.close()
    b.kill()
    b.start()
    adopted = wait_for(lambda: f"its worker (pid {worker}) is back" in b.log(), 15)
    after = vi.identify(q)
    same = b.workers("vfio-ntb-borrower") == [worker]
    q.kill()
    q.wait()
    cb = Control(b.control)
    cb.execute("detach", device="hosta/nvme0")
    # A worker that tries what its filter lacks.
    cb.close()
    b.kill()
    os.environ["VN_TEST_SANDBOX_VIOLATION"] = "1"
    try:
        b.start()
    finally:
        del os.environ["VN_TEST_SANDBOX_VIOLATION"]
    cb = Control(b.control)
    try:
        cb.execute("attach", device="hosta/nvme0", domain="vm-unpriv2")
        attached = True
    except Exception:  # noqa: BLE001 - the worker may die before or after the answer
        attached = False
    killed = wait_for(lambda: "was killed by its sandbox" in b.log(), 15)
    detached = wait_for(lambda: attached_to(b) is None, 10)
    not_again = not b.workers("vfio-ntb-borrower")
    cb.close()
    return result("workers-unprivileged",
                  before == (0, SERIAL) and sandboxed and bool(adopted) and after == (0, SERIAL)
                  and same and bool(killed) and bool(detached) and not_again and socket_ok
                  and lender_unprivileged,
                  uid=st["Uid"].split()[0], cap_eff=st["CapEff"], no_new_privs=st["NoNewPrivs"],
                  lender_uid=lst["Uid"].split()[0], lender_cap_eff=lst["CapEff"],
                  lender_no_new_privs=lst["NoNewPrivs"],
                  seccomp=st["Seccomp"], identify=before[0], adopted_after_restart=bool(adopted),
                  identify_after=after[0], same_worker=same, violation_attached=attached,
                  killed_by_filter=bool(killed), detached=bool(detached),
                  no_worker_left=not_again, socket_owner=sock["owner"], socket_mode=sock["mode"],
                  other_user_connect=sock["other_user"], qemu_user_connect=sock["qemu_user"])


def rule_files():
    """The C files that add seccomp rules: the filter's one place is borrower/sandbox.c."""
    return sorted(str(f.relative_to(h.REPO)) for f in (h.REPO / "vfio-ntb").rglob("*.c")
                  if "seccomp_rule_add" in f.read_text(errors="replace"))


def test_seccomp(procs):
    """What a borrower worker does while it serves, all under its filter: a system call the
    list lacks would kill it (SCMP_ACT_KILL_PROCESS) and fail this."""
    _wd, a, b, cb, q, before, worker = lent_to_consumer(procs, "vm-seccomp")
    st = h.proc_status(worker)
    msi = vi.msi_identify(q)
    # The lender's daemon away and back under the consumer: the worker's lender goes and
    # comes, and it serves again.
    a.kill()
    a.start()
    back = wait_for(lambda: vi.identify(q) == (0, SERIAL), 30)
    q.kill()
    q.wait()
    cb.execute("detach", device="hosta/nvme0")
    # A second worker, its interrupts relayed as fabric doorbells.
    r = cb.execute("attach", device="hosta/nvme0", domain="vm-seccomp2", **{"irq-mode": "relay"})
    q2 = vi.qtest_qemu(procs, r["socket"])
    vi.consumer_view(q2)
    relayed = vi.msi_identify(q2)
    [worker2] = b.workers("vfio-ntb-borrower")
    st2 = h.proc_status(worker2)
    q2.kill()
    q2.wait()
    cb.execute("detach", device="hosta/nvme0")
    cb.close()
    killed = "killed by its sandbox" in b.log()
    files = rule_files()
    return result("seccomp",
                  before == (0, SERIAL) and st["Seccomp"] == "2" and msi[1] == 0 and
                  msi[0] != 0 and bool(back) and relayed[1] == 0 and relayed[0] != 0 and
                  st2["Seccomp"] == "2" and worker2 != worker and not killed and
                  files == ["vfio-ntb/borrower/sandbox.c"],
                  seccomp=f"{st['Seccomp']},{st2['Seccomp']}", identify=before[0],
                  msi_status=msi[1], msi_word=hex(msi[0] or 0), after_lender_restart=bool(back),
                  relayed_status=relayed[1], relayed_word=hex(relayed[0] or 0),
                  killed_by_filter=killed,
                  rules_in=",".join(files) or "-")


def main():
    return h.run_tests((test_port_takeover_refused, test_workers_unprivileged, test_seccomp),
                       sys.argv[1:])


if __name__ == "__main__":
    sys.exit(main())
