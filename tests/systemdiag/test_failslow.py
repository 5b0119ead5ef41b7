"""Fail-slow detection on real chDB, simulated target_metrics + forwarder io_requests:
8 targets limited to 50,30,50,20,30,10,50,20 MB/s, proportionate load, one target slowed 4x."""

from __future__ import annotations

import numpy as np
import pharos_sysdiag_sim as sim
from rich.console import Console

from pharos_analytics.diagnosis_config import DiagnosisConfig
from pharos_analytics.failslow import detect_failslow, stall_added_ms
from pharos_analytics.system_diag import failslow_state
from pharos_api.cli_system import anomalies_table

CFG = DiagnosisConfig(failslow_windows_s=[5, 20, 60])
DURATION = 70
# (seed, slowed target): 50, 30, 20, 50 and 30 MB/s targets in turn
RUNS = [(11, "ost2"), (12, "ost1"), (13, "ost3"), (14, "ost6"), (15, "ost4")]


def _run(store, k: int, seed: int, faults, cluster=None, util=0.6):
    cl = cluster or sim.Cluster()
    t0 = (1_700_000_000 + k * 7200) * sim.NS  # each run in its own time range of the one store
    jobs = sim.proportionate_jobs(f"fs{k}", util * sum(cl.targets.values()), cl.fwd_nodes)
    sim.insert(store, sim.simulate(cl, jobs, t0, DURATION, seed=seed, faults=faults))
    return t0, detect_failslow(store, CFG, now_ns=t0 + DURATION * sim.NS)


def _pr(tp, fp, fn):
    return (tp / (tp + fp) if tp + fp else 1.0), (tp / (tp + fn) if tp + fn else 1.0)


def test_slowed_target_flagged_healthy_not_over_5_seeds(store):
    tp = fp = fn = btp = bfp = bfn = 0
    for k, (seed, slow) in enumerate(RUNS):
        _, rep = _run(store, k, seed, [sim.Fault("target", slow, 4.0)])
        flagged = {a.node for a in rep.anomalies if a.kind == "fail_slow_target"}
        beacon = {v.node for v in rep.verdicts if v.kind == "target" and v.beacon_slow}
        tp += slow in flagged
        fn += slow not in flagged
        fp += len(flagged - {slow})
        btp += slow in beacon
        bfn += slow not in beacon
        bfp += len(beacon - {slow})
        assert "ost5" not in flagged  # 10 MB/s by configuration, proportionate load: not fail-slow
        assert not [a for a in rep.anomalies if a.kind == "fail_slow_forwarder"]
        a = next(a for a in rep.anomalies if a.node == slow)
        assert a.persistence == "persistent" and a.active and a.rel_service >= 4
        print(
            f"seed {seed}: slowed {slow} ({sim.LIMITS[int(slow[3:])]} MB/s) -> model {sorted(flagged)}, "
            f"beacon rule {sorted(beacon)}, rel_service {a.rel_service}, z {a.z}"
        )
    p, r = _pr(tp, fp, fn)
    bp, br = _pr(btp, bfp, bfn)
    print(
        f"fail-slow targets over {len(RUNS)} seeds: model precision {p:.2f} recall {r:.2f}; "
        f"Beacon rule (NSDI'19 §5.3, raw bandwidth) precision {bp:.2f} recall {br:.2f}"
    )
    assert (p, r) == (1.0, 1.0)


def test_healthy_cluster_has_no_anomaly(store):
    _, rep = _run(store, 10, 21, [])
    assert rep.anomalies == []
    judged = [v for v in rep.verdicts if v.judged]
    assert len({v.node for v in judged if v.kind == "target"}) == 8  # every target was judged, none flagged


def test_persistent_fault_vs_transient_burst(store):
    _, rep = _run(store, 20, 31, [sim.Fault("target", "ost0", 4.0)])
    (a,) = [a for a in rep.anomalies if a.node == "ost0"]
    assert a.persistence == "persistent" and a.windows_flagged == [5, 20, 60]
    # a 6 s burst at the end: flagged in the 5 s window only
    _, rep = _run(store, 21, 32, [sim.Fault("target", "ost0", 4.0, start_s=DURATION - 6)])
    (b,) = [a for a in rep.anomalies if a.node == "ost0"]
    assert b.persistence == "transient" and b.active and 60 not in b.windows_flagged
    assert b.onset_ns is not None
    print(f"persistent: windows {a.windows_flagged}; burst: windows {b.windows_flagged}")


def test_slow_forwarding_node(store):
    t0, rep = _run(store, 30, 41, [sim.Fault("forwarder", "fwd2", 4.0)])
    kinds = {(a.kind, a.node) for a in rep.anomalies}
    assert kinds == {("fail_slow_forwarder", "fwd2")}
    (a,) = rep.anomalies
    assert a.persistence == "persistent" and 3 <= a.rel_service <= 5.5
    assert a.onset_ns is not None and a.onset_ns <= t0 + (DURATION - 59) * sim.NS


def test_a_slow_forwarding_node_does_not_make_its_targets_look_slow(store):
    """fwd2 slowed 4x (its service times stretched, as a daemon slowed in its own work reports them) while
    it carries one job's I/O to ost5 only, beside jobs on fwd0/fwd1 over every target: fwd2 is
    named, ost5 is not (the suite of issue 24 found a target named for its slow forwarder)."""
    cl = sim.Cluster(fwd_nodes=["fwd0", "fwd1", "fwd2"])
    t0 = (1_700_000_000 + 31 * 7200) * sim.NS
    jobs = sim.proportionate_jobs("fwdonly", 0.5 * sum(cl.targets.values()), ["fwd0", "fwd1"])
    jobs.append(sim.SimJob("fwdonly-ost5", ["fwd2"], 4, targets=["ost5"], name="one-target"))
    sim.insert(store, sim.simulate(cl, jobs, t0, DURATION, seed=43, faults=[sim.Fault("forwarder", "fwd2", 4.0)]))
    rep = detect_failslow(store, CFG, now_ns=t0 + DURATION * sim.NS)
    assert {(a.kind, a.node) for a in rep.anomalies} <= {("fail_slow_forwarder", "fwd2")}
    assert not [a for a in rep.anomalies if a.kind == "fail_slow_target"], rep.anomalies


def test_a_stalled_forwarding_node_is_named_by_its_waits(store):
    """fwd1's daemon not running most of the time (a CPU quota far below its need): a tenth of
    its capacity, so its requests wait (from their receipt) while each one's service stays as
    short as its peers'. The service-time model cannot see it; the waits, with less served than
    its peers, name it (the diagnosis suite's slow_forwarding_node cases, docs/diagnosis.md)."""
    t0, rep = _run(store, 70, 51, [sim.Fault("forwarder_stall", "fwd1", 10.0)])
    assert {(a.kind, a.node) for a in rep.anomalies if a.kind == "fail_slow_forwarder"} == {
        ("fail_slow_forwarder", "fwd1")
    }
    (a,) = [a for a in rep.anomalies if a.node == "fwd1"]
    assert a.active
    e = a.evidence["5"]
    assert e["stall_wait_ms"] >= CFG.failslow_stall_added_ms
    v = next(v for v in rep.verdicts if v.node == "fwd1" and v.window_s == 5)
    assert v.rel_service is not None and v.rel_service < CFG.failslow_min_ratio  # the service model is blind
    assert a.severity == "critical"  # its requests wait seconds (failslow_critical_ratio x the rule's 20 ms)
    # what users see: the wait, not its service ratio (~1x): GET /v1/forwarders' fail_slow and the CLI
    state, _ = failslow_state(store, None, CFG, "fail_slow_forwarder", t0 + DURATION * sim.NS)
    assert state["fwd1"].stall_added_ms == stall_added_ms(a.evidence) == e["stall_added_ms"] > 1000
    console = Console(width=200, record=True)
    console.print(anomalies_table({"source": "live", "as_of": None, "items": [a.to_dict()]}))
    assert f"stall +{e['stall_added_ms']:.0f} ms wait" in console.export_text()
    print(f"stalled fwd1: wait {e['stall_wait_ms']} ms, rel_service {v.rel_service:.2f}, windows {a.windows_flagged}")


def test_a_mild_stall_is_named_whichever_node_served_a_few_more(store):
    """fwd1 at a 4.5th of its capacity: enough, on average, for its share, so it serves as many
    requests as its peers (a few more or fewer, by the draw) while they wait 47-92 ms longer than
    theirs. Named in each of 5 draws (with "no more than the peers' median" it was named only where
    the draw gave it fewer: 1 of these 5); a warning below failslow_critical_ratio x the rule's
    20 ms, critical above."""
    more = 0
    for i, seed in enumerate(range(55, 60)):
        _, rep = _run(store, 72 + i, seed, [sim.Fault("forwarder_stall", "fwd1", 4.5)])
        five = {v.node: v.features for v in rep.verdicts if v.kind == "forwarder" and v.window_s == 5}
        served = five["fwd1"]["ops"] / float(np.median([five[n]["ops"] for n in five if n != "fwd1"]))
        more += served > 1.0
        named = [a for a in rep.anomalies if a.kind == "fail_slow_forwarder"]
        assert [a.node for a in named] == ["fwd1"], (seed, served, five["fwd1"].get("stall_added_ms"))
        added = named[0].evidence["5"]["stall_added_ms"]
        print(f"seed {seed}: fwd1 served {served:.3f} x its peers' median, waited {added} ms more, {named[0].severity}")
        assert named[0].severity == (
            "warning" if added < CFG.failslow_critical_ratio * CFG.failslow_stall_added_ms else "critical"
        )
    assert more >= 3  # the draws this test is for: it served more than its peers' median


def test_a_busier_forwarding_node_that_waits_is_not_stalled(store):
    """fwd1 carries a heavy job besides its share: more than it can serve, so its requests wait
    up to the backlog bound, but it serves more than its peers: its waits are its load (the
    interference pass's), not a stall."""
    cl = sim.Cluster()
    t0 = (1_700_000_000 + 71 * 7200) * sim.NS  # a time range of its own in the module's store
    jobs = sim.proportionate_jobs("busy", 0.3 * sum(cl.targets.values()), cl.fwd_nodes)
    jobs.append(sim.SimJob("busy-heavy", ["fwd1"], 260.0, ranks=8, name="heavy"))
    sim.insert(store, sim.simulate(cl, jobs, t0, DURATION, seed=52))
    rep = detect_failslow(store, CFG, now_ns=t0 + DURATION * sim.NS)
    waits = {
        v.node: v.features["queue_wait_ns"] / 1e6 for v in rep.verdicts if v.kind == "forwarder" and v.window_s == 5
    }
    assert waits["fwd1"] >= CFG.failslow_stall_added_ms + max(waits[n] for n in ("fwd0", "fwd2", "fwd3")), waits
    assert not [a for a in rep.anomalies if a.kind == "fail_slow_forwarder"], rep.anomalies


def test_a_very_slow_target_is_judged_on_its_few_requests(store):
    """ost5 (10 MB/s) slowed 10x serves about one 1 MiB request a second: fewer than
    failslow_min_ops in the 5 s window, but in service all the time. It is judged (utilisation
    guard) and flagged in the shortest window too: active (issue 24's suite: targets slowed 8x were
    only named after the job)."""
    _, rep = _run(store, 22, 33, [sim.Fault("target", "ost5", 10.0)])
    (a,) = [a for a in rep.anomalies if a.node == "ost5"]
    five = [v for v in rep.verdicts if v.node == "ost5" and v.window_s == 5]
    assert five and five[0].features["ops"] < CFG.failslow_min_ops, five
    assert a.active and 5 in a.windows_flagged
    assert {x.node for x in rep.anomalies} == {"ost5"}
    assert stall_added_ms(a.evidence) is None  # slow by its service time: its ratio says it


def test_a_fault_that_has_ended_keeps_its_onset(store):
    """ost0 slowed 4x until 8 s before the judgement: flagged in the long windows only (not
    active), with the onset of its slow run (the suite places late findings by onset)."""
    t0, rep = _run(store, 23, 34, [sim.Fault("target", "ost0", 4.0, end_s=DURATION - 8)])
    (a,) = [a for a in rep.anomalies if a.node == "ost0"]
    assert not a.active and 60 in a.windows_flagged
    assert a.onset_ns is not None and a.onset_ns <= t0 + 15 * sim.NS


def test_sub_millisecond_noise_is_not_a_fail_slow_target(store):
    """RAM-fast targets (1 MiB in ~0.35 ms), one 2.7x slower (~0.6 ms more per request: what CPU
    scheduling does to a tmpfs-backed target on a busy host, seen by the suite of issue 24): not
    fail-slow (failslow_min_added_ms, 1 ms); the same target slowed 40x (~14 ms more) is."""
    fast = sim.Cluster(targets={f"ost{i}": 3000.0 for i in range(8)})
    _, rep = _run(store, 24, 35, [sim.Fault("target", "ost4", 2.7)], cluster=fast, util=0.01)
    assert not rep.anomalies, rep.anomalies
    _, rep = _run(store, 25, 36, [sim.Fault("target", "ost4", 40.0)], cluster=fast, util=0.01)
    assert {(a.kind, a.node) for a in rep.anomalies} == {("fail_slow_target", "ost4")}


# The forwarder features as they were computed from raw records before the per-second rollup
# (migration 009): the rollups must give the same numbers, per second and (migration 014) per
# minute. The p99 is bfloat16's (migration 011: a bounded histogram state; raw quantile(0.99)
# interpolates between the two largest of a second's few samples, bfloat16 returns one of them,
# to < 1% of its value); per minute it merges the seconds' states, so it is compared to 1%.
RAW_FWD_WINDOW_SQL = """
SELECT node, count() AS busy, sum(b) AS bytes, sum(o) AS ops, sum(b) / greatest(count(), 1)__PER_S__ AS bw_avg,
       max(b)__PER_S__ AS bw_max, sum(qw) / greatest(sum(o), 1) AS queue_wait_ns, max(p99) AS p99_max_ns,
       quantileExact(0.5)(p99) AS p99_ns, length(groupUniqArrayArray(js)) AS jobs
FROM (
    SELECT forwarding_node AS node, toStartOfInterval(start, INTERVAL __STEP__ SECOND) AS t, sum(bytes) AS b,
           sum(count) AS o, sum(queue_wait_ns) AS qw, quantileBFloat16(0.99)(duration_ns) AS p99,
           groupUniqArray(job_id) AS js
    FROM io_requests
    WHERE layer = 'forwarder' AND forwarding_node != '' AND start > {since:DateTime64(9)} AND start <= {until:DateTime64(9)}
    GROUP BY node, t
)
GROUP BY node ORDER BY node
"""
RAW_FWD_PAIRS_SQL = """
SELECT forwarding_node AS node, target, intDiv(toUnixTimestamp64Nano(start), {bucket_ns:UInt64}) AS bucket,
       sum(count) AS ops, sum(bytes) AS bytes, sum(duration_ns) AS svc_ns, sum(queue_wait_ns) AS qw_ns
FROM io_requests
WHERE layer = 'forwarder' AND forwarding_node != '' AND start > {since:DateTime64(9)} AND start <= {until:DateTime64(9)}
GROUP BY node, target, bucket ORDER BY node, target, bucket
"""


def _raw_window(step: int) -> str:
    return RAW_FWD_WINDOW_SQL.replace("__STEP__", str(step)).replace("__PER_S__", f" / {step}" if step > 1 else "")


def test_forwarder_features_from_the_rollup_equal_the_raw_records(store):
    """Fail-slow forwarding nodes read the per-second rollup (issue 15: cost by time and objects,
    not records); on whole-second windows it gives exactly what the raw records give."""
    from pharos_analytics.failslow_sql import forwarder_window_sql
    from pharos_core.store import ns_to_datetime64

    t0, _ = _run(store, 40, 51, [sim.Fault("forwarder", "fwd1", 4.0)])
    for w in (5, 20, 60):
        until = t0 + DURATION * sim.NS
        p = {"since": ns_to_datetime64(until - w * sim.NS), "until": ns_to_datetime64(until)}
        q = forwarder_window_sql(until - w * sim.NS, until, 1)
        assert store.query(q.window) == store.query(_raw_window(1), p)
        b = {"bucket_ns": 2 * sim.NS}
        got = sorted(store.query(q.pairs, b), key=lambda r: (r["node"], r["target"], r["bucket"]))
        assert got == store.query(RAW_FWD_PAIRS_SQL, p | b) and len(got) > 10


def test_minute_intervals_from_the_coarse_rollups_equal_the_raw_records(store):
    """Windows read in minutes (migration 014, issue 28): the whole minutes from the per-minute
    rollup, the seconds at both edges from the per-second one; the same sums, busy minutes and jobs
    as the raw records grouped by minute, and the same pairs; the p99 to bfloat16's 1%. The
    interference pass's 60 s windows read them too: the same usage as from the raw records."""
    from pharos_analytics import interference
    from pharos_analytics.failslow_sql import forwarder_rollup, forwarder_window_sql
    from pharos_core.store import ns_to_datetime64

    cl = sim.Cluster()
    t0 = (1_700_000_000 + 60 * 7200) * sim.NS  # 20 s past a minute
    jobs = sim.proportionate_jobs("minutes", 0.6 * sum(cl.targets.values()), cl.fwd_nodes)
    sim.insert(store, sim.simulate(cl, jobs, t0, 200, seed=53, faults=[sim.Fault("forwarder", "fwd1", 4.0)]))
    assert "io_rollup_forwarder_1m" in forwarder_rollup(t0, t0 + 200 * sim.NS, 60)
    for since_s, until_s in ((3, 197), (40, 160), (10, 70)):  # edges on both sides; minutes only; none whole
        since, until = t0 + since_s * sim.NS, t0 + until_s * sim.NS  # whole seconds, as the raw query's
        # a window read in minutes takes its whole minutes only
        first, last = -(-(since // sim.NS) // 60) * 60 * sim.NS - 1, until // sim.NS // 60 * 60 * sim.NS - 1
        p = {"since": ns_to_datetime64(first), "until": ns_to_datetime64(last)}
        q = forwarder_window_sql(since, until, 60)
        got, raw = store.query(q.window), store.query(_raw_window(60), p)
        assert [r["node"] for r in got] == [r["node"] for r in raw] and len(got) == (4 if until_s > 100 else 0)
        for g, r in zip(got, raw, strict=True):
            assert {k: v for k, v in g.items() if "p99" not in k} == {k: v for k, v in r.items() if "p99" not in k}
            assert abs(float(g["p99_max_ns"]) / float(r["p99_max_ns"]) - 1) < 0.01
        b = {"bucket_ns": 60 * sim.NS}
        got = sorted(store.query(q.pairs, b), key=lambda r: (r["node"], r["target"], r["bucket"]))
        assert got == store.query(RAW_FWD_PAIRS_SQL, p | b) and (len(got) > 10) == (until_s > 100)
        # the interference pass's 60 s windows (its usage per job, window and resource) likewise,
        # with the seconds at both edges (from the per-second rollup)
        assert "io_rollup_1s" in forwarder_rollup(since, until, 60) or until_s - since_s == 120
        rolled = interference._usage(store, since, until, 60 * sim.NS, read_from="rollup")
        assert rolled == interference._usage(store, since, until, 60 * sim.NS, read_from="raw") and rolled[1]


def test_split_takes_whole_intervals_from_the_coarsest_rollup():
    """Pure: the seconds of a range by rollup, coarsest first, the edges from finer ones."""
    from pharos_analytics.failslow_sql import _split, rollup_step

    parts = {r.step_s: ranges for r, ranges in _split(1190, 3010, 60)}  # 10 min rows cannot make minutes
    assert parts == {60: [(1200, 3000)], 1: [(1190, 1200), (3000, 3010)]}
    parts = {r.step_s: ranges for r, ranges in _split(1130, 3070, 600)}
    assert parts == {600: [(1200, 3000)], 60: [(1140, 1200), (3000, 3060)], 1: [(1130, 1140), (3060, 3070)]}
    assert {r.step_s: x for r, x in _split(5, 50, 60)} == {1: [(5, 50)]}
    assert {r.step_s: x for r, x in _split(0, 1200, 1)} == {1: [(0, 1200)]}  # a 1 s step reads seconds
    assert {r.step_s: x for r, x in _split(0, 1800, 120)} == {60: [(0, 1800)]}  # 600 does not divide 120
    assert _split(50, 50, 60) == []
    assert [rollup_step(w, 60) for w in (5, 60, 3599, 3600, 14400, 43200, 345600)] == [1, 1, 1, 60, 60, 600, 600]


def test_a_window_read_in_minutes_names_the_slow_forwarding_node(store):
    """A 10-minute window read in minutes (failslow_min_intervals 10: the per-minute rollup, as a
    1 h window is with the default 60): fwd2 slowed 4x is named, nothing else, and its onset is
    within the first minutes."""
    cl = sim.Cluster()
    t0 = (1_700_000_000 + 61 * 7200) * sim.NS
    jobs = sim.proportionate_jobs("tenmin", 0.6 * sum(cl.targets.values()), cl.fwd_nodes)
    sim.insert(store, sim.simulate(cl, jobs, t0, 660, seed=54, faults=[sim.Fault("forwarder", "fwd2", 4.0)]))
    cfg = CFG.model_copy(update={"failslow_windows_s": [600.0], "failslow_min_intervals": 10})
    read = []
    real = store.query

    def recording(sql, params=None, *a, **k):
        read.append(sql)
        return real(sql, params, *a, **k)

    store.query = recording
    try:
        rep = detect_failslow(store, cfg, now_ns=t0 + 660 * sim.NS, kinds=("forwarder",))
    finally:
        store.query = real
    assert {(a.kind, a.node) for a in rep.anomalies} == {("fail_slow_forwarder", "fwd2")}
    (a,) = rep.anomalies
    assert 3 <= a.rel_service <= 5.5 and a.onset_ns is not None and a.onset_ns <= t0 + 180 * sim.NS
    assert any("io_rollup_forwarder_1m" in q for q in read)
    assert a.evidence["600"]["busy"] <= 11  # busy minutes, not seconds


def test_long_windows_are_rejudged_only_after_their_refresh_share(store):
    """The periodic detection (one WindowCache) re-reads a window but the shortest only when
    failslow_refresh_share of its length has passed; in between its verdicts are reused."""
    from pharos_analytics.failslow import WindowCache

    t0, _ = _run(store, 41, 52, [sim.Fault("target", "ost3", 4.0)])
    # 20 s window: re-judged after 5 s; 60 s window: 15 s; both long windows may be judged in one call
    cfg = CFG.model_copy(update={"failslow_refresh_share": 0.25, "failslow_windows_per_cycle": 2})
    now = t0 + DURATION * sim.NS
    calls = []
    real = store.query

    def counting(sql, params=None, *a, **k):
        calls.append(sql)
        return real(sql, params, *a, **k)

    cache = WindowCache()
    store.query = counting
    try:
        first = detect_failslow(store, cfg, now_ns=now, cache=cache)
        n_first = len(calls)
        again = detect_failslow(store, cfg, now_ns=now + 2 * sim.NS, cache=cache)  # 20 s and 60 s reused
        n_again = len(calls) - n_first
        later = detect_failslow(store, cfg, now_ns=now + 6 * sim.NS, cache=cache)  # 20 s re-judged, 60 s reused
        n_later = len(calls) - n_first - n_again
    finally:
        store.query = real
    assert {(a.kind, a.node) for a in first.anomalies} == {("fail_slow_target", "ost3")}
    assert {(a.kind, a.node) for a in again.anomalies} == {("fail_slow_target", "ost3")}
    assert {(v.window_s, v.node) for v in again.verdicts} == {(v.window_s, v.node) for v in first.verdicts}
    assert [v for v in again.verdicts if v.window_s == 60] == [v for v in first.verdicts if v.window_s == 60]
    assert n_again < n_later < n_first, (n_first, n_again, n_later)
    assert later.anomalies


def test_long_windows_are_judged_over_the_first_cycles_one_per_cycle(store):
    """After a start (an empty WindowCache) the periodic detection judges one long window per
    cycle (failslow_windows_per_cycle 1), shortest first: a slow target is found at once, and
    is not called persistent before every window is judged; a window due again while another
    is judged keeps its previous verdicts."""
    from pharos_analytics.failslow import WindowCache

    t0, _ = _run(store, 42, 53, [sim.Fault("target", "ost3", 4.0)])
    cfg = CFG.model_copy(update={"failslow_refresh_share": 0.25, "failslow_windows_per_cycle": 1})
    now = t0 + DURATION * sim.NS
    cache = WindowCache()
    reps = [detect_failslow(store, cfg, now_ns=now + k * sim.NS, cache=cache) for k in range(3)]
    windows = [sorted({v.window_s for v in r.verdicts}) for r in reps]
    assert windows == [[5, 20], [5, 20, 60], [5, 20, 60]]
    (a0,) = [a for a in reps[0].anomalies if a.node == "ost3"]
    (a1,) = [a for a in reps[1].anomalies if a.node == "ost3"]
    assert a0.persistence == "transient" and 60 not in a0.windows_flagged
    assert 60 in a1.windows_flagged and set(a0.windows_flagged) <= set(a1.windows_flagged)
    # at now + 20 s both long windows are due (20 s every 5 s, 60 s every 15 s): the 20 s one is
    # judged, the 60 s one keeps the verdicts judged at now + 1 s
    late = detect_failslow(store, cfg, now_ns=now + 20 * sim.NS, cache=cache)
    assert cache.entries[("target", 20.0)][0] == now + 20 * sim.NS
    assert cache.entries[("target", 60.0)][0] == now + 1 * sim.NS
    assert [v for v in late.verdicts if v.window_s == 60] == [v for v in reps[1].verdicts if v.window_s == 60]


def test_the_shortest_window_is_rejudged_after_its_own_share(store):
    """The shortest window keeps its verdicts for failslow_shortest_refresh_share of its length
    (at 40,960 simulated nodes one judgement of a 1 h window reads ~17 M rollup rows), then is
    judged again; 0 judges it every call."""
    from pharos_analytics.failslow import WindowCache

    t0, _ = _run(store, 43, 54, [sim.Fault("target", "ost3", 4.0)])
    now = t0 + DURATION * sim.NS
    for share, again_judged in ((0.5, False), (0.0, True)):  # 5 s window: kept 2.5 s, or not at all
        cfg = CFG.model_copy(update={"failslow_shortest_refresh_share": share, "failslow_refresh_share": 0.9})
        cache = WindowCache()
        first = detect_failslow(store, cfg, now_ns=now, cache=cache)
        soon = detect_failslow(store, cfg, now_ns=now + sim.NS, cache=cache)
        judged_at = cache.entries[("target", 5.0)][0]
        assert judged_at == (now + sim.NS if again_judged else now), share
        kept = [v for v in soon.verdicts if v.window_s == 5] == [v for v in first.verdicts if v.window_s == 5]
        assert kept != again_judged, share  # the window moved 1 s: judged again, other figures
        late = detect_failslow(store, cfg, now_ns=now + 3 * sim.NS, cache=cache)
        assert cache.entries[("target", 5.0)][0] == now + 3 * sim.NS  # past 2.5 s: judged again
        assert {(a.kind, a.node) for a in late.anomalies} == {("fail_slow_target", "ost3")}
