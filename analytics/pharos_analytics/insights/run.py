"""The catalogue of rules, in order, and the diagnosis that runs it on a job (see
:mod:`pharos_analytics.insights`)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from pharos_core.store import Store

from ..diagnosis_config import DiagnosisConfig
from ..phases import JobPhases
from .evidence import Counters, Trace
from .files import many_small_files, read_after_write, redundant_reads, stdio_heavy
from .imbalance import rank_imbalance, stragglers
from .metadata import fsync_storm, metadata_rate, metadata_time
from .model import DRISHTI_CODES, Insight, JobInsights, order_key
from .price import PRICES, Pricer, price
from .requests import misaligned, mpiio_independent, random_access, small_requests, small_shared
from .targets import interference, single_target, straggler_resource
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
    interference,
    stdio_heavy,
    mpiio_independent,
    read_after_write,
]


def job_insights(store: Store, job_id: str, cfg: DiagnosisConfig | None = None) -> JobInsights:
    """Run every rule on ``job_id`` (client layer), weigh each insight's severity by the bytes
    and time it concerns (:func:`weigh`), price it (``seconds_lost``, :mod:`.price`) and give
    it its Drishti code; sort by seconds lost, largest first (unpriced last), then severity,
    then id. An unknown job or one without I/O gives no insight (and its phases' source ``none``)."""
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
        pricer = Pricer(counters, trace, cfg)
        out = [priced(pricer, i) for i in out]
    out.sort(key=order_key)
    return JobInsights(job_id=job_id, insights=out, phases=ph, notes=notes)


def priced(p: Pricer, i: Insight) -> Insight:
    """The insight with its ``seconds_lost`` (basis in ``evidence["seconds_lost_basis"]``) and
    its Drishti code."""
    s, basis = price(p, i)
    return replace(
        i, seconds_lost=s, evidence={**i.evidence, "seconds_lost_basis": basis}, drishti_code=DRISHTI_CODES.get(i.id)
    )


def catalogue() -> list[dict[str, str | list[str] | None]]:
    """The rules with their docstrings (source, thresholds and units), the insight ids each
    can give with their Drishti codes, and how each is priced."""
    out: list[dict[str, str | list[str] | None]] = []
    for r in RULES:
        ids = [k for k, fn in PRICES.items() if _rule_of(k) == r.__name__]
        out.append(
            {
                "rule": r.__name__,
                "doc": (r.__doc__ or "").strip(),
                "insights": ids,
                "drishti_codes": sorted({DRISHTI_CODES[k] for k in ids if k in DRISHTI_CODES}),
                "price": " ".join(sorted({(PRICES[k].__doc__ or "").split(".")[0].strip() for k in ids})) or None,
            }
        )
    return out


#: The rule that gives each insight id (for the catalogue).
_RULE_OF = {
    "small_reads": "small_requests",
    "small_writes": "small_requests",
    "small_reads_shared": "small_shared",
    "small_writes_shared": "small_shared",
    "misaligned_file": "misaligned",
    "misaligned_memory": "misaligned",
    "random_reads": "random_access",
    "random_writes": "random_access",
    "redundant_reads": "redundant_reads",
    "rank_imbalance_bytes": "stragglers",
    "rank_imbalance_time": "stragglers",
    "rank_imbalance_bytes_per_rank": "rank_imbalance",
    "rank_imbalance_time_per_rank": "rank_imbalance",
    "metadata_time": "metadata_time",
    "metadata_heavy": "metadata_rate",
    "many_small_files": "many_small_files",
    "fsync_storm": "fsync_storm",
    "single_target_shared_file": "single_target",
    "straggler_resource": "straggler_resource",
    "interference": "interference",
    "stdio_heavy": "stdio_heavy",
    "mpiio_independent_reads": "mpiio_independent",
    "mpiio_independent_writes": "mpiio_independent",
    "read_after_write": "read_after_write",
}


def _rule_of(insight_id: str) -> str:
    return _RULE_OF.get(insight_id, "")
