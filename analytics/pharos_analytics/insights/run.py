"""The catalogue of rules, in order, and the diagnosis that runs it on a job (see
:mod:`pharos_analytics.insights`)."""

from __future__ import annotations

from collections.abc import Callable

from pharos_core.store import Store

from ..diagnosis_config import DiagnosisConfig
from ..phases import JobPhases
from .evidence import Counters, Trace
from .files import many_small_files, read_after_write, redundant_reads, stdio_heavy
from .imbalance import rank_imbalance, stragglers
from .metadata import fsync_storm, metadata_rate, metadata_time
from .model import SEVERITY_ORDER, Insight, JobInsights
from .requests import misaligned, random_access, small_requests, small_shared
from .targets import single_target, straggler_resource
from .weigh import totals, weigh

#: A rule takes (counters, trace, cfg, phases) and returns its insights.
Rule = Callable[[Counters, Trace, DiagnosisConfig, JobPhases], list[Insight]]
#: Every rule, in the order they run (and are listed by :func:`catalogue`).
RULES: list[Rule] = [
    small_requests,
    small_shared,
    misaligned,
    random_access,
    redundant_reads,
    stragglers,
    rank_imbalance,
    metadata_time,
    metadata_rate,
    many_small_files,
    fsync_storm,
    single_target,
    straggler_resource,
    stdio_heavy,
    read_after_write,
]


def job_insights(store: Store, job_id: str, cfg: DiagnosisConfig | None = None) -> JobInsights:
    """Run every rule on ``job_id`` (client layer), weigh each insight's severity by the bytes
    and time it concerns (:func:`weigh`), sort by severity, then id. An unknown job or one
    without I/O gives no insight (and its phases' source ``none``)."""
    cfg = cfg or DiagnosisConfig()
    counters = Counters(store, job_id)
    trace = Trace(store, job_id, cfg)
    ph = trace.phases()
    notes = []
    if counters.present and trace.present:
        notes.append(
            "rules that both can answer use the Darshan counters (complete); the trace adds "
            "phases, read-after-write and metadata rate"
        )
    out: list[Insight] = []
    for r in RULES:
        out += r(counters, trace, cfg, ph)
    if out:
        tot = totals(counters, trace)
        out = [weigh(i, tot, cfg) for i in out]
    out.sort(key=lambda i: (SEVERITY_ORDER[i.severity], i.id))
    return JobInsights(job_id=job_id, insights=out, phases=ph, notes=notes)


def catalogue() -> list[dict[str, str]]:
    """The rules with their docstrings (source, thresholds and units)."""
    return [{"rule": r.__name__, "doc": (r.__doc__ or "").strip()} for r in RULES]
