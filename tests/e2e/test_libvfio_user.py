#!/usr/bin/python3
"""End-to-end: devices served by libvfio-user, the most common vfio-user server library
(SPDK's target and most third-party servers use it), are lent like ours.  Its own samples,
built from the copy in Debian's QEMU source (scripts/build-libvfio-user), serve them: nobody
here wrote them.

Node A (vfio-ntbd) lends the sample's socket (`socket = PATH`); node B borrows it; a qtest
QEMU (no guest CPU) with stock QEMU's vfio-user-pci on B's socket is the consumer.  What an
operator would check:
- lend-libvfio-user-gpio: samples/gpio-pci-idio-16 (PCI 494f:0dc8).  The consumer's config
  space says 0x0dc8494f, and BAR2's input register (trapped: the sample serves it from a
  callback) reads through the fabric as the sample counts, one step every third read.  (The
  sample reports its config region with no READ/WRITE flags; QEMU's client reads it anyway,
  and so must we.)
- lend-libvfio-user-server: samples/server (PCI dead:beef), which serves one client for its
  lifetime and exits when it goes: the lender keeps that one connection across leases.  The
  consumer reads the id, writes a word to BAR1 and reads it back, through the fabric
  (the region is mappable: its GET_REGION_INFO carries the fd once per sparse area);
  its guest RAM, which QEMU maps for DMA, arrives at the sample as a DMA region (its log
  says "mapped DMA region"); it is detached, and a second attach's consumer reads the id
  too.
- lend-libvfio-user-restart: the gpio sample is killed and started again on its socket: A
  says its device server was lost and is back (DEVICE_SERVER_LOST, DEVICE_SERVER_BACK), and
  the next attach works: the new consumer reads the id and the counter from the start.
"""
import signal
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import harness as h  # noqa: E402
import vfio_inner as vi  # noqa: E402
from harness import result, wait_for  # noqa: E402
from cluster import Daemon  # noqa: E402
from control import Control  # noqa: E402

# tests/run-checks counts a result this file did not print as failed.
EXPECTED_RESULTS = 3

GPIO_ID = 0x0DC8494F
# The samples' BARs are I/O BARs (libvfio-user makes a region I/O space without
# VFU_REGION_FLAG_MEM): where the consumer puts them.
IO_BAR = 0xC000
SERVER_ID = 0xBEEFDEAD
DEV = "hosta/gpio0"


def samples():
    """The directory of the built samples (built on first use, then cached)."""
    out = subprocess.run([str(h.REPO / "scripts" / "build-libvfio-user"), "--print-path"],
                         capture_output=True, text=True, timeout=3600)
    if out.returncode != 0:
        raise h.HarnessError(f"scripts/build-libvfio-user failed:\n{out.stderr[-2000:]}")
    return Path(out.stdout.strip())


def gpio(procs, sock):
    """The gpio sample serving on @sock (it restarts itself after each client), once it
    listens."""
    if sock.exists():
        sock.unlink()
    p = procs.start("gpio", [str(samples() / "gpio-pci-idio-16"), "-v", str(sock)],
                    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    if not wait_for(sock.exists, 10):
        raise h.Timeout("the gpio sample does not listen")
    return p


def server(procs, sock, log):
    """The server sample on @sock, logging to @log, once it listens."""
    p = procs.start("server", [str(samples() / "server"), "-v", str(sock)],
                    stdout=subprocess.DEVNULL, stderr=open(log, "w"))
    if not wait_for(sock.exists, 10):
        raise h.Timeout("the server sample does not listen")
    return p


def hosts(procs, start=gpio):
    """hosta lends the sample @start starts as gpio0; hostb lists it."""
    wd = procs.tempdir()
    fab = procs.tempdir("vn-fabric-")
    sock = wd / "sample.sock"
    g = start(procs, sock) if start is gpio else start(procs, sock, wd / "sample.log")
    a = Daemon(procs, wd, "hosta", fab, lends={"gpio0": str(sock)}).start()
    b = Daemon(procs, wd, "hostb", fab).start()
    ctl = Control(b.control)
    try:
        if not wait_for(lambda: any(d["device"] == DEV for d in ctl.execute("query-devices")),
                        10):
            raise h.Timeout(f"hostb does not list {DEV}")
    finally:
        ctl.close()
    return sock, g, a, b, wd


def consumer(procs, b, domain):
    """A qtest consumer on hostb's attachment of the device: (qemu, its socket)."""
    ctl = Control(b.control)
    try:
        r = ctl.execute("attach", device=DEV, domain=domain)
    finally:
        ctl.close()
    return vi.qtest_qemu(procs, r["socket"]), r["socket"]


def gpio_view(q, reads=9):
    """(config id, BAR2's input register @reads times) as the consumer reads them."""
    ident = vi.config_rw(q, 0x00)
    vi.config_rw(q, 0x18, IO_BAR)                # BAR2: I/O space
    vi.config_rw(q, 0x04, 0x0401)                # COMMAND: I/O decode, INTx off
    values = [int(h.qtest_command(q, f"inb {IO_BAR:#x}")[1], 16) for _ in range(reads)]
    return ident, values


def counts_by_thirds(values):
    """Whether @values are the sample's counter: pin / 3 as pin goes up by one a read."""
    return any(values == [(start + i) // 3 for i in range(len(values))]
               for start in range(3 * values[0], 3 * values[0] + 3))


def detach(b):
    ctl = Control(b.control)
    try:
        ctl.execute("detach", device=DEV)
    finally:
        ctl.close()


def use(procs, b, domain, view):
    """Attach the device for @domain, let a qtest consumer run @view on it, let it go:
    what @view saw."""
    q, _ = consumer(procs, b, domain)
    try:
        return view(q)
    finally:
        q.kill()
        q.wait()
        detach(b)


def test_gpio(procs):
    sock, g, a, b, _ = hosts(procs)
    ident, values = use(procs, b, "vmq", gpio_view)
    return result("lend-libvfio-user-gpio",
                  ident == GPIO_ID and counts_by_thirds(values),
                  id=f"{ident:#010x}", bar2=values)


def server_view(q):
    """(config id, what BAR1 reads back after a word was written to it).  BAR1 is the
    sample's memory (shared with us: the lender exports it, the borrower maps it); the
    sample reads it from its start whatever the offset asked, so the word goes there."""
    ident = vi.config_rw(q, 0x00)
    vi.config_rw(q, 0x14, IO_BAR)                # BAR1: I/O space, 0x3000 bytes
    vi.config_rw(q, 0x04, 0x0401)
    h.qtest_command(q, f"outl {IO_BAR:#x} 0x5a17c0de")
    return ident, int(h.qtest_command(q, f"inl {IO_BAR:#x}")[1], 16)


def test_server(procs):
    sock, s, a, b, wd = hosts(procs, start=server)
    ident, word = use(procs, b, "vmq", server_view)
    mapped = "mapped DMA region" in (wd / "sample.log").read_text(errors="replace")
    ident2 = use(procs, b, "vmq2", lambda q: vi.config_rw(q, 0x00))
    alive = s.poll() is None
    return result("lend-libvfio-user-server",
                  ident == SERVER_ID and word == 0x5A17C0DE and mapped
                  and ident2 == SERVER_ID and alive,
                  id=f"{ident:#010x}", bar1=f"{word:#010x}", dma_region=mapped,
                  second_attach=f"{ident2:#010x}", sample_alive=alive)


def test_restart(procs):
    sock, g, a, b, _ = hosts(procs)
    before = use(procs, b, "vmq", lambda q: gpio_view(q, reads=3))
    ev = Control(a.control, timeout=30)
    ev.execute("subscribe-events")
    t0 = time.monotonic()
    g.send_signal(signal.SIGKILL)
    g.wait()
    lost = ev.wait_event("DEVICE_SERVER_LOST", 10)["data"]
    t_lost = time.monotonic() - t0
    gpio(procs, sock)                            # the same socket: the killed one's file is there
    back = ev.wait_event("DEVICE_SERVER_BACK", 15)["data"]
    ev.close()
    ident, values = use(procs, b, "vmq2", gpio_view)
    return result("lend-libvfio-user-restart",
                  before[0] == GPIO_ID and lost.get("device") == DEV
                  and back.get("device") == DEV and ident == GPIO_ID and values[0] == 0
                  and counts_by_thirds(values),
                  lost_s=f"{t_lost:.2f}", id=f"{ident:#010x}", bar2=values)


def main():
    ok = True
    tests = (test_gpio, test_server, test_restart)
    names = {t: "lend-libvfio-user-" + t.__name__.replace("test_", "") for t in tests}
    only = [t for t in tests if names[t] in sys.argv[1:]]
    for test in only or tests:
        with h.Procs() as procs:
            try:
                ok &= test(procs)
            except Exception as e:  # noqa: BLE001 - one test's failure must not hide the rest
                ok &= h.failed(names[test], e)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
