#!/usr/bin/python3
"""The checks `make check` runs first (`make lint`) fail on what they are there to catch: each
is run as the Makefile runs it, on the tree (which must pass) and on one bad file of its kind
in a scratch directory (which must fail it, the tree's files left out).

- lint-format: a C file that .clang-format would lay out differently;
- lint-shellcheck: a shell script with a word-splitting bug;
- lint-analyzer: C that reads past an array (cppcheck).
"""
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import harness as h  # noqa: E402

EXPECTED_RESULTS = 3

BAD = {
    "lint-format": ("FORMAT_FILES", "bad.c", "int  f(void){return 0;}\n"),
    "lint-shellcheck": ("SHELL_SCRIPTS", "bad.sh", "#!/bin/sh\nrm -rf $1/tmp\n"),
    "lint-analyzer": ("CPPCHECK_DIRS", "bad", "int f(void)\n{\n    int a[2] = { 0, 0 };\n\n"
                      "    return a[2];\n}\n"),
}
TARGET = {"lint-format": "format-check", "lint-shellcheck": "lint", "lint-analyzer": "lint"}


def make(*args):
    return subprocess.run(["make", "--no-print-directory", "-C", str(h.REPO), *args],
                          capture_output=True, text=True, timeout=600)


def main():
    ok = True
    with h.Procs() as procs:
        scratch = procs.tempdir("vn-lint-")
        clean = make("lint")
        for name, (var, fname, text) in BAD.items():
            path = scratch / fname
            if var == "CPPCHECK_DIRS":
                path.mkdir()
                (path / "bad.c").write_text(text)
            else:
                path.write_text(text)
            # The other checks see one good file of the tree each, this one the bad file only.
            only = {"FORMAT_FILES": h.REPO / "tests" / "unit" / "check-main.h",
                    "SHELL_SCRIPTS": h.REPO / "scripts" / "install-deps",
                    "CPPCHECK_DIRS": h.REPO / "vfio-ntb" / "common" / "name.c"}
            only[var] = path
            r = make(TARGET[name], *[f"{k}={v}" for k, v in only.items()])
            ok &= h.result(name, clean.returncode == 0 and r.returncode != 0 and
                           fname.split(".")[0] in r.stdout + r.stderr,
                           tree_clean=clean.returncode == 0, bad_file_rc=r.returncode)
    return ok


if __name__ == "__main__":
    sys.exit(0 if main() else 1)
