"""Issue 12, items 2 and 5 on the real daemon and mount: several epoll masters with lock-free
queues and RAAS thread allocation, the single-master, mutex-queue baseline, and the default (a
decoder thread per connection that serves a request itself in a sleeping worker's place,
lock-free queues) move data intact (fio crc32c verify through the FUSE mount), show their
per-class queue delay and worker allocation on GET /metrics, and refuse bad settings with a
clear error."""

from __future__ import annotations

import re
import subprocess
import time
import urllib.request

import pytest
from forwarder_testkit import BIN, OP_PING, Cluster, connect, fio_verify, frame, read_reply, request

OPTIMISED = (
    "--masters",
    "2",
    "--queue",
    "lockfree",
    "--scheduler",
    "raas",
    "--workers",
    "6",
    "--raas-min",
    "1,1,1",
    "--raas-delay-ms",
    "1,5,50",
    "--raas-cycle-ms",
    "50",
)
BASELINE = ("--masters", "1", "--queue", "mutex", "--scheduler", "weights", "--workers", "6")
DEFAULT = ("--workers", "6")
STACKS = {"optimised": OPTIMISED, "baseline": BASELINE, "default": DEFAULT}


def metrics(d) -> str:
    with urllib.request.urlopen(d.admin + "/metrics", timeout=10) as r:
        return r.read().decode()


def value(text: str, name: str, labels: str) -> float:
    m = re.search(rf"^{re.escape(name)}\{{{re.escape(labels)}\}} (\S+)$", text, re.M)
    assert m, f"{name}{{{labels}}} not in /metrics:\n{text[-3000:]}"
    return float(m.group(1))


@pytest.fixture(scope="module", params=list(STACKS))
def stack(request, binaries, tmp_path_factory):
    c = Cluster(tmp_path_factory.mktemp(f"threads-{request.param}"), n_targets=4)
    d = c.start_daemon("fwd0", *STACKS[request.param])
    m = c.start_mount([d], node_index=0)
    yield request.param, c, d, m
    c.close()


@pytest.mark.timeout(240)
@pytest.mark.parametrize(
    "rw,bs,jobs,size",
    [("randwrite", "4k", 8, "8M"), ("write", "1M", 4, "32M"), ("randrw", "16k", 4, "16M")],
)
def test_fio_verify_through_the_mount(stack, rw, bs, jobs, size):
    kind, _c, d, m = stack
    dd = m.path / f"{rw}-{bs}-{jobs}"
    dd.mkdir()
    fio_verify(dd, rw, bs, jobs, size)
    # FUSE sends some requests (release after close) after fio has returned: read the status once
    # every dequeued request has been served (bounded wait)
    deadline = time.monotonic() + 10
    while True:
        s = d.status()
        t = s["threads"]
        served = sum(s["counters"][f"served_{c}"] for c in ("metadata", "small", "large"))
        if sum(t["class_dequeued"]) == served or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    want = {"optimised": (2, "lockfree", "raas", False), "baseline": (1, "mutex", "weights", False)}
    assert (t["masters"], t["queue"], t["scheduler"], t["serve_inline"]) == want.get(
        kind, (0, "lockfree", "weights", True)
    )
    assert s["counters"]["bytes_written"] > 0 and s["counters"]["worker_panics"] == 0
    # Only decoder threads serve in a sleeping worker's place (fio's 4-8 jobs leave some asleep).
    assert (s["counters"]["served_inline"] > 0) == (kind == "default"), s["counters"]["served_inline"]
    # every served request went through a class queue, or a lent worker's place, and was counted
    assert sum(t["class_dequeued"]) == served


def test_metrics_show_class_delay_and_allocation(stack):
    kind, _c, d, m = stack
    f = m.path / "few"
    f.mkdir(exist_ok=True)
    for i in range(50):
        (f / f"f{i}").write_bytes(b"x" * 100)
    text = metrics(d)
    for c in ("metadata", "small", "large"):
        assert value(text, "pharos_fwd_class_queue_wait_seconds_total", f'class="{c}"') >= 0
        value(text, "pharos_fwd_class_queue_delay_seconds", f'class="{c}"')
    assert value(text, "pharos_fwd_class_dequeued_requests_total", 'class="metadata"') >= 100
    workers = {
        c: value(text, "pharos_fwd_class_workers", f'class="{c}"') for c in ("metadata", "small", "large", "shared")
    }
    assert sum(workers.values()) == 6, workers
    if kind == "optimised":
        assert all(workers[c] >= 1 for c in ("metadata", "small", "large")), workers
        assert value(text, "pharos_fwd_class_acceptable_delay_seconds", 'class="metadata"') == 0.001
        assert 'pharos_fwd_threading{masters="2",queue="lockfree",scheduler="raas"} 1' in text
    else:
        assert workers["shared"] == 6, workers
        masters, queue = ("1", "mutex") if kind == "baseline" else ("0", "lockfree")
        assert f'pharos_fwd_threading{{masters="{masters}",queue="{queue}",scheduler="weights"}} 1' in text
    served_inline = re.search(r"^pharos_fwd_served_inline_total (\S+)$", text, re.M)
    assert served_inline, "pharos_fwd_served_inline_total not in /metrics"
    assert (float(served_inline.group(1)) > 0) == (kind == "default")


def test_masters_serve_many_raw_connections_and_survive_a_closed_one(stack):
    """More connections than masters, each with a request in flight, and one that closes in
    the middle of a frame: every other gets its answer."""
    _kind, c, d, _m = stack
    socks = [connect(d.port, c.key) for _ in range(12)]
    cut = connect(d.port, c.key)
    cut.sendall(b"\x40\x00\x00\x00" + b"\x00" * 10)  # a 64-byte frame announced, 10 sent
    cut.close()
    for i, s in enumerate(socks):
        s.sendall(frame(request(100 + i, OP_PING)))
    for i, s in enumerate(socks):
        rid, err, _h, _data = read_reply(s)
        assert (rid, err) == (100 + i, None)
        s.close()


@pytest.mark.parametrize(
    "args,what",
    [
        (("--queue", "spin"), "lockfree or mutex"),
        (("--scheduler", "fifo"), "weights or raas"),
        (("--scheduler", "raas", "--workers", "4", "--raas-min", "2,2,2"), "reserves 6 workers"),
        (("--scheduler", "raas", "--raas-delay-ms", "1,0,5"), "acceptable delay > 0"),
        (("--raas-min", "1,1"), "expected three numbers"),
    ],
)
def test_bad_settings_are_refused_clearly(binaries, tmp_path, args, what):
    c = Cluster(tmp_path)
    base = [str(BIN / "pharos-fwd"), "--mdt", str(tmp_path / "mdt"), "--target", f"ost0={tmp_path}/ost0"]
    r = subprocess.run(
        [*base, "--no-kafka", "--listen", "127.0.0.1:0", "--admin", "127.0.0.1:0", *c.auth_args(), *args],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert r.returncode == 2, r
    assert what in r.stderr, r.stderr
