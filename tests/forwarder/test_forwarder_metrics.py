"""``GET /metrics`` of a real forwarding daemon and FUSE mount (prometheus-client, OpenMetrics
text, parsed strictly by prometheus_client's parser): the families exist, they count what
``/status`` counts (one counting path), they move with real fio I/O, and a killed daemon shows
as failovers and failures on the mount."""

from __future__ import annotations

import pytest
from forwarder_testkit import fio, http
from pharos_testkit import sample, scrape


@pytest.mark.timeout(120)
def test_daemon_and_mount_metrics_follow_real_io(cluster):
    d0, d1 = cluster.start_daemon("fwd0"), cluster.start_daemon("fwd1")
    m = cluster.start_mount([d0, d1], 0)
    before = scrape(d0.admin + "/metrics")
    assert sample(before, "pharos_fwd_requests_total", **{"class": "large"}) == 0
    assert sample(before, "pharos_build_info", service="fwd", node="fwd0") == 1

    fio("--name=w", f"--filename={m.path / 'f'}", "--rw=write", "--bs=1M", "--size=8M", job="7")
    st = d0.status()["counters"]
    got = scrape(d0.admin + "/metrics")
    for cls in ("metadata", "small", "large"):
        assert sample(got, "pharos_fwd_requests_total", **{"class": cls}) == st[f"served_{cls}"]
    assert st["served_large"] >= 8
    assert sample(got, "pharos_fwd_bytes_total", direction="write") == st["bytes_written"] == 8 << 20
    assert sample(got, "pharos_fwd_request_errors_total") == st["errors"]
    assert sample(got, "pharos_fwd_replies_not_sent_total") == st["reply_failures"] == 0
    # --no-kafka: every record counted as not shipped, none dropped silently
    assert sample(got, "pharos_fwd_records_produced_total") == d0.status()["records"]["produced"] > 0
    assert sample(got, "pharos_fwd_records_dropped_total", reason="not_shipped") > 0
    # the data requests' service time and queue wait, per op kind and per target
    assert sample(got, "pharos_fwd_service_seconds_count", op="write") >= 8
    assert sample(got, "pharos_fwd_service_seconds_sum", op="write") > 0
    data = sum(sample(got, "pharos_fwd_service_seconds_count", op=op) for op in ("read", "write"))
    assert sample(got, "pharos_fwd_dequeued_requests_total") == data  # reads and writes queue per target
    assert sample(got, "pharos_fwd_queue_wait_seconds_total") > 0
    assert {lab["target"] for lab, _ in got["pharos_fwd_queue_wait_seconds_total"]} == {
        f"ost{i}" for i in range(cluster.n_targets)
    }
    assert "pharos_fwd_target_metrics_batches_total" in got

    mm = scrape(m.admin + "/metrics")
    ms = m.status()
    assert sample(mm, "pharos_build_info", service="mount") == 1
    assert sample(mm, "pharos_mount_fuse_operations_total") == ms["ops"] > 0
    nodes = {n["name"]: n for n in ms["nodes"]}
    assert sample(mm, "pharos_mount_requests_total", node="fwd0") == nodes["fwd0"]["requests"] > 0
    assert sample(mm, "pharos_mount_requests_total", node="fwd1") == 0
    assert sample(mm, "pharos_mount_failovers_total") == 0

    # fwd0 dies: the next writes fail over to fwd1, and the mount's metrics say so
    d0.proc.kill()
    d0.proc.wait()
    fio("--name=w", f"--filename={m.path / 'g'}", "--rw=write", "--bs=1M", "--size=2M", job="7")
    mm = scrape(m.admin + "/metrics")
    assert sample(mm, "pharos_mount_failovers_total") >= 1
    assert sample(mm, "pharos_mount_request_failures_total", node="fwd0") >= 1
    assert sample(mm, "pharos_mount_node_down", node="fwd0") == 1
    assert sample(mm, "pharos_mount_requests_total", node="fwd1") > 0
    assert http("GET", m.admin + "/status")["failovers"] == sample(mm, "pharos_mount_failovers_total")
