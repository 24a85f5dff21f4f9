"""Runs inside the systemd host (test_systemd.py: systemd as PID 1, an IOMMU, QEMU's NVMe),
as root.  Prints `FACT key=value` lines.

- installs the package (`dpkg -i`, the .deb test_systemd.py built);
- hosta lends the NVMe with `pci =` and `managed = yes` under vfio-ntbd@hosta.service, with
  the package's drop-ins for VFIO and managed binding linked into its .service.d; hostb, under
  vfio-ntbd@hostb.service on the same (shm) fabric, borrows it for a qtest QEMU whose Identify
  must pass (the serial is the NVMe's);
- `systemctl reload vfio-ntbd@hosta` with a config the daemon would refuse fails, and changes
  nothing: the same main process, still lending to hostb, Identify still passing;
- `systemctl stop` of both units, the device still attached: no worker is left, and the NVMe
  is bound to its own driver again;
- the journal has the daemon's lines with their structured fields (`journalctl -o json`).
"""
import json
import subprocess
import sys
from pathlib import Path

import harness as h
from control import Control, ControlError
import vfio_inner as vi

SERIAL = "VN-VFIO-01"               # lenderhost.NVME's
UNITS = ("vfio-ntbd@hosta.service", "vfio-ntbd@hostb.service")
CONF = Path("/etc/vfio-ntb")
DROPINS = Path("/usr/share/vfio-ntb/systemd")


def fact(**kv):
    up = Path("/proc/uptime").read_text().split()[0]
    print("FACT " + " ".join(f"{k}={str(v).replace(' ', '_')}" for k, v in kv.items()) +
          f" uptime_{list(kv)[0]}={up}", flush=True)


def sh(*argv, timeout=120):
    return subprocess.run([str(a) for a in argv], capture_output=True, text=True,
                          timeout=timeout)


def node_conf(name, lend=None):
    text = (f"[node]\nname = {name}\nfabric-dir = /run/vfio-ntb/fabric\n"
            f"control-socket = /run/vfio-ntb/{name}/control.sock\n"
            f"run-dir = /run/vfio-ntb/{name}\nstate-dir = /var/lib/vfio-ntb/{name}\n")
    if lend is not None:
        text += f"\n[lend nvme0]\npci = {lend}\nmanaged = yes\nallow = hostb\n"
    (CONF / f"{name}.conf").write_text(text)


def main_pid(unit):
    return sh("systemctl", "show", "-p", "MainPID", "--value", unit).stdout.strip()


def workers():
    """The pids of the workers running (by their executable's name: the command name
    pgrep sees is cut to 15 characters)."""
    found = []
    for proc in Path("/proc").iterdir():
        try:
            exe = Path(proc / "exe").readlink().name if proc.name.isdigit() else ""
        except OSError:
            continue
        if exe in ("vfio-ntb-lender", "vfio-ntb-borrower"):
            found.append(int(proc.name))
    return found


def lent_to(control):
    x = [d for d in control.execute("query-devices") if d["device"] == "hosta/nvme0"]
    return x[0].get("borrower") if x else None


def journal_fields():
    """Whether the journal has hosta's lines with the fields docs/operations.md names."""
    out = sh("journalctl", "-o", "json", "--no-pager", "-u", UNITS[0]).stdout
    seen = set()
    for line in out.splitlines():
        try:
            entry = json.loads(line)
        except ValueError:
            continue
        if entry.get("VFIO_NTB_NODE") == "hosta":
            seen.add("node")
            if entry.get("VFIO_NTB_DEVICE") in ("nvme0", "hosta/nvme0"):
                seen.add("device")
    return sorted(seen)


def borrow_and_identify(procs, fact_prefix):
    cb = Control(Path("/run/vfio-ntb/hostb/control.sock"), timeout=30)
    listed = vi.wait_listed(cb, "hosta/nvme0", 60)
    r = cb.execute("attach", device="hosta/nvme0", domain="vm-sd")
    q = vi.qtest_qemu(procs, r["socket"])
    vi.consumer_view(q)
    status, serial = vi.identify(q)
    fact(**{f"{fact_prefix}listed": bool(listed), f"{fact_prefix}identify": status,
            f"{fact_prefix}serial": serial or "-"})
    return cb, q


def run(procs, deb):
    r = sh("dpkg", "-i", deb, timeout=300)
    fact(installed=r.returncode == 0)
    if r.returncode != 0:
        print(r.stdout[-2000:] + r.stderr[-2000:], file=sys.stderr)
    nvme = vi.find(vi.NVME_ID)
    h.wait_for(lambda: vi.driver_of(nvme) == "nvme", 60)
    fact(driver_before=vi.driver_of(nvme) or "none")
    sh("systemd-tmpfiles", "--create", "/usr/lib/tmpfiles.d/vfio-ntb.conf")
    node_conf("hosta", lend=nvme)
    node_conf("hostb")
    d = Path("/etc/systemd/system") / f"{UNITS[0]}.d"
    d.mkdir(parents=True, exist_ok=True)
    for name in ("vfio.conf", "managed.conf"):
        (d / name).symlink_to(DROPINS / name)
    sh("systemctl", "daemon-reload")
    r = sh("systemctl", "enable", "--now", *UNITS)
    active = [sh("systemctl", "is-active", u).stdout.strip() for u in UNITS]
    fact(started=r.returncode == 0, active=",".join(active))
    if r.returncode != 0:
        print(r.stderr[-2000:], file=sys.stderr)
        print(sh("journalctl", "--no-pager", "-n", "60").stdout, file=sys.stderr)
    cb, q = borrow_and_identify(procs, "")
    fact(driver_lent=vi.driver_of(nvme) or "none")

    # A config vfio-ntbd would refuse: the reload fails and nothing changes.
    ca = Control(Path("/run/vfio-ntb/hosta/control.sock"), timeout=30)
    good = (CONF / "hosta.conf").read_text()
    pid = main_pid(UNITS[0])
    (CONF / "hosta.conf").write_text(good + "\n[lend broken]\nsocket = relative.sock\n")
    r = sh("systemctl", "reload", UNITS[0])
    status, _ = vi.identify(q)
    fact(reload_rc=r.returncode, same_pid=main_pid(UNITS[0]) == pid,
         active_after_reload=sh("systemctl", "is-active", UNITS[0]).stdout.strip(),
         lent_after_reload=lent_to(ca) or "-", identify_after_reload=status)
    (CONF / "hosta.conf").write_text(good)
    # the good file again: the reload succeeds, once the daemon has answered (vfio-ntbd --reload)
    r = sh("systemctl", "reload", UNITS[0])
    said = sh("journalctl", "--no-pager", "-o", "cat", "-u", UNITS[0]).stdout
    fact(good_reload_rc=r.returncode, good_reload_answered="0 lent devices added" in said)
    ca.close()
    cb.close()

    # Stopped for good, the device still attached: no worker stays, the NVMe is the host's.
    # hostb first, then its VM goes (on the shm fabric the consumer maps the lent BAR through
    # the VFIO device's own file, which vfio-pci waits for before it lets the function go; a
    # hardware NTB's window would hold nothing of the lender's), then hosta.
    before = workers()
    r = sh("systemctl", "stop", UNITS[1])
    procs.stop(q)
    r2 = sh("systemctl", "stop", UNITS[0])
    gone = h.wait_for(lambda: not workers(), 60)
    back = h.wait_for(lambda: vi.driver_of(nvme) == "nvme", 60)
    for unit in UNITS:
        print(sh("systemctl", "status", "--no-pager", "-n", "30", unit, timeout=30).stdout,
              file=sys.stderr, flush=True)
    fact(workers_before_stop=len(before), stop_rc=r.returncode or r2.returncode,
         workers_left=len(workers()), no_worker=bool(gone),
         driver_after_stop=vi.driver_of(nvme) or "none", given_back=bool(back))
    fields = journal_fields()
    warned = "cannot be opened" in sh("journalctl", "--no-pager", "-u", UNITS[0]).stdout
    fact(journal_fields=",".join(fields) or "none", dropin_warning=warned)
    # For a person: what the kernel has blocked, if anything (sysrq w: their stacks).
    Path("/proc/sysrq-trigger").write_text("w")
    print(sh("dmesg", timeout=30).stdout[-20000:], file=sys.stderr, flush=True)


def main():
    deb = sys.argv[1]
    with h.Procs() as procs:
        try:
            run(procs, deb)
        except (OSError, TimeoutError, KeyError, h.HarnessError, ControlError,
                subprocess.SubprocessError) as e:
            fact(error=f"{type(e).__name__}:{str(e)[:200]}")
            print(sh("journalctl", "--no-pager", "-n", "80").stdout, file=sys.stderr)
            return 1
    fact(done=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
