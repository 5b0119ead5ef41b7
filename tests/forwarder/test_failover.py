"""Killing a forwarding daemon during a multi-job fio run: its clients move to the next
node of their mapping, in-flight idempotent requests are replayed there, and fio
finishes with crc32c verification passing."""

from __future__ import annotations

import threading
import time

import pytest
from forwarder_testkit import fio, http


@pytest.mark.timeout(180)
def test_kill_forwarding_daemon_mid_run(cluster):
    limits = [a for i in range(cluster.n_targets) for a in ("--limit", f"ost{i}=40")]
    d0 = cluster.start_daemon("fwd0", *limits, "--workers", "32")
    d1 = cluster.start_daemon("fwd1", "--workers", "32")
    m = cluster.start_mount([d0, d1], 0, "--threads", "32")
    # Job "A" is mapped to fwd0 then fwd1; job "B" uses the static default (fwd0).
    http("PUT", m.admin + "/mapping", {"jobs": {"A": ["fwd0", "fwd1"]}})
    results: dict[str, object] = {}

    def run(job: str) -> None:
        d = m.path / job
        d.mkdir()
        try:
            results[job] = fio(
                "--name=f",
                f"--directory={d}",
                "--rw=write",
                "--bs=1M",
                "--numjobs=4",
                "--size=64M",
                "--ioengine=psync",
                "--verify=crc32c",
                "--verify_state_save=0",
                "--do_verify=1",
                "--verify_fatal=1",
                "--group_reporting",
                job=job,
                timeout=150,
            )
        except BaseException as e:
            results[job] = e

    threads = [threading.Thread(target=run, args=(j,)) for j in ("A", "B")]
    for t in threads:
        t.start()
    # Let both jobs get going on fwd0, then kill it hard.
    deadline = time.monotonic() + 30
    while d0.status()["counters"]["bytes_written"] < 64 << 20 and time.monotonic() < deadline:
        time.sleep(0.05)
    written_before_kill = d0.status()["counters"]["bytes_written"]
    d0.proc.kill()
    d0.proc.wait()
    for t in threads:
        t.join(170)
    for job in ("A", "B"):
        r = results[job]
        assert not isinstance(r, BaseException), f"job {job}: {r}"
        assert r["jobs"][0]["error"] == 0
        assert r["jobs"][0]["write"]["io_bytes"] == 4 * (64 << 20)
    st = m.status()
    s1 = d1.status()
    print(
        f"fwd0 wrote {written_before_kill} B before the kill; fwd1 then wrote "
        f"{s1['counters']['bytes_written']} B; mount failovers={st['failovers']} replays={st['replays']}"
    )
    assert written_before_kill > 0
    assert st["failovers"] > 0
    assert s1["counters"]["bytes_written"] > 0
    assert next(n for n in st["nodes"] if n["name"] == "fwd0")["failures"] > 0
