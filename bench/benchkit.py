"""What the forwarding-layer benches share: fio through a mount, the order of the sides in a
round, starting a daemon or mount and waiting for its ready file, the site key and admin token,
the daemons' /metrics, the binaries under test, the scratch directory of a run, dropping the
page cache, and the two FUSE sides compared (a pharos-fwd + pharos-mount stack, and the
passthrough floor: Debian's bindfs with ``-o direct_io``).

Imported by the scripts beside it (``uv run python bench/NAME.py``); puts tests/ and
tests/forwarder on sys.path for ``forwarder_testkit``."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator, Sequence
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))
sys.path.insert(0, str(REPO / "tests" / "forwarder"))

import forwarder_testkit as kit  # noqa: E402


def fio(directory: Path, *args: str, enter: Sequence[str] = ()) -> dict:
    """fio's group-reported job summary of ``args`` in ``directory`` (psync), run under the
    ``enter`` prefix when given (e.g. a rig node's nsenter); exits on a fio failure."""
    cmd = [
        *enter,
        "fio",
        "--output-format=json",
        f"--directory={directory}",
        "--ioengine=psync",
        "--group_reporting",
        *args,
    ]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    if r.returncode:
        sys.exit(f"fio failed: {' '.join(cmd)}\n{r.stdout[-2000:]}{r.stderr[-2000:]}")
    return json.loads(r.stdout[r.stdout.index("{") :])["jobs"][0]


def rounds(n: int, sides: list[str]) -> Iterator[tuple[int, str]]:
    """(round, side) for ``n`` rounds of every side: the order rotates by one side each round and
    is reversed every other cycle of ``len(sides)`` rounds (with two sides, reversing every other
    round would undo the rotation: the same side would always go first), so a noisy neighbour or
    the writeback of the run before does not always fall on the same side."""
    for r in range(n):
        order = sides[r % len(sides) :] + sides[: r % len(sides)]
        if r // len(sides) % 2:
            order.reverse()
        for side in order:
            yield r, side


def auth_flags(root: Path) -> list[str]:
    """The site key and admin token flags of pharos-fwd and pharos-mount; the files are made in
    ``root`` the first time (the token is forwarder_testkit's ADMIN_TOKEN)."""
    key, token = root / "fwd.key", root / "admin.token"
    if not key.exists():
        kit.write_secret(key, os.urandom(32).hex())
        kit.write_secret(token, kit.ADMIN_TOKEN)
    return ["--key-file", str(key), "--admin-token-file", str(token)]


def start_ready(argv: list[str], root: Path, name: str, procs: list[subprocess.Popen]) -> dict:
    """Start ``argv`` with ``--ready-file root/NAME.ready``, its output to ``root/NAME.log``, add
    it to ``procs`` and wait until it is ready; returns the ready file's JSON (bound addresses)."""
    ready = root / f"{name}.ready"
    proc = subprocess.Popen(
        [*argv, "--ready-file", str(ready)],
        stdout=(root / f"{name}.log").open("w"),
        stderr=subprocess.STDOUT,
    )
    procs.append(proc)
    return kit.wait_ready(ready, proc)


def stop_all(procs: list[subprocess.Popen], mounts: list[Path]) -> None:
    """SIGTERM ``procs`` in reverse order (SIGKILL after 15 s each), then lazily unmount what of
    ``mounts`` is still mounted."""
    for p in reversed(procs):
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
            try:
                p.wait(15)
            except subprocess.TimeoutExpired:
                p.kill()
    for mnt in mounts:
        if os.path.ismount(mnt):
            subprocess.run(["umount", "-l", str(mnt)], check=False)


def daemon_metrics(d: kit.Daemon, prefix: str | tuple[str, ...]) -> dict[str, float]:
    """The samples of the daemon's GET /metrics whose line starts with ``prefix``, keyed by name
    and labels."""
    req = urllib.request.Request(d.admin + "/metrics", headers={"Authorization": f"Bearer {kit.ADMIN_TOKEN}"})
    return metric_samples(urllib.request.urlopen(req, timeout=10).read().decode(), prefix)


def metric_samples(text: str, prefix: str | tuple[str, ...]) -> dict[str, float]:
    """The samples of a Prometheus text exposition whose line starts with ``prefix``, keyed by
    name and labels."""
    out = {}
    for line in text.splitlines():
        if line.startswith(prefix) and not line.startswith("#"):
            k, v = line.rsplit(" ", 1)
            out[k] = float(v)
    return out


def cpu_s(pid: int) -> float:
    """CPU time process ``pid`` used so far (user + system, all its threads), seconds."""
    f = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(f[11]) + int(f[12])) / os.sysconf("SC_CLK_TCK")


def use_binaries(bin_dir: Path | None) -> None:
    """forwarder_testkit's pharos-fwd and pharos-mount: from ``bin_dir`` (``--bin``), else built
    now (cargo build --release)."""
    if bin_dir is not None:
        kit.BIN = bin_dir.resolve()
    else:
        kit.build_binaries()


@contextlib.contextmanager
def scratch_dir(prefix: str, workdir: str | None, keep: bool) -> Iterator[Path]:
    """A fresh directory under ``workdir`` (tempfile's default when None), removed at the end
    unless ``keep`` (``--keep``)."""
    root = Path(tempfile.mkdtemp(prefix=prefix, dir=workdir))
    try:
        yield root
    finally:
        if not keep:
            shutil.rmtree(root, ignore_errors=True)


@contextlib.contextmanager
def fresh_ext4(path: Path, size_gib: int, inodes: int) -> Iterator[Path]:
    """A fresh journaled ext4 mounted at ``path`` (made): a sparse image of ``size_gib`` GiB with
    ``inodes`` inodes beside it (``path``.img), loop-mounted; unmounted (lazily if still busy)
    and the image removed at the end. Gives each side of a metadata bench a file system of its
    own: on ext4 without a journal (some VMs' root file system), the inode allocator skips every
    inode freed in the last 60-300 s (``recently_deleted``), so one side's removals slowed the
    next side's creates up to 4x. Needs root (mkfs.ext4 from e2fsprogs, a loop device); exits
    with the command's error otherwise."""
    img = path.with_name(path.name + ".img")
    path.mkdir()
    with open(img, "wb") as f:
        f.truncate(size_gib << 30)
    for cmd in (["mkfs.ext4", "-q", "-F", "-N", str(inodes), str(img)], ["mount", "-o", "loop", str(img), str(path)]):
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
        if r.returncode != 0:
            img.unlink(missing_ok=True)
            sys.exit(
                f"{' '.join(cmd[:2])} failed: {r.stderr.strip()} (root and a loop device needed; --backing workdir avoids it)"
            )
    try:
        yield path
    finally:
        if subprocess.run(["umount", str(path)], capture_output=True, timeout=120).returncode != 0:
            subprocess.run(["umount", "-l", str(path)], check=False)
        img.unlink(missing_ok=True)


def drop_caches() -> None:
    """`sync`, then drop the page cache, dentries and inodes (root)."""
    subprocess.run(["sync"], check=False)
    try:
        Path("/proc/sys/vm/drop_caches").write_text("3\n")
    except OSError as e:
        sys.exit(f"cannot drop the page cache (root needed): {e}")


def start_passthrough(root: Path, mounts: list[Path]) -> Path:
    """bindfs -o direct_io of `root`/pt-src on `root`/pt: the FUSE passthrough column."""
    exe = shutil.which("bindfs")
    if exe is None:
        sys.exit("bindfs not found: apt-get install bindfs (make setup installs it)")
    src, mnt = root / "pt-src", root / "pt"
    src.mkdir()
    mnt.mkdir()
    subprocess.run([exe, "-o", "direct_io", str(src), str(mnt)], check=True, timeout=30)
    mounts.append(mnt)
    end = time.monotonic() + 10
    while not os.path.ismount(mnt):
        if time.monotonic() > end:
            sys.exit(f"bindfs did not mount {mnt}")
        time.sleep(0.05)
    return mnt


def bindfs_pid(mnt: Path) -> int | None:
    """The pid of the bindfs process serving `mnt` (it daemonizes)."""
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                argv = (d / "cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            if argv and argv[0].endswith(b"bindfs") and str(mnt).encode() in argv:
                return int(d.name)
    return None


def auth_args(bin_dir: Path, root: Path) -> list[str]:
    """The site key and admin token flags (made in `root`), for binaries that take them (a
    --baseline-bin build from before authenticated forwarding does not)."""
    help_text = subprocess.run([str(bin_dir / "pharos-fwd"), "--help"], capture_output=True, text=True).stdout
    if "--key-file" not in help_text:
        return []
    return auth_flags(root)


def start_stack(bin_dir: Path, root: Path, tag: str, procs: list[subprocess.Popen], mount_args: list[str] = ()) -> Path:
    """One pharos-fwd (8 unlimited targets) and one pharos-mount of `bin_dir` (extra flags
    `mount_args`); returns the mount."""
    mnt = root / f"mnt{tag}"
    mnt.mkdir()
    auth = auth_args(bin_dir, root)
    fwd_argv = [
        str(bin_dir / "pharos-fwd"),
        *("--node-name", "fwd0", "--listen", "127.0.0.1:0", "--admin", "127.0.0.1:0"),
        *("--mdt", str(root / f"be{tag}" / "mdt"), "--targets-root", str(root / f"be{tag}")),
        *("--target-count", "8", "--no-kafka", *auth),
    ]
    port = kit.port_of(start_ready(fwd_argv, root, f"fwd{tag}", procs)["listen"])
    mount_argv = [
        str(bin_dir / "pharos-mount"),
        *("--mountpoint", str(mnt), "--fwd", f"fwd0=127.0.0.1:{port}", "--admin", "127.0.0.1:0"),
        *auth,
        *mount_args,
    ]
    start_ready(mount_argv, root, f"mnt{tag}", procs)
    return mnt
