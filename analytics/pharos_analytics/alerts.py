"""Alerts for fail-slow, silent and unreachable nodes, slow networks and interference: Alertmanager (API v2) and a JSON webhook (Pharos).

A *condition* is an active anomaly (:class:`~pharos_analytics.failslow.Anomaly` with
``active``) or an active :class:`~pharos_analytics.interference.InterferenceEvent`, keyed by
its ``key``. :class:`Alerter` keeps the open conditions:

* a new condition is sent at once (``POST /api/v2/alerts``) with labels ``alertname``,
  ``severity``, ``target`` or ``node`` (fail-slow) / ``job``, ``culprit``, ``resource``
  (interference), ``startsAt`` = the fault's onset when known, ``endsAt`` = now +
  ``alert_ends_after_s``;
* while it stays open it is re-sent every ``alert_resend_s`` with the *same* labels and
  ``startsAt`` (Alertmanager deduplicates by labels: one alert, refreshed, never a new one),
  the severity fixed at opening, current numbers in the annotations;
* when it clears it is sent once more with ``endsAt`` = now, so Alertmanager resolves it.
  If Pharos stops, the last ``endsAt`` resolves it after ``alert_ends_after_s``.

The generic webhook receives ``{"version": "pharos.alerts.v1", "alerts": [...]}`` with the
same alert objects plus ``status`` firing|resolved and ``key``.

:class:`DetectionLoop` runs fail-slow, silent-forwarder and unreachable-broker
(:mod:`pharos_analytics.liveness`), slow-network (:mod:`pharos_analytics.network`) and
interference detection every ``detect_period_s``,
stores what it found (``anomalies``), alerts, logs notifications (``alert_log``) and
measures the time from a fault's onset (its first slow metrics interval) to Alertmanager
accepting the alert.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime

import httpx

from pharos_core.store import Store, ns_to_datetime64

from .diagnosis_config import DiagnosisConfig
from .failslow import Anomaly, WindowCache, detect_failslow
from .interference import InterferenceEvent, detect_interference
from .interference_usage import UsageCache
from .liveness import BROKER_KIND, SILENT_KIND, BrokerLike, detect_silent_forwarders, detect_unreachable_brokers
from .network import NETWORK_KIND, detect_slow_networks
from .periodic import PeriodicLoop
from .straggler import record_straggler_anomalies, trace_observations

log = logging.getLogger("pharos.alerts")
HTTP_TIMEOUT_S = 5.0
ALERTNAMES = {
    "fail_slow_target": "PharosFailSlowTarget",
    "fail_slow_forwarder": "PharosFailSlowForwarder",
    "forwarder_silent": "PharosForwarderSilent",
    "broker_unreachable": "PharosBrokerUnreachable",
    "network_slow": "PharosNetworkSlow",
    "interference": "PharosInterference",
}


def rfc3339(ns: int) -> str:
    return datetime.fromtimestamp(ns / 1e9, UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


@dataclass
class Condition:
    """One alertable condition: stable ``key`` and labels, current annotations."""

    key: str
    labels: dict[str, str]
    annotations: dict[str, str]
    onset_ns: int | None

    @classmethod
    def from_anomaly(cls, a: Anomaly) -> Condition:
        who = "target" if a.node_type == "target" else "node"
        ev = a.evidence.get(next(iter(a.evidence)), {}) if a.evidence else {}
        return cls(
            key=a.key,
            labels={
                "alertname": ALERTNAMES[a.kind],
                "severity": a.severity,
                who: a.node,
                "job": "",
                "source": "pharos",
            },
            annotations={
                "summary": (
                    f"forwarding node {a.node} is silent: no batch for {a.rel_service:.1f}x the silence threshold "
                    "while its peers are heard (cut off, stopped or hung)"
                    if a.kind == SILENT_KIND
                    else f"Kafka broker {a.node} does not answer while other brokers do (killed, cut off or hung): "
                    "producers hold their records until it is back"
                    if a.kind == BROKER_KIND
                    else f"compute node {a.node}'s requests spend {a.rel_service:.1f}x its peers' time between the "
                    "node and its forwarding nodes (lossy, capped or congested link)"
                    if a.kind == NETWORK_KIND
                    else f"{'storage target' if who == 'target' else 'forwarding node'} {a.node} is fail-slow: "
                    f"{a.rel_service:.1f}x its peers' service time per byte ({a.persistence})"
                ),
                "persistence": a.persistence,
                "windows_flagged_s": ",".join(f"{w:g}" for w in a.windows_flagged),
                "rel_service": f"{a.rel_service:.3f}",
                "z": f"{a.z:.2f}",
                "beacon_rule": str(a.beacon_slow).lower(),
                "evidence": json.dumps(ev, separators=(",", ":")),
                "rule_source": a.rule_source,
            },
            onset_ns=a.onset_ns,
        )

    @classmethod
    def from_interference(cls, e: InterferenceEvent) -> Condition:
        return cls(
            key=e.key,
            labels={
                "alertname": ALERTNAMES["interference"],
                "severity": e.severity,
                "job": e.job_id,
                "culprit": e.culprit_job,
                "resource": f"{e.resource_type}:{e.resource}",
                "source": "pharos",
            },
            annotations={
                "summary": f"job {e.job_id} slowed {e.latency_ratio:.1f}x by job {e.culprit_job} on "
                f"{e.resource_type} {e.resource}",
                "latency_ms": f"{e.latency_ms:.3f}",
                "baseline_latency_ms": f"{e.baseline_latency_ms:.3f}",
                "queue_wait_ms": f"{e.queue_wait_ms:.3f}",
                "baseline_source": e.baseline_source,
                "culprit_bytes": str(e.culprit_bytes),
                "co_located": ",".join(e.co_located),
                "rule_source": e.rule_source,
            },
            onset_ns=e.start_ns,
        )


@dataclass
class SendResult:
    sink: str
    accepted: bool
    status_code: int
    error: str
    accepted_ns: int


class AlertmanagerSink:
    """Alertmanager API v2: ``POST {url}/api/v2/alerts`` with a list of postable alerts."""

    name = "alertmanager"

    def __init__(self, url: str, client: httpx.Client | None = None) -> None:
        self.url = url.rstrip("/")
        self.client = client or httpx.Client(timeout=HTTP_TIMEOUT_S)

    def send(self, alerts: list[dict]) -> SendResult:
        body = [{k: a[k] for k in ("labels", "annotations", "startsAt", "endsAt", "generatorURL")} for a in alerts]
        return _post(self.client, self.name, self.url + "/api/v2/alerts", body)


class WebhookSink:
    """A generic JSON webhook: ``POST url`` with ``{"version": "pharos.alerts.v1", "alerts": [...]}``."""

    name = "webhook"

    def __init__(self, url: str, client: httpx.Client | None = None) -> None:
        self.url = url
        self.client = client or httpx.Client(timeout=HTTP_TIMEOUT_S)

    def send(self, alerts: list[dict]) -> SendResult:
        return _post(self.client, self.name, self.url, {"version": "pharos.alerts.v1", "alerts": alerts})


def _post(client: httpx.Client, sink: str, url: str, body) -> SendResult:
    try:
        r = client.post(url, json=body)
    except httpx.HTTPError as exc:
        return SendResult(sink, False, 0, str(exc)[:300], time.time_ns())
    ok = 200 <= r.status_code < 300
    return SendResult(sink, ok, r.status_code, "" if ok else r.text[:300], time.time_ns())


@dataclass
class OpenAlert:
    condition: Condition
    labels: dict[str, str]  # fixed at opening
    starts_ns: int
    last_sent_ns: int = 0
    first_accepted_ns: int | None = None


@dataclass
class Alerter:
    """Deduplicating alert state over any number of sinks (see the module doc)."""

    sinks: list
    cfg: DiagnosisConfig
    store: Store | None = None  # alert_log rows when set
    generator_url: str = ""
    open: dict[str, OpenAlert] = field(default_factory=dict)
    latencies: list[dict] = field(default_factory=list)  # {key, onset_ns, accepted_ns, latency_s}
    _lock: threading.Lock = field(default_factory=threading.Lock)

    @classmethod
    def from_config(cls, cfg: DiagnosisConfig, store: Store | None = None, generator_url: str = "") -> Alerter:
        sinks: list = []
        if cfg.alertmanager_url:
            sinks.append(AlertmanagerSink(cfg.alertmanager_url))
        if cfg.alert_webhook_url:
            sinks.append(WebhookSink(cfg.alert_webhook_url))
        return cls(sinks, cfg, store, generator_url)

    def _alert(self, oa: OpenAlert, ends_ns: int, status: str) -> dict:
        return {
            "labels": oa.labels,
            "annotations": oa.condition.annotations,
            "startsAt": rfc3339(oa.starts_ns),
            "endsAt": rfc3339(ends_ns),
            "generatorURL": self.generator_url,
            "status": status,
            "key": oa.condition.key,
        }

    def update(self, conditions: list[Condition], now_ns: int | None = None) -> dict:
        """Open, refresh and resolve alerts so that exactly ``conditions`` are firing. Returns counts."""
        now_ns = time.time_ns() if now_ns is None else now_ns
        resend_ns = int(self.cfg.alert_resend_s * 1e9)
        firing, resolved = [], []
        with self._lock:
            current = {c.key: c for c in conditions}
            for key, c in current.items():
                oa = self.open.get(key)
                if oa is None:
                    starts = c.onset_ns if c.onset_ns and c.onset_ns <= now_ns else now_ns
                    oa = self.open[key] = OpenAlert(c, dict(c.labels), starts)
                else:
                    oa.condition = Condition(key, oa.labels, c.annotations, oa.condition.onset_ns)
                if oa.first_accepted_ns is None or now_ns - oa.last_sent_ns >= resend_ns:
                    firing.append(oa)
            for key in [k for k in self.open if k not in current]:
                resolved.append(self.open.pop(key))
            batch = [self._alert(o, now_ns + int(self.cfg.alert_ends_after_s * 1e9), "firing") for o in firing] + [
                self._alert(o, now_ns, "resolved") for o in resolved
            ]
            if not batch:
                return {"firing": len(self.open), "sent": 0, "resolved": 0}
            results = [s.send(batch) for s in self.sinks]
            am = next((r for r in results if r.sink == "alertmanager"), results[0] if results else None)
            log_rows = []
            for o in firing:
                o.last_sent_ns = now_ns
                if am is not None and am.accepted and o.first_accepted_ns is None:
                    o.first_accepted_ns = am.accepted_ns
                    if o.condition.onset_ns:
                        self.latencies.append(
                            {
                                "key": o.condition.key,
                                "onset_ns": o.condition.onset_ns,
                                "accepted_ns": am.accepted_ns,
                                "latency_s": (am.accepted_ns - o.condition.onset_ns) / 1e9,
                            }
                        )
                        self.latencies = self.latencies[-100:]
            for r in results:
                for o, state in [(o, "firing") for o in firing] + [(o, "resolved") for o in resolved]:
                    lat = None
                    if (
                        state == "firing"
                        and r.accepted
                        and o.condition.onset_ns
                        and o.first_accepted_ns == r.accepted_ns
                    ):
                        lat = (r.accepted_ns - o.condition.onset_ns) / 1e9
                    log_rows.append(
                        {
                            "time": ns_to_datetime64(r.accepted_ns),
                            "key": o.condition.key,
                            "alertname": o.labels["alertname"],
                            "state": state,
                            "sink": r.sink,
                            "accepted": int(r.accepted),
                            "status_code": r.status_code,
                            "onset": ns_to_datetime64(o.condition.onset_ns) if o.condition.onset_ns else None,
                            "latency_s": lat,
                            "labels": json.dumps(o.labels),
                            "error": r.error,
                        }
                    )
                if not r.accepted:
                    log.warning("alert sink %s refused %d alert(s): %s %s", r.sink, len(batch), r.status_code, r.error)
            # a refused firing alert is retried next cycle
            for o in firing:
                if not (am and am.accepted):
                    o.last_sent_ns = 0
            if self.store is not None and log_rows:
                try:
                    self.store.insert_rows("alert_log", log_rows)
                except Exception as exc:  # the log is best effort; alerting goes on
                    log.warning("alert_log insert failed: %s", str(exc).splitlines()[0])
            return {"firing": len(self.open), "sent": len(firing), "resolved": len(resolved)}


#: Jobs whose end event falls in (since, until].
ENDED_JOBS_SQL = """
SELECT job_id, max(time) AS ended FROM job_events
WHERE kind = 'end' AND time > {since:DateTime64(9)} AND time <= {until:DateTime64(9)}
GROUP BY job_id
ORDER BY ended, job_id
"""


def anomaly_rows(anoms: list[Anomaly], events: list[InterferenceEvent], now_ns: int) -> list[dict]:
    """Rows of the ``anomalies`` table for one detection cycle."""
    det = ns_to_datetime64(now_ns)
    rows = [
        {
            "detected": det,
            "key": a.key,
            "kind": a.kind,
            "node": a.node,
            "node_type": a.node_type,
            "job_id": "",
            "culprit_job": "",
            "persistence": a.persistence,
            "active": int(a.active),
            "severity": a.severity,
            "ratio": a.rel_service,
            "onset": ns_to_datetime64(a.onset_ns) if a.onset_ns else None,
            "start": None,
            "end": None,
            "evidence": json.dumps(
                {"windows_flagged": a.windows_flagged, "z": a.z, "beacon_slow": a.beacon_slow, "windows": a.evidence}
            ),
        }
        for a in anoms
    ]
    rows += [
        {
            "detected": det,
            "key": e.key,
            "kind": "interference",
            "node": e.resource,
            "node_type": e.resource_type,
            "job_id": e.job_id,
            "culprit_job": e.culprit_job,
            "persistence": "",
            "active": int(e.active),
            "severity": e.severity,
            "ratio": e.latency_ratio,
            "onset": ns_to_datetime64(e.start_ns),
            "start": ns_to_datetime64(e.start_ns),
            "end": ns_to_datetime64(e.end_ns),
            "evidence": json.dumps({k: v for k, v in e.to_dict().items() if k not in ("key",)}),
        }
        for e in events
    ]
    return rows


class DetectionLoop(PeriodicLoop):
    """Periodic fail-slow + interference detection and alerting on one store (a daemon thread,
    every ``[diagnosis] detect_period_s``; :class:`~pharos_analytics.periodic.PeriodicLoop`).

    ``cfg_factory`` is called every cycle (``DiagnosisConfig`` re-reads file and environment)."""

    thread_name = "sysdiag"
    cycle_name = "detection"

    def __init__(
        self,
        store: Store,
        cfg_factory: Callable[[], DiagnosisConfig] = DiagnosisConfig,
        generator_url: str = "",
        broker_probe: Callable[[], Sequence[BrokerLike]] | None = None,
        mount_dir: str = "",
    ) -> None:
        self.store = store
        self.broker_probe = broker_probe  # the server's Kafka brokers (pharos_pipeline.broker_health.BrokerProbe)
        self.mount_dir = mount_dir  # the compute nodes' mount point (slow network paths); "" = not judged
        self.cfg_factory = cfg_factory
        cfg = cfg_factory()
        self.alerter = Alerter.from_config(cfg, store, generator_url)
        self.failslow_windows = WindowCache()  # long windows re-judged every failslow_refresh_share of them
        self.interference_usage = UsageCache()  # the settled windows of the interference pass
        # ended jobs waiting for straggler attribution (oldest end first), and when each was queued
        # (a job seen again in the next cycle's 30 s overlap is not queued twice)
        self.straggler_backlog: list[str] = []
        self.straggler_dropped = 0  # jobs left out when the backlog was full (logged)
        self._straggler_seen: dict[str, int] = {}
        super().__init__(cfg.detect_period_s, log)

    def run_once(self, now_ns: int | None = None) -> dict:
        cfg = self.cfg_factory()
        self.alerter.cfg = cfg
        t0 = time.monotonic()
        now_ns = time.time_ns() if now_ns is None else now_ns
        rep = detect_failslow(self.store, cfg, now_ns=now_ns, cache=self.failslow_windows)
        nodes = detect_silent_forwarders(self.store, cfg, now_ns=now_ns)
        nodes += self._brokers(now_ns)
        if self.mount_dir:
            nodes += detect_slow_networks(self.store, self.mount_dir, cfg, now_ns)
        events = detect_interference(self.store, cfg, until_ns=now_ns, cache=self.interference_usage)
        rows = anomaly_rows(rep.anomalies + nodes, events, now_ns)
        if rows:
            self.store.insert_rows("anomalies", rows)
        stragglers = self._stragglers(cfg, now_ns)
        conds = [Condition.from_anomaly(a) for a in rep.anomalies + nodes if a.active]
        conds += [Condition.from_interference(e) for e in events if e.active]
        sent = (
            self.alerter.update(conds, time.time_ns())
            if self.alerter.sinks
            else {"firing": len(conds), "sent": 0, "resolved": 0}
        )
        self.last = {
            "time_ns": now_ns,
            "duration_s": self.cycle_done(t0),
            "anomalies": len(rep.anomalies),
            "silent_forwarders": sum(1 for a in nodes if a.kind == SILENT_KIND),
            "unreachable_brokers": sum(1 for a in nodes if a.kind == BROKER_KIND),
            "slow_networks": sum(1 for a in nodes if a.kind == NETWORK_KIND),
            "interference": len(events),
            "straggler_resources": stragglers,
            "straggler_backlog": len(self.straggler_backlog),
            "straggler_dropped": self.straggler_dropped,
            "conditions": len(conds),
            **sent,
            "alert_latencies_s": [round(x["latency_s"], 3) for x in self.alerter.latencies[-10:]],
        }
        return self.last

    def _brokers(self, now_ns: int) -> list[Anomaly]:
        """Unreachable Kafka brokers by :attr:`broker_probe` (none without a probe, or when it fails)."""
        if self.broker_probe is None:
            return []
        try:
            return detect_unreachable_brokers(self.broker_probe(), now_ns)
        except Exception:  # a probe failure must not stop the other detectors
            log.exception("Kafka broker probe failed")
            return []

    def _stragglers(self, cfg: DiagnosisConfig, now_ns: int) -> int:
        """Straggler attribution (:mod:`~pharos_analytics.straggler`) of the jobs that ended since the
        previous cycle, and in the 30 s before it (their last forwarder records may come after the
        end event), on the first cycle within ``interference_lookback_s``. At most
        ``straggler_jobs_per_cycle`` jobs per cycle, oldest end first: the rest stay in
        :attr:`straggler_backlog` for the next cycles. Each blamed resource is stored once per job
        (kind ``straggler_resource``). Returns the resources found."""
        since = int(self.last.get("time_ns", 0)) if self.last else now_ns - int(cfg.interference_lookback_s * 1e9)
        ended = self.store.query(
            ENDED_JOBS_SQL, {"since": ns_to_datetime64(since - 30_000_000_000), "until": ns_to_datetime64(now_ns)}
        )
        for r in ended:
            if r["job_id"] not in self._straggler_seen:
                self._straggler_seen[r["job_id"]] = now_ns
                self.straggler_backlog.append(r["job_id"])
        cap = 100 * cfg.straggler_jobs_per_cycle
        if len(self.straggler_backlog) > cap:  # attribution failing cycle after cycle: keep the newest
            over = len(self.straggler_backlog) - cap
            self.straggler_dropped += over
            log.warning("straggler attribution: backlog over %d jobs, %d oldest left out", cap, over)
            del self.straggler_backlog[:over]
        horizon = now_ns - 600_000_000_000  # well past the 30 s overlap
        self._straggler_seen = {j: t for j, t in self._straggler_seen.items() if t >= horizon}
        jobs = self.straggler_backlog[: cfg.straggler_jobs_per_cycle]
        if not jobs:
            return 0
        n = 0
        try:
            traces = trace_observations(self.store, jobs)  # one query for the batch
        except Exception as exc:  # never stops the detection loop; the jobs stay queued for the next cycle
            log.warning("straggler attribution: reading %d ended jobs failed: %s", len(jobs), str(exc).splitlines()[0])
            return 0
        del self.straggler_backlog[: len(jobs)]
        for job in jobs:
            try:
                n += len(record_straggler_anomalies(self.store, job, cfg, now_ns, traces[job]).findings)
            except Exception as exc:  # one job's attribution never stops the detection loop
                log.warning("straggler attribution of job %s failed: %s", job, str(exc).splitlines()[0])
        return n

    def status(self) -> dict:
        return {
            "period_s": self.period_s,
            "cycles": self.cycles,
            "open_alerts": len(self.alerter.open),
            "sinks": [s.name for s in self.alerter.sinks],
            "last": self.last,
        }
