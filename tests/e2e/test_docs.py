#!/usr/bin/python3
"""The man pages and ntbctl's bash completion, checked as an operator meets them.

- man-pages-render: each page in docs/man renders with `man --warnings -E UTF-8 -l PAGE` and
  groff says nothing on stderr (a page with an unknown macro, rendered the same way, does
  warn: the check can fail);
- man-ntbctl-commands: ntbctl(8) has a subsection for every command of the agreed CLI and every
  command `ntbctl --help` lists, and names every option `ntbctl help CMD` shows in that
  command's subsection;
- completion-commands: completion/ntbctl, loaded with bash-completion into a bash process,
  completes `ntbctl <TAB>` to the commands and `ntbctl he<TAB>` to help;
- completion-options: `ntbctl attach hosta/nvme0 --<TAB>` gives attach's options and the global
  ones, not another command's; every option `ntbctl help CMD` shows is offered for CMD;
- completion-devices: `ntbctl show <TAB>` completes hosta/nvme0 from a real vfio-ntbd lending a
  simulated NVMe ($VFIO_NTB_CONTROL; and --socket on the line wins over it), and with the
  daemon down completes nothing, quietly and at once;
- readme-quickstart: README.md's quickstart, its shell blocks run as written by bash in the
  source directory (all but the QEMU one, which boots a guest: too slow here): three daemons,
  the device listed, attached with --serve-only on the socket the QEMU line names, given back,
  unlent, everything stopped.
"""
import os
import re
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import harness as h  # noqa: E402
from cluster import Daemon  # noqa: E402

EXPECTED_RESULTS = 6

MAN = h.REPO / "docs" / "man"
PAGES = ["ntbctl.8", "vfio-ntbd.8", "vfio-ntbd.conf.5"]
COMPLETION = h.REPO / "completion" / "ntbctl"
BASH_COMPLETION = Path("/usr/share/bash-completion/bash_completion")
BUILD = h.REPO / "build"
NTBCTL = BUILD / "ntbctl"

# The commands of the agreed CLI (docs/control.md, ntbctl(8)).
COMMANDS = ["nodes", "list", "show", "borrow", "return", "revoke", "attach", "detach", "unplug",
            "lend", "unlend", "stats", "top", "events", "trace", "reassign", "xml", "version",
            "help"]
# Options every command takes (ntbctl --help's "global options").
GLOBAL = {"--socket", "--json", "--timeout-ms", "--trace", "--help", "--version"}


def render(page):
    return subprocess.run(["man", "--warnings", "-E", "UTF-8", "-l", str(page)],
                          capture_output=True, text=True, timeout=60,
                          env=dict(os.environ, MANWIDTH="80"))


def test_render(scratch):
    bad = []
    for name in PAGES:
        p = MAN / name
        if not p.exists():
            bad.append(f"{name}:missing")
            continue
        r = render(p)
        if r.returncode != 0 or r.stderr.strip() or len(r.stdout) < 2000:
            bad.append(f"{name}:rc={r.returncode}:{r.stderr.strip()[:120]}")
    # The same call on a page with an unknown macro warns: an empty stderr means something.
    wrong = scratch / "wrong.8"
    wrong.write_text(".TH WRONG 8\n.SH NAME\nwrong \\- a page\n.XYZ here\n")
    r = render(wrong)
    return h.result("man-pages-render", not bad and bool(r.stderr.strip()), pages=len(PAGES),
                    problems=";".join(bad)[:300] or "none",
                    bad_page_warns=bool(r.stderr.strip()))


def help_commands():
    """The commands `ntbctl --help` lists (two-space indent, then the name)."""
    out = subprocess.run([NTBCTL, "--help"], capture_output=True, text=True, timeout=30)
    text = out.stdout + out.stderr
    block = text.split("commands:", 1)[1].split("\n\n", 1)[0] if "commands:" in text else ""
    return [m.group(1) for m in re.finditer(r"^  ([a-z]+)\s", block, re.M)]


def help_options(cmd):
    """The options `ntbctl help CMD` shows for CMD (its "options:" block)."""
    out = subprocess.run([NTBCTL, "help", cmd], capture_output=True, text=True, timeout=30)
    if out.returncode != 0 or "options:" not in out.stdout:
        return set()
    block = out.stdout.split("options:", 1)[1].split("\n\n", 1)[0]
    return set(re.findall(r"^  (--[a-z0-9-]+)", block, re.M))


def man_sections():
    """ntbctl(8)'s command subsections: name -> their roff text."""
    text = (MAN / "ntbctl.8").read_text()
    parts = re.split(r"^\.SS +\"?([a-z]+)\b.*$", text, flags=re.M)
    return {parts[i]: parts[i + 1] for i in range(1, len(parts) - 1, 2)}


def test_man_commands():
    if not (MAN / "ntbctl.8").exists():
        return h.result("man-ntbctl-commands", False, why="no docs/man/ntbctl.8")
    secs = man_sections()
    listed = help_commands()
    missing = [c for c in COMMANDS + listed if c not in secs]
    no_opt = []
    for cmd in listed:
        for opt in sorted(help_options(cmd)):
            if opt.replace("-", "\\-") not in secs.get(cmd, ""):
                no_opt.append(f"{cmd}:{opt}")
    return h.result("man-ntbctl-commands", len(listed) >= 10 and not missing and not no_opt,
                    subsections=len(secs), help_lists=len(listed),
                    missing=",".join(sorted(set(missing))) or "none",
                    options_missing=",".join(no_opt) or "none")


def complete(*words, env=None, path_dirs=(BUILD,)):
    """COMPREPLY for the line `words` (the last word is the one being completed), from
    _ntbctl in a bash that loaded bash-completion and completion/ntbctl."""
    script = r'''
source "$1" || exit 90
source "$2" || exit 91
shift 2
COMP_WORDS=("$@")
COMP_CWORD=$(( ${#COMP_WORDS[@]} - 1 ))
COMP_LINE="${COMP_WORDS[*]}"
COMP_POINT=${#COMP_LINE}
complete -p ntbctl >/dev/null || exit 92
_ntbctl ntbctl "${COMP_WORDS[COMP_CWORD]}" "${COMP_WORDS[COMP_CWORD-1]}"
printf '%s\n' "${COMPREPLY[@]}"
'''
    e = dict(os.environ, **(env or {}))
    e["PATH"] = ":".join([str(d) for d in path_dirs] + [e.get("PATH", "/usr/bin:/bin")])
    t0 = time.monotonic()
    r = subprocess.run(["bash", "--norc", "--noprofile", "-c", script, "bash",
                        str(BASH_COMPLETION), str(COMPLETION), *words],
                       capture_output=True, text=True, timeout=30, env=e)
    took = time.monotonic() - t0
    if r.returncode != 0:
        raise h.HarnessError(f"bash exited {r.returncode}: {r.stderr.strip()[:300]}")
    return [w for w in r.stdout.split("\n") if w], r.stderr, took


def test_completion_commands():
    got, err, _ = complete("ntbctl", "")
    he, _, _ = complete("ntbctl", "--json", "he")
    listed = help_commands()
    return h.result("completion-commands", sorted(got) == sorted(COMMANDS) and he == ["help"]
                    and set(listed) <= set(got) and not err.strip(),
                    completed=len(got), help_lists=len(listed),
                    unlisted=",".join(sorted(set(listed) - set(got))) or "none",
                    he=",".join(he))


def test_completion_options():
    got, _, _ = complete("ntbctl", "attach", "hosta/nvme0", "--")
    attach = {"--domain", "--alias", "--config", "--connect", "--serve-only", "--qmp",
              "--qdev-id"}
    ok = attach | GLOBAL <= set(got) and "--grace-ms" not in got and "--to" not in got
    dom, _, _ = complete("ntbctl", "attach", "hosta/nvme0", "--se")
    ok &= dom == ["--serve-only"]
    # Every option ntbctl's own help shows for a command is offered for it.
    unoffered = []
    for cmd in help_commands():
        offered, _, _ = complete("ntbctl", cmd, "--")
        unoffered += [f"{cmd}:{o}" for o in sorted(help_options(cmd) - set(offered))]
    return h.result("completion-options", ok and not unoffered, attach=len(got),
                    serve_only=",".join(dom), unoffered=",".join(unoffered) or "none")


def test_completion_devices(procs, wd):
    fab = procs.tempdir("vn-fabric-")
    img = h.make_backing(wd / "a.img", 16)
    sd = h.Simdev(procs, wd / "dev.sock", img, 16).start()
    a = Daemon(procs, wd, "hosta", fab, lends={"nvme0": sd.socket_path}).start()
    b = Daemon(procs, wd, "hostb", fab).start()
    env = {"VFIO_NTB_CONTROL": str(b.control)}
    # hostb knows hosta's device once hosta has announced it.
    seen = h.wait_for(lambda: complete("ntbctl", "show", "", env=env)[0] == ["hosta/nvme0"], 10)
    got, err, _ = complete("ntbctl", "attach", "host", env=env)
    # --socket on the line wins over the environment (which points nowhere here).
    via, _, _ = complete("ntbctl", "--socket", str(a.control), "stats", "",
                         env={"VFIO_NTB_CONTROL": str(wd / "nothing.sock")})
    # Past the device, nothing more to complete.
    after, _, _ = complete("ntbctl", "show", "hosta/nvme0", "", env=env)
    a.stop()
    b.stop()
    down, down_err, down_s = complete("ntbctl", "show", "", env=env)
    ok = bool(seen) and got == ["hosta/nvme0"] and via == ["hosta/nvme0"] and after == []
    ok &= down == [] and not down_err.strip() and not err.strip() and down_s < 2.0
    return h.result("completion-devices", ok, completed=",".join(got) or "none",
                    via_socket=",".join(via) or "none", daemon_down=",".join(down) or "none",
                    down_s=f"{down_s:.2f}", stderr=(err + down_err).strip()[:100] or "none")


def test_readme(procs):
    text = (h.REPO / "README.md").read_text()
    sec = text.split("## Quickstart", 1)[1].split("\n## ", 1)[0] if "## Quickstart" in text \
        else ""
    blocks = re.findall(r"```sh\n(.*?)```", sec, re.S)
    qemu = [b for b in blocks if "vfio-user-pci" in b]
    run = [b for b in blocks if "vfio-user-pci" not in b]
    if len(blocks) < 3 or len(qemu) != 1:
        return h.result("readme-quickstart", False, blocks=len(blocks), qemu_blocks=len(qemu))
    # The QEMU line's socket, in the shell's own words (after $Q is set by the first block).
    # ('...'$Q'...': the shell's quotes around $Q, which the JSON's own quotes surround.)
    sock = re.search(r'"path":"([^"]+)"', qemu[0].replace("'$Q'", "$Q"))
    script = "set -e\n" + "\n".join(run) + \
        f'\necho "QUICKSTART-SOCKET {sock.group(1) if sock else ""}"\n'
    out = procs.tempdir("vn-readme-") / "quickstart.log"
    with open(out, "w") as log:
        p = procs.start("quickstart", ["bash", "-c", script], cwd=h.REPO, stdout=log,
                        stderr=subprocess.STDOUT)
        try:
            rc = p.wait(60)
        except subprocess.TimeoutExpired:
            rc = "timeout"
    log_text = out.read_text(errors="replace")
    named = re.search(r"QUICKSTART-SOCKET (\S+)", log_text)
    served = re.search(r"QEMU socket (\S+)", log_text)
    ok = (rc == 0 and bool(named) and bool(served) and named.group(1) == served.group(1)
          and re.search(r"^hosta/nvme0 +available", log_text, re.M) is not None
          and "returned hosta/nvme0" in log_text and "no longer lends hosta/nvme0" in log_text
          and all((h.REPO / "scripts" / s).exists() for s in ("testbed-qemu", "testbed-guest")))
    if not ok:
        print(log_text[-3000:], file=sys.stderr)
    return h.result("readme-quickstart", ok, rc=rc, blocks_run=len(run),
                    socket_matches=bool(named and served and named.group(1) == served.group(1)))


def main():
    ok = True
    with h.Procs() as procs:
        wd = procs.tempdir("vn-docs-")
        for name, fn, args in [("man-pages-render", test_render, (wd,)),
                               ("man-ntbctl-commands", test_man_commands, ()),
                               ("completion-commands", test_completion_commands, ()),
                               ("completion-options", test_completion_options, ()),
                               ("completion-devices", test_completion_devices, (procs, wd)),
                               ("readme-quickstart", test_readme, (procs,))]:
            try:
                ok &= fn(*args)
            except Exception as e:  # noqa: BLE001 - one failed check must not hide the rest
                ok &= h.failed(name, e)
    return ok


if __name__ == "__main__":
    sys.exit(0 if main() else 1)
