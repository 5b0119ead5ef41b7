"""Issue 28 item 3: a control cycle reads the forwarding nodes' capacity, loads and holders once,
not once per job (2,000 jobs at TaihuLight's scale: 75 s a cycle, docs/operations.md), and
records its DFRA decisions in one insert; holders are read again after an allocation is written.
The histories of its new jobs are read at once (one history query, one metrics read). On a real
chDB store."""

from __future__ import annotations

import json

import control_rows as cr

from pharos_analytics.control import dfra, state
from pharos_analytics.control.config import ControlConfig
from pharos_analytics.control.loop import ControlLoop
from pharos_analytics.profiles import JOB_METRICS_SQL
from pharos_core.settings import Settings

S = cr.NS
T0 = 1_772_100_000 * S


class Counting:
    """The real store, counting queries by SQL text and inserts by table."""

    def __init__(self, store):
        self.store, self.queries, self.inserts = store, {}, {}

    def query(self, sql, params=None):
        self.queries[sql] = self.queries.get(sql, 0) + 1
        return self.store.query(sql, params)

    def insert_rows(self, table, rows):
        self.inserts[table] = self.inserts.get(table, 0) + 1
        return self.store.insert_rows(table, rows)

    def __getattr__(self, name):
        return getattr(self.store, name)


def test_a_cycle_reads_capacity_loads_and_holders_once_for_all_its_jobs(store):
    jobs = [f"memo{i}" for i in range(6)]
    for i, j in enumerate(jobs):
        store.insert_rows("job_events", cr.job_events(j, T0 + i * S, None, f"app{i}"))
        store.insert_rows("io_requests", cr.requests(j, T0 + i * S, 2, 8, fwd=f"fwd{i % 2}"))
    cfg = ControlConfig(dry_run=True, placement_enabled=False, active_job_max_age_s=3600.0)
    counted = Counting(store)
    loop = ControlLoop(counted, Settings(), lambda: cfg)
    now = T0 + 30 * S
    summary = loop.cycle(now_ns=now)
    assert summary["decisions"] == len(jobs)
    q = counted.queries
    assert q[state.CAPACITY_SQL] == 1 and q[state.LOAD_SQL] == 1 and q[state.ALLOCATIONS_SQL] == 1, q
    assert counted.inserts["control_actions"] == 1  # the cycle's decisions: one insert
    rows = store.query("SELECT job_id FROM control_actions WHERE kind LIKE 'dfra_%' AND job_id LIKE 'memo%'")
    assert sorted(r["job_id"] for r in rows) == jobs
    # Outside a cycle nothing is kept: each call reads the store.
    before = q[state.CAPACITY_SQL]
    loop.node_capacity(now)
    loop.node_capacity(now)
    assert q[state.CAPACITY_SQL] == before + 2
    # Within one, an allocation written is seen by the next holders read.
    with loop.memo_cycle():
        assert loop._holders().get("fwd9", "") == ""
        loop._hold(["fwd9"], "memo0", "test", now)
        assert loop._holders()["fwd9"] == "memo0"
        assert loop._holders()["fwd9"] == "memo0"
    assert q[state.ALLOCATIONS_SQL] == 1 + 2


def _metrics_reads(counted: Counting) -> int:
    """Calls of ``profiles.job_metrics`` (its per-(job, layer) query, one a call)."""
    head = JOB_METRICS_SQL[: JOB_METRICS_SQL.index("__WHERE__")]
    return sum(n for sql, n in counted.queries.items() if sql.startswith(head))


def test_a_cycle_reads_the_histories_of_all_its_new_jobs_at_once(store):
    """The histories of a cycle's new jobs: one history query and one metrics read for all of
    them, not two per job (2,000 jobs at TaihuLight's scale: 11.7 s); each decision's history is
    the job's own (``job_history``)."""
    apps = [(f"hist{a}", user) for a in range(4) for user in ("alice", "bob")]
    for i, (name, user) in enumerate(apps):  # earlier runs: ended, with I/O, one without a command match
        for r in range(3):
            job = f"{name}-{user}-r{r}"
            t = T0 - (600 - 60 * r - i) * S
            cmd = [name] if r < 2 else [name, "--other"]
            store.insert_rows("job_events", cr.job_events(job, t, t + 20 * S, name, user, cmd))
            store.insert_rows("io_requests", cr.requests(job, t, 2, 4 + r + i, fwd="fwd0"))
    new = []
    for i in range(12):  # new jobs: 1-2 of each app, and two of a name never run
        name, user = apps[i % len(apps)] if i < 10 else (f"fresh{i}", "alice")
        job = f"hnew{i}"
        store.insert_rows("job_events", cr.job_events(job, T0 + i * S, None, name, user, [name]))
        new.append((job, name, user, [name]))
    cfg = ControlConfig(dry_run=True, placement_enabled=False, active_job_max_age_s=3600.0, dfra_model_enabled=False)
    counted = Counting(store)
    loop = ControlLoop(counted, Settings(), lambda: cfg)
    summary = loop.cycle(now_ns=T0 + 30 * S)
    assert summary["decisions"] == len(new)
    assert counted.queries[dfra.HISTORY_SQL] == 1 and _metrics_reads(counted) == 1, counted.queries
    rows = store.query("SELECT job_id, evidence FROM control_actions WHERE kind LIKE 'dfra_%' AND job_id LIKE 'hnew%'")
    got = {r["job_id"]: json.loads(r["evidence"]) for r in rows}
    assert sorted(got) == sorted(j for j, *_ in new)
    for job, name, user, command in new:
        h = dfra.job_history(store, name, user, command, cfg, job_id=job)
        assert got[job].get("jobs", []) == (h.jobs if h else []), job
        assert got[job].get("runs", 0) == (2 if not name.startswith("fresh") else 0), job
    assert got["hnew0"]["jobs"] == ["hist0-alice-r1", "hist0-alice-r0"]  # r2 ran another command
