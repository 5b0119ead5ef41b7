"""Scoring of the labelled fault-injection suite (``bench/diagnosis_suite.py``, issue 24): what
Pharos named for a case, mapped to the suite's fault classes, against the case's label.

Pure logic (no stack): unit-tested in tests/diagnosis/test_suite_scoring.py.

**What counts as named.** For each job of a case: every insight of severity ``high`` (after
:func:`pharos_analytics.insights.weigh.weigh`: what it describes is a material share of the job's
bytes or time), the interference events of ``GET /v1/jobs/{id}/interference``, and every anomaly
of ``GET /v1/anomalies`` (the detection loop's stored results) whose onset or first detection
falls inside the case's time window (a node still flagged from an earlier case is not this
case's finding). Each is mapped to ``(class, resource)`` by :func:`finding_class`; a finding no
class of the suite covers keeps its own name (``other:<id>``) and counts as a false positive.

**Scoring** (Kaleidoscope, FAST'24-style localisation: the class *and* the resource must match):

* a case is *detected* (a true positive of its class) when a finding has the label's class and,
  for the system-side classes, the label's resource (target, forwarding node);
* a finding is a *false positive* when it is neither the label nor one of the case's
  ``also_true`` classes: what the injected workload really also has (4 KiB random reads are
  small reads too; a rank writing to a slowed target is a straggler rank). Those are written in
  each case's JSON, not scored either way;
* precision = TP / (TP + FP) over all findings, recall = TP / cases with a fault; per class,
  precision counts the findings of that class, recall the cases of that class. ``clean`` cases
  have no fault: any finding on them is a false positive of the class it names.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from statistics import median
from typing import Any

#: The suite's classes: the faults (client-side workload faults, then system-side faults) and
#: ``clean`` (no fault). Issue 24's list.
CLASSES = [
    "clean",
    "small_writes",
    "small_reads_shared",
    "misaligned",
    "random_reads",
    "rank_imbalance",
    "fsync_per_write",
    "metadata_storm",
    "slow_target",
    "slow_forwarding_node",
    "interference_forwarding_node",
    "interference_target",
]
#: Classes whose label names a resource (a target or forwarding node) that must match.
SYSTEM_CLASSES = {"slow_target", "slow_forwarding_node", "interference_forwarding_node", "interference_target"}

#: Insight id -> suite class (client-side findings). Several insight ids describe one class
#: (a shared file's small reads are small reads; metadata time, rate and many small files are a
#: metadata storm's signs).
INSIGHT_CLASS = {
    "small_writes": "small_writes",
    "small_writes_shared": "small_writes",
    "small_reads": "small_reads_shared",
    "small_reads_shared": "small_reads_shared",
    "misaligned_file": "misaligned",
    "misaligned_memory": "misaligned",
    "random_reads": "random_reads",
    "rank_imbalance_bytes": "rank_imbalance",
    "rank_imbalance_time": "rank_imbalance",
    "rank_imbalance_bytes_per_rank": "rank_imbalance",
    "rank_imbalance_time_per_rank": "rank_imbalance",
    "fsync_storm": "fsync_per_write",
    "metadata_time": "metadata_storm",
    "metadata_heavy": "metadata_storm",
    "many_small_files": "metadata_storm",
}
#: Stored anomaly kind -> suite class (system-side findings; interference by resource type).
ANOMALY_CLASS = {"fail_slow_target": "slow_target", "fail_slow_forwarder": "slow_forwarding_node"}
INTERFERENCE_CLASS = {"forwarding_node": "interference_forwarding_node", "target": "interference_target"}
STRAGGLER_CLASS = {"target": "slow_target", "ost": "slow_target", "forwarding_node": "slow_forwarding_node"}


@dataclass
class Finding:
    """One thing Pharos named: suite class (or ``other:<id>``), resource ("" when the class has
    none), what it came from (``insight:<id>``, ``anomaly:<kind>``, ``interference``), the job it
    is about, seconds from the case's fault start to when it was first seen (None: only seen
    after the job ended, at scoring)."""

    cls: str
    resource: str
    source: str
    job_id: str
    seen_s: float | None = None

    def key(self) -> tuple[str, str]:
        return (self.cls, self.resource)


def insight_finding(item: dict[str, Any], job_id: str) -> Finding | None:
    """The finding of an insight of ``GET /v1/jobs/{id}/insights`` (None below severity high)."""
    if item.get("severity") != "high":
        return None
    iid = str(item["id"])
    if iid == "interference":  # the job's interference events, as an insight
        ev = item.get("evidence") or {}
        f = anomaly_finding(
            {"resource_type": ev.get("resource_type"), "resource": ev.get("resource"), "job_id": job_id}
        )
        f.source = "insight:interference"
        return f
    if iid == "straggler_resource":
        ev = item.get("evidence") or {}
        rt = str(ev.get("resource_type", ""))
        return Finding(
            STRAGGLER_CLASS.get(rt, f"other:straggler_{rt}"), str(ev.get("resource", "")), "insight:" + iid, job_id
        )
    return Finding(INSIGHT_CLASS.get(iid, f"other:{iid}"), "", "insight:" + iid, job_id)


def anomaly_finding(item: dict[str, Any]) -> Finding:
    """The finding of a stored anomaly (``GET /v1/anomalies`` item) or an interference event
    (``GET /v1/jobs/{id}/interference`` ``events`` item, which has ``resource_type``)."""
    kind = str(item.get("kind", "interference"))
    if kind == "interference":
        rt = str(item.get("resource_type") or item.get("node_type") or "")
        res = str(item.get("resource") or item.get("node") or "")
        return Finding(
            INTERFERENCE_CLASS.get(rt, f"other:interference_{rt}"), res, "interference", str(item.get("job_id", ""))
        )
    if kind == "straggler_resource":
        rt = str(item.get("node_type", ""))
        return Finding(
            STRAGGLER_CLASS.get(rt, f"other:straggler_{rt}"),
            str(item["node"]),
            "anomaly:" + kind,
            str(item.get("job_id", "")),
        )
    return Finding(
        ANOMALY_CLASS.get(kind, f"other:{kind}"),
        str(item.get("node", "")),
        "anomaly:" + kind,
        str(item.get("job_id", "")),
    )


@dataclass
class CaseResult:
    """A case's label and what Pharos named. ``label``: class; ``resource``: the faulted target or
    forwarding node ("" for client-side classes); ``job_id``: the job the fault is about (the
    victim of interference); ``also_true``: classes the workload really also has (not scored)."""

    case: int
    label: str
    resource: str
    job_id: str
    params: dict[str, Any]
    findings: list[Finding] = field(default_factory=list)
    also_true: list[str] = field(default_factory=list)
    wall_s: float = 0.0
    error: str = ""
    #: What Pharos named from a Darshan log of the same workload (client-side cases with
    #: ``--darshan-lib``), None when there is none.
    log_findings: list[Finding] | None = None

    def as_log(self) -> CaseResult | None:
        """The case scored on its Darshan log's findings instead of the trace's (None: no log)."""
        if self.log_findings is None:
            return None
        return CaseResult(
            self.case, self.label, self.resource, self.job_id, self.params, self.log_findings, self.also_true
        )

    def matches(self, f: Finding) -> bool:
        return f.cls == self.label and (self.label not in SYSTEM_CLASSES or f.resource == self.resource)

    @property
    def detected(self) -> bool:
        return self.label != "clean" and any(self.matches(f) for f in self.findings)

    def false_positives(self) -> list[Finding]:
        """Findings that are neither the label nor an ``also_true`` class, one per (class,
        resource): the same wrong finding named by two sources counts once."""
        seen: dict[tuple[str, str], Finding] = {}
        for f in self.findings:
            if self.label != "clean" and self.matches(f):
                continue
            if f.cls in self.also_true:
                continue
            seen.setdefault(f.key(), f)
        return list(seen.values())

    def detect_s(self) -> float | None:
        """Seconds from the fault's start to the first matching finding (None: not detected)."""
        ts = [f.seen_s for f in self.findings if self.matches(f) and f.seen_s is not None]
        return min(ts) if ts else None

    def to_dict(self) -> dict[str, Any]:
        return {
            "case": self.case,
            "label": {"class": self.label, "resource": self.resource, "job": self.job_id},
            "params": self.params,
            "also_true": self.also_true,
            "detected": self.detected,
            "detect_s": self.detect_s(),
            "false_positives": [f.__dict__ for f in self.false_positives()],
            "findings": [f.__dict__ for f in self.findings],
            "log": None
            if self.log_findings is None
            else {
                "detected": self.as_log().detected,
                "false_positives": [f.__dict__ for f in self.as_log().false_positives()],
                "findings": [f.__dict__ for f in self.log_findings],
            },
            "wall_s": round(self.wall_s, 2),
            "error": self.error,
        }


def score(results: list[CaseResult]) -> dict[str, Any]:
    """``{precision, recall, tp, fp, fn, per_class: {cls: {cases, tp, fp, fn, precision, recall,
    median_detect_s}}, median_detect_s}``. Precision is None when nothing was named (no finding),
    recall None for a class without faulty cases (``clean``)."""
    per: dict[str, dict[str, Any]] = {c: {"cases": 0, "tp": 0, "fp": 0, "fn": 0, "detect": []} for c in CLASSES}
    for r in results:
        p = per.setdefault(r.label, {"cases": 0, "tp": 0, "fp": 0, "fn": 0, "detect": []})
        p["cases"] += 1
        if r.label != "clean":
            if r.detected:
                p["tp"] += 1
                if (d := r.detect_s()) is not None:
                    p["detect"].append(d)
            else:
                p["fn"] += 1
        for f in r.false_positives():
            per.setdefault(f.cls, {"cases": 0, "tp": 0, "fp": 0, "fn": 0, "detect": []})["fp"] += 1
    tp = sum(p["tp"] for p in per.values())
    fp = sum(p["fp"] for p in per.values())
    fn = sum(p["fn"] for p in per.values())
    out_cls = {}
    for c, p in per.items():
        out_cls[c] = {
            "cases": p["cases"],
            "tp": p["tp"],
            "fp": p["fp"],
            "fn": p["fn"],
            "precision": p["tp"] / (p["tp"] + p["fp"]) if p["tp"] + p["fp"] else None,
            "recall": p["tp"] / (p["tp"] + p["fn"]) if p["tp"] + p["fn"] else None,
            "median_detect_s": round(median(p["detect"]), 1) if p["detect"] else None,
        }
    all_detect = [d for p in per.values() for d in p["detect"]]
    return {
        "precision": tp / (tp + fp) if tp + fp else None,
        "recall": tp / (tp + fn) if tp + fn else None,
        "tp": tp,
        "fp": fp,
        "fn": fn,
        "median_detect_s": round(median(all_detect), 1) if all_detect else None,
        "per_class": out_cls,
    }
