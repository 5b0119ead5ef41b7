"""A cycle run every ``period_s`` seconds in a daemon thread: the one loop of ``pharos serve``'s
periodic jobs (the detection loop of :mod:`pharos_analytics.alerts`, the control loop of
:mod:`pharos_analytics.control.loop`).

A failing cycle is logged and the loop goes on; :meth:`PeriodicLoop.stop` ends it between
cycles (a cycle in progress finishes first, bounded by the join timeout). Completed cycles are
timed once, by :meth:`PeriodicLoop.cycle_done` (their count, ``duration_s`` of the summary and the
``pharos_loop_cycle_seconds`` histogram), failed ones counted in ``pharos_loop_cycle_failures_total``
(pharos_core.telemetry).
"""

from __future__ import annotations

import logging
import threading
import time
from typing import ClassVar, Self

from pharos_core.telemetry import CYCLE_FAILURES, CYCLE_SECONDS


class PeriodicLoop:
    """Calls :meth:`run_once` every ``period_s`` seconds (the wait starts when a cycle ends) in a
    daemon thread named :attr:`thread_name`, once :meth:`start` is called; ``period_s`` 0 = off.

    Subclasses implement :meth:`run_once` (returns a summary dict, kept in ``last`` by the
    subclass) and end a completed cycle with :meth:`cycle_done`; exceptions of a cycle go to
    ``logger`` with a traceback."""

    thread_name: ClassVar[str] = "periodic"
    cycle_name: ClassVar[str] = "periodic"  # in the log line of a failed cycle

    def __init__(self, period_s: float, logger: logging.Logger) -> None:
        self.period_s = period_s
        self._log = logger
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.cycles = 0
        self.last: dict = {}
        CYCLE_FAILURES.labels(self.cycle_name)  # exported as 0 from the start, not only after a failure

    def run_once(self) -> dict:
        """One cycle; raises whatever the cycle raises."""
        raise NotImplementedError

    def cycle_done(self, t0: float) -> float:
        """Count a completed cycle that started at ``time.monotonic()`` ``t0``: ``cycles`` + 1, its
        time observed in ``pharos_loop_cycle_seconds{loop=cycle_name}``; returns the time in
        seconds, rounded to ms (the summary's ``duration_s``)."""
        took = time.monotonic() - t0
        self.cycles += 1
        CYCLE_SECONDS.labels(self.cycle_name).observe(took)
        return round(took, 3)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.run_once()
            except Exception:  # a failing cycle must not end the loop
                CYCLE_FAILURES.labels(self.cycle_name).inc()
                self._log.exception("%s cycle failed", self.cycle_name)
            self._stop.wait(self.period_s)

    def start(self) -> Self:
        """Run :meth:`run_once` every ``period_s`` in a daemon thread (not when period_s is 0, nor
        twice); returns self."""
        if self.period_s > 0 and self._thread is None:
            self._thread = threading.Thread(target=self._run, name=self.thread_name, daemon=True)
            self._thread.start()
        return self

    def stop(self, timeout: float = 30.0) -> None:
        """Ask the thread to end and wait for it up to ``timeout`` seconds."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)
