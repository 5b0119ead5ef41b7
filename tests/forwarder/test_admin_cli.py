"""Control interface (live mapping, placement, limits, faults) and CLI behaviour."""

from __future__ import annotations

import os
import subprocess
import time
import urllib.error

import pytest
from forwarder_testkit import BIN, fio, http, write_secret


def test_live_job_mapping_moves_new_requests(cluster):
    d0, d1 = cluster.start_daemon("fwd0"), cluster.start_daemon("fwd1")
    m = cluster.start_mount([d0, d1], 0)

    def write(name: str) -> None:
        fio("--name=w", f"--filename={m.path / name}", "--rw=write", "--bs=1M", "--size=8M", job="77")

    write("a")
    assert d0.status()["counters"]["bytes_written"] == 8 << 20
    assert d1.status()["counters"]["bytes_written"] == 0
    got = http("PUT", m.admin + "/mapping", {"jobs": {"77": ["fwd1"]}})
    assert got["jobs"] == {"77": ["fwd1"]}
    assert http("GET", m.admin + "/mapping")["jobs"] == {"77": ["fwd1"]}
    write("b")
    assert d1.status()["counters"]["bytes_written"] == 8 << 20
    assert d0.status()["counters"]["bytes_written"] == 8 << 20
    # Another job still follows the static default (node index 0 -> fwd0).
    fio(
        "--name=w",
        f"--filename={m.path / 'c'}",
        "--rw=write",
        "--bs=1M",
        "--size=4M",
        job="other",
    )
    assert d0.status()["counters"]["bytes_written"] == 12 << 20
    # Unknown nodes are refused and the mapping stays.
    with pytest.raises(urllib.error.HTTPError) as e:
        http("PUT", m.admin + "/mapping", {"jobs": {"77": ["nope"]}})
    assert e.value.code == 400
    assert http("GET", m.admin + "/mapping")["jobs"] == {"77": ["fwd1"]}


def test_target_limit_and_fault_apply_live_across_daemons(cluster):
    d0, d1 = cluster.start_daemon("fwd0"), cluster.start_daemon("fwd1")
    m = cluster.start_mount([d0, d1], 1)  # served by fwd1
    # Limits set through fwd0 apply to the targets fwd1 serves (shared token buckets).
    for i in range(cluster.n_targets):
        http("PUT", d0.admin + f"/targets/ost{i}", {"max_perf_mb_s": 20})
    t = http("GET", d1.admin + "/targets")
    assert {x["max_perf_mb_s"] for x in t} == {20.0}
    t0 = time.monotonic()
    fio("--name=l", f"--filename={m.path / 'l'}", "--rw=write", "--bs=1M", "--size=30M")
    took = time.monotonic() - t0
    assert took > 1.2, f"30 MB at 20 MB/s took {took:.2f}s"  # 1.5 s less the 50 ms burst
    # Remove the limit, add latency: small requests slow down by the added latency.
    for i in range(cluster.n_targets):
        http("PUT", d1.admin + f"/targets/ost{i}", {"max_perf_mb_s": 0, "added_latency_ms": 20})
    t0 = time.monotonic()
    fio("--name=l", f"--filename={m.path / 'l'}", "--rw=read", "--bs=4k", "--size=200k")
    took = time.monotonic() - t0
    assert took > 50 * 0.02, f"50 reads with 20 ms added latency took {took:.2f}s"
    with pytest.raises(urllib.error.HTTPError):
        http("PUT", d1.admin + "/targets/ost0", {"slowdown": 0.5})
    with pytest.raises(urllib.error.HTTPError):
        http("PUT", d1.admin + "/targets/ost99", {"slowdown": 2})


def test_placement_pool_set_live(cluster):
    d = cluster.start_daemon("fwd0")
    m = cluster.start_mount([d], 0)
    p = {"pools": {"p": {"targets": ["ost6"]}}, "job_pools": {"9": "p"}}
    assert http("PUT", d.admin + "/placement", p)["job_pools"] == {"9": "p"}
    (m.path / "x").write_bytes(b"x")  # no job: round-robin
    fio(
        "--name=p",
        f"--filename={m.path / 'y'}",
        "--rw=write",
        "--bs=4k",
        "--size=4k",
        job="9",
    )
    assert len(list((cluster.backend / "ost6").glob("*.0"))) >= 1
    with pytest.raises(urllib.error.HTTPError) as e:
        http("PUT", d.admin + "/placement", {"pools": {"p": {"targets": ["ost42"]}}})
    assert e.value.code == 400


@pytest.mark.parametrize(
    "args,msg",
    [
        (["--mdt", "/tmp/x"], "no storage targets"),
        (["--mdt", "/tmp/x", "--target", "bad"], "expected NAME=VALUE"),
        (
            ["--mdt", "/tmp/x", "--targets-root", "/tmp/x", "--target-count", "2", "--limit", "ost9=5"],
            "unknown target ost9",
        ),
        (["--mdt", "/tmp/x", "--targets-root", "/tmp/x", "--target-count", "2", "--weights", "1,2"], "--weights"),
        # the site key: root-only, long enough, present
        (
            ["--mdt", "/tmp/x", "--targets-root", "/tmp/x", "--target-count", "2", "--key-file", "/tmp/x/loose"],
            "chmod 600",
        ),
        (
            ["--mdt", "/tmp/x", "--targets-root", "/tmp/x", "--target-count", "2", "--key-file", "/tmp/x/short"],
            "at least 32",
        ),
        (
            ["--mdt", "/tmp/x", "--targets-root", "/tmp/x", "--target-count", "2", "--key-file", "/tmp/x/none"],
            "--key-file",
        ),
        (
            [
                "--mdt",
                "/tmp/x",
                "--targets-root",
                "/tmp/x",
                "--target-count",
                "2",
                "--admin-token-file",
                "/tmp/x/loose",
            ],
            "--admin-token-file",
        ),
    ],
)
def test_daemon_bad_config_one_line_error(binaries, tmp_path, args, msg):
    key = write_secret(tmp_path / "key", "k" * 64)
    write_secret(tmp_path / "short", "k" * 31)
    os.chmod(write_secret(tmp_path / "loose", "k" * 64), 0o644)
    args = [a.replace("/tmp/x", str(tmp_path)) for a in args]
    if "--key-file" not in args:
        args += ["--key-file", str(key)]
    r = subprocess.run(
        [str(BIN / "pharos-fwd"), "--no-kafka", "--listen", "127.0.0.1:0", "--admin", "127.0.0.1:0", *args],
        capture_output=True,
        text=True,
        timeout=20,
    )
    assert r.returncode != 0
    lines = [line for line in r.stderr.splitlines() if "error" in line]
    assert len(lines) == 1 and msg in lines[0], r.stderr


def test_mount_bad_config_and_sigterm_unmounts(cluster, tmp_path):
    mount = [str(BIN / "pharos-mount"), "--fwd", "a=127.0.0.1:1", "--key-file"]
    r = subprocess.run(
        [*mount, str(cluster.key_file), "--mountpoint", str(tmp_path / "nope")],
        capture_output=True,
        text=True,
        timeout=20,
    )
    assert r.returncode != 0 and "not a directory" in r.stderr
    (tmp_path / "mp").mkdir()
    os.chmod(cluster.key_file, 0o640)  # readable by a group: refused
    r = subprocess.run(
        [*mount, str(cluster.key_file), "--mountpoint", str(tmp_path / "mp")],
        capture_output=True,
        text=True,
        timeout=20,
    )
    assert r.returncode == 2 and "chmod 600" in r.stderr, r.stderr
    os.chmod(cluster.key_file, 0o600)
    d = cluster.start_daemon("fwd0")
    m = cluster.start_mount([d], 0)
    assert os.path.ismount(m.path)
    m.proc.terminate()
    assert m.proc.wait(15) == 0
    assert not os.path.ismount(m.path)
    d.proc.terminate()
    assert d.proc.wait(15) == 0
