"""The scoring of the labelled fault-injection suite (bench/diagnosis_scoring.py): pure logic on
hand-made findings."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

from diagnosis_scoring import CaseResult, Finding, anomaly_finding, insight_finding, score

pytestmark = pytest.mark.unit


def F(cls: str, res: str = "", seen: float | None = None) -> Finding:
    return Finding(cls, res, "test", "j", seen)


def test_mapping_of_insights_and_anomalies():
    assert insight_finding({"id": "small_writes_shared", "severity": "high"}, "j").cls == "small_writes"
    assert insight_finding({"id": "small_writes", "severity": "warn"}, "j") is None  # only high is named
    assert insight_finding({"id": "stdio_heavy", "severity": "high"}, "j").cls == "other:stdio_heavy"
    f = insight_finding(
        {"id": "straggler_resource", "severity": "high", "evidence": {"resource_type": "target", "resource": "ost3"}},
        "j",
    )
    assert f.key() == ("slow_target", "ost3")
    assert anomaly_finding({"kind": "fail_slow_forwarder", "node": "fwd2"}).key() == ("slow_forwarding_node", "fwd2")
    ev = {"job_id": "light", "culprit_job": "heavy", "resource_type": "target", "resource": "ost1"}
    assert anomaly_finding(ev).key() == ("interference_target", "ost1")
    stored = {"kind": "interference", "node": "fwd0", "node_type": "forwarding_node", "job_id": "light"}
    assert anomaly_finding(stored).key() == ("interference_forwarding_node", "fwd0")
    assert anomaly_finding({"kind": "network_slow", "node": "cn1"}).cls == "other:network_slow"
    ins = {"id": "interference", "severity": "high", "evidence": {"resource_type": "target", "resource": "ost2"}}
    assert insight_finding(ins, "j").key() == ("interference_target", "ost2")


def test_scores_class_resource_and_also_true():
    rs = [
        # right class and resource, plus a true consequence (not scored) and the same wrong finding twice (one FP)
        CaseResult(
            0,
            "slow_target",
            "ost3",
            "a",
            {},
            [F("slow_target", "ost3", 4.0), F("rank_imbalance"), F("small_writes"), F("small_writes")],
            ["rank_imbalance"],
        ),
        # right class, wrong resource: a miss and a false positive
        CaseResult(1, "slow_target", "ost5", "b", {}, [F("slow_target", "ost2", 3.0)]),
        # client class: no resource to match
        CaseResult(2, "small_writes", "", "c", {}, [F("small_writes", "", 1.0)]),
        # clean with a finding: a false positive, no recall term
        CaseResult(3, "clean", "", "d", {}, [F("fsync_per_write")]),
        CaseResult(4, "clean", "", "e", {}, []),
    ]
    s = score(rs)
    assert (s["tp"], s["fp"], s["fn"]) == (2, 3, 1)
    assert s["precision"] == pytest.approx(2 / 5) and s["recall"] == pytest.approx(2 / 3)
    pc = s["per_class"]
    assert (pc["slow_target"]["tp"], pc["slow_target"]["fp"], pc["slow_target"]["fn"]) == (1, 1, 1)
    assert pc["small_writes"]["fp"] == 1 and pc["small_writes"]["precision"] == pytest.approx(0.5)
    assert pc["clean"]["cases"] == 2 and pc["clean"]["recall"] is None
    assert pc["fsync_per_write"]["fp"] == 1 and pc["fsync_per_write"]["precision"] == 0.0
    assert pc["slow_target"]["median_detect_s"] == 4.0 and s["median_detect_s"] == 2.5
    assert rs[0].to_dict()["false_positives"] == [F("small_writes").__dict__]
