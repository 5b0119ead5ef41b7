"""How Pharos writes quantities for people (shared by the analytics, the API's HTML report and the
CLI; light: no import beyond the standard library)."""

from __future__ import annotations


def lost_text(seconds: float | None) -> str:
    """Seconds lost as people read them: ``~12.3 s lost``, ``~0.0042 s lost``; ``''`` when unpriced
    (None)."""
    if seconds is None:
        return ""
    return f"~{seconds:.1f} s lost" if seconds >= 0.1 else f"~{seconds:.2g} s lost"
