#!/usr/bin/python3
"""End-to-end: the package's units under systemd, with the hardware path.  A TCG VM whose PID 1
is systemd (lenderhost.LenderHost, flavor "systemd-host": the lender host's kernel, IOMMU and
VFIO, this machine's root under a writable overlay; systemd_inner.py says what it does) installs
the .deb this tree builds (`make deb`) and runs two nodes as the package's template unit.

- systemd-unit-vfio: the package installs; vfio-ntbd@hosta lends QEMU's NVMe with `pci =` and
  `managed = yes` (the package's drop-ins vfio.conf and managed.conf linked into its .service.d,
  so the hardened unit reaches /dev/vfio and /sys/bus/pci; the daemon does not warn that it
  cannot), vfio-ntbd@hostb borrows it for a qtest QEMU whose Identify passes with the NVMe's
  serial; `systemctl reload` of hosta with a config it would refuse fails and changes nothing
  (the same main process, still lent to hostb, Identify passing); `systemctl stop` of both, the
  device still attached, leaves no worker and the NVMe bound to its own driver again; the
  journal has hosta's lines with VFIO_NTB_NODE and VFIO_NTB_DEVICE (`journalctl -o json`).
"""
import shutil
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import harness as h  # noqa: E402
from lenderhost import NVME, LenderHost  # noqa: E402
from test_ntb import facts  # noqa: E402

EXPECTED_RESULTS = 1
# A TCG boot of systemd (about 50 s), make deb, the checks; tests/run-checks reads this.
TIMEOUT_S = 900


def built_deb(share):
    """`make deb`'s vfio-ntb package, copied into @share; its path there."""
    r = subprocess.run(["make", "-C", str(h.REPO), "deb"], capture_output=True, text=True,
                       timeout=600)
    debs = sorted(h.REPO.glob("vfio-ntb_*.deb"))
    if r.returncode != 0 or not debs:
        raise h.HarnessError(f"make deb failed: {h._tail(r.stdout + r.stderr)}")
    shutil.copy(debs[-1], share / debs[-1].name)
    return Path("/tmp/share") / debs[-1].name


def main():
    with h.Procs() as procs:
        share = procs.tempdir("vn-systemd-share-")
        try:
            deb = built_deb(share)
        except (h.HarnessError, OSError, subprocess.SubprocessError) as e:
            return h.failed("systemd-unit-vfio", e)
        host = LenderHost(procs, "systemd_inner.py", args=(deb,), devices=(NVME,), share=share,
                          flavor="systemd-host", timeout=TIMEOUT_S - 120)
        try:
            f = facts(host.run())
        except (h.HarnessError, TimeoutError, OSError) as e:
            f = facts(host.out.read_text().splitlines()) if host.out.exists() else {}
            f.setdefault("error", str(e).splitlines()[0][:120])
        logs = h.REPO / "build" / "artifacts" / "systemd-host"
        logs.mkdir(parents=True, exist_ok=True)
        for p in [host.out]:
            if p.exists():
                shutil.copy(p, logs / p.name)
        (logs / "console.log").write_text(host.console)
    ok = (f.get("installed") == "True" and f.get("started") == "True" and
          f.get("active") == "active,active" and f.get("identify") == "0" and
          f.get("serial") == "VN-VFIO-01" and f.get("driver_lent") == "vfio-pci" and
          f.get("reload_rc", "0") != "0" and f.get("same_pid") == "True" and
          f.get("good_reload_rc") == "0" and f.get("good_reload_answered") == "True" and
          f.get("active_after_reload") == "active" and f.get("lent_after_reload") == "hostb" and
          f.get("identify_after_reload") == "0" and f.get("no_worker") == "True" and
          f.get("given_back") == "True" and f.get("driver_after_stop") == "nvme" and
          f.get("journal_fields") == "device,node" and f.get("dropin_warning") == "False" and
          f.get("done") == "True")
    return h.result("systemd-unit-vfio", ok, installed=f.get("installed"),
                    active=f.get("active"), identify=f.get("identify"), serial=f.get("serial"),
                    driver_lent=f.get("driver_lent"), reload_rc=f.get("reload_rc"),
                    same_pid=f.get("same_pid"), good_reload_rc=f.get("good_reload_rc"),
                    lent_after_reload=f.get("lent_after_reload"),
                    identify_after_reload=f.get("identify_after_reload"),
                    workers_before_stop=f.get("workers_before_stop"),
                    workers_left=f.get("workers_left"), driver_after_stop=f.get("driver_after_stop"),
                    journal_fields=f.get("journal_fields"),
                    dropin_warning=f.get("dropin_warning"), error=f.get("error", "-"))


if __name__ == "__main__":
    sys.exit(0 if main() else 1)
