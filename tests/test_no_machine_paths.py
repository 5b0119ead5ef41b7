"""The repository holds no machine path and no build recipe of a fetched peer (issue 26,
item 13): bench/ and docs/ (and every Markdown file) name no absolute path of one machine
(``/tmp/...``, ``/work/...``, ``/home/...``, ``/root/...``) and give no build commands
(``autoreconf``, ``./configure``, ``make install``, ``cmake``, ``git clone``, ...) next to the
name of a peer that is fetched and built from its own sources (pjdfstest, IOR/mdtest,
Darshan): a bench takes the peer's directory (or library) as an argument and points to the
peer's own README.

Not flagged: paths every Linux host has (``/var/tmp``, ``/proc/...``, ``/usr/...``), URLs, and
the repository's own ``make <target>`` instructions.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

#: Folders scanned whole (every tracked file), besides every tracked Markdown file.
DIRS = ("bench", "docs")

#: An absolute path of one machine: /tmp/x, /work/x, /home/x, /root/x (not /var/tmp/x, nor a
#: URL's path segment, nor a relative path like build/tmp/x).
MACHINE_PATH = re.compile(r"(?<![\w.~/$:-])/(?:tmp|work|home|root)/[\w.~-]")

#: Commands that build or fetch a project from its sources.
RECIPE = re.compile(
    r"\bautoreconf\b|\bautogen\.sh\b|(?<![\w/])\./configure\b|\bconfigure\s+--prefix|\bmake\s+install\b"
    r"|\bcmake\b|\bgit\s+clone\b|\bmeson\s+setup\b|\bninja\s+install\b|\bspack\s+install\b"
    r"|\bmake\s+(?:-j\s*\d+\s+)?(?:pjdfstest|ior|mdtest|darshan)\b"
)

#: Peers fetched and built from their own sources.
PEER = re.compile(r"pjdfstest|\bior\b|\bmdtest\b|darshan", re.IGNORECASE)

#: A recipe this many lines from a peer's name is that peer's recipe.
NEAR = 10


def findings(text: str) -> list[tuple[int, str, str]]:
    """(line number, what, line) of each machine path, and of each build command within
    ``NEAR`` lines of a peer's name."""
    lines = text.splitlines()
    peers = [i for i, line in enumerate(lines) if PEER.search(line)]
    out = []
    for i, line in enumerate(lines):
        if MACHINE_PATH.search(line):
            out.append((i + 1, "machine path", line.strip()))
        if RECIPE.search(line) and any(abs(i - p) <= NEAR for p in peers):
            out.append((i + 1, "peer build recipe", line.strip()))
    return out


def scanned() -> list[Path]:
    files = subprocess.run(
        ["git", "ls-files", "-z", "--", *DIRS, "*.md"], cwd=REPO, capture_output=True, text=True, check=True
    ).stdout.split("\0")
    return sorted({REPO / f for f in files if f and (REPO / f).is_file()})


def test_bench_and_docs_hold_no_machine_path_nor_peer_build_recipe():
    files = scanned()
    assert any(f.name == "posix_conformance.py" for f in files) and any(f.parent.name == "docs" for f in files)
    bad = []
    for f in files:
        try:
            text = f.read_text()
        except UnicodeDecodeError:
            continue
        bad += [f"{f.relative_to(REPO)}:{n}: {what}: {line}" for n, what, line in findings(text)]
    assert not bad, "\n".join(bad)


def test_the_scan_finds_paths_and_recipes_and_leaves_the_repos_own_instructions():
    # What a bench's docstring once held (a peer's build recipe, a machine path).
    flagged = """pjdfstest is built outside the repository:

    cd /tmp/pjdfstest && autoreconf -ifs && ./configure && make pjdfstest
    uv run python bench/posix_conformance.py /work/peers/pjdfstest
    git clone https://github.com/hpc/ior && cd ior && ./configure && make install   (IOR, mdtest)
    darshan-runtime: ../configure --prefix=/home/me/darshan --without-mpi && make install
"""
    got = [(n, what) for n, what, _ in findings(flagged)]
    assert (3, "machine path") in got and (3, "peer build recipe") in got
    assert (4, "machine path") in got
    assert (5, "peer build recipe") in got
    assert (6, "machine path") in got and (6, "peer build recipe") in got
    fine = """pjdfstest (https://github.com/pjd/pjdfstest) is fetched and built outside the repository,
as its own README says; this bench takes the directory of that build as its argument.
Darshan's runtime library: see Darshan's own docs (darshan-runtime/README).
    make setup && make test        # the repository's own targets
    fio missing: apt-get install fio (make setup installs it)
    root = tempfile.mkdtemp(prefix="pharos-posix-", dir="/var/tmp")
    /proc/self/fd/3, /usr/lib, https://example.org/home/root/x, build/tmp/x, ~/work/x
"""
    assert findings(fine) == []
    # A build command far from any peer's name is the repository's own business.
    assert findings("cmake -S . -B build\n" + "\n" * 20 + "pjdfstest") == []


def symlinks_out_of_the_repository(entries: str) -> list[tuple[str, str]]:
    """(path, target) of each symbolic link in ``git ls-files -s -z`` output (mode 120000) whose
    target is absolute or climbs out of the repository: such a link points at one machine's
    folder (a worktree's ``node_modules`` once was committed as a link to another checkout)."""
    out = []
    for entry in filter(None, entries.split("\0")):
        meta, path = entry.split("\t", 1)
        mode, blob, _stage = meta.split()
        if mode != "120000":
            continue
        target = subprocess.run(
            ["git", "cat-file", "blob", blob], cwd=REPO, capture_output=True, text=True, check=True
        ).stdout
        depth = len(Path(path).parts) - 1
        if target.startswith("/") or Path(target).parts[: depth + 1].count("..") > depth:
            out.append((path, target))
    return out


def test_no_tracked_symlink_points_out_of_the_repository():
    entries = subprocess.run(
        ["git", "ls-files", "-s", "-z"], cwd=REPO, capture_output=True, text=True, check=True
    ).stdout
    assert symlinks_out_of_the_repository(entries) == []
