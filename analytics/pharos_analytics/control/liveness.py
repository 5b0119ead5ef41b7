"""What the control loop knows of the forwarding layer (:class:`~.push.View`: the mounts' job
tables, nodes and default node; which daemons do not answer), asked of every admin interface
at once and kept, so that a hint never waits on an unreachable one.

Why: the Slurm plugin waits 2 s for a hint (``agents/slurm``), and an admin interface that
accepts connections and never answers (a hung daemon, a black-holed address) costs a whole
timeout per call. So:

* :meth:`Liveness.fetch_view` asks every mount (``GET /mapping``) and every daemon (``GET
  /status``) concurrently, each call bounded by its timeout: a view costs one timeout at most,
  however many endpoints hang.
* :meth:`Liveness.live_view` (hints, previews, I/O classes, pins) returns the newest view as it
  is; one older than ``[control] liveness_max_age_s`` (5 s) is refreshed in the background
  (``liveness_timeout_s``, 0.5 s, one refresh at a time). Only the very first call, with no
  view yet, waits for one (at most ``liveness_timeout_s``).
* The control cycle refreshes the view at its start (:meth:`Liveness.refresh_view`, outside the
  lock hints take) with ``http_timeout_s`` (3 s): a daemon slow to answer under load is not
  taken for down by the cycle (placement, DFRA); hints may see the shorter timeout's view.

A daemon that does not answer is ``down`` (no decision names it, no placement call goes to it);
a mount that does not answer has no table (``mount_maps`` None: a push to it fails at once,
recorded, and is retried by the loop).
"""

from __future__ import annotations

import logging
import threading
import time

from .push import View, concurrently

log = logging.getLogger("pharos.control")


class Liveness:
    """The view-keeping half of :class:`~pharos_analytics.control.loop.ControlLoop`. Uses the
    loop's ``cfg``, ``endpoints`` and ``_http``; call :meth:`_init_liveness` in ``__init__``."""

    def _init_liveness(self) -> None:
        self._live: tuple[float, View] | None = None  # (monotonic time fetched, view)
        self._live_lock = threading.Lock()
        self._live_refreshing = False

    def fetch_view(self, mount_timeout_s: float, daemon_timeout_s: float) -> View:
        """The forwarding layer now: every mount's ``GET /mapping`` and every daemon's ``GET
        /status`` at once, each bounded by its timeout (s). Never raises for an endpoint's sake."""
        eps = self.endpoints
        mounts = concurrently(lambda u: self._http("GET", u + "/mapping", timeout=mount_timeout_s), eps.mounts)
        daemons = sorted(eps.daemons.items())
        status = concurrently(lambda nu: self._http("GET", nu[1] + "/status", timeout=daemon_timeout_s), daemons)
        maps: dict[str, dict | None] = {}
        names: list[str] = []
        default = None
        errors: dict[str, str] = {}
        mount_nodes: dict[str, str] = {}
        for url, (got, err) in zip(eps.mounts, mounts, strict=True):
            if got is None or not isinstance(got, dict):
                maps[url], errors[url] = None, err or "bad reply"
                continue
            maps[url] = {k: list(v) for k, v in (got.get("jobs") or {}).items()}
            mount_nodes[url] = str(got.get("compute_node") or "")
            if not names:
                names = [n["name"] for n in got.get("nodes") or []]
                default = got.get("default")
        if not names:
            names = sorted(eps.daemons)
        down = {n for (n, _), (got, _) in zip(daemons, status, strict=True) if got is None}
        return View(names, default, maps, errors, down, mount_nodes)

    def refresh_view(self, timeout_s: float | None = None) -> View:
        """Fetch the view now (each call bounded by ``timeout_s``, default ``liveness_timeout_s``)
        and keep it for :meth:`live_view`."""
        t = timeout_s or self.cfg.liveness_timeout_s
        view = self.fetch_view(t, t)
        with self._live_lock:
            self._live = (time.monotonic(), view)
        return view

    def live_view(self) -> View:
        """The newest view, without waiting on the network (except when there is none yet: one
        fetch, at most ``liveness_timeout_s``); one older than ``liveness_max_age_s`` is
        refreshed in a background thread."""
        with self._live_lock:
            live = self._live
            stale = live is None or time.monotonic() - live[0] >= self.cfg.liveness_max_age_s
            start = live is not None and stale and not self._live_refreshing
            if start:
                self._live_refreshing = True
        if live is None:
            return self.refresh_view()
        if start:
            threading.Thread(target=self._refresh_in_background, name="control-liveness", daemon=True).start()
        return live[1]

    def _refresh_in_background(self) -> None:
        try:
            self.refresh_view()
        except Exception:  # a thread of its own: log, the next stale read tries again
            log.exception("liveness refresh failed")
        finally:
            with self._live_lock:
                self._live_refreshing = False

    def fresh_mount_maps(self, view: View, timeout_s: float) -> View:
        """``view`` with the job tables of the mounts that answered it read again (``GET
        /mapping`` at once, ``timeout_s`` each): the base a push modifies. Mounts that did not
        answer are not asked (the push fails at once; the loop retries)."""
        urls = [u for u, m in view.mount_maps.items() if m is not None]
        got = concurrently(lambda u: self._http("GET", u + "/mapping", timeout=timeout_s), urls)
        maps = dict(view.mount_maps)
        errors = dict(view.mount_errors)
        for url, (doc, err) in zip(urls, got, strict=True):
            if isinstance(doc, dict):
                maps[url] = {k: list(v) for k, v in (doc.get("jobs") or {}).items()}
            else:
                maps[url], errors[url] = None, err or "bad reply"
        return View(view.node_names, view.default_node, maps, errors, set(view.down), dict(view.mount_nodes))
