"""A function with INTx only, in the lender host (run from vfio_inner.py, with its helpers).

- vfio-intx: QEMU's e1000 (lenderhost.E1000: conventional PCI, no MSI or MSI-X capability)
  lent through VFIO to a qtest consumer whose IOAPIC input is watched (`irq_intercept_in`).
  The consumer enables the function's INTx and makes it interrupt (IMS, then ICS: a cause
  set by software), twice.  Each time the consumer's interrupt line rises; the consumer
  reads ICR, which clears the cause, and its QEMU ends the interrupt (it lowers the line and
  unmasks INTx through SET_IRQS, which the lender passes to VFIO).  The second interrupt
  shows that the unmask reached the device: VFIO masks INTx at each interrupt and would
  deliver no other.  Both interrupts went from VFIO to the consumer's eventfd: none was
  relayed by the lender or the borrower.
"""
import harness as h
from cluster import Daemon
from control import Control
import vfio_inner as vi

E1000_ID = "0x8086:0x100e"
# e1000 registers (Intel 8254x SDM 13.4.17-21) and the cause the test sets: link status.
ICR, ICS, IMS, IMC = 0xc0, 0xc8, 0xd0, 0xd8
CAUSE_LSC = 0x4
# q35 routes PCI INTx to IOAPIC inputs 16-23 (its PIRQA-H).
PCI_GSIS = range(16, 24)
ROUNDS = 2


def capabilities(q):
    """IDs of the consumer's view of the function's capability list (bounded walk)."""
    ids, cap = [], vi.config_rw(q, 0x34) & 0xfc
    while cap and len(ids) < 48:
        ids.append(vi.config_rw(q, cap) & 0xff)
        cap = (vi.config_rw(q, cap) >> 8) & 0xfc
    return ids


def wait_irq(q, events, what, timeout=20.0):
    """The IOAPIC input that went @what ("raise" or "lower") as @events holds it, polling
    with reads of the consumer's RAM (QEMU reports it between commands); None when none
    did within @timeout seconds."""
    def seen():
        h.qtest_command(q, "readl 0x0", events=events)
        return [int(e.split()[2]) for e in events if e.split()[1] == what]
    got = h.wait_for(seen, timeout)
    return got[0] if got else None


def interrupt_rounds(q):
    """Enable the function's INTx, make it interrupt ROUNDS times, each time reading ICR
    as its driver would.  Returns a dict per round: the GSI raised (None when none), ICR
    as read, the GSI lowered after the read."""
    bar = vi.BAR

    def wr(off, v, events=None):
        h.qtest_command(q, f"writel {bar + off:#x} {v:#x}", events=events)

    def rd(off, events=None):
        return int(h.qtest_command(q, f"readl {bar + off:#x}", events=events)[1], 16)

    events = []
    h.qtest_command(q, "irq_intercept_in ioapic")
    vi.config_rw(q, 0x10, bar)                       # BAR0
    vi.config_rw(q, 0x04, 0x0006)                    # memory, bus master; INTx on
    wr(IMC, 0xffffffff)
    rd(ICR)
    wr(IMS, CAUSE_LSC)
    rounds = []
    for _ in range(ROUNDS):
        events.clear()
        wr(ICS, CAUSE_LSC, events)
        raised = wait_irq(q, events, "raise")
        events.clear()
        icr = rd(ICR, events)
        lowered = wait_irq(q, events, "lower")
        rounds.append({"raised": raised, "icr": icr, "lowered": lowered})
    wr(IMC, 0xffffffff)
    return rounds


def test_intx(procs, wd, fab):
    bdf = vi.find(E1000_ID)
    vi.bind_vfio(bdf)
    a = Daemon(procs, wd, "hostm", fab, lends={"nic1": {"pci": bdf}}).start()
    b = Daemon(procs, wd, "hostn", fab).start()
    cb = Control(b.control)
    vi.wait_listed(cb, "hostm/nic1")
    r = cb.execute("attach", device="hostm/nic1", domain="vm-intx")
    q = vi.qtest_qemu(procs, r["socket"])
    try:
        pin = (vi.config_rw(q, 0x3c) >> 8) & 0xff
        caps = capabilities(q)
        rounds = interrupt_rounds(q)
        relayed = vi.irqs_relayed(a, b)
    finally:
        procs.stop(q)
    cb.execute("detach", device="hostm/nic1")
    cb.execute("return", device="hostm/nic1")
    a.stop()
    b.stop()
    each = [x["raised"] in PCI_GSIS and x["icr"] & CAUSE_LSC and x["lowered"] == x["raised"]
            for x in rounds]
    return h.result("vfio-intx", pin == 1 and 0x05 not in caps and 0x11 not in caps and
                    len(rounds) == ROUNDS and all(each) and relayed == 0,
                    pin=pin, msi_or_msix=0x05 in caps or 0x11 in caps,
                    gsis=",".join(str(x["raised"]) for x in rounds),
                    icr=",".join(f"{x['icr']:#x}" for x in rounds),
                    lowered=",".join(str(x["lowered"]) for x in rounds), relayed=relayed)
