"""The Job dashboard follows a running job (issue 24, item 4): it refreshes every 10 s up to
``now``, and its Job table links the job id to the dashboard over the job's own run, to ``now``
while it runs (so the heat map grows at each refresh) and to its end (plus a minute) once it
has ended. The Job table's query, expanded as Grafana does, runs on chDB for a running job
("n1": a start event, no end) and a finished one ("mix")."""

from __future__ import annotations

import re
import time
from datetime import UTC, datetime

from dashboard_check import dashboards, run
from grafana_expand import Context, expand
from pharos_dashboards.boards.job import FOLLOW_MARGIN_MS, REFRESH
from pharos_synthetic_jobs import EVENTS, T0, S


def job_table(store, job: str) -> dict:
    dash = dashboards()["pharos-job"]
    (panel,) = [p for p in dash["panels"] if p["title"] == "Job"]
    ctx = Context(
        time_from=datetime.fromtimestamp(T0 / S - 600, UTC),
        time_to=datetime.fromtimestamp(time.time() + 60, UTC),
        values={"job": job, "layer": ["$__all"], "rank": ["$__all"]},
    )
    rows, _ = run(store, expand(panel["targets"][0]["rawSql"], ctx))
    assert len(rows) == 1, rows
    return rows[0]


def event_ms(job: str, kind: str) -> int:
    (e,) = [e for e in EVENTS if e["job_id"] == job and e["kind"] == kind]
    sec, ns = e["time"].split(".")  # pharos_core.store.ns_to_datetime64's text
    return int(sec) * 1000 + int(ns) // 1_000_000


def test_job_dashboard_refreshes_up_to_now():
    dash = dashboards()["pharos-job"]
    assert dash["refresh"] == REFRESH == "10s" and dash["time"]["to"] == "now"
    (panel,) = [p for p in dash["panels"] if p["title"] == "Job"]
    (link,) = [
        lk
        for o in panel["fieldConfig"]["overrides"]
        if o["matcher"]["options"] == "job_id"
        for prop in o["properties"]
        if prop["id"] == "links"
        for lk in prop["value"]
    ]
    fields = set(re.findall(r"\$\{__data\.fields\.(\w+)\}", link["url"]))
    assert fields == {"view_from", "view_to"} and "var-job=${__value.raw}" in link["url"]
    assert "refresh=10s" in link["url"] and link["url"].startswith("/d/pharos-job/")


def test_follow_link_of_a_running_job_ends_now_of_a_finished_one_at_its_end(store):
    running = job_table(store, "n1")
    assert running["state"] == "running" and running["view_to"] == "now"
    assert int(running["view_from"]) == event_ms("n1", "start") - FOLLOW_MARGIN_MS
    done = job_table(store, "mix")
    assert done["state"] == "finished"
    assert int(done["view_to"]) == event_ms("mix", "end") + FOLLOW_MARGIN_MS
    assert int(done["view_from"]) == event_ms("mix", "start") - FOLLOW_MARGIN_MS
    assert job_table(store, "failed")["state"] == "failed"
