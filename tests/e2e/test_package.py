#!/usr/bin/python3
"""End-to-end: the Debian packages and `make install`, as an operator meets them.

`make deb` builds vfio-ntb_*.deb and vfio-ntb-simdev_*.deb into the top directory, lintian
finding no error; the packages hold what the layout promises (daemon in /usr/sbin, workers in
/usr/libexec/vfio-ntb, test tools in their own package, every unit, man page and the completion
the tree has, the example config, no config shipped as a conffile, a postinst that reloads
systemd and starts nothing).  Installed with dpkg -i into a clean Debian 12 root (mmdebstrap),
`ntbctl --help` and `vfio-ntbd --check-config` on the example run there, and the installed
daemon starts its lender worker from /usr/libexec/vfio-ntb; the libvirt hook drop-in lets
domains start before and after a remove (a purge takes it).  `make install` into a DESTDIR
puts the same layout, `make uninstall` takes back exactly that (an admin's config stays), and
an install under a PREFIX the daemon was not built for is refused.

The clean root's base (Debian 12 minbase plus the packages' dependencies, read from the .debs)
is cached as a tarball under $VN_CACHE (default /var/cache/vfio-ntb), keyed by the suite and
that package list: the first run builds it from Debian's archive (about 40 s), later runs
unpack it (the whole file: about 90 s cold, 50 s warm, most of it make deb).  Needs root (chroot, mounts).
"""
import fcntl
import hashlib
import os
import re
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import harness as h  # noqa: E402
from harness import result, wait_for  # noqa: E402

# tests/run-checks counts a result this file did not print as failed.
EXPECTED_RESULTS = 11

SUITE = "bookworm"
MIRRORS = ["deb http://deb.debian.org/debian bookworm main",
           "deb http://deb.debian.org/debian bookworm-updates main",
           "deb http://deb.debian.org/debian-security bookworm-security main"]
CACHE = Path(os.environ.get("VN_CACHE", "/var/cache/vfio-ntb"))
EXAMPLE = "/usr/share/doc/vfio-ntb/examples/vfio-ntbd.conf.example"
WORKERS = ("vfio-ntb-borrower", "vfio-ntb-lender", "vfio-ntb-libvirt-hook")
TIMES = {}


def run(argv, timeout=600, **kw):
    return subprocess.run([str(a) for a in argv], capture_output=True, text=True,
                          timeout=timeout, **kw)


def make(*args, timeout=900):
    return run(["make", "--no-print-directory", "-C", h.REPO, *args], timeout=timeout)


def arch():
    return run(["dpkg", "--print-architecture"]).stdout.strip()


def tree_version():
    m = re.search(r'^#define VN_VERSION "([^"]+)"', (h.REPO / "configure").read_text(), re.M)
    return m.group(1)


def deb_files(deb):
    """The paths a .deb holds (./usr/sbin/vfio-ntbd -> /usr/sbin/vfio-ntbd)."""
    lines = run(["dpkg-deb", "-c", deb]).stdout.splitlines()
    return {ln.split(None, 5)[5].split(" -> ")[0][1:].rstrip("/") or "/" for ln in lines}


def deb_control(deb, name):
    """A control member of @deb (postinst, conffiles), or "" when it has none."""
    with subprocess.Popen(["dpkg-deb", "--ctrl-tarfile", str(deb)],
                          stdout=subprocess.PIPE) as ctl:
        r = subprocess.run(["tar", "-xOf", "-", f"./{name}"], stdin=ctl.stdout,
                           capture_output=True, timeout=60)
    return r.stdout.decode() if r.returncode == 0 else ""


def deb_member(deb, path):
    """The text of file @path (./lib/...) in @deb's data, or "" when it has none."""
    with subprocess.Popen(["dpkg-deb", "--fsys-tarfile", str(deb)],
                          stdout=subprocess.PIPE) as data:
        r = subprocess.run(["tar", "-xOf", "-", path], stdin=data.stdout, capture_output=True,
                           timeout=60)
    return r.stdout.decode() if r.returncode == 0 else ""


def dropin_faults(deb, dropins):
    """What systemd-analyze verify finds wrong in the packaged unit with all its drop-ins for
    hardware (an unknown key, a value it cannot parse): the lines that say so."""
    import tempfile
    with tempfile.TemporaryDirectory(prefix="vn-units-") as d:
        unit = Path(d) / "vfio-ntbd.service"
        unit.write_text(deb_member(deb, "./lib/systemd/system/vfio-ntbd.service"))
        (Path(d) / "vfio-ntbd.service.d").mkdir()
        for name in dropins:
            (Path(d) / "vfio-ntbd.service.d" / name).write_text(
                deb_member(deb, f"./usr/share/vfio-ntb/systemd/{name}"))
        r = run(["systemd-analyze", "verify", unit], env={**os.environ,
                                                           "SYSTEMD_UNIT_PATH": f"{d}:"})
    # Not ours to judge here: the daemon and man pages are not installed on this host.
    return [ln for ln in (r.stdout + r.stderr).splitlines()
            if ln.strip() and "is not executable" not in ln and "Command 'man " not in ln]


def test_make_deb():
    """make deb: the two packages in the top directory, at the tree's version; lintian ran
    (make echoes it) and found no error."""
    for old in h.REPO.glob("vfio-ntb*.deb"):
        old.unlink()
    t0 = time.monotonic()
    r = make("deb")
    TIMES["make_deb_s"] = round(time.monotonic() - t0, 1)
    out = r.stdout + r.stderr
    ver = tree_version()
    debs = {p.name for p in h.REPO.glob("vfio-ntb*.deb")}
    want = {f"vfio-ntb_{ver}_{arch()}.deb", f"vfio-ntb-simdev_{ver}_{arch()}.deb",
            f"vfio-ntb-dkms_{ver}_all.deb"}
    ok = result("package-deb-built", r.returncode == 0 and debs == want,
                rc=r.returncode, debs=",".join(sorted(debs)) or "none",
                seconds=TIMES["make_deb_s"])
    if not ok:
        print(out[-3000:])
    errors = [ln for ln in out.splitlines() if re.match(r"^E: ", ln)]
    warnings = sorted({ln.split(":", 2)[2].split()[0] for ln in out.splitlines()
                       if re.match(r"^W: [a-z0-9-]+: ", ln)})
    ran = "lintian --fail-on error" in out
    result("package-lintian-no-errors", r.returncode == 0 and ran and not errors,
           lintian_ran=ran, errors=len(errors), warnings=",".join(warnings) or "none")
    for ln in errors:
        print("  " + ln)
    return [h.REPO / f"vfio-ntb_{ver}_{arch()}.deb",
            h.REPO / f"vfio-ntb-simdev_{ver}_{arch()}.deb",
            h.REPO / f"vfio-ntb-dkms_{ver}_all.deb"] if ok else None


def test_layout(debs):
    main, simdev, _dkms = debs
    files = deb_files(main)
    sim = deb_files(simdev)
    units = {p.name for p in (h.REPO / "systemd").glob("*.service")}
    mans = {(p.suffix[1:], p.name) for p in (h.REPO / "docs" / "man").glob("*.[1-8]")}
    want = {"/usr/sbin/vfio-ntbd", "/usr/bin/ntbctl", EXAMPLE, "/etc/vfio-ntb",
            "/usr/lib/tmpfiles.d/vfio-ntb.conf", "/etc/libvirt/hooks/qemu.d/vfio-ntb"}
    want |= {f"/usr/libexec/vfio-ntb/{w}" for w in WORKERS}
    want |= {f"/lib/systemd/system/{u}" for u in units}
    want |= {f"/usr/share/man/man{s}/{n}.gz" for s, n in mans}
    if (h.REPO / "completion" / "ntbctl").exists():
        want.add("/usr/share/bash-completion/completions/ntbctl")
    dropins = sorted(p.name for p in (h.REPO / "systemd" / "dropins").glob("*.conf"))
    want |= {f"/usr/share/vfio-ntb/systemd/{d}" for d in dropins}
    # The guides, as they are (they link to each other by name).
    want |= {f"/usr/share/doc/vfio-ntb/{p.name}" for p in (h.REPO / "docs").glob("*.md")}
    want.add("/usr/share/doc/vfio-ntb/README.md")
    missing = sorted(want - files)
    tools = {"/usr/bin/vfio-ntb-simdev", "/usr/bin/vfio-ntb-ntbsim"}
    # The test tools are in their package alone; no worker is on PATH.
    misplaced = sorted((tools & files) | (tools - sim) |
                       {f for f in files if f.startswith(("/usr/bin/vfio-ntb-b",
                                                          "/usr/bin/vfio-ntb-l"))})
    conffiles = deb_control(main, "conffiles").split()
    postinst = deb_control(main, "postinst")
    # No config is shipped (the daemon would start with someone else's node name; whether the
    # postinst enables the unit is seen in the clean root).  Every unit runs the daemon where
    # the package put it.
    bad_units = [u for u in units if "/usr/sbin/vfio-ntbd " not in
                 deb_member(main, f"./lib/systemd/system/{u}") or "/usr/bin/vfio-ntbd" in
                 deb_member(main, f"./lib/systemd/system/{u}")]
    unit_faults = dropin_faults(main, dropins)
    ok = (not missing and not misplaced and conffiles == ["/etc/libvirt/hooks/qemu.d/vfio-ntb"]
          and "systemctl --system daemon-reload" in postinst and not bad_units
          and len(dropins) >= 3 and not unit_faults)
    for ln in unit_faults:
        print("  " + ln)
    result("package-layout", ok, missing=",".join(missing) or "none",
           misplaced=",".join(misplaced) or "none", conffiles=",".join(conffiles) or "none",
           units=len(units), units_not_sbin=",".join(bad_units) or "none", man_pages=len(mans),
           dropins=",".join(dropins) or "none", unit_faults=len(unit_faults),
           reloads_systemd="daemon-reload" in postinst)


def test_dkms(procs, deb):
    """vfio-ntb-dkms: its source tree, built by DKMS (dkms build, as its postinst's dkms install
    does) for the test guest's kernel, from a linux-source-style tarball of that kernel's
    drivers/ntb: every module build-ntb-modules builds (but Switchtec's) comes out, for that
    kernel; the postinst installs for each kernel with headers, the prerm removes them."""
    import tempfile
    ver = tree_version()
    built = Path(run([h.REPO / "scripts" / "build-ntb-modules"], timeout=1800).stdout.strip())
    release = (built / "release").read_text().strip()
    want = [m for m in (built / "load-order").read_text().split() if "switchtec" not in m]
    t0 = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="vn-dkms-") as d:
        d = Path(d)
        run(["dpkg-deb", "-x", deb, d / "root"])
        (d / "tree").mkdir()
        src = Path((built / "source").read_text().strip())
        series = ".".join(release.split(".")[:2])
        (d / "ls").mkdir()
        os.symlink(src, d / "ls" / f"linux-source-{series}")  # the package's layout
        tarball = d / f"linux-source-{series}.tar.xz"
        run(["tar", "-cJhf", tarball, "-C", d / "ls", f"linux-source-{series}"], timeout=300)
        r = run(["dkms", "build", "-m", "vfio-ntb", "-v", ver, "-k", release,
                 f"--kernelsourcedir={(built / 'headers').read_text().strip()}",
                 f"--sourcetree={d / 'root' / 'usr' / 'src'}", f"--dkmstree={d / 'tree'}"],
                timeout=900, env={**os.environ, "VN_NTB_SOURCE": str(tarball)})
        mods = d / "tree" / "vfio-ntb" / ver / release / run(["uname", "-m"]).stdout.strip() \
            / "module"
        got = sorted(p.name.split(".")[0] for p in mods.glob("*.ko*")) if mods.is_dir() else []
        magic = {run(["modinfo", "-F", "vermagic", p]).stdout.split()[0]
                 for p in mods.glob("*.ko*")}
        deps = run(["modinfo", "-F", "depends", mods / "vfio_ntb.ko"]).stdout.strip() \
            if "vfio_ntb" in got else ""
        if r.returncode != 0:
            print(h._tail(r.stdout + r.stderr))
            for log in (d / "tree").rglob("make.log"):
                print(h._tail(log.read_text(errors="replace")))
    postinst = deb_control(deb, "postinst")
    prerm = deb_control(deb, "prerm")
    scripts_ok = "dkms install" in postinst and "dkms add" in postinst and "dkms remove" in prerm
    result("package-dkms", r.returncode == 0 and got == sorted(want) and magic == {release}
           and deps == "ntb" and scripts_ok, rc=r.returncode, kernel=release,
           modules=",".join(got) or "none", missing=",".join(sorted(set(want) - set(got)))
           or "none", vermagic=",".join(sorted(magic)) or "none", vfio_ntb_depends=deps or "-",
           scripts=scripts_ok, seconds=round(time.monotonic() - t0, 1))


def depends(deb):
    """The package names @deb depends on (first of each alternative)."""
    field = run(["dpkg-deb", "-f", deb, "Depends"]).stdout.strip()
    return {d.split("|")[0].split("(")[0].strip().split(":")[0]
            for d in field.split(",") if d.strip()}


def base_root(procs, debs):
    """A tarball of a clean Debian 12 root with the packages' dependencies, built once per
    suite and package list; returns (path, seconds it took to build, 0 when cached)."""
    # init-system-helpers (every Debian 12 with systemd has it): the postinst's
    # deb-systemd-helper, which would enable the unit if the package asked it to.
    pkgs = sorted(set().union({"init-system-helpers"}, *(depends(d) for d in debs)) -
                  {"vfio-ntb"})
    key = hashlib.sha256(" ".join([SUITE, *MIRRORS, *pkgs]).encode()).hexdigest()[:12]
    tar = CACHE / f"pkg-root-{SUITE}-{key}.tar"
    CACHE.mkdir(parents=True, exist_ok=True)
    with open(CACHE / "pkg-root.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if tar.exists():
            return tar, 0
        t0 = time.monotonic()
        tmp = tar.with_suffix(".tmp.tar")
        log = tar.with_suffix(".log")
        with open(log, "w") as f:
            r = subprocess.run(["mmdebstrap", "--variant=minbase", "--mode=root",
                                "--aptopt=Acquire::Check-Valid-Until \"false\"",
                                "--dpkgopt=path-exclude=/usr/share/locale/*",
                                f"--include={','.join(pkgs)}", SUITE, str(tmp), *MIRRORS],
                               stdout=f, stderr=subprocess.STDOUT, timeout=1800)
        if r.returncode != 0:
            tmp.unlink(missing_ok=True)
            raise h.HarnessError(f"mmdebstrap failed (rc {r.returncode}); see {log}")
        tmp.rename(tar)
        return tar, round(time.monotonic() - t0, 1)


def in_root(root, *argv, timeout=60):
    return run(["chroot", root, *argv], timeout=timeout)


def test_clean_root(procs, debs):
    t0 = time.monotonic()
    try:
        tar, built = base_root(procs, debs)
    except (h.HarnessError, subprocess.TimeoutExpired) as e:
        for name in ("package-installs", "package-ntbctl-help", "package-check-config",
                     "package-daemon-finds-worker", "package-remove-purge"):
            result(name, False, error=str(e).replace(" ", "_"))
        return
    TIMES["base_root_build_s"] = built
    root = procs.tempdir("vn-pkg-root-")
    run(["tar", "-xpf", tar, "-C", root, "--numeric-owner"], timeout=300)
    for d in debs:
        (root / "tmp" / d.name).write_bytes(d.read_bytes())
    r = in_root(root, "dpkg", "-i", *[f"/tmp/{d.name}" for d in debs], timeout=300)
    st = in_root(root, "dpkg-query", "-W", "-f=${Package} ${Status}\\n", "vfio-ntb",
                 "vfio-ntb-simdev")
    installed = st.stdout.count("install ok installed") == 2
    # Installed, not enabled: it has no config yet, and would fail (docs: enable it once
    # vfio-ntbd --check-config passes).  deb-systemd-helper enables offline, by symlinks.
    wants = list((root / "etc" / "systemd" / "system").rglob("vfio-ntbd*"))
    TIMES["root_and_install_s"] = round(time.monotonic() - t0, 1)
    result("package-installs", r.returncode == 0 and installed and not wants, rc=r.returncode,
           status=st.stdout.strip().replace("\n", ";").replace(" ", "_"),
           enabled_links=",".join(str(w.relative_to(root)) for w in wants) or "none",
           base_built_s=built, seconds=TIMES["root_and_install_s"])
    if r.returncode != 0:
        print(h._tail(r.stdout + r.stderr))

    r = in_root(root, "ntbctl", "--help")
    result("package-ntbctl-help", r.returncode == 0 and "usage" in (r.stdout + r.stderr).lower(),
           rc=r.returncode, lines=len(r.stdout.splitlines()))

    # --check-config (another branch adds it): checked once `vfio-ntbd --help` lists it; until
    # then the installed daemon at least runs and says the tree's version.
    helptext = in_root(root, "vfio-ntbd", "--help")
    if "--check-config" in helptext.stdout + helptext.stderr:
        r = in_root(root, "vfio-ntbd", "--check-config", EXAMPLE)
        result("package-check-config", r.returncode == 0, mode="check-config", rc=r.returncode,
               said=(r.stdout + r.stderr).strip()[-200:].replace(" ", "_") or "nothing")
    else:
        r = in_root(root, "vfio-ntbd", "--version")
        result("package-check-config", r.returncode == 0 and tree_version() in r.stdout,
               mode="version-only(--check-config_not_in_--help_yet)", rc=r.returncode,
               said=r.stdout.strip().replace(" ", "_"))

    test_daemon_finds_worker(procs, root)
    test_remove_purge(root)


def test_remove_purge(root):
    """libvirt runs every hook in qemu.d and a failing one stops the domain: the drop-in (a
    conffile, left behind by a remove) must let domains start before and after the package
    is removed; a purge takes it away.  The admin's config stays through both."""
    hook = "/etc/libvirt/hooks/qemu.d/vfio-ntb"
    xml = "<domain type='kvm'><name>vm1</name></domain>"

    def start_domain():
        return subprocess.run(["chroot", str(root), hook, "vm1", "prepare", "begin", "-"],
                              input=xml, capture_output=True, text=True, timeout=30).returncode

    before = start_domain()
    rm = in_root(root, "dpkg", "-r", "vfio-ntb-simdev", "vfio-ntb", timeout=120)
    kept = (root / hook[1:]).exists()
    after = start_domain()
    purge = in_root(root, "dpkg", "-P", "vfio-ntb", timeout=120)
    config = (root / "etc" / "vfio-ntb" / "vfio-ntbd.conf").exists()
    result("package-remove-purge", before == 0 and rm.returncode == 0 and kept and after == 0
           and purge.returncode == 0 and not (root / hook[1:]).exists() and config,
           hook_rc_installed=before, remove_rc=rm.returncode, hook_kept=kept,
           hook_rc_removed=after, purge_rc=purge.returncode,
           hook_gone=not (root / hook[1:]).exists(), admin_config_kept=config)


def test_daemon_finds_worker(procs, root):
    """The installed daemon (in /usr/sbin, no worker beside it, /usr/libexec/vfio-ntb not on
    PATH) starts the lender worker of its [lend] device from /usr/libexec/vfio-ntb, and the
    installed ntbctl lists its trace events (`trace --list`: the lists are built in).  It runs
    in a PID namespace of its own, so the worker, which outlives the daemon by design, ends
    with it."""
    conf = root / "etc" / "vfio-ntb" / "vfio-ntbd.conf"
    conf.write_text("[node]\nname = hosta\nfabric-dir = /run/vfio-ntb/fabric\n"
                    "control-socket = /run/vfio-ntb/control.sock\nrun-dir = /run/vfio-ntb\n"
                    "[lend nvme0]\nsocket = /run/vfio-ntb/nvme0-device.sock\nallow = hostb\n")
    log = root / "tmp" / "vfio-ntbd.log"
    worker = f"{root}/usr/libexec/vfio-ntb/vfio-ntb-lender"

    def worker_pids():
        pids = []
        for p in Path("/proc").iterdir():
            try:
                if p.name.isdigit() and os.readlink(p / "exe") == worker:
                    pids.append(int(p.name))
            except OSError:
                pass
        return pids

    with open(log, "w") as f:
        d = procs.start("vfio-ntbd", ["unshare", "--pid", "--kill-child=SIGKILL",
                                      f"--mount-proc={root}/proc", "chroot", root,
                                      "/usr/sbin/vfio-ntbd", "--config",
                                      "/etc/vfio-ntb/vfio-ntbd.conf"],
                        stdout=f, stderr=subprocess.STDOUT, env={"PATH": "/usr/sbin:/usr/bin"})
        seen = wait_for(lambda: worker_pids() or d.poll() is not None, 10)
        pids = worker_pids()
        # The trace events it knows, from the installed ntbctl (they are in the binaries).
        traces = in_root(root, "ntbctl", "--socket", "/run/vfio-ntb/control.sock", "trace",
                         "--list")
        rc = procs.stop(d)
    text = log.read_text()
    started = "lender worker for nvme0" in text and "started" in text
    gone = wait_for(lambda: not worker_pids(), 5)
    events = len([ln for ln in traces.stdout.splitlines() if "lender_" in ln or "port_" in ln])
    result("package-daemon-finds-worker", bool(seen) and bool(pids) and started and gone
           and traces.returncode == 0 and events > 0, worker_pids=len(pids),
           log_says_started=started, workers_gone_after=bool(gone), daemon_rc=rc,
           trace_list_rc=traces.returncode, trace_events_listed=events)
    if not (pids and started):
        print(h._tail(text))


def test_install_uninstall(procs):
    """make install into a DESTDIR: the layout; make uninstall: exactly those files go (an
    admin's config and a file of someone else's stay)."""
    dest = procs.tempdir("vn-pkg-dest-")
    r = make("install", f"DESTDIR={dest}")
    prefix = re.search(r'^#define VN_PREFIX "([^"]+)"', (h.REPO / "config.h").read_text(),
                       re.M).group(1)
    p = Path(str(dest) + prefix)
    want = [p / "sbin" / "vfio-ntbd", p / "bin" / "ntbctl"] + \
        [p / "libexec" / "vfio-ntb" / w for w in WORKERS]
    placed = [str(w.relative_to(dest)) for w in want if not os.access(w, os.X_OK)]
    unit = p / "lib" / "systemd" / "system" / "vfio-ntbd.service"
    exec_ok = unit.exists() and f"ExecStart={prefix}/sbin/vfio-ntbd " in unit.read_text()
    installed = sorted(str(f.relative_to(dest)) for f in dest.rglob("*") if not f.is_dir())
    # What is not ours: the admin's config, and another program in the same bin.
    admin = dest / "etc" / "vfio-ntb" / "vfio-ntbd.conf"
    other = p / "bin" / "other-tool"
    for f, text in ((admin, "[node]\nname = hosta\n"), (other, "#!/bin/sh\n")):
        f.parent.mkdir(parents=True, exist_ok=True)
        f.write_text(text)
    u = make("uninstall", f"DESTDIR={dest}")
    left = sorted(str(f.relative_to(dest)) for f in dest.rglob("*") if not f.is_dir())
    ours_left = sorted(str(f.relative_to(dest)) for f in dest.rglob("*vfio-ntb*")
                       if f not in (admin, admin.parent))
    ok = (r.returncode == 0 and u.returncode == 0 and not placed and exec_ok and
          len(installed) >= 12 and left == sorted([str(admin.relative_to(dest)),
                                                   str(other.relative_to(dest))])
          and not ours_left)
    result("package-install-uninstall", ok, install_rc=r.returncode, uninstall_rc=u.returncode,
           installed=len(installed), not_placed=",".join(placed) or "none",
           unit_execstart_sbin=exec_ok, left=",".join(left) or "none",
           ours_left=",".join(ours_left) or "none")
    if r.returncode or u.returncode:
        print(h._tail(r.stdout + r.stderr + u.stdout + u.stderr))

    # A PREFIX the daemon was not built for would put the workers where it never looks.
    dest2 = procs.tempdir("vn-pkg-dest-")
    r = make("install", f"DESTDIR={dest2}", "PREFIX=/opt/vn-elsewhere")
    anything = [f for f in dest2.rglob("*")]
    result("package-install-prefix-guard", r.returncode != 0 and not anything and
           "./configure --prefix=/opt/vn-elsewhere" in r.stderr,
           rc=r.returncode, files=len(anything))


def main():
    if os.geteuid() != 0:
        print("test_package: needs root (chroot, mount namespaces)")
        return False
    t0 = time.monotonic()
    with h.Procs() as procs:
        debs = test_make_deb()
        if debs is None:
            for name in ("package-layout", "package-dkms", "package-installs", "package-ntbctl-help",
                         "package-check-config", "package-daemon-finds-worker",
                         "package-remove-purge"):
                result(name, False, error="no_packages")
        else:
            test_layout(debs)
            test_dkms(procs, debs[2])
            test_clean_root(procs, debs[:2])
        test_install_uninstall(procs)
    TIMES["total_s"] = round(time.monotonic() - t0, 1)
    print("test_package times: " + " ".join(f"{k}={v}" for k, v in TIMES.items()))
    return True


if __name__ == "__main__":
    sys.exit(0 if main() else 1)
