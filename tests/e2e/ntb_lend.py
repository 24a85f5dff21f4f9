"""A device lent through the `ntb` fabric backend between the two NTB hosts of test_ntb.py
(run from ntb_inner.py).  Host a (its QEMU NVMe bound to vfio-pci, its IOMMU real) lends it
with vfio-ntbd on `fabric = ntb`; host b borrows it with its own vfio-ntbd on the same NTB,
and a qtest QEMU in host b (no guest CPU) uses it through vfio-user-pci:

- its config space and BAR0's CAP as the device has them (host a read CAP through sysfs
  before lending);
- an NVMe Identify through the admin queue in the consumer's RAM: the device DMAs through
  host a's IOMMU into host a's outbound window, which host b's inbound window translates to
  the consumer's RAM (pinned, behind host b's IOMMU); the serial number is host a's NVMe's;
- an Identify completed by MSI-X vector 0, through a doorbell route (the device's vector
  rings host b's doorbell in host a's kernel; nothing relays it);
- every BAR access of the consumer's went through host b's window onto the device's BAR
  (host a's inbound window translated to it, peer to peer through host a's IOMMU): none
  forwarded by the borrower or served by the lender's backend.

Then the BAR guard, under load (guard_under_load): a thread of host b's keeps reading BAR0
through a window file onto it that it took from the consumer's side (pidfd_getfd: what a
QEMU that kept its file holds) while the consumer clears COMMAND.MEM, sets it again, then
asks for an FLR.  While memory decode is off the thread reads all ones (host a withheld its
translation onto the BAR first, so nothing reaches a BAR that does not decode: the
simulated NTB counts no failed peer-to-peer access), and CAP again once it is on.

Then the daemon's fence (fence_*): host a's lender worker is stopped (SIGSTOP) while host
b's thread keeps reading the BAR through the window file it kept, and host a revokes the
lease: host a's daemon withdraws the window onto the BAR without the worker (host b reads
all ones while the worker is still stopped), kills the worker when it does not say it
fenced, and only then lends the device again: host b borrows it anew, and a new consumer's
Identify passes.

Facts are host b's (lend_*, guard_*, fence_*), but for lend_cap_sysfs, guard_withholds and
fence_worker_* (host a's).

Then peer_lost(), the last phase: the device lent again, in use by host b's consumer, and
host a's VM killed (by test_ntb.py, when host b asks).  Host b's daemon sees the link go
down (our module's link event), the consumer's BAR reads all ones and its writes are
dropped (the window reaches nothing), the borrower reports the lender lost at once (the
windows and routes went with the NTB session: nothing waits the lease timeout for them),
the consumer keeps running, and the device is given back.  Then, with the
daemon stopped, the module on its own: the link reads down, the window all ones, and it
unloads.
"""
import ctypes
import mmap
import os
import signal
import struct
import subprocess
import threading
import time
from pathlib import Path

import harness as h
from cluster import Daemon
from control import Control, ControlError
import ntb_kmod
import vfio_inner as vi

SHARE = Path("/tmp/share")
RAM_SIZE = 64 << 20         # the consumer's: one segment through one window (--window-mib)


# The link's key ([fabric] key-file), the same in both hosts' files; every daemon of the
# NTB tests proves it (fabric/ntb-auth.h).
LINK_KEY = "5a" * 32


def daemon(procs, role, ntb_bdf, lends=None, lease_timeout_ms=20000, key=LINK_KEY, more=None):
    me, peer = ("hosta", "hostb") if role == "a" else ("hostb", "hosta")
    wd = procs.tempdir(f"vn-lend-{role}-")
    keys = wd / "link.keys"
    keys.write_text(f"# the link to {peer}\n{peer} {key}\n")
    keys.chmod(0o600)
    return Daemon(procs, wd, me, None, fabric="ntb",
                  fabric_params={"ports": f"/dev/vfio-ntb/{ntb_bdf}={peer}",
                                 "key-file": keys, **(more or {})}, lends=lends,
                  lease_timeout_ms=lease_timeout_ms).start()


def lender(procs, ntb_bdf, barrier, fact):
    nvme = vi.find(vi.NVME_ID)
    # The host's nvme driver probes it at boot (slowly, under TCG); then it is VFIO's.
    h.wait_for(lambda: (Path("/sys/bus/pci/devices") / nvme / "driver").exists(), 60)
    vi.unbind(nvme)
    cap = vi.bar0_cap(nvme)
    vi.bind_vfio(nvme)
    fact(lend_cap_sysfs=f"{cap:#018x}")
    a = daemon(procs, "a", ntb_bdf, lends={"nvme0": {"pci": nvme}})
    try:
        barrier("a", "lend-lent")
        barrier("a", "fence-ready", timeout=900)
        # The worker that served the consumer so far (it is killed next).
        lent = a.stats()["lent"]
        fact(lend_lender_region_rw=sum(x["region_rw"] - x["config_rw"] for x in lent),
             guard_withholds=sum(x.get("bar_withholds", 0) for x in lent))
        fence_without_worker(a, fact)
        barrier("a", "fence-done", timeout=300)
        # For a person: the guard's give-backs that failed (a BAR left unreachable).
        fact(guard_giveback_failed=a.log().count("could not all be given back"))
        barrier("a", "lend-done", timeout=900)
    finally:
        a.stop()
    barrier("a", "lend-stopped", timeout=300)


def borrower(procs, ntb_bdf, barrier, fact):
    b = daemon(procs, "b", ntb_bdf)
    cb = Control(b.control)
    barrier("b", "lend-lent")
    try:
        fact(lend_listed=bool(vi.wait_listed(cb, "hosta/nvme0", 120)))
        r = cb.execute("attach", device="hosta/nvme0", domain="vm0")
        q = vi.qtest_qemu(procs, r["socket"], ram_size=RAM_SIZE)
        try:
            ident, cap = vi.consumer_view(q)
            fact(lend_config_id=f"{ident:#010x}", lend_cap=f"{cap:#018x}")
            t0 = time.monotonic()
            status, serial = vi.identify(q)
            fact(lend_identify_status=status, lend_serial=serial.replace(" ", "_") or "-",
                 lend_identify_s=round(time.monotonic() - t0, 2))
            word, msi_status = vi.msix_identify(q)
            fact(lend_msix_word=f"{word:#x}", lend_msix_status=msi_status)
            bor = b.stats()["borrowed"][0]
            fact(lend_forwarded=bor["region_forwarded"], lend_relayed=bor["relayed_irqs"],
                 lend_dma_maps=bor["dma_maps"])
            guard_under_load(q, cap, fact)
            # The old holder uses the device again after the guard's FLR (an Identify, which
            # leaves CC enabled): a reset between the leases must clear that.
            vi.consumer_view(q)
            status, _ = vi.identify(q)
            fact(fence_old_identify=status, fence_old_cc=f"{answered_read(q, 0x14):#x}")
            fence_old_holder(cb, cap, barrier, fact)
        finally:
            procs.stop(q)
        fence_new_holder(procs, cb, fact)
        barrier("b", "fence-done", timeout=300)
    finally:
        barrier("b", "lend-done", timeout=900)
        b.stop()
    barrier("b", "lend-stopped", timeout=300)


def window_onto_bar0(cap):
    """A mapping of our own of a window file onto the lent BAR0, taken from whichever process
    of this host holds one (the consumer's QEMU, the borrower worker) with pidfd_getfd: the
    one whose first 8 bytes are the device's CAP."""
    libc = ctypes.CDLL(None, use_errno=True)
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            fds = os.listdir(f"/proc/{pid}/fd")
        except OSError:
            continue
        pidfd = -1
        for name in fds:
            try:
                if "vfio-ntb-window" not in os.readlink(f"/proc/{pid}/fd/{name}"):
                    continue
            except OSError:
                continue
            if pidfd < 0:
                pidfd = libc.syscall(434, int(pid), 0)             # pidfd_open
            fd = libc.syscall(438, pidfd, int(name), 0) if pidfd >= 0 else -1   # pidfd_getfd
            if fd < 0:
                continue
            try:
                m = mmap.mmap(fd, 4096)
            except OSError:
                continue
            finally:
                os.close(fd)
            if struct.unpack_from("<Q", m, 0)[0] == cap:
                os.close(pidfd)
                return m
            m.close()
        if pidfd >= 0:
            os.close(pidfd)
    raise h.HarnessError("no window file onto BAR0 in any process of this host")


def ntbsim_counters(name, timeout=20):
    """The simulated NTB's counters now, both ports summed (the outside answers: see
    test_ntb.serve_stats_requests); None when they do not come."""
    ports = ntb_kmod.ntbsim_ports(SHARE, name, timeout)
    if ports is None:
        return None
    out = {}
    for port in ("port0", "port1"):
        for k, v in ports.get(port, {}).items():
            if isinstance(v, int):
                out[k] = out.get(k, 0) + v
    return out


def guard_under_load(q, cap, fact):
    """The BAR guard under load (see the top)."""
    window = window_onto_bar0(cap)
    samples = []
    stop = threading.Event()

    def hammer():
        while not stop.is_set() and len(samples) < 200000:
            t = time.monotonic()
            samples.append((t, struct.unpack_from("<I", window, 0)[0]))

    counters_before = ntbsim_counters("guard-before")
    thread = threading.Thread(target=hammer)
    thread.start()
    try:
        time.sleep(0.5)
        off0 = time.monotonic()
        vi.config_rw(q, 0x4, 0x00000404)             # MEM off (bus master on, INTx off)
        off1 = time.monotonic()
        time.sleep(1.0)
        on0 = time.monotonic()
        vi.config_rw(q, 0x4, 0x00000406)             # MEM on
        on1 = time.monotonic()
        time.sleep(0.5)
        pcie = vi.find_cap(q, 0x10)
        flr0 = time.monotonic()
        if pcie:
            vi.config_rw(q, pcie + 8, vi.config_rw(q, pcie + 8) | 0x8000)   # Initiate FLR
        # What a driver does after a reset: its BAR and COMMAND again.
        ident, cap_after = vi.consumer_view(q)
        time.sleep(0.5)
    finally:
        stop.set()
        thread.join()
    counters_after = ntbsim_counters("guard-after")
    if counters_before is not None and counters_after is not None:
        fact(guard_p2p_failures=counters_after.get("p2p_failures", 0) -
             counters_before.get("p2p_failures", 0),
             guard_p2p_unanswered=counters_after.get("p2p_unanswered", 0) -
             counters_before.get("p2p_unanswered", 0),
             guard_window_faults=counters_after.get("window_faults", 0) -
             counters_before.get("window_faults", 0))
    lo = cap & 0xffffffff
    before = [v for t, v in samples if t < off0]
    during = [v for t, v in samples if off1 < t < on0]
    after = [v for t, v in samples if on1 + 0.1 < t < flr0]
    final = struct.unpack_from("<I", window, 0)[0]
    window.close()
    # Before and after, the device's CAP; now and then all ones too, for a read that the
    # simulated NTB's peer (a busy TCG VM) did not answer in time (its p2p_unanswered).  While
    # memory decode is off, all ones only, and none of them a refused access (p2p_failures).
    def cap_again(reads):
        return lo in reads and set(reads) <= {lo, 0xffffffff}
    fact(guard_before=len(before), guard_before_ok=cap_again(before),
         guard_before_ones=before.count(0xffffffff), guard_during=len(during),
         guard_during_ones=bool(during) and set(during) == {0xffffffff},
         guard_after=len(after), guard_after_ok=cap_again(after),
         guard_after_ones=after.count(0xffffffff),
         guard_flr=bool(pcie), guard_flr_cap=cap_after == cap, guard_final_ok=final == lo)


def _lender_worker_pid():
    """The pid of this host's vfio-ntb-lender, or None."""
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0]
        except OSError:
            continue
        if cmd.endswith(b"vfio-ntb-lender"):
            return int(pid)
    return None


def _alive(pid):
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def fence_without_worker(a, fact):
    """Host a: stop the lender worker, revoke the lease (no grace), and see the daemon kill
    the worker that cannot say it fenced."""
    ca = Control(a.control)
    pid = _lender_worker_pid()
    if pid is None:
        raise h.HarnessError("no vfio-ntb-lender runs")
    os.kill(pid, signal.SIGSTOP)
    log_before = len(a.log())
    t0 = time.monotonic()
    r = ca.execute("revoke", device="hosta/nvme0", **{"grace-ms": 0})
    ended = time.monotonic()
    stopped = _alive(pid)                       # still there, stopped, at the lease's end
    gone = h.wait_for(lambda: not _alive(pid), VN_FENCE_TIMEOUT_S + 10)
    killed = time.monotonic()
    (SHARE / "fence-killed").write_text("")
    new = h.wait_for(lambda: _lender_worker_pid() not in (None, pid), 10)
    fact(fence_worker_forced=r.get("forced"), fence_worker_stopped_at_end=stopped,
         fence_worker_gone=bool(gone), fence_lease_end_s=round(ended - t0, 2),
         fence_worker_killed_s=round(killed - ended, 2),
         fence_worker_logged="killing it to fence" in a.log()[log_before:],
         fence_worker_respawned=bool(new))


# The daemon's time for a worker to say it fenced (daemon/fence.h VN_FENCE_TIMEOUT_MS).
VN_FENCE_TIMEOUT_S = 3


def fence_old_holder(cb, cap, barrier, fact):
    """Host b, the old holder: keeps reading the BAR through its window file while host a
    stops its worker and revokes; all ones must come while that worker is still there.  The
    reading is a child's: once host b's own lease ends its window is revoked, and a kept
    mapping may then end in SIGBUS (which reaches nothing either)."""
    window = window_onto_bar0(cap)
    lo = cap & 0xffffffff
    before = struct.unpack_from("<I", window, 0)[0]
    rd, wr = os.pipe()
    pid = os.fork()
    if pid == 0:                        # the old holder's reader
        os.close(rd)
        try:
            seen = "never"
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:
                if struct.unpack_from("<I", window, 0)[0] == 0xffffffff:
                    seen = "after-kill" if (SHARE / "fence-killed").exists() else "before-kill"
                    break
                time.sleep(0.001)
            os.write(wr, f"{seen}\n".encode())
            h.wait_for(lambda: (SHARE / "fence-killed").exists(), 60)
            os.write(wr, f"{struct.unpack_from('<I', window, 0)[0]}\n".encode())
        finally:
            os._exit(0)
    os.close(wr)
    barrier("b", "fence-ready", timeout=300)
    _, status = os.waitpid(pid, 0)
    with os.fdopen(rd) as f:
        out = f.read().split()
    window.close()
    sigbus = os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGBUS
    after = int(out[1]) if len(out) > 1 else None
    fact(fence_before_ok=before == lo, fence_ones=out[0] if out else "none",
         fence_after_kill="sigbus" if sigbus else f"{after:#x}" if after is not None else "-",
         fence_after_ok=sigbus or after == 0xffffffff)


def answered_read(q, off, tries=5):
    """The consumer's BAR0 dword at @off, read again while it reads all ones: the simulated
    NTB completes a read its peer's busy TCG VM did not answer in time with all ones (its
    p2p_unanswered, a completion timeout), which no register here holds."""
    for _ in range(tries):
        v = int(h.qtest_command(q, f"readl {vi.BAR + off:#x}")[1], 16)
        if v != 0xffffffff:
            break
    return v


def fence_new_holder(procs, cb, fact):
    """Host b again, as a new holder: the revoked lease given up, the device borrowed anew
    once host a fenced it, CC at its reset value, and a new consumer's Identify."""
    for cmd in ("detach", "return"):
        try:
            cb.execute(cmd, device="hosta/nvme0")
        except ControlError:
            pass                        # revoked: it may be out already
    deadline = time.monotonic() + 60
    r = None
    while r is None and time.monotonic() < deadline:
        try:
            r = cb.execute("attach", device="hosta/nvme0", domain="vm1")
        except ControlError:
            time.sleep(0.5)             # the lender's new worker starting
    if r is None:
        raise h.HarnessError("hosta/nvme0 could not be borrowed again after its fence")
    q = vi.qtest_qemu(procs, r["socket"], ram_size=RAM_SIZE)
    try:
        vi.consumer_view(q)
        # What the old holder left (CC.EN set) must not be there: the device was reset
        # between the two leases.  (QEMU's NVMe keeps AQA across a reset, so only CC tells.)
        fact(fence_new_cc=f"{answered_read(q, 0x14):#x}")
        status, serial = vi.identify(q)
        fact(fence_new_identify=status, fence_new_serial=serial.replace(" ", "_") or "-")
    finally:
        procs.stop(q)
    cb.execute("detach", device="hosta/nvme0")
    cb.execute("return", device="hosta/nvme0")


PHASES = ("lend-lent", "fence-ready", "fence-done", "lend-done", "lend-stopped")
# What a phase's failure can be: a fact of the host's, not the end of its script.
PHASE_ERRORS = (h.HarnessError, ControlError, TimeoutError, KeyError, OSError,
                subprocess.SubprocessError)


def passed(role, names):
    """This host's barriers @names passed, without waiting for the other host."""
    for name in names:
        (SHARE / f"sync-{name}-{role}").write_text(str(time.time()))


def run_phase(role, parts, ntb_bdf, barrier, fact, phases, error_key):
    """One phase, this host's part of it (@parts: host a's function and host b's, each called
    with procs, ntb_bdf, barrier, fact).  A failure is the fact @error_key, and this host's
    barriers @phases are passed at once so that the other host is not left waiting."""
    try:
        with h.Procs() as procs:
            parts[role == "b"](procs, ntb_bdf, barrier, fact)
    except PHASE_ERRORS as e:
        fact(**{error_key: f"{type(e).__name__}:{str(e)[:160]}"})
        passed(role, phases)


def run(role, ntb_bdf, barrier, fact):
    """Both hosts' part (see the top)."""
    run_phase(role, (lender, borrower), ntb_bdf, barrier, fact, PHASES, "lend_error")


# The lease timeout of the last phase: how long host b waits for a lender whose link went
# down before calling its device lost.
LOST_LEASE_MS = 3000
CSTS = vi.BAR + 0x1c


def peer_lost(role, ntb_bdf, barrier, fact):
    """The last phase (see the top)."""
    with h.Procs() as procs:
        try:
            if role == "a":
                daemon(procs, "a", ntb_bdf, lends={"nvme0": {"pci": vi.find(vi.NVME_ID)}},
                       lease_timeout_ms=LOST_LEASE_MS)
                barrier("a", "lost-lent")
                time.sleep(600)         # until test_ntb.py kills this VM
                return
            _lost_borrower(procs, ntb_bdf, barrier, fact)
        except (h.HarnessError, ControlError, TimeoutError, KeyError, OSError,
                subprocess.SubprocessError) as e:
            fact(lost_error=f"{type(e).__name__}:{str(e)[:160]}")
            if role == "b":
                (SHARE / "kill-a").write_text("")
                return
    _module_after_loss(ntb_bdf, fact)


def _lost_borrower(procs, ntb_bdf, barrier, fact):
    b = daemon(procs, "b", ntb_bdf, lease_timeout_ms=LOST_LEASE_MS)
    try:
        _lost_borrower_with(procs, b, barrier, fact)
    except Exception:
        # For a person: where it failed and what host b's daemon said (test_ntb.py keeps
        # the share's inner-*.log files).
        import traceback
        (SHARE / "inner-b-lost.log").write_text(traceback.format_exc() + "\n--- vfio-ntbd\n" +
                                                b.log()[-20000:])
        raise


def _lost_borrower_with(procs, b, barrier, fact):
    cb = Control(b.control)
    barrier("b", "lost-lent")
    if not vi.wait_listed(cb, "hosta/nvme0", 120):
        raise h.HarnessError("hosta/nvme0 was not listed")
    r = cb.execute("attach", device="hosta/nvme0", domain="vm0")
    q = vi.qtest_qemu(procs, r["socket"], ram_size=RAM_SIZE)
    vi.consumer_view(q)
    status, _ = vi.identify(q)
    fact(lost_identify_before=status)

    def link_down():
        nodes = cb.execute("query-nodes")
        return any(n.get("node") == "hosta" and n.get("link") != "up" for n in nodes)

    def lost():
        return bool(b.stats()["borrowed"][0].get("lender_lost"))

    # Mid-I/O: the consumer keeps reading the device's CSTS (and writing a register) while
    # host a's VM is killed.
    (SHARE / "kill-a").write_text("")
    marker = SHARE / "killed-a"
    killed = down = ones = gone = None
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and gone is None:
        if killed is None and marker.exists():
            killed = time.monotonic()
        csts = int(h.qtest_command(q, f"readl {CSTS:#x}")[1], 16)
        h.qtest_command(q, f"writel {vi.BAR + 0x24:#x} 0x10001")     # AQA: dropped once lost
        now = time.monotonic()
        if killed is not None:
            if ones is None and csts == 0xffffffff:
                ones = now
            if down is None and link_down():
                down = now
            if gone is None and lost():
                gone = now
        time.sleep(0.05)

    def since(t):
        return round(max(0.0, t - killed), 2) if t is not None and killed is not None \
            else "none"
    bor = b.stats()["borrowed"][0]
    fact(kmod_link_down_s=since(down), lost_all_ones_s=since(ones), lost_reported_s=since(gone),
         lost_stat=bool(bor.get("lender_lost")), lost_consumer_alive=q.poll() is None)
    procs.stop(q)
    try:
        cb.execute("detach", device="hosta/nvme0")
    except ControlError:
        pass                            # the device may be out already (the lender lost)
    cb.execute("return", device="hosta/nvme0")
    fact(lost_returned=not any(x["device"] == "hosta/nvme0" and x.get("attached_to")
                               for x in cb.execute("query-devices")))
    b.stop()


def _module_after_loss(ntb_bdf, fact):
    """Host b, the daemon gone: the module's own view of the lost peer, then its unload."""
    fd = os.open(f"/dev/vfio-ntb/{ntb_bdf}", os.O_RDWR)
    try:
        down = not ntb_kmod.info(fd)[1] & 1
        window = mmap.mmap(fd, 4096, offset=ntb_kmod.mw_info(fd, 0)[3])
        ones = window[:8] == b"\xff" * 8
        window.close()
    finally:
        os.close(fd)
    r = subprocess.run(["rmmod", "vfio_ntb"], capture_output=True, text=True)
    fact(kmod_link_down=down, kmod_window_all_ones=ones,
         kmod_unloaded_after_loss=r.returncode == 0)
