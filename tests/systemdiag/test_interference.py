"""Interference on real chDB: a light job alone on fwd0, then a heavy job joins it on fwd0
(forced onto one forwarding node) versus on fwd1 (separate nodes); same targets, same seed."""

from __future__ import annotations

import pharos_sysdiag_sim as sim

from pharos_analytics.diagnosis_config import DiagnosisConfig
from pharos_analytics.interference import detect_interference, job_interference

CFG = DiagnosisConfig(interference_window_s=5)


def _scenario(store, k: int, heavy_fwd: str, tag: str):
    cl = sim.Cluster(fwd_nodes=["fwd0", "fwd1"], fwd_capacity_mb_s=100)
    t0 = (1_710_000_000 + k * 7200) * sim.NS
    jobs = [
        sim.SimJob(
            f"light-{tag}", ["fwd0"], 20, req_bytes=256 << 10, targets=["ost0", "ost1", "ost2", "ost3"], name="light"
        ),
        sim.SimJob(f"heavy-{tag}", [heavy_fwd], 140, start_s=30, name="heavy"),
    ]
    sim.insert(store, sim.simulate(cl, jobs, t0, 90, seed=7))
    return t0, detect_interference(store, CFG, since_ns=t0, until_ns=t0 + 90 * sim.NS)


def test_shared_forwarding_node_names_heavy_job(store):
    t0, events = _scenario(store, 0, "fwd0", "same")
    assert events, "no interference event"
    (e,) = [e for e in events if e.job_id == "light-same"]
    assert (e.culprit_job, e.resource_type, e.resource) == ("heavy-same", "forwarding_node", "fwd0")
    assert e.baseline_source == "quiet_windows" and e.baseline_windows == 6
    assert e.start_ns == t0 + 30 * sim.NS and e.latency_ratio >= 3 and e.queue_wait_ms > 100 * e.baseline_queue_wait_ms
    assert not [x for x in events if x.job_id == "heavy-same"]  # never alone, no earlier run: no baseline
    print(
        f"light slowed {e.latency_ratio}x (queue wait {e.baseline_queue_wait_ms} -> {e.queue_wait_ms} ms) "
        f"by {e.culprit_job} on {e.resource_type} {e.resource}, {e.windows} windows"
    )
    r = job_interference(store, "light-same", CFG)
    assert [x["culprit_job"] for x in r["events"]] == ["heavy-same"]
    assert sum(1 for w in r["shared_windows"] if w["shared"]) == 12


def test_separate_forwarding_nodes_no_interference(store):
    _, events = _scenario(store, 1, "fwd1", "sep")
    assert events == []
    r = job_interference(store, "light-sep", CFG)
    # they still share targets (never saturated): windows are shared, none interfered
    assert r["events"] == [] and any(w["shared"] for w in r["shared_windows"])


def test_previous_run_baseline(store):
    """A job never alone in this run is judged against the quiet windows of its previous run."""
    cl = sim.Cluster(fwd_nodes=["fwd0"], fwd_capacity_mb_s=100)
    t0 = 1_720_000_000 * sim.NS
    sim.insert(
        store,
        sim.simulate(cl, [sim.SimJob("light-run1", ["fwd0"], 20, req_bytes=256 << 10, name="lightp")], t0, 30, seed=8),
    )
    t1 = t0 + 600 * sim.NS
    jobs = [
        sim.SimJob("light-run2", ["fwd0"], 20, req_bytes=256 << 10, name="lightp"),
        sim.SimJob("heavy-run2", ["fwd0"], 140, name="heavyp"),
    ]
    sim.insert(store, sim.simulate(cl, jobs, t1, 30, seed=9))
    events = detect_interference(store, CFG, since_ns=t1, until_ns=t1 + 30 * sim.NS, job_ids=["light-run2"])
    assert [(e.culprit_job, e.baseline_source) for e in events] == [("heavy-run2", "previous_run:light-run1")]
    # the runs of many names in one query: what the query per name gives, spans read ahead alike
    from pharos_analytics.interference import _Lookups

    one, many = (_Lookups(store, t0, t1 + 30 * sim.NS, {}, {}) for _ in range(2))
    many.prefetch_runs(["lightp", "heavyp", "nosuchname", ""])
    assert many.runs_by_name == {n: one.runs(n) for n in ("lightp", "heavyp", "nosuchname")}
    assert [r["job_id"] for r in many.runs_by_name["lightp"]] == ["light-run2", "light-run1"]
    assert many.spans == one.spans and many.spans["light-run1"]["n"] > 0


def test_rollup_gives_the_events_of_the_raw_records(store):
    """Interference reads the per-second rollup (issue 15: a cycle's cost grows with seconds and
    objects, not records); on whole-second windows it finds exactly what the raw records give:
    same events (culprit, resource, windows, latencies, baseline), same per-window view, and the
    previous-run baseline found through the per-minute rollup."""
    from dataclasses import asdict

    def strip(events):
        return [asdict(e) | {"detected_ns": 0} for e in events]

    t0, _ = _scenario(store, 3, "fwd0", "eq")
    cl = sim.Cluster(fwd_nodes=["fwd0"], fwd_capacity_mb_s=100)
    t1 = 1_730_000_000 * sim.NS
    run1 = [sim.SimJob("lq-run1", ["fwd0"], 20, req_bytes=256 << 10, name="lq")]
    sim.insert(store, sim.simulate(cl, run1, t1, 30, seed=8))
    t2 = t1 + 600 * sim.NS
    pair = [sim.SimJob("lq-run2", ["fwd0"], 20, req_bytes=256 << 10, name="lq"), sim.SimJob("hq-run2", ["fwd0"], 140)]
    sim.insert(store, sim.simulate(cl, pair, t2, 30, seed=9))
    for since, until, jobs in ((t0, t0 + 90 * sim.NS, None), (t2, t2 + 30 * sim.NS, ["lq-run2"])):
        raw = detect_interference(store, CFG, since_ns=since, until_ns=until, job_ids=jobs, read_from="raw")
        rolled = detect_interference(store, CFG, since_ns=since, until_ns=until, job_ids=jobs, read_from="rollup")
        assert raw and strip(rolled) == strip(raw)
    assert [e.baseline_source for e in raw] == ["previous_run:lq-run1"]
    # the previous run inside the range already loaded: judged from those sums, the same event
    for how in ("raw", "rollup"):
        wide = detect_interference(
            store, CFG, since_ns=t1, until_ns=t2 + 30 * sim.NS, job_ids=["lq-run2"], read_from=how
        )
        assert strip(wide) == strip(raw), how
    for job in ("light-eq", "lq-run2"):
        a, b = (job_interference(store, job, CFG, read_from=x) for x in ("raw", "rollup"))
        assert a["shared_windows"] and b["shared_windows"] == a["shared_windows"]
        assert [e | {"detected_ns": 0} for e in b["events"]] == [e | {"detected_ns": 0} for e in a["events"]]


def test_own_slow_target_blames_no_co_located_job(store):
    """A job slowed by its own slow target (service time up 5x from 30 s, no queue wait) while a
    small job shares its forwarding node on other targets: no forwarding node and no job is
    blamed (issue 24's fault-injection suite found that event: the co-located job was named)."""
    cl = sim.Cluster(fwd_nodes=["fwd0", "fwd1"], fwd_capacity_mb_s=400)
    t0 = (1_710_000_000 + 9 * 7200) * sim.NS  # hours apart from the other scenarios
    jobs = [
        sim.SimJob("own", ["fwd0"], 20, req_bytes=256 << 10, targets=["ost0", "ost1"], name="own"),
        sim.SimJob("small", ["fwd0"], 2, req_bytes=256 << 10, targets=["ost4", "ost6"], start_s=30, name="small"),
    ]
    faults = [sim.Fault("target", "ost0", 5.0, start_s=30)]
    sim.insert(store, sim.simulate(cl, jobs, t0, 90, seed=11, faults=faults))
    r = job_interference(store, "own", CFG)
    assert any(w["shared"] for w in r["shared_windows"]), "the jobs must share fwd0"
    shared = [w["latency_ms"] for w in r["shared_windows"] if w["shared"]]
    quiet = [w["latency_ms"] for w in r["shared_windows"] if not w["shared"]]
    assert quiet and min(shared) > 2 * max(quiet), "ost0's slowdown must raise the job's latency"
    assert r["events"] == [], r["events"]


def test_a_job_that_barely_used_the_node_is_not_blamed(store):
    """fwd0 turns slow at 30 s (queue wait up for every job on it) as a tiny job (0.5 MB/s, a few
    requests in service per window) joins: the tiny job did not hold the node, no event names it."""
    cl = sim.Cluster(fwd_nodes=["fwd0", "fwd1"], fwd_capacity_mb_s=60)
    t0 = (1_710_000_000 + 10 * 7200) * sim.NS
    jobs = [
        sim.SimJob("busy", ["fwd0"], 40, req_bytes=256 << 10, targets=["ost0", "ost2"], name="busy"),
        sim.SimJob("tiny", ["fwd0"], 0.5, req_bytes=64 << 10, targets=["ost6"], start_s=30, name="tiny"),
    ]
    sim.insert(store, sim.simulate(cl, jobs, t0, 90, seed=12, faults=[sim.Fault("forwarder", "fwd0", 3.0, start_s=30)]))
    r = job_interference(store, "busy", CFG)
    qw = [w["queue_wait_ms"] for w in r["shared_windows"] if w["shared"]]
    assert qw and min(qw) > 1.0, "the slow node must raise the busy job's queue wait"
    assert r["events"] == [], r["events"]


def test_window_indexes_equal_their_definitions(store):
    """The indexes the detection reads (``shared``, ``co_bytes``: the store's ``INDEX_SQL``; the
    baseline's ``_Usual``, each job's windows) equal the per-(job, window) scans they replace, on
    a random usage of 12 jobs over 30 resources; the usage itself is read only when asked."""
    import random

    from pharos_analytics.interference import _JobWindows, _Usual, _Windows

    rnd = random.Random(5)
    resources = [("forwarding_node", f"fwd{i}") for i in range(6)] + [("target", f"ost{i}") for i in range(24)]
    rows = [  # the usage query's rows (window, resource type, resource, job, n, bytes, svc_ns)
        (w, *res, j, 1, rnd.randint(1, 10**6), rnd.randint(1, 1000))
        for w in range(40)
        for j in (f"job{k}" for k in range(12))
        for res in rnd.sample(resources, rnd.randint(0, 4))
    ]
    rnd.shuffle(rows)  # in no particular order, as a GROUP BY gives them
    cols = "w UInt64, rtype String, res String, job_id String, n UInt64, bytes UInt64, svc_ns UInt64"
    usage_sql = (
        f"SELECT * FROM values('{cols}', "
        + ", ".join(f"({w}, '{t}', '{r}', '{j}', {n}, {b}, {v})" for w, t, r, j, n, b, v in rows)
        + ")"
    )
    by_w = _Windows.read(store, usage_sql, {})
    assert by_w._by_w is None  # not read yet: the indexes are
    assert sum(len(jobs) for w in range(40) for jobs in (by_w.get(w) or {}).values()) == len(rows)
    for w, rt, r, j, _, b, _ in rows:
        assert by_w[w][(rt, r)][j]["bytes"] == b
    assert sorted(by_w.shared) == sorted({(j, w) for w, _, _, j, *_ in rows})
    assert by_w.shared and any(by_w.shared.values()) and not all(by_w.shared.values())
    for j, w in by_w.shared:
        res = by_w.resources(j, w)
        assert res == sorted((t, r) for x, t, r, k, *_ in rows if (k, x) == (j, w))
        others = {o for r in res for o in by_w[w][r]} - {j}
        assert by_w.shared[(j, w)] == bool(others)
        assert by_w.co_bytes[(j, w)] == sum(st["bytes"] for r in res for o, st in by_w[w][r].items() if o != j)
    base = sorted({w for (j, w) in by_w.shared if j == "job3"})[:10]
    usual: dict = {}
    for w in base:  # the eager sum the detection did before
        for r in by_w.resources("job3", w):
            for o, st in by_w[w][r].items():
                usual[(o, r)] = usual.get((o, r), 0.0) + st["bytes"] / len(base)
    lazy = _Usual(by_w, "job3", base)
    assert usual and all(lazy.get(k) == v for k, v in usual.items())
    assert lazy.get(("job99", resources[0])) == 0.0 and _Usual(by_w, "job3", []).get(next(iter(usual))) == 0.0
    # each job's windows, oldest first, as the scan of every (job, window) gave them
    jobw = _JobWindows(((j, w), {"n": 1}) for (j, w) in rnd.sample(sorted(by_w.shared), len(by_w.shared)))
    for j in {j for j, _ in by_w.shared}:
        assert jobw.windows(j) == sorted(w for (k, w) in jobw if k == j)
    assert jobw.windows("job99") == [] and sorted(jobw.of) == sorted({j for j, _ in by_w.shared})
    # with an occupancy: only the resources some job occupied (svc_ns >= occ) are read, the
    # indexes still count every resource
    occ = sorted(v for *_, v in rows)[len(rows) * 9 // 10]
    busy = _Windows.read(store, usage_sql, {"occ": occ})
    assert busy.shared == by_w.shared and busy.co_bytes == by_w.co_bytes
    kept = {(w, (t, r)) for w, t, r, _, _, _, v in rows if v >= occ}
    assert kept and {(w, res) for w in range(40) for res in busy[w]} == kept
    for w, res in kept:
        assert busy[w][res] == by_w[w][res]


def test_earlier_runs_spans_read_for_the_range_only():
    """The detection pass reads ahead the exact spans of the earlier runs of its jobs' names that
    ended in the hour before its range or inside it, not of every run of the name (at 1 B stored
    records and 10,000 runs of one name that read was 4 s of a 9 s diagnosis); one job's
    interference (``pharos diagnose``) reads none ahead."""
    from pharos_analytics.interference import _Lookups

    class Store:  # records the job ids whose spans are asked for; pure logic
        def __init__(self):
            self.asked: list[list[str]] = []

        def query(self, sql, params):
            if "jobs" in params:
                self.asked.append(sorted(params["jobs"]))
                return [{"job_id": j, "first_ns": 0, "last_ns": 0, "n": 1} for j in params["jobs"]]
            return [{"job_id": f"r{m}", "last_minute": m * 60} for m in range(100, 0, -1)]  # newest first

    s = Store()
    hour = 3600 * 10**9
    seen = _Lookups(s, since_ns=50 * 60 * 10**9 + hour, until_ns=70 * 60 * 10**9 + hour, by_w={}, jobw={})
    seen.runs("ior")
    (asked,) = s.asked  # one query: the runs that ended in [since - 1 h, until) = minutes 50..100
    assert set(asked) == {f"r{m}" for m in range(50, 101)}
    s2 = Store()
    _Lookups(s2, 0, 0, {}, {}).runs("ior")  # no range: nothing read ahead
    assert s2.asked == []
    s3 = Store()
    _Lookups(s3, 50 * 60 * 10**9 + hour, 70 * 60 * 10**9 + hour, {}, {}, read_ahead=False).runs("ior")
    assert s3.asked == []  # one job: its search reads spans one by one


def test_a_window_builds_only_the_resources_asked():
    """The usage of a window (``_WindowUsage``) keeps each resource's jobs as the grouped query's
    arrays and makes the job dictionary of a resource on its first ask only (the detection asks
    for the resources of interfered windows: building all of them was ~6 s of a 23 s cycle at
    40,960 simulated nodes)."""
    from pharos_analytics.interference_usage import _grouped, _Windows

    rows = {  # GROUPED_SQL's columns: a row per (window, resource), the jobs' sums as arrays
        "w": [7, 7],
        "rtype": ["target", "forwarding_node"],
        "res": ["ost0", "fwd0"],
        "jobs": [["a", "b"], ["a"]],
        "ns": [[3, 4], [4]],
        "bs": [[10, 11], [5]],
        "svs": [[100, 101], [50]],
    }
    by_w = _Windows({("a", 7): True}, {("a", 7): 5}, lambda: _grouped(rows))
    win = by_w[7]
    assert set(win) == {("target", "ost0"), ("forwarding_node", "fwd0")} and len(win) == 2
    assert win._built == {}, "nothing built before an ask"
    assert win[("target", "ost0")] == {
        "a": {"n": 3, "bytes": 10, "svc_ns": 100},
        "b": {"n": 4, "bytes": 11, "svc_ns": 101},
    }
    assert list(win._built) == [("target", "ost0")], "only the resource asked"
    assert win.get(("target", "ost9"), {}) == {} and ("forwarding_node", "fwd0") in win
    assert dict(win.items())[("forwarding_node", "fwd0")] == {"a": {"n": 4, "bytes": 5, "svc_ns": 50}}
    assert by_w.get(8) is None and by_w.shared[("a", 7)] and by_w.co_bytes[("a", 7)] == 5


def test_cycles_keep_settled_windows_and_find_the_same_events(store):
    """The periodic detection keeps the windows that ended ``interference_settle_s`` before a
    cycle (``UsageCache``) and reads only the rest: cycle after cycle it finds the events a whole
    read of the same range finds, and each cycle's read starts at the first window not settled
    at the cycle before (at 40,960 simulated nodes the whole look-back was re-read every 10 s)."""
    from dataclasses import asdict

    from pharos_analytics.interference_sql import INDEX_SQL
    from pharos_analytics.interference_usage import UsageCache
    from pharos_core.store import ns_to_datetime64

    cfg = DiagnosisConfig(interference_window_s=5, interference_settle_s=10)
    t0, _ = _scenario(store, 4, "fwd0", "inc")
    reads: list[str] = []
    query_columns = store.query_columns

    def spy(sql, params=None):
        if sql.startswith(INDEX_SQL.split("__USAGE__")[0]):
            reads.append(params["since"])
        return query_columns(sql, params)

    cache = UsageCache()
    store.query_columns = spy
    try:
        found, prev = [], None
        for k in (2, 3, 5, 7, 9):
            until = t0 + k * 10 * sim.NS
            reads.clear()
            kept = detect_interference(store, cfg, since_ns=t0, until_ns=until, cache=cache)
            mine = [r for r in reads if r >= ns_to_datetime64(t0)]  # not earlier runs' baselines
            assert mine == [ns_to_datetime64(t0 if prev is None else prev - 10 * sim.NS)], (k, reads)
            prev = until
            whole = detect_interference(store, cfg, since_ns=t0, until_ns=until)
            assert [asdict(e) | {"detected_ns": 0} for e in kept] == [asdict(e) | {"detected_ns": 0} for e in whole]
            found += kept
            assert max(cache.parts) == (until - 10 * sim.NS) // (5 * sim.NS) - 1  # the last settled window
    finally:
        del store.query_columns
    assert any(e.job_id == "light-inc" and e.culprit_job == "heavy-inc" for e in found)
    assert cache.reads == 5
    # another window width empties it
    detect_interference(
        store,
        DiagnosisConfig(interference_window_s=10, interference_settle_s=10),
        since_ns=t0,
        until_ns=t0 + 90 * sim.NS,
        cache=cache,
    )
    assert cache.parts and all(t0 <= w * 10 * sim.NS < t0 + 90 * sim.NS for w in cache.parts)
