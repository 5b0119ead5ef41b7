"""The findings of the insights catalogue (:mod:`pharos_analytics.insights`) and how their
numbers are written in messages."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from ..phases import JobPhases

Severity = Literal["high", "warn", "info"]
SEVERITY_ORDER = {"high": 0, "warn": 1, "info": 2}

#: Insight id -> Drishti trigger code (hpc-io/drishti-io ``drishti/includes/config.py``: S01
#: STDIO, P05-P22 POSIX, M02/M03 MPI-IO collective use). Ids without a code are Pharos' or
#: Beacon's / TOKIO's rules.
DRISHTI_CODES: dict[str, str] = {
    "stdio_heavy": "S01",
    "small_reads": "P05",
    "small_writes": "P06",
    "misaligned_memory": "P07",
    "misaligned_file": "P08",
    "redundant_reads": "P09",
    "random_reads": "P11",
    "random_writes": "P13",
    "small_reads_shared": "P15",
    "small_writes_shared": "P16",
    "metadata_time": "P17",
    "rank_imbalance_bytes": "P18",
    "rank_imbalance_time": "P19",
    "rank_imbalance_bytes_per_rank": "P21/P22",
    "mpiio_independent_reads": "M02",
    "mpiio_independent_writes": "M03",
}


def order_key(i: Insight) -> tuple[float, int, str]:
    """Sort key of insights: seconds lost, largest first (unpriced last), then severity, then id."""
    lost = -i.seconds_lost if i.seconds_lost is not None else float("inf")
    return (lost, SEVERITY_ORDER[i.severity], i.id)


@dataclass(frozen=True)
class Insight:
    """One finding. ``evidence`` holds the numbers (bytes, counts, seconds, shares 0-1).

    ``seconds_lost``: seconds of the job's run time (wall clock on its critical path: the
    slowest rank, or the rank the finding slows most) the finding is estimated to have cost,
    ``None`` when the rule cannot price it; how it was computed is ``evidence["seconds_lost_basis"]``
    (see :mod:`pharos_analytics.insights.price`). ``drishti_code``: the Drishti trigger the
    insight corresponds to (``S01``, ``P05``..``P22``, ``M02``..; hpc-io/drishti-io
    ``includes/config.py``), ``None`` for Pharos' own rules."""

    id: str
    title: str
    severity: Severity
    source: Literal["trace", "counters"]
    message: str
    evidence: dict[str, Any]
    recommendations: list[str]
    rule_source: str
    seconds_lost: float | None = None
    drishti_code: str | None = None


@dataclass(frozen=True)
class JobInsights:
    job_id: str
    insights: list[Insight]
    phases: JobPhases
    notes: list[str] = field(default_factory=list)


def pct(x: float) -> str:
    """A share 0-1 as a percentage, one decimal: ``12.5%``."""
    return f"{100 * x:.1f}%"


def mib(n: float) -> str:
    """Bytes in MiB (2**20 bytes), one decimal: ``1.5 MiB``."""
    return f"{n / 2**20:.1f} MiB"
