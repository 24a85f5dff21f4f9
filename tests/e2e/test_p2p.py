#!/usr/bin/python3
"""End-to-end: device-to-device DMA between two borrowed devices (docs/p2p.md).

Host A lends an NVMe (vfio-ntb-simdev, the disk); host C lends another whose Controller
Memory Buffer (simdev --cmb-mib) Linux publishes as p2pmem; host B borrows both into one VM
(one domain), both behind one emulated PCIe switch in a guest whose kernel has
CONFIG_PCI_P2PDMA (scripts/testbed-guest --p2p).  What a user would check:
- p2p-nvme-to-cmb: a guest program (tests/guest/vn-p2p.c) maps p2pmem from device 2's CMB
  and O_DIRECT-reads device 1 into it, then writes it back out elsewhere: the data verifies
  in the guest and on A's backing file; A's lender maps device 2's BAR range to C's segments
  (its DMA table names hostc); over the transfers nothing of ours ran for either device: no
  vfio-user message, forwarded access, lending request, relayed interrupt or doorbell;
- p2p-same-lender-simdev: both devices lent by A (placement 3): the transfer stays inside A;
- p2p-same-lender: the same with two PCI functions lent through Linux VFIO in the lender host
  (p2p_vfio_inner.py says what it checks): one QEMU NVMe reads into the other's CMB through
  its IOMMU mapping of that BAR, no software of ours in between;
- p2p-teardown: device 2 detached from the VM while device 1 reads into its CMB again and
  again: the next such read fails in the guest (A's lender unmapped the range: its DMA table
  names hostc no more), the guest keeps running and device 1 still reads into its memory;
- p2p-target-lender-lost: the same, device 2's lender (C's daemon) killed instead: once B
  gives C up, A's lender unmaps the CMB's range (C may lend that memory again);
- p2p-needs-composition: the same VM, the two devices not declared p2p: the daemon composes
  nothing, and the same read into the CMB fails in the guest.
"""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import harness as h  # noqa: E402
from harness import result  # noqa: E402
from cluster import Daemon, simdev_stats  # noqa: E402
from lenderhost import NVME, P2P_CMB_NVME, LenderHost  # noqa: E402
from control import Control  # noqa: E402

# tests/run-checks counts a result this file did not print as failed.
EXPECTED_RESULTS = 6

DISK_SERIAL = "VN-P2P-DISK"
CMB_SERIAL = "VN-P2P-CMB"
SIZE_MIB = 64


def cluster(procs, domains, same_lender=False, p2p=True):
    """A lends the disk, C the CMB device (A both, @same_lender), B borrows both into @domain
    (a name, or {device: name}), both declared p2p (@p2p)."""
    wd = procs.tempdir()
    fab = procs.tempdir("vn-fabric-")
    disk = h.make_backing(wd / "disk.img", SIZE_MIB)
    cmbdisk = h.make_backing(wd / "cmb-disk.img", SIZE_MIB)
    sd1 = h.Simdev(procs, wd / "dev1.sock", disk, SIZE_MIB, serial=DISK_SERIAL,
                   extra_args=["--stats-file", str(wd / "dev1.stats")]).start()
    sd2 = h.Simdev(procs, wd / "dev2.sock", cmbdisk, SIZE_MIB, serial=CMB_SERIAL,
                   extra_args=["--cmb-mib", "16", "--stats-file", str(wd / "dev2.stats")]).start()
    if same_lender:
        a = Daemon(procs, wd, "hosta", fab,
                   lends={"nvme0": sd1.socket_path, "nvme1": sd2.socket_path}).start()
        c = a
    else:
        a = Daemon(procs, wd, "hosta", fab, lends={"nvme0": sd1.socket_path}).start()
        c = Daemon(procs, wd, "hostc", fab, lends={"nvme1": sd2.socket_path}).start()
    b = Daemon(procs, wd, "hostb", fab, domain=domains, p2p=p2p,
               borrows={"nvme0": ("hosta", wd / "vm-nvme0.sock", "fd"),
                        "nvme1": (c.name, wd / "vm-nvme1.sock", "fd")}).start(wait_sockets=True)
    return wd, disk, (sd1, sd2), (a, b, c)


def guest(procs, wd, b, checks, params):
    devices = [h.PcieSwitch(2),
               h.VfioUserDevice(b.borrows["nvme0"][1], id="d0", bus="dn0"),
               h.VfioUserDevice(b.borrows["nvme1"][1], id="d1", bus="dn1")]
    return h.Qemu(procs, checks, devices, guest="p2p", workdir=wd, memory_mib=768,
                  params={"p2p_disk_serial": DISK_SERIAL, "p2p_mem_serial": CMB_SERIAL,
                          "pause_s": 2, **params}).start()


def device_counters(a, b, c, sds):
    """What our software did for each device while device 1 moved data to and from device 2's
    BAR: nothing (d1_*: the disk's, d2_*: the CMB's)."""
    sa, sb, sc = a.stats(), b.stats(), c.stats()
    out = {}
    for i, (lender, stats, name) in enumerate(((a, sa, "nvme0"), (c, sc, "nvme1"))):
        bor = [x for x in sb["borrowed"] if x["device"] in (name, f"{lender.name}/{name}")][0]
        lent = [x for x in stats["lent"] if x["device"] == name][0]
        out.update({
            f"d{i + 1}_borrower_vfio_user_messages": bor["vfio_user"]["messages"],
            f"d{i + 1}_forwarded": bor["region_forwarded"] + lent["region_rw"],
            f"d{i + 1}_lender_requests": lent["requests"],
            f"d{i + 1}_relayed_irqs": lent["relayed_irqs"] + bor["relayed_irqs"],
            f"d{i + 1}_device_messages": simdev_stats(sds[i])["messages"],
        })
    out["fabric_doorbells"] = sa["fabric"]["doorbells_sent"] + (
        sc["fabric"]["doorbells_sent"] if c is not a else 0)
    return out


def lender_p2p(a):
    lent = [x for x in a.stats()["lent"] if x["device"] == "nvme0"][0]
    return lent.get("p2p_maps", 0), lent.get("p2p_mappings", [])


def nvme_to_cmb(procs, name, same_lender):
    wd, disk, (sd1, sd2), (a, b, c) = cluster(procs, "vm1", same_lender)
    q = guest(procs, wd, b, "pause,p2p,pause", {})
    q.wait_line("VNREADY", "pause")
    before = device_counters(a, b, c, (sd1, sd2))
    q.wait_line("VNREADY", "pause")
    after = device_counters(a, b, c, (sd1, sd2))
    maps, table = lender_p2p(a)
    run = q.wait_done()
    q.stop()
    p2p = run.results.get("p2p", {})
    ver = h.verify_backing(disk, run.data)
    delta = {k: after[k] - before[k] for k in after}
    to_c = [m for m in table if m.get("peer") == c.name]
    return result(name, p2p.get("status") == "PASS" and len(ver) >= 2
                  and all(v["ok"] for v in ver) and maps > 0 and len(to_c) > 0
                  and all(v == 0 for v in delta.values()),
                  rounds=p2p.get("rounds"), elapsed_ms=p2p.get("elapsed_ms"),
                  regions=len(ver), lender_p2p_maps=maps, mappings_to_target=len(to_c), **delta)


def test_nvme_to_cmb(procs):
    return nvme_to_cmb(procs, "p2p-nvme-to-cmb", False)


def test_same_lender_simdev(procs):
    """Placement 3 on the emulated fabric: both devices lent by A, whose daemon shares the
    CMB's BAR with itself; A's lender maps it without a fabric window."""
    return nvme_to_cmb(procs, "p2p-same-lender-simdev", True)


def test_same_lender(procs):
    """Placement 3 with Linux VFIO: in the lender host (a TCG VM with intel-iommu)."""
    lh = LenderHost(procs, "p2p_vfio_inner.py", devices=(NVME, P2P_CMB_NVME), timeout=600)
    try:
        lines = lh.run()
    except (h.HarnessError, OSError, TimeoutError) as e:
        return result("p2p-same-lender", False, error=str(e).splitlines()[0][:120])
    got = [ln for ln in lines if ln.startswith("RESULT p2p-same-lender ")]
    for ln in lines:
        if not ln.startswith("RESULT ") and ln.strip():
            print(f"  [lender host] {ln}", file=sys.stderr)
    if not got:
        return result("p2p-same-lender", False, error="the lender host did not report it")
    print(got[0], flush=True)
    return got[0].split()[2] == "PASS"


def teardown(procs, name, take_away):
    """Device 2 goes while device 1 reads into its CMB again and again (@take_away(b, c))."""
    wd, _disk, _sds, (a, b, c) = cluster(procs, "vm1")
    q = guest(procs, wd, b, "p2p", {"p2p_expect": "teardown", "p2p_loop_s": 60})
    q.wait_line("VNREADY", "p2p-looping")
    _maps, during = lender_p2p(a)
    take_away(b, c)
    run = q.wait_done()
    q.stop()
    _maps, after = lender_p2p(a)
    p2p = run.results.get("p2p", {})
    return result(name, p2p.get("status") == "PASS" and run.done is not None
                  and any(m.get("peer") == "hostc" for m in during)
                  and not any(m.get("peer") == "hostc" for m in after),
                  rounds=p2p.get("rounds"), errno=p2p.get("errno"), mappings_during=len(during),
                  mappings_after=len(after))


def test_teardown(procs):
    return teardown(procs, "p2p-teardown",
                    lambda b, c: Control(b.control).execute("detach", device="hostc/nvme1"))


def test_target_lender_lost(procs):
    """C's daemon dies and does not come back: once B gives it up (lease-timeout-ms), the
    CMB's memory is nobody's to reach (C may lend it again): A's lender unmaps it, though
    C's worker and the window's memory live on (shm cannot revoke it: the holder must)."""
    return teardown(procs, "p2p-target-lender-lost", lambda b, c: c.kill())


def test_needs_composition(procs):
    wd, _disk, _sds, (a, b, c) = cluster(procs, "vm1", p2p=False)
    q = guest(procs, wd, b, "p2p", {"p2p_expect": "read-fails", "p2p_rounds": 1})
    run = q.wait_done()
    q.stop()
    maps, _table = lender_p2p(a)
    p2p = run.results.get("p2p", {})
    return result("p2p-needs-composition", p2p.get("status") == "PASS" and maps == 0,
                  errno=p2p.get("errno"), lender_p2p_maps=maps)


def main():
    return h.run_tests([test_nvme_to_cmb, test_same_lender_simdev, test_same_lender,
                        test_teardown, test_target_lender_lost, test_needs_composition],
                       sys.argv[1:])


if __name__ == "__main__":
    sys.exit(main())
