"""Online migration of file objects off a target (issue 27, item 1; forwarder/README.md,
"Online migration"): a real daemon and FUSE mount, files written by fio with crc32c
verification headers on 2-target layouts (stripe 64 KiB over 4 targets), then every object
on one target moved away through the admin API (`POST /migrations`), paced by MODM's
allocation under a total cap.

Checked: every task ends `done`; no sidecar names the source target any more and no object
of the moved files is left there; fio `--verify_only` reads every block back through the
mount and finds its checksum; the copy took at least the time the cap allows (the pacing
works) and each unit of migration I/O became a record. Second test: the daemon is SIGKILLed
while a slow migration is copying (its journal entry is on disk), restarted (the entry is
rolled back or forward at start, the journal is empty again), every file verifies, and the
re-submitted migration then completes and the files verify again.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import time
from pathlib import Path

import pytest
from forwarder_testkit import Cluster, fio, http, wait_for

TARGETS = 4
PLACEMENT = {"stripe_count": 2, "stripe_size": 65536}
JOBS, SIZE, BS = 4, "8M", "256k"
FILE_BYTES = 8 << 20


def fio_job(directory: Path, *extra: str) -> dict:
    """fio's sequential crc32c-verified write of JOBS files of SIZE in ``directory`` (with
    ``--verify_only``: the read-back pass alone, which fails on any bad block); its job summary."""
    out = fio(
        "--name=mig",
        f"--directory={directory}",
        "--rw=write",
        f"--bs={BS}",
        f"--numjobs={JOBS}",
        f"--size={SIZE}",
        "--ioengine=psync",
        "--verify=crc32c",
        "--verify_state_save=0",
        "--verify_fatal=1",
        "--group_reporting",
        *extra,
        timeout=120,
    )
    job = out["jobs"][0]
    assert job["error"] == 0, job
    return job


def verify(directory: Path) -> None:
    """Every block of every file reads back with its checksum (and all of them are read)."""
    job = fio_job(directory, "--verify_only")
    assert job["read"]["io_bytes"] == JOBS * FILE_BYTES, job["read"]


def sidecars(c: Cluster) -> dict[str, tuple[str, list[int]]]:
    """Namespace path -> (oid hex, target indexes) from each file's layout sidecar."""
    out = {}
    for p in c.ns.rglob("*"):
        if p.is_file():
            text = p.read_text()
            oid = re.search(r"oid=([0-9a-f]+)", text).group(1)
            targets = [int(t) for t in re.search(r"targets=([0-9,]+)", text).group(1).split(",")]
            out["/" + str(p.relative_to(c.ns))] = (oid, targets)
    return out


def tasks(d) -> list[dict]:
    return http("GET", d.admin + "/migrations")["tasks"]


def all_finished(d, ids: list[int]) -> bool:
    ts = {t["id"]: t for t in tasks(d)}
    return all(ts[i]["state"] in ("done", "failed", "cancelled") for i in ids)


def busiest_target(c: Cluster) -> int:
    """The target holding objects of the most files."""
    counts = [0] * TARGETS
    for _, ts in sidecars(c).values():
        for t in ts:
            counts[t] += 1
    return max(range(TARGETS), key=lambda i: counts[i])


def setup(c: Cluster, sub: str):
    d = c.start_daemon("fwd0", "--placement", json.dumps(PLACEMENT))
    m = c.start_mount([d], 0)
    work = m.path / sub
    work.mkdir()
    fio_job(work, "--do_verify=1")
    return d, m, work


def src_objects(c: Cluster, src: int, oids: set[str]) -> list[str]:
    return [p.name for p in (c.backend / f"ost{src}").iterdir() if p.name.split(".")[0] in oids]


@pytest.mark.timeout(240)
def test_migration_moves_every_object_and_keeps_every_byte(cluster):
    c = cluster
    c.n_targets = TARGETS
    d, _m, work = setup(c, "w")
    src = busiest_target(c)
    before = sidecars(c)
    moving = {p: v for p, v in before.items() if src in v[1]}
    assert moving, before
    cap = 20.0  # MB/s for all migration
    http("PUT", d.admin + "/migrations", {"max_total_mb_s": cap, "max_active": 2, "retry_s": 0.5})
    produced0 = d.status()["records"]["produced"]
    t0 = time.monotonic()
    r = http("POST", d.admin + "/migrations", {"source_target": f"ost{src}", "min_mb_s": 5, "unit_bytes": 1 << 20})
    ids = r["ids"]
    assert len(ids) == len(moving), (r, moving)
    assert wait_for(lambda: all_finished(d, ids), timeout=120)
    took = time.monotonic() - t0
    ts = [t for t in tasks(d) if t["id"] in ids]
    assert all(t["state"] == "done" for t in ts), ts
    moved = sum(t["bytes_done"] for t in ts)
    assert moved == len(moving) * FILE_BYTES // 2, ts  # half of each file was on the source
    # Paced: never faster than the cap (the token buckets allow no burst).
    floor = 0.98 * moved / (cap * 1e6)
    assert took >= floor, (took, floor)
    print(f"moved {moved / 2**20:.0f} MiB in {took:.2f} s ({moved / 1e6 / took:.1f} MB/s, cap {cap} MB/s)")
    for t in ts:
        print(f"task {t['id']}: {t['achieved_mb_s']:.1f} MB/s achieved over {t['copy_s']:.2f} s")
    after = sidecars(c)
    assert set(after) == set(before)
    for p, (oid, targets) in after.items():
        assert src not in targets, (p, targets)
        assert oid == before[p][0]
        assert len(targets) == 2
    assert src_objects(c, src, {oid for oid, _ in before.values()}) == []
    # One record per unit read and per unit written (tagged job "migration").
    assert d.status()["records"]["produced"] - produced0 >= 2 * moved // (1 << 20)
    verify(work)
    # Cancelling a finished task changes nothing; an unknown one is a 404.
    assert http("DELETE", d.admin + f"/migrations/{ids[0]}")["state"] == "done"


@pytest.mark.timeout(300)
def test_sigkill_mid_migration_leaves_every_file_whole(cluster):
    c = cluster
    c.n_targets = TARGETS
    d, m, _work = setup(c, "k")
    src = busiest_target(c)
    before = sidecars(c)
    http("PUT", d.admin + "/migrations", {"max_total_mb_s": 2.0, "max_active": 2, "retry_s": 0.5})
    ids = http("POST", d.admin + "/migrations", {"source_target": f"ost{src}", "unit_bytes": 262144})["ids"]
    assert ids
    journal = c.backend / "mdt" / "migrations"

    def copying() -> bool:
        return any(t["state"] == "copying" and t["bytes_done"] > 0 for t in tasks(d)) and any(journal.iterdir())

    assert wait_for(copying, timeout=30)
    d.proc.kill()
    d.proc.wait(10)
    assert list(journal.iterdir()), "a journal entry is on disk at the kill"
    Cluster._stop(m.proc)
    subprocess.run(["umount", "-l", str(m.path)], check=False)
    # Restart: the dead daemon's entries are recovered before it serves.
    d2 = c.start_daemon("fwd1", "--placement", json.dumps(PLACEMENT))
    log = d2.log.read_text()
    assert re.search(r"migration journal: \d+ rolled back, \d+ rolled forward, 0 kept", log), log
    assert list(journal.iterdir()) == []
    after = sidecars(c)
    assert set(after) == set(before)
    for p, (oid, targets) in after.items():
        old = before[p][1]
        # Old layout, or the new one (the source replaced); the source's objects only if old.
        assert targets == old or (src not in targets and len(targets) == 2), (p, old, targets)
        left = src_objects(c, src, {oid})
        assert bool(left) == (src in targets), (p, targets, left)
    m2 = c.start_mount([d2], 0)
    verify(m2.path / "k")
    # Resumed: planned again at full speed, every file leaves the source, still whole.
    http("PUT", d2.admin + "/migrations", {"max_total_mb_s": 200, "max_active": 4, "retry_s": 0.5})
    ids = http("POST", d2.admin + "/migrations", {"source_target": f"ost{src}"})["ids"]
    assert wait_for(lambda: all_finished(d2, ids), timeout=60)
    assert all(t["state"] == "done" for t in tasks(d2) if t["id"] in ids), tasks(d2)
    assert all(src not in ts for _, ts in sidecars(c).values())
    verify(m2.path / "k")
    assert os.path.isdir(m2.path / "k")


@pytest.mark.timeout(240)
def test_modm_three_tasks_get_their_minimums_and_the_rest_by_priority(cluster):
    """Three concurrent tasks (one file each), minimums 1, 1.5 and 0.5 MB/s, priorities 1, 5
    and 3, cap 6 MB/s: MODM allocates 1, 4.5 (its minimum and the 3 MB/s left) and 0.5. The
    bytes each task copies over a window while all three copy match that allocation."""
    c = cluster
    c.n_targets = TARGETS
    d, _m, work = setup(c, "t")
    files = sorted(sidecars(c).items())[:3]
    assert len(files) == 3
    http("PUT", d.admin + "/migrations", {"max_total_mb_s": 6.0, "max_active": 3, "retry_s": 0.5})
    asks = [(1.0, 1), (1.5, 5), (0.5, 3)]
    ids = []
    for (path, (_, targets)), (mn, prio) in zip(files, asks, strict=True):
        body = {"source_target": f"ost{targets[0]}", "paths": [path], "min_mb_s": mn, "priority": prio}
        ids += http("POST", d.admin + "/migrations", {**body, "unit_bytes": 65536})["ids"]
    assert len(ids) == 3

    def snapshot() -> dict[int, dict]:
        return {t["id"]: t for t in tasks(d) if t["id"] in ids}

    assert wait_for(lambda: all(t["state"] == "copying" for t in snapshot().values()), timeout=20)
    time.sleep(0.3)
    t1, s1 = time.monotonic(), snapshot()
    time.sleep(0.6)
    t2, s2 = time.monotonic(), snapshot()
    assert all(t["state"] == "copying" for t in s2.values()), s2  # the window saw all three copying
    want = [1.0, 4.5, 0.5]
    assert [s2[i]["rate_mb_s"] for i in ids] == pytest.approx(want)
    got = [(s2[i]["bytes_done"] - s1[i]["bytes_done"]) / 1e6 / (t2 - t1) for i in ids]
    print("allocated MB/s", want, "copied MB/s", [round(g, 2) for g in got])
    for g, w, (mn, _) in zip(got, want, asks, strict=True):
        # within one 64 KiB unit per end of the window, and never below the minimum by more
        assert g == pytest.approx(w, abs=0.25), (got, want)
        assert g >= mn - 0.25, (got, asks)
    assert got[1] > got[0] > got[2]
    assert wait_for(lambda: all(t["state"] == "done" for t in snapshot().values()), timeout=60), snapshot()
    verify(work)


@pytest.mark.timeout(240)
def test_writes_during_the_copy_are_not_lost(cluster):
    """A file written through the mount while its objects are being copied: the switch sees
    the write (the file's data generation moved, or it is still open) and copies again or
    defers; the file ends on the new layout with the write in it."""
    c = cluster
    c.n_targets = TARGETS
    d, m, _work = setup(c, "x")
    path, (_, targets) = sorted(sidecars(c).items())[0]
    f = m.path / path.lstrip("/")
    original = f.read_bytes()
    http("PUT", d.admin + "/migrations", {"max_total_mb_s": 1.0, "max_active": 1, "retry_s": 0.3})
    body = {"source_target": f"ost{targets[0]}", "paths": [path], "unit_bytes": 65536}
    (tid,) = http("POST", d.admin + "/migrations", body)["ids"]

    def task() -> dict:
        return next(t for t in tasks(d) if t["id"] == tid)

    # The first 512 KiB of the source object are copied: the write lands in copied bytes.
    assert wait_for(lambda: task()["bytes_done"] >= 512 << 10, timeout=20), task()
    patch = os.urandom(512 << 10)  # 8 stripes of 64 KiB: the first 256 KiB of each object
    fd = os.open(f, os.O_WRONLY)
    try:
        os.pwrite(fd, patch, 0)
    finally:
        os.close(fd)
    http("PUT", d.admin + "/migrations", {"max_total_mb_s": 200.0, "max_active": 1, "retry_s": 0.3})
    assert wait_for(lambda: task()["state"] in ("done", "failed"), timeout=60), task()
    t = task()
    assert t["state"] == "done", t
    assert targets[0] not in sidecars(c)[path][1]
    assert f.read_bytes() == patch + original[len(patch) :]
    assert t["recopies"] + t["deferrals"] >= 1, t  # the write was seen
