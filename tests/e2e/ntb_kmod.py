"""Our NTB client module, vfio_ntb (vfio-ntb/kmod/), in each NTB host of test_ntb.py (run
from ntb_inner.py, after Linux's own clients).  Drives /dev/vfio-ntb/<bdf> as vfio-ntbd
will: ioctls (vfio_ntb_uapi.h, packed by hand below), mmap and eventfds.

- Host a exports its own memory, as much as the window takes (pinned user pages,
  VN_NTB_MW_EXPORT: one range behind the IOMMU, in many DMA segments), as the target of b's
  window; host b gives a's window a buffer of the module's (VN_NTB_MW_ALLOC,
  mmap'd).  Each maps its outbound window (mmap) and writes a pattern through it, reads it
  back through it, and finds the other's pattern in its own target.
- Each also maps its window through a file of that window alone (VN_NTB_MW_FD) and sees the
  same bytes.  Host b's BAR mapped through sysfs (a pci-testdev's BAR 0) is refused as an
  inbound window's target: only a VFIO device's mapping is one (vfio-ntbd exports a lent
  device's BAR so).  Revoking a window (VN_NTB_MW_REVOKE, as vfio-ntbd does before the
  window reaches a new target) leaves a process that kept its mapping with SIGBUS at its
  next access, and the window file it kept cannot be mapped again.
- Doorbells: each registers an eventfd for one bit; the other rings it; the eventfd fires
  and the bit is cleared.
- Host b tries a table of bad arguments; each is refused with the errno it names, and a
  second open is EBUSY, a window is not torn down while mapped (EBUSY).
- Both close the device; the module unloads (nothing held); they load it again and bring
  the link up again.  (The peer's loss is ntb_lend.peer_lost's: host a's VM killed under
  vfio-ntbd, whose link event is the module's; then the link reads down, the window all
  ones, and the module unloads.)
"""
import errno
import fcntl
import json
import mmap
import os
import select
import signal
import struct
import subprocess
import time
from pathlib import Path

# vfio_ntb_uapi.h
TYPE = 0xb7
MAX_MWS = 8
INFO_FMT = "<IIiiIIIIQ"               # argsz flags port peer_port mw peer_mw spad res db
MW_INFO_FMT = "<IIQQQQQQQ"            # argsz index out_size out_off align salign max in_off in_size
SPAD_FMT = "<II"
DB_EV_FMT = "<iIQ"
EXPORT_FMT = "<IIQQQ"                 # index res vaddr size dma
ALLOC_FMT = "<IIQ"
MW_FD_FMT = "<IIII"                   # argsz index flags reserved
MMAP_OUT, MMAP_IN = 1, 2
BUF = 65536


def _ioc(direction, nr, size):
    return (direction << 30) | (size << 16) | (TYPE << 8) | nr


def IOWR(nr, fmt):
    return _ioc(3, nr, struct.calcsize(fmt))


def IOW(nr, fmt):
    return _ioc(1, nr, struct.calcsize(fmt))


def IOR(nr, fmt):
    return _ioc(2, nr, struct.calcsize(fmt))


INFO = IOWR(0, INFO_FMT)
MW_INFO = IOWR(1, MW_INFO_FMT)
LINK = IOW(2, "<I")
LINK_EVENTFD = IOW(3, "<i")
SPAD_READ = IOWR(4, SPAD_FMT)
SPAD_WRITE = IOW(5, SPAD_FMT)
PEER_SPAD_READ = IOWR(6, SPAD_FMT)
PEER_SPAD_WRITE = IOW(7, SPAD_FMT)
PEER_DB_SET = IOW(8, "<Q")
DB_EVENTFD = IOW(9, DB_EV_FMT)
DB_READ = IOR(10, "<Q")
MW_EXPORT = IOWR(11, EXPORT_FMT)
MW_ALLOC = IOW(12, ALLOC_FMT)
MW_CLEAR = IOW(14, "<I")
MW_FD = IOW(15, MW_FD_FMT)
MW_REVOKE = IOW(17, "<I")
PEER_DB_EVENTFD = IOW(19, DB_EV_FMT)


def mmap_offset(kind, index):
    return (kind << 56) | (index << 48)


def call(fd, req, fmt, *args):
    """One ioctl with a struct packed from @args; the struct as the module left it."""
    buf = bytearray(struct.pack(fmt, *args))
    fcntl.ioctl(fd, req, buf, True)
    return struct.unpack(fmt, bytes(buf))


def window_fd(fd, idx):
    """VN_NTB_MW_FD: a new fd for outbound window @idx alone (memory: write-combining)."""
    return fcntl.ioctl(fd, MW_FD, bytearray(struct.pack(MW_FD_FMT, struct.calcsize(MW_FD_FMT),
                                                        idx, 1, 0)), True)


def errno_of(fn):
    try:
        fn()
        return 0
    except OSError as e:
        return e.errno


def info(fd):
    return call(fd, INFO, INFO_FMT, struct.calcsize(INFO_FMT), 0, 0, 0, 0, 0, 0, 0, 0)


def mw_info(fd, idx):
    return call(fd, MW_INFO, MW_INFO_FMT, struct.calcsize(MW_INFO_FMT), idx, 0, 0, 0, 0, 0,
                0, 0)


def wait_fd(fd, timeout):
    """True when @fd became readable within @timeout s (and its count read)."""
    if not select.select([fd], [], [], timeout)[0]:
        return False
    os.read(fd, 8)
    return True


def ntbsim_ports(share, name, timeout=20):
    """The simulated NTB's counters and port states now, as its stats file has them (the
    test outside answers a file stats-request-NAME in @share: test_ntb.serve_stats_requests);
    None when they do not come."""
    answer = share / f"stats-{name}.json"
    (share / f"stats-request-{name}").write_text("")
    deadline = time.monotonic() + timeout
    while not answer.exists():
        if time.monotonic() > deadline:
            return None
        time.sleep(0.1)
    return json.loads(answer.read_text())


def model_said(share, name):
    """What the simulated NTB's ports are (for an error): connected, link wanted, and how many
    link ups, downs, resets and connections each saw."""
    ports = ntbsim_ports(share, name) if share is not None else None
    if ports is None:
        return "model: no answer"
    return "model: link %s; %s" % (
        "up" if ports.get("link_up") else "down",
        "; ".join("p%d %s %s ups=%s downs=%s resets=%s connects=%s" % (
            i, "connected" if p.get("connected") else "absent",
            "wants" if p.get("link_wanted") else "does-not-want", p.get("link_ups"),
            p.get("link_downs"), p.get("resets"), p.get("connects"))
            for i, p in enumerate(ports.get(f"port{i}", {}) for i in range(2))))


def link_up(fd, timeout=120, again_s=10, share=None):
    """Ask for the link and wait for it.  Asked again every @again_s s: under load one side's
    request has been seen to go unanswered (make check failed once at kmod-linked).  With
    @share, a timeout's error says what the simulated NTB's ports were."""
    call(fd, LINK, "<I", 1)
    deadline = time.monotonic() + timeout
    asked = time.monotonic()
    while not info(fd)[1] & 1:
        if time.monotonic() > deadline:
            raise TimeoutError("vfio_ntb: the link did not come up; " +
                               model_said(share, "link-timeout"))
        if time.monotonic() - asked > again_s:
            call(fd, LINK, "<I", 1)
            asked = time.monotonic()
        time.sleep(0.05)


def keep_link(fd, again_s=10):
    """What a host that saw the link up does while it waits for the other to see it too: ask
    again (every @again_s s) while it reads down.  CI failed once with host a past its
    link_up and host b's link down for 120 s; why is not known yet (the simulated NTB's log
    now says what each port asked for, and link_up's error what each port is).  A host that
    asks again while it waits brings the link back if its own request was what went."""
    asked = [0.0]

    def look():
        if not info(fd)[1] & 1 and time.monotonic() - asked[0] > again_s:
            call(fd, LINK, "<I", 1)
            asked[0] = time.monotonic()
    return look


# The doorbell bit of doorbell_trigger (b's, rung by a's trigger).
TRIGGER_BIT = 1 << 3


def doorbell_trigger(role, fd, barrier, fact):
    """A peer doorbell trigger (VN_NTB_PEER_DB_EVENTFD): a signal of a's eventfd rings b's
    doorbell in the kernel (no process of a's reads the eventfd: its count is gone at once);
    once a removed it, a signal rings nothing."""
    if role == "b":
        ev = os.eventfd(0, os.EFD_NONBLOCK)
        call(fd, DB_EVENTFD, DB_EV_FMT, ev, 0, TRIGGER_BIT)
        barrier(role, "kmod-trigger-set")
        barrier(role, "kmod-trigger-signalled")
        rung = wait_fd(ev, 20)
        barrier(role, "kmod-trigger-removed")
        after = wait_fd(ev, 3)
        call(fd, DB_EVENTFD, DB_EV_FMT, -1, 0, TRIGGER_BIT)
        os.close(ev)
        fact(kmod_trigger_rang=rung, kmod_trigger_rang_after_removal=after)
        return
    t = os.eventfd(0, os.EFD_NONBLOCK)
    call(fd, PEER_DB_EVENTFD, DB_EV_FMT, t, 0, TRIGGER_BIT)
    barrier(role, "kmod-trigger-set")
    os.eventfd_write(t, 1)
    taken = not select.select([t], [], [], 0.5)[0]
    barrier(role, "kmod-trigger-signalled")
    call(fd, PEER_DB_EVENTFD, DB_EV_FMT, -1, 0, TRIGGER_BIT)
    os.eventfd_write(t, 1)
    left = bool(select.select([t], [], [], 0.5)[0])
    barrier(role, "kmod-trigger-removed")
    os.close(t)
    fact(kmod_trigger_taken=taken, kmod_trigger_left_after_removal=left)


def bad_arguments(fd, dev, spads, in_max):
    """(what, errno got, errno wanted) for each bad call; the module must refuse each."""
    not_eventfd = os.open("/dev/null", os.O_RDONLY)
    rows = [
        ("info argsz 0", lambda: call(fd, INFO, INFO_FMT, 0, 0, 0, 0, 0, 0, 0, 0, 0),
         errno.EINVAL),
        ("mw_info index 99", lambda: call(fd, MW_INFO, MW_INFO_FMT,
                                          struct.calcsize(MW_INFO_FMT), 99, 0, 0, 0, 0, 0, 0, 0),
         errno.EINVAL),
        ("spad past the last", lambda: call(fd, SPAD_READ, SPAD_FMT, spads, 0), errno.EINVAL),
        ("peer spad 2^32-1", lambda: call(fd, PEER_SPAD_WRITE, SPAD_FMT, 0xffffffff, 1),
         errno.EINVAL),
        ("peer doorbell 0", lambda: call(fd, PEER_DB_SET, "<Q", 0), errno.EINVAL),
        ("peer doorbell bit 63", lambda: call(fd, PEER_DB_SET, "<Q", 1 << 63), errno.EINVAL),
        ("doorbell eventfd -5", lambda: call(fd, DB_EVENTFD, DB_EV_FMT, -5, 0, 1), errno.EINVAL),
        ("doorbell eventfd, no bits", lambda: call(fd, DB_EVENTFD, DB_EV_FMT, -1, 0, 0),
         errno.EINVAL),
        ("doorbell eventfd not an eventfd",
         lambda: call(fd, DB_EVENTFD, DB_EV_FMT, not_eventfd, 0, 1), errno.EINVAL),
        ("doorbell eventfd removed twice", lambda: call(fd, DB_EVENTFD, DB_EV_FMT, -1, 0, 0x4),
         errno.ENOENT),
        ("peer doorbell eventfd -5", lambda: call(fd, PEER_DB_EVENTFD, DB_EV_FMT, -5, 0, 1),
         errno.EINVAL),
        ("peer doorbell eventfd, two bits",
         lambda: call(fd, PEER_DB_EVENTFD, DB_EV_FMT, -1, 0, 0x3), errno.EINVAL),
        ("peer doorbell eventfd, bit 63",
         lambda: call(fd, PEER_DB_EVENTFD, DB_EV_FMT, -1, 0, 1 << 63), errno.EINVAL),
        ("peer doorbell eventfd not an eventfd",
         lambda: call(fd, PEER_DB_EVENTFD, DB_EV_FMT, not_eventfd, 0, 1), errno.EINVAL),
        ("peer doorbell eventfd removed twice",
         lambda: call(fd, PEER_DB_EVENTFD, DB_EV_FMT, -1, 0, TRIGGER_BIT), errno.ENOENT),
        ("link 7", lambda: call(fd, LINK, "<I", 7), errno.EINVAL),
        ("link eventfd -2", lambda: call(fd, LINK_EVENTFD, "<i", -2), errno.EINVAL),
        ("export unaligned", lambda: call(fd, MW_EXPORT, EXPORT_FMT, 0, 0, 0x1001, 4096, 0),
         errno.EINVAL),
        ("export 0 bytes", lambda: call(fd, MW_EXPORT, EXPORT_FMT, 0, 0, 0x10000, 0, 0),
         errno.EINVAL),
        ("export unmapped memory", lambda: call(fd, MW_EXPORT, EXPORT_FMT, 0, 0, 0x10000,
                                                4096, 0), errno.EFAULT),
        ("export wrapping around", lambda: call(fd, MW_EXPORT, EXPORT_FMT, 0, 0,
                                                (1 << 64) - 4096, 8192, 0), errno.EINVAL),
        ("alloc window 9", lambda: call(fd, MW_ALLOC, ALLOC_FMT, 9, 0, 4096), errno.EINVAL),
        ("alloc beyond the window", lambda: call(fd, MW_ALLOC, ALLOC_FMT, 0, 0, in_max * 2),
         errno.EINVAL),
        ("export BAR by address (gone)", lambda: fcntl.ioctl(fd, _ioc(3, 13, 32)),
         errno.ENOTTY),
        ("clear window 8", lambda: call(fd, MW_CLEAR, "<I", 8), errno.EINVAL),
        ("unknown command", lambda: fcntl.ioctl(fd, _ioc(0, 63, 0)), errno.ENOTTY),
        ("mmap of kind 3", lambda: mmap.mmap(fd, 4096, offset=mmap_offset(3, 0)), errno.EINVAL),
        ("mmap past the window", lambda: mmap.mmap(fd, in_max * 2,
                                                  offset=mmap_offset(MMAP_OUT, 0)),
         errno.EINVAL),
        ("mmap private", lambda: mmap.mmap(fd, 4096, flags=mmap.MAP_PRIVATE,
                                          offset=mmap_offset(MMAP_OUT, 0)), errno.EINVAL),
        ("a second open", lambda: os.close(os.open(dev, os.O_RDWR)), errno.EBUSY),
    ]
    out = [(what, errno_of(fn), want) for what, fn, want in rows]
    os.close(not_eventfd)
    return out


# QEMU's pci-testdev (no driver binds it, so its BARs can be mapped through sysfs).
TESTDEV = "pci-testdev"
TESTDEV_ID = ("0x1b36", "0x0005")


def testdev_bar0():
    """sysfs's file of the pci-testdev's BAR 0 (test_ntb.py gives host b one)."""
    for d in Path("/sys/bus/pci/devices").iterdir():
        if ((d / "vendor").read_text().strip(), (d / "device").read_text().strip()) == \
                TESTDEV_ID:
            return d / "resource0"
    raise FileNotFoundError("no pci-testdev in this host")


def device_memory_exports(fd, window):
    """Device memory the caller mapped as an inbound window's target: refused unless VFIO
    mapped it (here a pci-testdev's BAR through sysfs; vfio-ntbd maps a lent device's through
    VFIO, which ntb-lend shows), and refused past its mapping and for a window of ours.
    Rows as bad_arguments' (0: accepted)."""
    res = os.open(testdev_bar0(), os.O_RDWR)
    bar = mmap.mmap(res, 4096)
    rows = [("export a BAR mapped through sysfs", errno_of(lambda: call(
                fd, MW_EXPORT, EXPORT_FMT, 1, 0, _address_of(bar), 4096, 0)), errno.EINVAL),
            ("clear a window with no target", errno_of(lambda: call(fd, MW_CLEAR, "<I", 1)),
             errno.ENOENT),
            ("export past a BAR's mapping", errno_of(lambda: call(
                fd, MW_EXPORT, EXPORT_FMT, 1, 0, _address_of(bar), 8192, 0)), errno.EFAULT),
            ("export a window of ours", errno_of(lambda: call(
                fd, MW_EXPORT, EXPORT_FMT, 1, 0, _address_of(window), 4096, 0)), errno.EINVAL)]
    bar.close()
    os.close(res)
    wfd = window_fd(fd, 0)
    rows += [("window fd of window 9", errno_of(lambda: window_fd(fd, 9)), errno.EINVAL),
             ("an ioctl on a window fd", errno_of(lambda: call(wfd, INFO, INFO_FMT,
                                                               struct.calcsize(INFO_FMT), 0, 0,
                                                               0, 0, 0, 0, 0, 0)),
              errno.ENOTTY),
             ("window fd mmap past the window", errno_of(
                 lambda: mmap.mmap(wfd, 4096, offset=1 << 40)), errno.EINVAL),
             ("window fd mmap private", errno_of(
                 lambda: mmap.mmap(wfd, 4096, flags=mmap.MAP_PRIVATE)), errno.EINVAL)]
    os.close(wfd)
    return rows + revoked(fd)


def revoked(fd):
    """VN_NTB_MW_REVOKE: a process that mapped window 0 through a window file faults
    (SIGBUS) on its next access once the window is revoked; the file it came from cannot be
    mapped again (ENODEV), a new window file can.  Rows as bad_arguments' (for the child:
    the signal that ended it, SIGBUS wanted)."""
    wfd = window_fd(fd, 0)
    ready_r, ready_w = os.pipe()
    go_r, go_w = os.pipe()
    pid = os.fork()
    if pid == 0:                        # the child: a QEMU that kept its mapping
        m = mmap.mmap(wfd, 4096)
        m[0]                            # mapped and reachable
        os.write(ready_w, b"1")
        os.read(go_r, 1)
        m[0]                            # revoked meanwhile: SIGBUS
        os._exit(0)
    os.read(ready_r, 1)
    rows = [("revoke window 9", errno_of(lambda: call(fd, MW_REVOKE, "<I", 9)), errno.EINVAL),
            ("revoke window 0", errno_of(lambda: call(fd, MW_REVOKE, "<I", 0)), 0)]
    os.write(go_w, b"1")
    _, status = os.waitpid(pid, 0)
    rows.append(("an access after the revoke", os.WTERMSIG(status) if os.WIFSIGNALED(status)
                 else 0, signal.SIGBUS))
    rows.append(("the old file mapped after the revoke",
                 errno_of(lambda: mmap.mmap(wfd, 4096).close()), errno.ENODEV))
    nfd = window_fd(fd, 0)
    m = mmap.mmap(nfd, 4096)
    rows.append(("a new file's mapping after the revoke", 0 if m[:8] is not None else -1, 0))
    m.close()
    for f in (wfd, nfd, ready_r, ready_w, go_r, go_w):
        os.close(f)
    return rows


def data_and_doorbells(role, fd, barrier, share, fact):
    other = "b" if role == "a" else "a"
    mi = mw_info(fd, 0)
    out_size, out_off, in_max = mi[2], mi[3], mi[6]
    # Our target for the peer's window.
    if role == "a":
        # Behind the IOMMU its pages are one range of DMA addresses but many segments (a
        # PCI function's are 64 KiB at most), as guest RAM will be.  At most 4 MiB: each
        # page is a DMA mapping of the simulated NTB's (its table holds VN_MAX_DMA_MAPS).
        size = min(in_max, 4 << 20)
        buf = mmap.mmap(-1, size)
        addr = _address_of(buf)
        _, _, _, _, dma = call(fd, MW_EXPORT, EXPORT_FMT, 0, 0, addr, size, 0)
        target = buf
        fact(kmod_export_dma=hex(dma), kmod_export_bytes=size)
    else:
        call(fd, MW_ALLOC, ALLOC_FMT, 0, 0, BUF)
        in_off = mw_info(fd, 0)[7]
        target = mmap.mmap(fd, BUF, offset=in_off)
    barrier(role, "kmod-targets")
    window = mmap.mmap(fd, min(BUF, out_size), offset=out_off)
    pattern = role.encode() * 64 + os.urandom(4096 - 64)
    t0 = time.monotonic()
    window[:4096] = pattern
    fact(kmod_window_write_s=round(time.monotonic() - t0, 2))
    fact(kmod_readback_ok=window[:4096] == pattern)
    # The same window as a file of its own (what the daemon hands a QEMU): it sees what the
    # device's mapping wrote, and what it writes the device's mapping sees.
    wfd = window_fd(fd, 0)
    wmap = mmap.mmap(wfd, 4096)
    seen = wmap[:4096] == pattern
    wmap[:64] = role.encode() * 64
    fact(kmod_window_fd_ok=seen and window[:64] == role.encode() * 64)
    window[:64] = pattern[:64]
    wmap.close()
    os.close(wfd)
    (share / f"kpattern-{role}").write_bytes(pattern)
    barrier(role, "kmod-written")
    fact(kmod_inbound_ok=target[:4096] == (share / f"kpattern-{other}").read_bytes())

    # Doorbells: a listens on bit 0 and b rings it; then b listens on bit 1 and a rings it.
    ev = os.eventfd(0, os.EFD_NONBLOCK)
    mine = 0x1 if role == "a" else 0x2
    call(fd, DB_EVENTFD, DB_EV_FMT, ev, 0, mine)
    barrier(role, "kmod-db-ready")
    call(fd, PEER_DB_SET, "<Q", 0x2 if role == "a" else 0x1)
    rung = wait_fd(ev, 20)
    left = call(fd, DB_READ, "<Q", 0)[0]
    fact(kmod_doorbell_ok=rung and not left & mine)
    call(fd, DB_EVENTFD, DB_EV_FMT, -1, 0, mine)
    os.close(ev)
    barrier(role, "kmod-db-done")
    return window, target, in_max


def _address_of(m):
    """The address of an mmap object's memory (ctypes reads it from the buffer)."""
    import ctypes
    return ctypes.addressof(ctypes.c_char.from_buffer(m))


def load(mods, bdf):
    """insmod vfio_ntb and wait for the device's node; its path."""
    subprocess.run(["insmod", str(mods / "vfio_ntb.ko")], check=True)
    dev = f"/dev/vfio-ntb/{bdf}"
    deadline = time.monotonic() + 10
    while not os.path.exists(dev):
        if time.monotonic() > deadline:
            raise TimeoutError(f"{dev} did not appear")
        time.sleep(0.05)
    return dev


def run(role, mods, bdf, barrier, share, fact):
    """The whole kmod phase; returns the open fd of the relinked device."""
    dev = load(mods, bdf)
    fd = os.open(dev, os.O_RDWR)
    i = info(fd)
    fact(kmod_info=f"mw={i[4]},peer_mw={i[5]},spads={i[6]},db=0x{i[8]:x}")
    t0 = time.monotonic()
    link_up(fd, share=share)
    fact(kmod_link_s=round(time.monotonic() - t0, 2))
    barrier(role, "kmod-linked", waiting=keep_link(fd))
    window, target, in_max = data_and_doorbells(role, fd, barrier, share, fact)
    doorbell_trigger(role, fd, barrier, fact)
    if role == "b":
        # Clearing a buffer under its mapping revokes the mapping (its next access would
        # fault) and the buffer cannot be mapped again; then the table of bad calls, with
        # window 0 free (so that each reaches the check it is about).
        in_off = mw_info(fd, 0)[7]
        rows = [("clear while mapped", errno_of(lambda: call(fd, MW_CLEAR, "<I", 0)), 0),
                ("map a cleared buffer", errno_of(lambda: mmap.mmap(fd, 4096, offset=in_off)),
                 errno.EINVAL),
                ("clear twice", errno_of(lambda: call(fd, MW_CLEAR, "<I", 0)), errno.ENOENT)]
        rows += device_memory_exports(fd, window)
        target.close()
        rows += bad_arguments(fd, dev, i[6], in_max)
        wrong = [f"{w}:{got}!={want}" for w, got, want in rows if got != want]
        fact(kmod_bad_args=len(rows), kmod_bad_args_wrong=";".join(wrong) or "none")
    else:
        target.close()
    # Closing the device disables the link, and the NTB API answers window calls only while
    # the link is up (ntb_mw_get_align: ENOTCONN): b's table first, then both close.
    barrier(role, "kmod-args-done")
    window.close()
    os.close(fd)
    barrier(role, "kmod-closed")
    r = subprocess.run(["rmmod", "vfio_ntb"], capture_output=True, text=True)
    fact(kmod_unloaded=r.returncode == 0)
    load(mods, bdf)
    fd = os.open(dev, os.O_RDWR)
    link_up(fd, share=share)
    return fd
