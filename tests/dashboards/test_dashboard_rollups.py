"""The system-wide panels read the rollups (issue 15, item 2): a range within the last 7 days
reads io_rollup_1s, an older one io_rollup_1m. Both give the same per-minute rows on the
synthetic jobs (an hour old), and the rates add up to the raw records' bytes, requests and
metadata operations (boards/common.py's IS_DATA and META)."""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta

import pytest
from dashboard_check import dashboards, run
from grafana_expand import ALL, Context, expand
from pharos_dashboards.boards.common import IS_DATA, META, READ, ROLLUP_1S_DAYS, WRITE
from pharos_synthetic_jobs import T0, S

from pharos_analytics.summary_sql import META_OPS, READ_OPS, WRITE_OPS, sql_list

#: (dashboard, panel title, series column or None, value column) of panels that read the rollups
#: and whose values are rates (per second over the panel interval).
RATE_PANELS = [
    ("pharos-overview", "Bandwidth by layer", "series", "bandwidth"),
    ("pharos-overview", "IOPS by layer", "series", "iops"),
    ("pharos-overview", "Metadata ops by layer", "layer", "metadata_ops"),
    ("pharos-forwarders", "Load: bandwidth", "forwarding_node", "bandwidth"),
    ("pharos-forwarders", "Load: requests", "forwarding_node", "requests"),
]
OTHER_PANELS = [
    ("pharos-overview", "Jobs doing I/O"),
    ("pharos-overview", "Top jobs by bytes"),
    ("pharos-overview", "Top jobs by metadata ops"),
    ("pharos-forwarders", "Queue wait"),
    ("pharos-forwarders", "Service time"),
    ("pharos-forwarders", "Jobs mapped (served in range)"),
]
#: What the raw records give for each rate panel: per series, the total.
RAW = {
    "Bandwidth by layer": f"SELECT concat(layer, ' ', if(op IN {READ}, 'read', 'write')) AS k, sum(bytes) AS v "
    f"FROM io_requests WHERE {IS_DATA} GROUP BY k",
    "IOPS by layer": f"SELECT concat(layer, ' ', if(op IN {READ}, 'read', 'write')) AS k, sum(count) AS v "
    f"FROM io_requests WHERE {IS_DATA} GROUP BY k",
    "Metadata ops by layer": f"SELECT layer AS k, sum(count) AS v FROM io_requests WHERE op IN {META} GROUP BY k",
    "Load: bandwidth": f"SELECT forwarding_node AS k, sum(bytes) AS v FROM io_requests "
    f"WHERE layer = 'forwarder' AND forwarding_node != '' AND {IS_DATA} GROUP BY k",
    "Load: requests": "SELECT forwarding_node AS k, sum(count) AS v FROM io_requests "
    "WHERE layer = 'forwarder' AND forwarding_node != '' GROUP BY k",
}


def ctx(days_back: float) -> Context:
    """Per-minute panels (interval 60 s, so both rollups fill the same buckets) over a range from
    ``days_back`` days ago to a minute from now; every multi-value variable at All."""
    now = datetime.fromtimestamp(time.time(), UTC)
    values = {"layer": [ALL], "node": [ALL], "topn": "50"}
    return Context(
        time_from=now - timedelta(days=days_back), time_to=now + timedelta(minutes=1), interval_s=60, values=values
    )


def panel_sql(uid: str, title: str) -> str:
    (sql,) = [t["rawSql"] for p in dashboards()[uid]["panels"] if p["title"] == title for t in p.get("targets", [])]
    assert "io_rollup_1s" in sql and "io_rollup_1m" in sql and "io_requests" not in sql, title
    return sql


def rows(store, uid: str, title: str, c: Context) -> list[dict]:
    got, _ = run(store, expand(panel_sql(uid, title), c))
    return sorted(got, key=lambda r: tuple(str(v) for v in r.values()))


def recent_days() -> float:
    """Days back to 10 minutes before the synthetic jobs (the 1 s rollup), from now: computed when
    a test runs, not at import (the suite may reach this module long after collection, and a range
    computed then would begin after the jobs)."""
    return (time.time() * S - T0 + 600 * S) / S / 86400


OLD = ROLLUP_1S_DAYS + 1  # older than the 1 s rollup keeps: the 1 min rollup


@pytest.mark.parametrize(("uid", "title", "series", "value"), RATE_PANELS, ids=[p[1] for p in RATE_PANELS])
def test_rate_panels_both_rollups_equal_the_raw_records(store, uid, title, series, value):
    recent, old = rows(store, uid, title, ctx(recent_days())), rows(store, uid, title, ctx(OLD))
    assert recent and recent == old
    totals: dict[str, float] = {}
    for r in recent:
        totals[r[series]] = totals.get(r[series], 0.0) + float(r[value]) * 60  # per second x 60 s buckets
    raw = {r["k"]: float(r["v"]) for r in store.query(RAW[title]) if float(r["v"]) > 0}
    assert totals.keys() == raw.keys() and all(totals[k] == pytest.approx(raw[k]) for k in raw), (totals, raw)


@pytest.mark.parametrize(("uid", "title"), OTHER_PANELS, ids=[p[1] for p in OTHER_PANELS])
def test_other_panels_same_from_both_rollups(store, uid, title):
    recent, old = rows(store, uid, title, ctx(recent_days())), rows(store, uid, title, ctx(OLD))
    assert recent
    if title == "Queue wait":  # p99 only from the 1 s rollup (its quantile state); the means agree
        assert [(r["time"], r["forwarding_node"], r["mean"]) for r in recent] == [
            (r["time"], r["forwarding_node"], r["mean"]) for r in old
        ]
        assert all(r["p99"] >= 0 for r in recent)
    elif title == "Jobs mapped (served in range)":  # last request: the second vs the minute it fell in
        drop = "last_request"
        assert [{k: v for k, v in r.items() if k != drop} for r in recent] == [
            {k: v for k, v in r.items() if k != drop} for r in old
        ]
    else:
        assert recent == old


def test_metadata_ops_are_the_dashboards_meta_set():
    """011's SQL names the same operation sets as the dashboards (READ, META)."""
    from pharos_core.store import migration_files

    (sql,) = [q for _, n, q in migration_files() if n.startswith("011_")]
    assert sql_list(META_OPS) == META and sql_list(READ_OPS) == READ and sql_list(WRITE_OPS) == WRITE
    # two views and two backfills, each: metadata ops, data reads and bytes read, data writes and bytes written
    assert sql.count(META) == 4 and sql.count(READ) >= 8 and sql.count(WRITE) >= 8
    assert "file_type = 'regular' AND op IN" in sql and IS_DATA.startswith("(file_type = 'regular' AND op IN")
