"""The control loop's pushes to the forwarding layer's admin interfaces (HTTP, admin token,
back-off), and what it reads there: the mounts' job tables and nodes, the daemons' placement.

**Per compute node** (DFRA, Ji et al., FAST'19 §4: compute nodes are mapped to forwarding
nodes). With mounts on several compute nodes (a cluster: the mounts that answer name two or more
distinct compute nodes), a job whose entry names several forwarding nodes is pushed to each mount
as ONE of them: the compute node at position p of the job's compute nodes (sorted; those its
requests came from so far) gets node ``p mod k``; before the job's first request (a hint at
dispatch) the mount's position among the answering mounts in the configured list stands in for p. So the job's compute nodes spread over its forwarding nodes, each node's ranks
on one of them (the mount's failover order stays its own). With one mount (the embedded stack),
the mount gets the whole list and spreads the job's ranks over it.

A push that fails (unreachable, timeout, HTTP error) changes nothing on that side: the mount and
the daemons swap their tables atomically only on success, so the previous mapping or placement
keeps serving; the loop re-pushes later, back-off doubling up to ``retry_max_backoff_s`` (see
:mod:`pharos_analytics.control.loop`). Every call carries the admin token (``[control]
admin_token_file``, else ``fwd_admin_token_file``).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TypeVar

import httpx

from pharos_core.settings import Settings, admin_headers

from .config import ControlConfig

T = TypeVar("T")
R = TypeVar("R")

#: At most this many admin calls in flight at once per batch.
MAX_PARALLEL = 32


def concurrently(fn: Callable[[T], R], items: list[T]) -> list[R]:
    """``[fn(x) for x in items]``, the calls in parallel threads (at most :data:`MAX_PARALLEL`);
    ``fn`` must not raise (the admin calls return their error instead)."""
    if len(items) <= 1:
        return [fn(x) for x in items]
    with ThreadPoolExecutor(max_workers=min(MAX_PARALLEL, len(items)), thread_name_prefix="control-http") as ex:
        return list(ex.map(fn, items))


@dataclass
class Endpoints:
    """Admin base URLs: the FUSE clients (``mounts``) and the forwarding daemons (node -> URL)."""

    mounts: list[str]
    daemons: dict[str, str]

    @classmethod
    def from_settings(cls, settings: Settings, cfg: ControlConfig) -> Endpoints:
        """``cfg``'s URLs, else those of the processes ``pharos up`` starts: the ``admin`` address in
        their ready files (``<state>/run/fwd<i>.ready``, ``mount.ready``), else the Settings ports."""

        def ready_admin(name: str) -> str | None:
            f = settings.state_dir / "run" / f"{name}.ready"
            try:
                return "http://" + json.loads(f.read_text())["admin"]
            except (OSError, ValueError, KeyError, TypeError):
                return None

        daemons = dict(cfg.fwd_admin_urls)
        if not daemons:
            for i in range(settings.fwd_nodes):
                port = settings.fwd_port_base + 10 * i + 1
                daemons[f"fwd{i}"] = ready_admin(f"fwd{i}") or f"http://127.0.0.1:{port}"
        mounts = list(cfg.mount_admin_urls)
        if not mounts and settings.fwd_nodes:
            mounts = [ready_admin("mount") or f"http://127.0.0.1:{settings.mount_admin_port}"]
        return cls([u.rstrip("/") for u in mounts], {k: v.rstrip("/") for k, v in daemons.items()})


@dataclass
class PushResult:
    url: str
    ok: bool
    error: str = ""
    changed: bool = True


@dataclass
class _Backoff:
    failures: int = 0
    next_ns: int = 0


@dataclass
class View:
    """What one cycle knows about the forwarding layer."""

    node_names: list[str]
    default_node: str | None
    mount_maps: dict[str, dict[str, list[str]] | None]  # url -> jobs table (None: unreachable)
    mount_errors: dict[str, str] = field(default_factory=dict)
    down: set[str] = field(default_factory=set)  # nodes whose daemon's admin interface does not answer
    mount_nodes: dict[str, str] = field(default_factory=dict)  # url -> its compute node ('' unknown)


def compute_node_entry(
    nodes: list[str] | None, job_nodes: list[str], compute_node: str, fallback: int
) -> list[str] | None:
    """A job's mapping entry as one mount gets it (see the module docstring, "Per compute node").

    Args:
        nodes: the job's forwarding nodes (None: no entry, the mount's default).
        job_nodes: the job's compute nodes so far, sorted (empty: not known yet).
        compute_node: the mount's compute node name.
        fallback: the mount's position in the mount list, used when ``compute_node`` is not
            among ``job_nodes``.

    Returns:
        ``[nodes[p mod k]]`` for a list of k > 1 nodes, p the compute node's position in
        ``job_nodes`` (else ``fallback``); ``nodes`` itself otherwise.
    """
    if not nodes or len(nodes) < 2:
        return nodes
    p = job_nodes.index(compute_node) if compute_node in job_nodes else fallback
    return [nodes[p % len(nodes)]]


def _canon(x):
    """A JSON value without null members (the daemons print absent options as null)."""
    if isinstance(x, dict):
        return {k: _canon(v) for k, v in x.items() if v is not None}
    if isinstance(x, list):
        return [_canon(v) for v in x]
    return x


class AdminPush:
    """The admin-interface half of :class:`~pharos_analytics.control.loop.ControlLoop`: HTTP
    calls with the admin token, back-off after a failed push, the mounts' view, the pushes of
    mappings and placement. Uses the loop's ``settings``, ``cfg``, ``client``, ``_endpoints``,
    ``_backoff`` and ``period_s``."""

    @property
    def endpoints(self) -> Endpoints:
        return self._endpoints or Endpoints.from_settings(self.settings, self.cfg)

    def _admin_headers(self) -> dict[str, str]:
        """The admin token of the mounts' and daemons' admin interfaces (``[control]
        admin_token_file``, else the settings' ``fwd_admin_token_file``), read per call: a token
        rotated on disk is used at once."""
        if self.cfg.admin_token_file is not None:
            return admin_headers(self.cfg.admin_token_file)
        return self.settings.fwd_admin_headers()

    def _http(self, method: str, url: str, body=None, timeout: float | None = None) -> tuple[dict | list | None, str]:
        """(JSON reply, '') or (None, one-line error); ``timeout`` (s) None: ``http_timeout_s``."""
        try:
            r = self.client.request(
                method,
                url,
                json=body,
                timeout=self.cfg.http_timeout_s if timeout is None else timeout,
                headers=self._admin_headers(),
            )
        except httpx.HTTPError as exc:
            return None, f"{method} {url}: {type(exc).__name__}: {str(exc)[:200]}"
        if r.status_code >= 400:
            return None, f"{method} {url}: HTTP {r.status_code} {r.text[:200]}"
        try:
            return r.json(), ""
        except ValueError:
            return None, f"{method} {url}: reply is not JSON"

    # -- pushing ----------------------------------------------------------------------------------
    def _backoff_ok(self, key: str, now_ns: int) -> bool:
        b = self._backoff.get(key)
        return b is None or now_ns >= b.next_ns

    def _note_push(self, key: str, ok: bool, now_ns: int) -> None:
        if ok:
            self._backoff.pop(key, None)
            return
        b = self._backoff.setdefault(key, _Backoff())
        b.failures += 1
        delay_s = min(self.cfg.retry_max_backoff_s, max(self.period_s, 1.0) * 2 ** (b.failures - 1))
        b.next_ns = now_ns + int(delay_s * 1e9)

    def _push_mapping(
        self,
        view: View,
        desired: dict[str, list[str] | None],
        drop: set[str],
        now_ns: int,
        force: bool,
        job_nodes: dict[str, list[str]] | None = None,
        timeout: float | None = None,
    ) -> list[PushResult]:
        """Make each mount's job table hold ``desired`` (and not ``drop``), per compute node when
        the mounts are on several compute nodes (:func:`compute_node_entry`, ``job_nodes``: job -> its compute
        nodes so far); PUT only on a change, to every mount at once (``timeout`` s each, None:
        ``http_timeout_s``)."""
        out: dict[str, PushResult] = {}
        puts: list[tuple[str, dict]] = []
        named = [u for u in view.mount_maps if view.mount_nodes.get(u)]  # the mounts that said their node
        several = len({view.mount_nodes[u] for u in named}) > 1
        for url, cur in view.mount_maps.items():
            if cur is None:  # a new decision fails there; otherwise it is re-pushed once the mount answers
                out[url] = PushResult(url, False, view.mount_errors.get(url, "unreachable"), changed=force)
                continue
            new = {k: v for k, v in cur.items() if k not in drop}
            for job, nodes in desired.items():
                if several:
                    nodes = compute_node_entry(
                        nodes,
                        (job_nodes or {}).get(job, []),
                        view.mount_nodes.get(url, ""),
                        named.index(url) if url in named else len(named),
                    )
                if nodes is None:
                    new.pop(job, None)
                else:
                    new[job] = nodes
            if new == cur:
                out[url] = PushResult(url, True, changed=False)
            elif not force and not self._backoff_ok("mount:" + url, now_ns):
                out[url] = PushResult(url, False, "in back-off after a failed push")
            else:
                puts.append((url, new))
        errs = concurrently(lambda un: self._http("PUT", un[0] + "/mapping", {"jobs": un[1]}, timeout)[1], puts)
        for (url, _), err in zip(puts, errs, strict=True):
            self._note_push("mount:" + url, not err, now_ns)
            out[url] = PushResult(url, not err, err)
        return [out[u] for u in view.mount_maps]

    def _daemon_placements(
        self, eps: Endpoints, down: set[str]
    ) -> tuple[dict[str, dict | None], dict[str, str], list[str]]:
        """(node -> its placement document, None when it did not answer; node -> error; the
        targets the first daemon that answers knows). Daemons ``down`` (no answer to the
        liveness check) are not asked; the others at once."""
        nodes = sorted(eps.daemons)
        up = [n for n in nodes if n not in down]
        got = dict(zip(up, concurrently(lambda n: self._http("GET", eps.daemons[n] + "/placement"), up), strict=True))
        docs: dict[str, dict | None] = {}
        errors: dict[str, str] = {}
        targets: list[str] = []
        for node in nodes:
            doc, err = got.get(node, (None, "no answer to the liveness check (GET /status)"))
            docs[node] = doc if isinstance(doc, dict) else None
            if err:
                errors[node] = err
            if not targets and doc is not None:
                t, _ = self._http("GET", eps.daemons[node] + "/targets")
                targets = [x["name"] for x in t] if isinstance(t, list) else []
        return docs, errors, targets

    def _push_placement(
        self,
        eps: Endpoints,
        nodes: list[str],
        docs: dict[str, dict | None],
        errors: dict[str, str],
        doc: dict,
        now_ns: int,
    ) -> list[PushResult]:
        """PUT ``doc`` to the daemons of ``nodes``; one that did not answer the GET fails with its
        error (no PUT). Back-off noted per node."""
        results = []
        for node in nodes:
            url = eps.daemons[node]
            if docs[node] is None:
                err = errors.get(node, "unreachable")
            else:
                _, err = self._http("PUT", url + "/placement", doc)
            self._note_push("fwd:" + node, not err, now_ns)
            results.append(PushResult(url, not err, err))
        return results
