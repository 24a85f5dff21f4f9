"""make demo's last part, run inside the lender host (demo.py boots it): a real PCI function
lent through Linux VFIO, as an operator sees it.  Prints the demo's lines; the last one is
"VFIO-DEMO OK" or "VFIO-DEMO FAILED".

Host A lends its NVMe (QEMU's, bound to the host's nvme driver) with `pci = ...` and
`managed = yes`; host B attaches it and a consumer (a qtest QEMU: no guest CPU, so it runs in
seconds) reads its identity and runs an NVMe Identify through the mapped BAR, DMA into its
own memory and an MSI-X interrupt; then the drive goes back to the host's nvme driver.
"""
import json
import subprocess
import sys

import harness as h
from cluster import Daemon
from control import Control, ControlError
from demo import ntbctl, say
from vfio_inner import (MSI_DATA, NVME_ID, SERIAL, consumer_view, data_counters, driver_of,
                        find, identify, msix_identify, qtest_qemu, wait_listed)
from vfio_inner import group_free as vfio_group_free


def main():
    with h.Procs() as procs:
        bdf = find(NVME_ID)
        wd = procs.tempdir()
        fab = procs.tempdir("vn-fabric-")
        before = h.wait_for(lambda: driver_of(bdf), 60)   # the nvme driver probes at boot
        say(f"   the lender host has an NVMe at {bdf}, driven by its '{before or 'no'}' driver")
        a = Daemon(procs, wd, "hosta", fab).start()
        b = Daemon(procs, wd, "hostb", fab).start()
        args = {"name": "nvme1", "pci": bdf, "managed": True, "allow": ["hostb"]}
        say(f"   host A lends it, on its control socket: lend {json.dumps(args)}")
        Control(a.control).execute("lend", **args)
        if not h.wait_for(lambda: driver_of(bdf) == "vfio-pci", 15):
            raise h.HarnessError(f"{bdf} did not go to vfio-pci")
        say(f"   managed: {bdf} is bound to '{driver_of(bdf)}' while it is lendable")
        wait_listed(Control(b.control), "hosta/nvme1")
        ntbctl(b, "list")
        ntbctl(b, "attach", "hosta/nvme1", "--domain", "vm1", "--serve-only")
        sock = b.run_dir / "vm1-hosta-nvme1.sock"
        q = qtest_qemu(procs, sock)
        try:
            ident, _ = consumer_view(q)
            say(f"   the consumer (a QEMU on host B) sees PCI id {ident & 0xffff:04x}:"
                f"{ident >> 16:04x} behind vfio-user-pci")
            c0 = data_counters(a, b)
            status, serial = identify(q)
            c1 = data_counters(a, b)
            word, mstatus = msix_identify(q)    # MSI-X set up through config space first
        finally:
            procs.stop(q)
        say(f"   NVMe Identify through the mapped BAR: status {status}, serial {serial}; "
            f"its completion raised MSI-X: {'yes' if word == MSI_DATA else 'no'}")
        say("   over the Identify (after - before):")
        for k in c1:
            say(f"     {k:20} {c1[k] - c0[k]}")
        say("   -> registers through VFIO's own BAR mapping, data DMAed by the device into the")
        say("      consumer's memory through the IOMMU, the interrupt to its eventfd.")
        ntbctl(b, "detach", "hosta/nvme1")
        ntbctl(b, "return", "hosta/nvme1")
        h.wait_for(lambda: vfio_group_free(bdf), 15)
        say("   host A stops lending it: unlend {\"name\": \"nvme1\"}")
        Control(a.control).execute("unlend", name="nvme1")
        back = h.wait_for(lambda: driver_of(bdf) == before, 15)
        say(f"   {bdf} is back with its '{driver_of(bdf) or 'no'}' driver")
        a.stop()
        b.stop()
        ok = (status == 0 and serial == SERIAL and mstatus == 0 and word == MSI_DATA and
              all(c1[k] == c0[k] for k in c1) and bool(back))
        return ok


if __name__ == "__main__":
    try:
        ok = main()
    except (h.HarnessError, ControlError, OSError, subprocess.SubprocessError) as e:
        say(f"   error: {e}")
        ok = False
    say("VFIO-DEMO " + ("OK" if ok else "FAILED"))
    sys.exit(0 if ok else 1)
