"""GPU-class devices in the lender host (run from vfio_inner.py, with its helpers).

- vfio-gpu-display: the lender host's bochs-display (lenderhost.DISPLAY), lent to the
  nested guest of vfio-nvme-guest (the same boot): its stock DRM driver (bochs) binds, the
  guest sets the display's preferred mode through DRM and fills the buffer it scans out with
  four bands (red, green, blue, white; tests/guest/vn-draw.c), and a screendump of the
  lender host's display of that device, taken by the outside, is exactly that picture: the
  mode's registers went through the borrowed BAR2 and the pixels through the borrowed VRAM
  (BAR0).  The PNG is kept (build/artifacts/vfio-gpu-display.png).

- vfio-large-bar: an ivshmem-plain function whose 1 GiB memory BAR (64-bit, prefetchable:
  what a GPU's VRAM BAR is) stands in for GPU memory, its backing a file of the test's
  share (lenderhost.GPU_MEM).  Both daemons' windows are 256 MiB (`max-window-size`), so
  the BAR crosses as 4 windows, one fd for the consumer's QEMU.  The consumer writes all of
  it (a byte per 16 MiB slice and a mark at each slice's start), reads all of it back, and
  the lender side (the backing file, read by this script) holds the same bytes; what the
  lender side writes at the end of each window the consumer reads.  No BAR access is served
  by software.  A third host whose budget is 2 windows is refused, the message naming the
  BAR and the budget.
"""
import base64
import os
import time

import harness as h
from cluster import Daemon
from control import Control, ControlError
from lenderhost import DISPLAY_ID, INSIDE_SHARE, ask_outside
import vfio_inner as vi

IVSHMEM_ID = "0x1af4:0x1110"
# QEMU's bochs-display.  Its ids are those of QEMU's standard VGA too (the lender host has
# one, its console): the class tells them apart.
DISPLAY_PCI_ID, DISPLAY_CLASS = "0x1234:0x1111", "0x038000"
# The guest's bands, top to bottom, as RGB (tests/guest/vn-draw.c).
BANDS = (b"\xff\x00\x00", b"\x00\xff\x00", b"\x00\x00\xff", b"\xff\xff\xff")
SCREEN = "vfio-gpu-display"
GPU_MEM = "/tmp/share/gpumem"   # lenderhost.GPU_MEM's backing, seen inside
BAR_SIZE = 1 << 30
WINDOW = 256 << 20
SLICE = 16 << 20
BAR2 = 0x100000000              # where the consumer puts BAR2: q35's 64-bit hole


def slice_bytes(k):
    """What the consumer writes into slice @k."""
    data = bytearray([(k * 37 + 11) & 0xff]) * SLICE
    data[0:8] = b"VNBAR%03d" % k
    return data


def b64read(q, addr, size, timeout=120.0):
    """@size bytes of the consumer's memory at @addr (qtest's b64read)."""
    return base64.b64decode(h.qtest_command(q, f"b64read {addr:#x} {size:#x}", timeout)[1])

def place_bar2(q):
    """BAR2 (64-bit) at BAR2, memory decoding on."""
    vi.config_rw(q, 0x18, BAR2 & 0xffffffff)
    vi.config_rw(q, 0x1c, BAR2 >> 32)
    vi.config_rw(q, 0x04, 0x0002)


def refused_over_budget(procs, wd, fab):
    """A host with 2 windows borrows gpu0: the attach fails, saying why; nothing stays."""
    c = Daemon(procs, wd, "hostn", fab,
               fabric_params={"max-window-size": WINDOW, "max-windows": 2}).start()
    cc = Control(c.control)
    vi.wait_listed(cc, "hostl/gpu0")
    try:
        cc.execute("attach", device="hostl/gpu0", domain="vm-small")
        why = "attached"
    except ControlError as e:
        why = e.desc
    try:
        cc.execute("return", device="hostl/gpu0")
    except ControlError:
        pass
    c.stop()
    return why


def test_large_bar(procs, wd, fab):
    bdf = vi.find(IVSHMEM_ID)
    vi.bind_vfio(bdf)
    params = {"max-window-size": WINDOW}
    a = Daemon(procs, wd, "hostl", fab, lends={"gpu0": {"pci": bdf}},
               fabric_params=params).start()
    b = Daemon(procs, wd, "hostm", fab, fabric_params=params).start()
    cb = Control(b.control)
    vi.wait_listed(cb, "hostl/gpu0")
    r = cb.execute("attach", device="hostl/gpu0", domain="vm-gpu")
    q = vi.qtest_qemu(procs, r["socket"])
    t0 = time.monotonic()
    bad_consumer, bad_lender, bad_back = [], [], []
    try:
        place_bar2(q)
        windows = b.stats()["fabric"]["windows_in_use"]
        for k in range(BAR_SIZE // SLICE):
            data = slice_bytes(k)
            h.qtest_command(q, f"memset {BAR2 + k * SLICE:#x} {SLICE:#x} {data[8]:#x}")
            h.qtest_command(q, f"write {BAR2 + k * SLICE:#x} 8 0x{data[:8].hex()}")
        t_write = time.monotonic() - t0
        for k in range(BAR_SIZE // SLICE):
            if b64read(q, BAR2 + k * SLICE, SLICE) != slice_bytes(k):
                bad_consumer.append(k)
        t_read = time.monotonic() - t0 - t_write
        with open(GPU_MEM, "r+b", buffering=0) as f:
            for k in range(BAR_SIZE // SLICE):
                if os.pread(f.fileno(), SLICE, k * SLICE) != slice_bytes(k):
                    bad_lender.append(k)
            for w in range(BAR_SIZE // WINDOW):
                os.pwrite(f.fileno(), b"LENDER%02d" % w, (w + 1) * WINDOW - 8)
        for w in range(BAR_SIZE // WINDOW):
            got = h.qtest_command(q, f"read {BAR2 + (w + 1) * WINDOW - 8:#x} 8")[1]
            if bytes.fromhex(got[2:]) != b"LENDER%02d" % w:
                bad_back.append(w)
        forwarded = vi.bar_forwarded(a, b)
    finally:
        procs.stop(q)
    cb.execute("detach", device="hostl/gpu0")
    cb.execute("return", device="hostl/gpu0")
    why = refused_over_budget(procs, wd, fab)
    a.stop()
    b.stop()
    return h.result("vfio-large-bar",
                    windows >= 4 and not bad_consumer and not bad_lender and not bad_back and
                    forwarded == 0 and "BAR2" in why and "needs 4 windows" in why and
                    "max-windows" in why,
                    bar_mib=BAR_SIZE >> 20, window_mib=WINDOW >> 20, windows_in_use=windows,
                    slices_wrong_consumer=len(bad_consumer),
                    slices_wrong_lender=len(bad_lender), lender_writes_unseen=len(bad_back),
                    bar_accesses_forwarded=forwarded, write_s=round(t_write, 1),
                    read_s=round(t_read, 1), over_budget=why[-100:].replace(" ", "_"))


def read_ppm(path):
    """(width, height, RGB bytes) of a binary PPM (QEMU's screendump)."""
    data = path.read_bytes()
    fields, pos = [], 0
    while len(fields) < 4:                  # magic, width, height, maxval
        while data[pos:pos + 1].isspace():
            pos += 1
        end = pos
        while not data[end:end + 1].isspace():
            end += 1
        fields.append(data[pos:end])
        pos = end
    if fields[0] != b"P6" or fields[3] != b"255":
        raise h.HarnessError(f"{path.name}: not a P6 PPM of 8-bit samples")
    w, hgt = int(fields[1]), int(fields[2])
    return w, hgt, data[pos + 1:pos + 1 + w * hgt * 3]


def display_check(w, hgt):
    """Screendump the lent display GPU (the outside does it) while the guest holds its
    picture of @w x @hgt; how many of its rows differ from the bands, and its size."""
    ask_outside({"screendump": f"{SCREEN}.ppm", "device": DISPLAY_ID, "format": "ppm"})
    ask_outside({"screendump": f"{SCREEN}.png", "device": DISPLAY_ID, "format": "png"})
    sw, sh, rgb = read_ppm(INSIDE_SHARE / f"{SCREEN}.ppm")
    (INSIDE_SHARE / f"{SCREEN}.ppm").unlink()
    if (sw, sh) != (w, hgt):
        return {"size": f"{sw}x{sh}", "rows_wrong": hgt}
    band = hgt // 4
    wrong = sum(1 for y in range(hgt)
                if rgb[y * w * 3:(y + 1) * w * 3] != BANDS[min(y // band, 3)] * w)
    return {"size": f"{sw}x{sh}", "rows_wrong": wrong}
