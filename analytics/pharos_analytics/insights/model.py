"""The findings of the insights catalogue (:mod:`pharos_analytics.insights`) and how their
numbers are written in messages."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from ..phases import JobPhases

Severity = Literal["high", "warn", "info"]
SEVERITY_ORDER = {"high": 0, "warn": 1, "info": 2}


@dataclass(frozen=True)
class Insight:
    """One finding. ``evidence`` holds the numbers (bytes, counts, seconds, shares 0-1)."""

    id: str
    title: str
    severity: Severity
    source: Literal["trace", "counters"]
    message: str
    evidence: dict[str, Any]
    recommendations: list[str]
    rule_source: str


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
