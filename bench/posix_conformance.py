"""POSIX conformance of the forwarding layer's mount: pjdfstest on pharos-mount and on a
local directory side by side (issue 16). Not run by `make test` (it takes minutes and needs
a pjdfstest build, which is not part of this repository).

pjdfstest (https://github.com/pjd/pjdfstest) is fetched and built outside the repository, as
its own README says; this bench takes the directory of that build as its argument. Then, as
root (FUSE, allow_other, and pjdfstest switches uids):

    uv run python bench/posix_conformance.py PJDFSTEST_DIR [--only rename,link] [--modes 0700] [--keep]

Starts one pharos-fwd (8 targets, --no-kafka) and one pharos-mount (the release binaries,
built first) in a tmp dir, runs `prove -r <pjdfstest>/tests` (or the groups of `--only`)
inside a directory of the mount and inside a local directory on the backend's file system,
once per mode of `--modes` (default both 0755 and 0700: the directory the suite runs in is
root's with that mode; 0700 is what `mktemp -d` gives, and the suite's uids then work below
a directory they cannot search, relative to their working directory), and prints, for each
run, the test files, tests and failed tests, then the failing files per syscall group (the
first-level directories of pjdfstest's tests) and, with --verbose, the failed test numbers
of each file on the mount.
"""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
import tempfile
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "forwarder"))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from forwarder_testkit import Cluster, build_binaries

SUMMARY = re.compile(r"^Files=(\d+), Tests=(\d+)")
FILE = re.compile(r"^(\S+\.t)\s+\(Wstat: (\d+)\s+Tests: (\d+)\s+Failed: (\d+)\)")
FAILED = re.compile(r"^\s+Failed tests?:\s+(.*)")


def prove(pjd: Path, cwd: Path, groups: list[str], timeout: float) -> dict:
    """Runs prove in `cwd`; returns files, tests, failed and the failing files."""
    dirs = [str(pjd / "tests" / g) for g in groups] if groups else [str(pjd / "tests")]
    r = subprocess.run(["prove", "-r", *dirs], cwd=cwd, capture_output=True, text=True, timeout=timeout)
    out = {"files": 0, "tests": 0, "failed": 0, "bad": {}, "raw": r.stdout[-4000:]}
    cur = None
    for line in r.stdout.splitlines():
        if m := SUMMARY.match(line):
            out["files"], out["tests"] = int(m[1]), int(m[2])
        elif m := FILE.match(line):
            cur = Path(m[1]).relative_to(pjd / "tests").as_posix()
            # A file that died (Wstat != 0) with no failed test still counts as failing.
            out["bad"][cur] = {"failed": int(m[4]), "wstat": int(m[2]), "tests": "", "notes": []}
            out["failed"] += int(m[4])
        elif (m := FAILED.match(line)) and cur:
            out["bad"][cur]["tests"] += m[1].strip()
        elif cur and line.startswith(" ") and line.strip():
            notes = out["bad"][cur]["notes"]
            text = " ".join(line.split())  # e.g. "TODO passed: 675, 678", "Parse errors: ..."
            if notes and ":" not in text:  # a continuation of the previous list
                notes[-1] += " " + text
            else:
                notes.append(text)
        elif line.strip() and not line.startswith(" "):
            cur = None
    # prove's summary also lists files whose only remark is "TODO passed" (tests pjdfstest marks
    # as expected to fail on this system, which passed): not failures; kept apart.
    out["todo_passed"] = {
        f: b["notes"]
        for f, b in out["bad"].items()
        if not b["failed"] and not b["wstat"] and all(n.startswith("TODO passed") for n in b["notes"])
    }
    out["bad"] = {f: b for f, b in out["bad"].items() if f not in out["todo_passed"]}
    return out


def groups_of(bad: dict) -> Counter:
    return Counter(f.split("/")[0] for f in bad)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("pjdfstest", type=Path, help="pjdfstest source dir with the built `pjdfstest` binary")
    ap.add_argument("--only", default="", help="comma list of syscall groups (e.g. rename,link)")
    ap.add_argument("--keep", action="store_true", help="keep the stack's tmp dir")
    ap.add_argument("--verbose", action="store_true", help="failed test numbers per file on the mount")
    ap.add_argument(
        "--modes",
        default="0755,0700",
        help="comma list of modes (octal) of the root-owned directory each run is in (default 0755,0700)",
    )
    ap.add_argument("--timeout", type=float, default=3600)
    a = ap.parse_args()
    modes = [int(x, 8) for x in a.modes.split(",") if x]
    pjd = a.pjdfstest.resolve()
    if not (pjd / "pjdfstest").is_file() or not (pjd / "tests").is_dir():
        sys.exit(f"{pjd}: no pjdfstest binary or tests/ (build it first, see --help)")
    groups = [g for g in a.only.split(",") if g]
    build_binaries()
    root = Path(tempfile.mkdtemp(prefix="pharos-posix-", dir="/var/tmp"))
    root.chmod(0o755)
    c = Cluster(root)
    try:
        d = c.start_daemon("fwd0")
        m = c.start_mount([d])
        local = root / "local"
        local.mkdir()
        local.chmod(0o755)
        res = {}
        for mode in modes:
            for where, base in (("local", local), ("mount", m.path)):
                run = base / f"pjd-{mode:04o}"
                run.mkdir()
                run.chmod(mode)
                res[f"{where} {mode:04o}"] = prove(pjd, run, groups, a.timeout)
    finally:
        c.close()
        if not a.keep:
            shutil.rmtree(root, ignore_errors=True)
    print(f"{'':10} {'files':>6} {'tests':>7} {'failed':>7} {'files failing':>14}")
    for k, r in res.items():
        print(f"{k:10} {r['files']:>6} {r['tests']:>7} {r['failed']:>7} {len(r['bad']):>14}")
    for k, r in res.items():
        per = groups_of(r["bad"])
        print(f"{k} files with failures per group: " + (", ".join(f"{g} {n}" for g, n in per.most_common()) or "none"))
    for k, r in res.items():
        if r["bad"]:
            print(f"{k} failing files: " + ", ".join(sorted(r["bad"])))
        for f, notes in sorted(r["todo_passed"].items()):
            print(f"{k} {f}: not a failure ({'; '.join(notes)}: tests pjdfstest expects to fail here passed)")
    if a.verbose:
        for k, r in res.items():
            for f, b in sorted(r["bad"].items()) if k.startswith("mount") else ():
                print(f"  {k} {f}: failed {b['failed']} (wstat {b['wstat']}): {b['tests']} {'; '.join(b['notes'])}")


if __name__ == "__main__":
    main()
