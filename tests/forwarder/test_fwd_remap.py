"""Issue 26, item 6: remapping a job to another forwarding node with Gather-Arrange-Scatter or the
page cache (FGF-LRU) on loses no byte and serves no stale one.

Real daemons (two, sharing the targets), a real mount and fio with ``--verify=crc32c``:

* A job writes a file through fwd0 while the control loop's route (the mount's ``PUT /mapping``)
  moves it to fwd1 in the middle of the run; fio then reads every block back through fwd1.
  With GAS on, the blocks fwd0 gathered before the switch must be on the targets by then (the
  mount has fwd0 flush this compute node's buffer before the switch takes effect). The daemons
  run with a flush interval far longer than the test (``--gas-flush-ms 60000``), so nothing
  reaches the targets by time: the switch alone must get it there.
* The job moves back to fwd0 and verifies the file again. With the cache on, fwd0 holds pages
  of the file's previous contents (read before the job moved); the blocks rewritten through
  fwd1 must not be served from them.
* A file served by two daemons at once (two jobs, one per daemon): a read through fwd0 after a
  write through fwd1 sees the new bytes, though fwd0 cached the old ones.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading

import pytest
from forwarder_testkit import fio, http, wait_for
from pharos_testkit import in_job

OPTIONS = {
    # gathered writes stay in the daemon's buffer until a read, fsync, close or (not within the
    # test) the time flush; 64 MiB per compute node: no size flush of a 16 MiB file either
    "gas": ["--gas", "on", "--gas-flush-ms", "60000", "--gas-buffer-kb", "65536"],
    "cache": ["--cache-mb", "64"],
}

SIZE = "16M"


def fio_args(*verify: str) -> list[str]:
    """One 16 MiB file ``f`` in 64 KiB writes, checked with ``verify``."""
    return [
        "--name=remap",
        "--filename=f",
        "--rw=write",
        "--bs=64k",
        f"--size={SIZE}",
        "--ioengine=psync",
        "--verify_fatal=1",
        "--verify_state_save=0",
        *verify,
    ]


CRC = ["--verify=crc32c"]
# Bytes of this run only (a block fio's crc32c header makes self-consistent would pass a check
# of its checksum though it is another run's): a pattern with each block's offset.
PATTERN = ["--verify=pattern", "--verify_pattern=0x5a5a5a5a%o"]


def served(d) -> int:
    c = d.status()["counters"]
    return c["served_metadata"] + c["served_small"] + c["served_large"]


def put_mapping(m, jobs: dict) -> dict:
    return http("PUT", m.admin + "/mapping", {"jobs": jobs})


def written(d) -> int:
    return d.status()["counters"]["bytes_written"]


def write_while_remapped(m, job: str, frm, to, verify: list[str]) -> dict:
    """fio writes ``f`` as ``job`` at 4 MiB/s (4 s) and reads every block back; once daemon
    ``frm`` got 2 MiB of it, the job is moved to daemon ``to`` (the mount's PUT /mapping), which
    serves the rest and the reads. Returns the answer of the PUT."""
    before, started = served(to), written(frm)
    err: list[BaseException] = []

    def run() -> None:
        try:
            fio(f"--directory={m.path}", *fio_args(*verify, "--rate=4m"), job=job)
        except BaseException as e:  # reported by the test thread
            err.append(e)

    t = threading.Thread(target=run)
    t.start()
    try:
        assert wait_for(lambda: written(frm) >= started + (2 << 20), 60), f"fio wrote nothing through {frm.name}"
        assert t.is_alive(), "fio ended before the remap"
        got = put_mapping(m, {job: [to.name]})
        assert wait_for(lambda: served(to) > before, 10), f"no request of the job reached {to.name}"
    finally:
        t.join(120)
    assert not t.is_alive()
    assert not err, err[0]
    return got


@pytest.mark.timeout(300)
@pytest.mark.parametrize("option", ["gas", "cache"])
def test_a_job_remapped_mid_write_loses_and_stales_no_byte(cluster, option):
    d0 = cluster.start_daemon("fwd0", *OPTIONS[option])
    d1 = cluster.start_daemon("fwd1", *OPTIONS[option])
    # node index 1: the default node (requests of no job) is fwd1, not the job's first node
    m = cluster.start_mount([d0, d1], 1, "--job-map", "rm=fwd0")
    job = "rm"
    # 1. A new file written through fwd0, then fwd1; read back through fwd1: the blocks fwd0
    #    gathered reached the targets at the switch.
    moves = [write_while_remapped(m, job, d0, d1, CRC)]
    if option == "gas":
        assert d0.status()["gas"]["flushes"]["remap"] == 1 and d0.status()["gas"]["buffered_bytes"] == 0
    # 2. Back on fwd0, every block read through it (with the cache on, fwd0 now holds its pages).
    put_mapping(m, {job: ["fwd0"]})
    fio(f"--directory={m.path}", *fio_args(*CRC, "--verify_only"), job=job)
    # 3. Rewritten with other bytes through fwd0, then fwd1 (which cached pages of the file in
    #    step 1); read back through fwd1.
    moves.append(write_while_remapped(m, job, d0, d1, PATTERN))
    # 4. Back on fwd0: the blocks written through fwd1 are not served from fwd0's old pages.
    put_mapping(m, {job: ["fwd0"]})
    fio(f"--directory={m.path}", *fio_args(*PATTERN, "--verify_only"), job=job)
    # each time, the node the job left (fwd0) flushed this compute node's writes before the switch
    assert moves == [{"jobs": {job: ["fwd1"]}, "flushed": [{"node": "fwd0"}]}] * 2, moves


def run_as(job: str, code: str, *args: str, stdin: bytes = b"") -> bytes:
    """Runs ``python -c code args`` as job ``job`` (its cgroup); its stdout."""
    with in_job(job) as preexec:
        r = subprocess.run(
            [sys.executable, "-c", code, *args],
            input=stdin,
            capture_output=True,
            timeout=30,
            preexec_fn=preexec,
            check=True,
        )
    return r.stdout


# 4 KiB reads inside the file (a read past its end always misses the cache: no page there)
READ = (
    "import os, sys; fd = os.open(sys.argv[1], os.O_RDONLY); "
    "sys.stdout.buffer.write(b''.join(os.pread(fd, 4096, o) for o in range(0, 64 << 10, 4096)))"
)
# fsync: the gathered write is on the targets when the writer is done (a close does it too, but
# the kernel sends the release after close(2) returns)
WRITE = (
    "import os, sys; f = open(sys.argv[1], 'r+b'); f.write(sys.stdin.buffer.read()); f.flush(); "
    "os.fsync(f.fileno()); f.close()"
)


@pytest.mark.timeout(120)
@pytest.mark.parametrize(
    "options", [["--cache-mb", "8"], ["--cache-mb", "8", "--gas", "on"]], ids=["cache", "cache+gas"]
)
def test_a_file_served_by_two_daemons_is_read_fresh(cluster, options):
    d0 = cluster.start_daemon("fwd0", *options)
    d1 = cluster.start_daemon("fwd1", *options)
    m = cluster.start_mount([d0, d1], 0, "--job-map", "ra=fwd0", "--job-map", "wb=fwd1")
    p = m.path / "shared"
    old = os.urandom(64 << 10)
    p.write_bytes(old)
    for _ in range(2):  # through fwd0: its cache holds the file's pages
        assert run_as("ra", READ, str(p)) == old
    assert d0.status()["cache"]["fine_hits"] >= 16  # the second read: from the cache
    for k in range(3):
        new = os.urandom(64 << 10)
        run_as("wb", WRITE, str(p), stdin=new)  # through fwd1, closed there
        assert run_as("ra", READ, str(p)) == new, f"round {k}: fwd0 served bytes fwd1 overwrote"


@pytest.mark.timeout(120)
def test_a_close_flushes_where_the_writes_were_gathered(cluster):
    """The kernel sends a file's release with no process (no job): it goes where the opener's
    job goes, so the forwarding node that gathered the writes flushes them at close (before,
    it went to the mount's default node and the writes waited for the time flush)."""
    gas = OPTIONS["gas"]
    d0, d1 = cluster.start_daemon("fwd0", *gas), cluster.start_daemon("fwd1", *gas)
    m = cluster.start_mount([d0, d1], 1, "--job-map", "w=fwd0", "--job-map", "r=fwd1")  # default fwd1
    p = m.path / "g"
    p.write_bytes(b"")
    data = os.urandom(256 << 10)
    run_as("w", "import sys; open(sys.argv[1], 'r+b').write(sys.stdin.buffer.read())", str(p), stdin=data)
    # read through fwd1 (whole-file read: 256 KiB plus one byte past the end)
    assert wait_for(
        lambda: run_as("r", "import sys; sys.stdout.buffer.write(open(sys.argv[1], 'rb').read())", str(p)) == data, 10
    )
    assert d0.status()["gas"]["flushes"]["close"] >= 1
