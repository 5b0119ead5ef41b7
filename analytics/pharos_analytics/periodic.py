"""A cycle run every ``period_s`` seconds in a daemon thread: the one loop of ``pharos serve``'s
periodic jobs (the detection loop of :mod:`pharos_analytics.alerts`, the control loop of
:mod:`pharos_analytics.control.loop`).

A failing cycle is logged and the loop goes on; :meth:`PeriodicLoop.stop` ends it between
cycles (a cycle in progress finishes first, bounded by the join timeout).
"""

from __future__ import annotations

import logging
import threading
from typing import ClassVar, Self


class PeriodicLoop:
    """Calls :meth:`run_once` every ``period_s`` seconds (the wait starts when a cycle ends) in a
    daemon thread named :attr:`thread_name`, once :meth:`start` is called; ``period_s`` 0 = off.

    Subclasses implement :meth:`run_once` (returns a summary dict, kept in ``last`` by the
    subclass) and count ``cycles``; exceptions of a cycle go to ``logger`` with a traceback."""

    thread_name: ClassVar[str] = "periodic"
    cycle_name: ClassVar[str] = "periodic"  # in the log line of a failed cycle

    def __init__(self, period_s: float, logger: logging.Logger) -> None:
        self.period_s = period_s
        self._log = logger
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.cycles = 0
        self.last: dict = {}

    def run_once(self) -> dict:
        """One cycle; raises whatever the cycle raises."""
        raise NotImplementedError

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.run_once()
            except Exception:  # a failing cycle must not end the loop
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
