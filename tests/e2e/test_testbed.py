#!/usr/bin/python3
"""The testbed's QEMU on a host that has another QEMU installed (every libvirt/KVM host has).

Debian's qemu-system-x86 puts its modules in /usr/lib/x86_64-linux-gnu/qemu, the directory the
testbed's QEMU was built to search.  Each scene runs in a private mount namespace where that
directory holds a foreign build's modules: an overlay adds, for every module name the testbed's
QEMU knows and its root lacks, a shared object without QEMU's build stamp (what a module from
another build looks like to QEMU; loading one used to abort it).  What a user would check:
- `scripts/testbed-qemu` still answers with the cached wrapper and rebuilds nothing;
- `-device help` succeeds and lists vfio-user-pci;
- a qtest QEMU (its accelerator is itself a module) realizes vfio-user-pci against the
  simulated NVMe and reads the device's vendor ID through config space;
- the versions the testbed installed are recorded, and a version the archive does not have
  is refused with a message that says so.
"""
import os
import re
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import harness as h  # noqa: E402
from harness import result  # noqa: E402

# tests/run-checks counts a result this file did not print as failed.
EXPECTED_RESULTS = 4

HOST_LIBDIR = "/usr/lib/x86_64-linux-gnu"
MODULE_NAME = re.compile(rb"^(accel|audio|block|chardev|hw|ui)-[a-z0-9-]+$")
SIMDEV_VENDOR = 0x1de1


def wrapper_root(wrapper):
    """The root filesystem a testbed-qemu wrapper runs QEMU from (its R= line)."""
    m = re.search(r"^R=(.+)$", Path(wrapper).read_text(), re.M)
    if not m:
        raise h.HarnessError(f"{wrapper}: not a testbed-qemu wrapper")
    return Path(m.group(1))


def foreign_modules(procs, root):
    """An overlay upper directory whose qemu/ holds a stamp-less .so for each module name the
    root's QEMU binary names but the root does not have."""
    wd = procs.tempdir("vn-foreign-")
    (wd / "upper" / "qemu").mkdir(parents=True)
    (wd / "work").mkdir()
    so = wd / "foreign.so"
    subprocess.run(["cc", "-shared", "-fPIC", "-o", str(so), "-x", "c", "-"],
                   input=b"int vn_foreign_build;\n", check=True, timeout=60)
    have = {p.stem for p in (root / "usr/lib/x86_64-linux-gnu/qemu").glob("*.so")}
    names = set(subprocess.run(["strings", str(root / "usr/bin/qemu-system-x86_64")],
                               capture_output=True, check=True, timeout=60).stdout.split())
    fakes = sorted(n.decode() for n in names if MODULE_NAME.match(n))
    fakes = [n for n in fakes if n not in have]
    for n in fakes:
        os.link(so, wd / "upper" / "qemu" / f"{n}.so")
    if not fakes:
        raise h.HarnessError(f"{root}: found no module names to fake")
    return wd, len(fakes)


def foreign_host_argv(wd, argv):
    """argv run where HOST_LIBDIR/qemu holds the foreign modules, visible to nothing else."""
    script = ('mount -t overlay vn-foreign -o "lowerdir=$1,upperdir=$2/upper,workdir=$2/work" '
              '"$1" && shift 2 && exec "$@"')
    return ["unshare", "--mount", "--propagation", "private", "sh", "-c", script, "sh",
            HOST_LIBDIR, str(wd)] + [str(a) for a in argv]


def test_foreign_modules(procs, wrapper, wd, nfakes):
    tb = subprocess.run(foreign_host_argv(wd, [h.REPO / "scripts" / "testbed-qemu"]),
                        capture_output=True, text=True, timeout=600)
    ok = result("testbed-qemu-keeps-cache-foreign-host",
                tb.returncode == 0 and tb.stdout.strip() == wrapper and
                "building" not in tb.stderr,
                rc=tb.returncode, printed=tb.stdout.strip() or "-", faked_modules=nfakes)
    help_ = subprocess.run(foreign_host_argv(wd, [wrapper, "-device", "help"]),
                           capture_output=True, text=True, timeout=120)
    err = help_.stderr.strip().splitlines()
    ok &= result("device-help-foreign-host",
                 help_.returncode == 0 and '"vfio-user-pci"' in help_.stdout and
                 "module" not in help_.stderr,
                 rc=help_.returncode, stderr=(err[-1] if err else "-")[:120])
    return ok


def test_qtest_device(procs, wrapper, wd):
    sdir = procs.tempdir()
    sd = h.Simdev(procs, sdir / "nvme.sock", h.make_backing(sdir / "disk.img", 16), 16).start()
    dev = ('{"driver":"vfio-user-pci","id":"d0","bus":"pcie.0","addr":"0x2",'
           f'"socket":{{"type":"unix","path":"{sd.socket_path}"}}}}')
    argv = [wrapper, "-machine", "q35,memory-backend=mem", "-accel", "qtest", "-qtest",
            "stdio", "-object", "memory-backend-memfd,id=mem,size=256M,share=on", "-m", "256M",
            "-nodefaults", "-display", "none", "-device", dev]
    q = procs.start("qemu-qtest", foreign_host_argv(wd, argv), stdin=subprocess.PIPE,
                    stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        h.qtest_command(q, "outl 0xcf8 0x80001000")   # bus 0, device 2, function 0, offset 0
        words = h.qtest_command(q, "inl 0xcfc")
        ids = int(words[1], 16) if len(words) > 1 else 0
    finally:
        procs.stop(q)
    return result("qtest-vfio-user-foreign-host", ids & 0xffff == SIMDEV_VENDOR,
                  config_id=f"{ids:#010x}")


def test_versions(procs, wrapper):
    stamp = wrapper_root(wrapper) / ".vn-testbed-complete"
    recorded = stamp.read_text() if stamp.exists() else ""
    cache = procs.tempdir("vn-cache-")
    bad = subprocess.run([h.REPO / "scripts" / "testbed-qemu"],
                         env=dict(os.environ, VN_CACHE=str(cache),
                                  VN_TESTBED_QEMU_VERSION="1:0.0.1+vn-missing"),
                         capture_output=True, text=True, timeout=900)
    return result("testbed-versions-pinned",
                  re.search(r"^qemu-system-x86 \S+$", recorded, re.M) is not None and
                  bad.returncode != 0 and "no longer has QEMU 1:0.0.1+vn-missing" in bad.stderr,
                  recorded=(recorded.split("\n")[0] or "-"), missing_rc=bad.returncode)


def main():
    if os.geteuid() != 0:
        for name in ("testbed-qemu-keeps-cache-foreign-host", "device-help-foreign-host",
                     "qtest-vfio-user-foreign-host", "testbed-versions-pinned"):
            result(name, False, error="needs root (a private mount namespace)")
        return 1
    ok = True
    with h.Procs() as procs:
        try:
            wrapper = h.stock_qemu()
            wd, nfakes = foreign_modules(procs, wrapper_root(wrapper))
        except (h.HarnessError, subprocess.SubprocessError, OSError) as e:
            print(f"testbed: {e}", file=sys.stderr)
            return 1
        for scene in (lambda: test_foreign_modules(procs, wrapper, wd, nfakes),
                      lambda: test_qtest_device(procs, wrapper, wd),
                      lambda: test_versions(procs, wrapper)):
            try:
                ok &= scene()
            except (h.HarnessError, subprocess.SubprocessError, OSError) as e:
                ok = h.failed("testbed", e)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
