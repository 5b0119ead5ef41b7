"""The anomaly annotations' text (every dashboard shares it: pharos_dashboards.boards.common), on
chDB: how slow, as ``pharos anomalies`` says it. A forwarding node named by its waits (a stall)
has a service ratio of ~1, so its text gives the added wait of the shortest window that named it
(pharos_analytics.failslow.stall_added_ms), not "x1.0"."""

from __future__ import annotations

import json
import time
from datetime import UTC, datetime

from dashboard_check import dashboards, run
from grafana_expand import Context, expand
from pharos_dashboard_rows import anomaly

from pharos_analytics.failslow import stall_added_ms
from pharos_api.cli_system import _stall

#: A stall: named by its waits in the 1 h and 4 h windows (41.6 and 80 ms more than its peers);
#: the 12 h window saw it slow by service (no stall figure), the 96 h one not at all.
STALL = {
    "3600": {"model_slow": True, "stall_added_ms": 41.6, "ratio": 1.02},
    "14400": {"model_slow": True, "stall_added_ms": 80.0},
    "43200": {"model_slow": True, "stall_added_ms": None, "ratio": 2.2},
    "345600": {"model_slow": False, "stall_added_ms": 12.0},
    "method": "bayes",
}


def test_a_stall_says_its_added_wait_and_a_slow_node_its_ratio(store):
    stalled = anomaly("fail_slow_forwarder", "fwd9", "forwarder", 60, persistence="persistent", ratio=1.02)
    older = anomaly("fail_slow_forwarder", "fwd9", "forwarder", 90, persistence="transient", ratio=1.01)
    older["evidence"] = json.dumps(
        {"3600": {"model_slow": True, "stall_added_ms": 7.0}}
    )  # the latest counts (its persistence too)
    stalled["evidence"] = json.dumps(STALL)
    # the service-slow window alone: no stall figure
    slow = anomaly("fail_slow_forwarder", "fwd8", "forwarder", 60, persistence="persistent", ratio=2.46)
    slow["evidence"] = json.dumps({"43200": STALL["43200"], "oops": {"model_slow": True, "stall_added_ms": 9}})
    store.insert_rows("anomalies", [older, stalled, slow])

    sql = next(a["target"]["rawSql"] for a in dashboards()["pharos-forwarders"]["annotations"]["list"] if "target" in a)
    now = time.time()
    ctx = Context(time_from=datetime.fromtimestamp(now - 3600, UTC), time_to=datetime.fromtimestamp(now + 60, UTC))
    rows, cols = run(store, expand(sql, ctx))
    assert "String" in cols["text"]
    text = {r["title"]: r["text"] for r in rows}
    want = _stall(stall_added_ms(STALL))
    assert want == "stall +42 ms wait"
    assert text["fail_slow_forwarder fwd9"] == f"{want}, persistent, active"
    assert stall_added_ms(json.loads(slow["evidence"])) is None
    assert text["fail_slow_forwarder fwd8"] == "x2.46, persistent, active"
    # the other anomalies of the synthetic rows keep their ratio
    assert text["fail_slow_forwarder fwd1"].startswith("x2.5")
    assert text["interference fwd0 (job mix)"].startswith("x5, culprit job n1")
