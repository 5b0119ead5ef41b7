"""Placement-pool hints (Sunway lessons §5): pure rules, then max_perf measured from the
target_metrics of a simulated loaded system on a real chDB store."""

from __future__ import annotations

import pharos_sysdiag_sim as sim

from pharos_analytics.control.config import ControlConfig
from pharos_analytics.control.placement import TargetLoad, measure_targets, plan_placement

S = 1_000_000_000
TARGETS = [f"ost{i}" for i in range(4)]


def loads(mb: dict[str, float], loaded: int = 30) -> dict[str, TargetLoad]:
    return {t: TargetLoad(t, loaded, loaded, v * 1e6, v * 1.1e6) for t, v in mb.items()}


MEASURED = loads({"ost0": 50, "ost1": 30, "ost2": 20, "ost3": 10})


def test_pool_from_measured_bandwidth_keeps_the_rest_of_the_document():
    cur = {
        "pools": {"other": {"targets": ["ost3"]}},
        "default_pool": None,
        "job_pools": {"7": "other"},
        "stripe_size": 1 << 20,
    }
    p = plan_placement(cur, TARGETS, MEASURED, set(), {}, 1000 * S, ControlConfig())
    assert p.changed and p.targets == TARGETS
    assert p.max_perf == {"ost0": 50.0, "ost1": 30.0, "ost2": 20.0, "ost3": 10.0}
    assert p.doc["default_pool"] == "pharos" and p.doc["pools"]["pharos"]["component_size"] == 2 << 20
    assert p.doc["pools"]["other"] == {"targets": ["ost3"]} and p.doc["job_pools"] == {"7": "other"}
    # nothing measured and no pool yet: no document
    q = plan_placement({}, TARGETS, loads({"ost0": 50}, loaded=2), set(), {}, 1000 * S, ControlConfig())
    assert not q.changed and "no target measured" in q.reason


def test_unmeasured_targets_keep_their_previous_value_or_get_the_median():
    cur = {"pools": {"pharos": {"targets": TARGETS, "max_perf": {"ost3": 12.0}}}, "default_pool": "pharos"}
    p = plan_placement(
        cur,
        TARGETS,
        {k: v for k, v in MEASURED.items() if k != "ost3"} | loads({"ost2": 20}),
        set(),
        {},
        0,
        ControlConfig(),
    )
    assert p.max_perf["ost3"] == 12.0
    p = plan_placement(
        {}, TARGETS, {k: v for k, v in MEASURED.items() if k in ("ost0", "ost1", "ost2")}, set(), {}, 0, ControlConfig()
    )
    assert p.max_perf["ost3"] == 30.0 and p.evidence["max_perf_source"]["ost3"] == "median of measured targets"


def test_fail_slow_target_leaves_and_returns_after_the_quiet_period():
    c = ControlConfig(placement_quiet_s=300)
    first = plan_placement({}, TARGETS, MEASURED, {"ost1"}, {"ost1": 1000 * S}, 1000 * S, c)
    assert first.targets == ["ost0", "ost2", "ost3"] and "ost1" in first.left and "ost1" not in first.max_perf
    # detection cleared 100 s ago: still out (recovering)
    p = plan_placement(first.doc, TARGETS, MEASURED, set(), {"ost1": 1000 * S}, 1100 * S, c)
    assert "ost1" not in p.targets and "recovering" in p.left["ost1"] and not p.changed
    # after the quiet period it is back
    p = plan_placement(first.doc, TARGETS, MEASURED, set(), {"ost1": 1000 * S}, 1301 * S, c)
    assert p.changed and "ost1" in p.targets and "back in the pool: ost1" in p.reason


def test_never_an_empty_pool():
    p = plan_placement({}, TARGETS, MEASURED, set(TARGETS), {}, 0, ControlConfig())
    assert p.targets == ["ost0"] and "never empty" in p.reason


def test_small_changes_do_not_repush_large_ones_do():
    c = ControlConfig(placement_min_change=0.15)
    base = plan_placement({}, TARGETS, MEASURED, set(), {}, 0, c).doc
    assert not plan_placement(
        base, TARGETS, loads({"ost0": 55, "ost1": 30, "ost2": 20, "ost3": 10}), set(), {}, 0, c
    ).changed
    slow = plan_placement(base, TARGETS, loads({"ost0": 12.5, "ost1": 30, "ost2": 20, "ost3": 10}), set(), {}, 0, c)
    assert slow.changed and slow.max_perf["ost0"] == 12.5


def test_pinned_pool_is_used_as_given():
    pin = {"targets": ["ost2"], "max_perf": {"ost2": 5.0}}
    p = plan_placement({}, TARGETS, MEASURED, {"ost2"}, {}, 0, ControlConfig(), pinned=pin)
    assert p.targets == ["ost2"] and p.max_perf == {"ost2": 5.0} and p.reason == "pool pinned by an admin"


def test_max_perf_measured_under_load_on_the_store(store):
    """Eight targets limited to 50, 30, 50, 20, 30, 10, 50, 20 MB/s under a load above their sum, ost6
    slowed 4x: the measured max_perf follows what each delivers, not the configured limit."""
    t0 = 1_760_000_000 * S
    cl = sim.Cluster(fwd_nodes=["fwd0", "fwd1"], fwd_capacity_mb_s=500)
    rows = sim.simulate(
        cl,
        sim.proportionate_jobs("p", 400, ["fwd0", "fwd1"]),
        t0,
        60,
        seed=3,
        faults=[sim.Fault("target", "ost6", 4.0)],
    )
    sim.insert(store, {"target_metrics": rows["target_metrics"]})
    m = measure_targets(store, t0, t0 + 60 * S, 0.9)
    assert set(m) == {f"ost{i}" for i in range(8)} and all(x.loaded >= 50 for x in m.values())
    p = plan_placement({}, sorted(m), m, set(), {}, t0 + 60 * S, ControlConfig())
    for i, limit in enumerate(sim.LIMITS):
        want = limit / 4 if i == 6 else limit
        assert abs(p.max_perf[f"ost{i}"] - want) / want < 0.15, (i, p.max_perf)
