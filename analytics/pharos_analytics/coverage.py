"""Producer liveness and job coverage: no silent gaps when an agent dies.

Every producer (eBPF agent, forwarding daemon) sends a batch at least every heartbeat
interval (``Settings.heartbeat_interval_s``, 2 s): its records, or an empty ``IoBatch`` when
it has none (``pharos_wire::sink``). The pipeline stores one ``io_batches`` row per batch
(producer_id, seq, host, records, created), so that table is each producer's liveness
timeline; ``created`` is the producer's own clock when the batch left it. A producer is
*silent* when no batch of it was created for more than ``silence_s`` =
``heartbeat_missed`` (3) x ``heartbeat_interval_s``: it died, hung, or cannot reach Kafka.

**Agents.** Producer ids are unique per process instance; an agent's is
``<host>:agent:<pid>:<start ns>`` (agents/ebpf/src/main.rs), so a restarted agent is a new
producer on the same host. Only agents (client layer) decide whether a job is complete: the
forwarding daemons have failover of their own (the mount replays a request on another node).

**Job coverage** (:func:`job_coverage`). The job's hosts are its start event's host, the hosts
of its client-layer records and the compute nodes named by its forwarder-layer records. A host
is *checked* when an agent on it had sent a heartbeat (a batch without records, which only
agents with heartbeats send) before the job ended: hosts that never had such an agent (an
imported Darshan log's nodes, a mount's compute-node name, nodes without Pharos, jobs older than
heartbeats) are not monitored by an agent, so nothing is missing there. For each checked host, a
*gap* is a stretch of more than ``silence_s`` without a batch from any agent on it that overlaps
the job's time range [start event, end event] (a running job: up to now); it is reported
clipped to that range, as ``{host, producer, start, end, next_producer}``: ``producer`` is
the agent that fell silent ('' when none had been heard on the host before), ``next_producer``
the agent heard next (a restarted agent; '' when none yet). The cases:

* the agent died during the job and was restarted later (or not): gap from its last batch to
  the job's end (or to the new agent's first batch, if that came before the end);
* no agent ran when the job started: gap from the job's start to the first batch;
* the agent hung or lost Kafka for a while: gap between its batches.

A job with a gap is *incomplete*: ``complete`` is false in its summary, its report and ``GET
/v1/jobs/{id}``; its figures are a lower bound. Jobs imported from Darshan logs are not
checked (``checked`` ``"darshan"``), nor jobs with no time range (``"no-time"``); a job on
hosts that never had an agent is ``"no-agent"``. All are ``complete``.

Gaps are computed on every request from what is stored, never stored themselves: a pipeline
lagging by more than ``silence_s`` shows recent jobs as incomplete until it catches up.

Every number comes from SQL over ``io_batches`` (window functions; only gap rows come back).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Literal

from pharos_core.store import Store

from .summary_sql import JOB_EVENTS_SQL, ns_to_datetime

#: Substring of every agent's producer id: ``<host>:agent:<pid>:<start ns>``.
AGENT_MARK = ":agent:"
#: Prefix of a forwarding daemon's producer id: ``pharos-fwd-<node>-<pid>-<start hex>``.
FWD_PREFIX = "pharos-fwd-"
ProducerKind = Literal["agent", "fwd", "other"]
Checked = Literal["agents", "no-agent", "darshan", "no-time"]

#: Placeholder of the SQL below for :func:`_agents_on`'s condition: the agents of given hosts.
_AGENTS = "__AGENTS__"

#: The hosts a job ran on: its start event's host, its client-layer records' hosts, its
#: forwarder-layer records' compute nodes.
JOB_HOSTS_SQL = """
SELECT DISTINCT h AS host FROM
(
    SELECT host AS h FROM job_events WHERE job_id = {job_id:String} AND kind = 'start'
    UNION ALL
    SELECT DISTINCT host AS h FROM io_requests WHERE job_id = {job_id:String} AND layer = 'client'
    UNION ALL
    SELECT DISTINCT toString(compute_node) AS h FROM io_requests
    WHERE job_id = {job_id:String} AND layer = 'forwarder'
)
WHERE h != ''
ORDER BY host
"""

#: The job's record time range (for jobs without events) and whether it came from Darshan.
JOB_RECORDS_SQL = """
SELECT
    toUnixTimestamp64Nano(min(start))                      AS first_ns,
    toUnixTimestamp64Nano(max(end))                        AS last_ns,
    count()                                                AS n,
    (SELECT count() FROM darshan_logs WHERE job_id = {job_id:String}) AS darshan_logs
FROM io_requests WHERE job_id = {job_id:String}
"""

#: Per host with an agent: its first heartbeat, and around the window [lo, hi] (the job's
#: range widened by the silence): the first and last batch inside, the last agent before, the
#: first agent after.
HOST_EDGES_SQL = """
SELECT
    host,
    toUnixTimestamp64Nano(minIf(created, records = 0))      AS first_beat_ns,
    countIf(records = 0)                                    AS beats,
    countIf(inside)                                         AS n,
    toUnixTimestamp64Nano(minIf(created, inside))           AS first_ns,
    argMinIf(producer, created, inside)                     AS first_producer,
    toUnixTimestamp64Nano(maxIf(created, inside))           AS last_ns,
    argMaxIf(producer, created, inside)                     AS last_producer,
    argMaxIf(producer, created, created < lo)               AS before_producer,
    argMinIf(producer, created, created > hi)               AS after_producer
FROM
(
    SELECT
        host,
        toString(producer_id)                                AS producer,
        records,
        created,
        fromUnixTimestamp64Nano({lo_ns:Int64})             AS lo,
        fromUnixTimestamp64Nano({hi_ns:Int64})             AS hi,
        created >= lo AND created <= hi                      AS inside
    FROM io_batches
    WHERE __AGENTS__
)
GROUP BY host
"""

#: Silences longer than {silence_ns} between consecutive agent batches of a host inside [lo, hi].
HOST_SILENCES_SQL = """
SELECT host, prev_producer, producer, prev_ns, t_ns
FROM
(
    SELECT
        host,
        toString(producer_id)                                       AS producer,
        toUnixTimestamp64Nano(created)                              AS t_ns,
        lagInFrame(toUnixTimestamp64Nano(created), 1, toInt64(0)) OVER w AS prev_ns,
        lagInFrame(toString(producer_id), 1, '') OVER w             AS prev_producer
    FROM io_batches
    WHERE __AGENTS__
      AND created BETWEEN fromUnixTimestamp64Nano({lo_ns:Int64}) AND fromUnixTimestamp64Nano({hi_ns:Int64})
    WINDOW w AS (PARTITION BY host ORDER BY created ASC ROWS BETWEEN 1 PRECEDING AND CURRENT ROW)
)
WHERE prev_ns > 0 AND t_ns - prev_ns > {silence_ns:Int64}
ORDER BY host, t_ns
"""

#: Every producer heard since {since_ns}: its host, first and last batch, batches, heartbeats.
PRODUCERS_SQL = """
SELECT
    toString(producer_id)                            AS producer,
    toString(argMax(host, created))                  AS last_host,
    toUnixTimestamp64Nano(min(created))              AS first_ns,
    toUnixTimestamp64Nano(max(created))              AS last_ns,
    toUnixTimestamp64Milli(max(ingested))            AS last_ingested_ms,
    uniqExact(seq)                                   AS n_batches,
    uniqExactIf(seq, records = 0)                    AS n_heartbeats,
    sum(records)                                     AS n_records
FROM io_batches
WHERE created >= fromUnixTimestamp64Nano({since_ns:Int64})
GROUP BY producer_id
ORDER BY last_host, last_ns DESC, producer
"""


@dataclass(frozen=True)
class Gap:
    """A stretch of a job's time on ``host`` with no batch from any agent there (UTC)."""

    host: str
    producer: str
    start: datetime
    end: datetime
    next_producer: str = ""

    @property
    def duration_s(self) -> float:
        return (self.end - self.start).total_seconds()


@dataclass(frozen=True)
class Coverage:
    """Whether agents watched a job's hosts for its whole time range (see the module docstring).

    ``hosts`` are the job's hosts that were checked (had an agent), ``unmonitored_hosts`` the
    others; ``silence_s`` the threshold used."""

    complete: bool
    gaps: list[Gap] = field(default_factory=list)
    checked: Checked = "agents"
    hosts: list[str] = field(default_factory=list)
    unmonitored_hosts: list[str] = field(default_factory=list)
    silence_s: float = 6.0


@dataclass(frozen=True)
class Producer:
    """One producer's liveness from its batches. ``age_s``: seconds since its last batch was made."""

    producer_id: str
    kind: ProducerKind
    host: str
    pid: int | None
    first_batch: datetime | None
    last_batch: datetime | None
    last_ingested: datetime | None
    age_s: float
    batches: int
    heartbeats: int
    records: int
    state: Literal["alive", "silent"]


def _agents_on(sql: str, hosts: list[str]) -> tuple[str, dict[str, str]]:
    """``sql`` with its ``__AGENTS__`` placeholder replaced by the condition "a batch of an agent on
    one of ``hosts``", and the bound parameters it uses. The condition is a prefix of the
    producer id (``<host>:agent:``) per host, which the table's key (producer_id, seq) serves,
    so only those producers' rows are read; ``host IN`` guards the rest."""
    params = {f"agent_{i}": f"{h}{AGENT_MARK}" for i, h in enumerate(hosts)}
    prefixes = " OR ".join(f"startsWith(producer_id, {{{k}:String}})" for k in params) or "0"
    return sql.replace(_AGENTS, f"({prefixes}) AND host IN {{hosts:Array(String)}}"), {**params, "hosts": hosts}


def default_silence_s() -> float:
    """``Settings.silence_s`` of this process's settings (heartbeat_missed x heartbeat_interval_s)."""
    from pharos_core.settings import get_settings

    return get_settings().silence_s


def producer_kind(producer_id: str) -> ProducerKind:
    """``agent`` (``<host>:agent:<pid>:<ns>``), ``fwd`` (``pharos-fwd-<node>-<pid>-<hex>``) or ``other``."""
    if AGENT_MARK in producer_id:
        return "agent"
    if producer_id.startswith(FWD_PREFIX):
        return "fwd"
    return "other"


def producer_pid(producer_id: str) -> int | None:
    """The process id inside an agent's or forwarding daemon's producer id, else None."""
    kind = producer_kind(producer_id)
    try:
        if kind == "agent":
            return int(producer_id.rsplit(AGENT_MARK, 1)[1].split(":")[0])
        if kind == "fwd":
            return int(producer_id.rsplit("-", 2)[1])
    except (IndexError, ValueError):
        pass
    return None


def producers(
    store: Store, since_s: float = 3600.0, silence_s: float | None = None, now_ns: int | None = None
) -> list[Producer]:
    """Producers that sent a batch in the last ``since_s`` seconds, by host, newest first;
    ``alive`` when their last batch is at most ``silence_s`` old (default: the settings')."""
    silence = default_silence_s() if silence_s is None else silence_s
    now = time.time_ns() if now_ns is None else now_ns
    rows = store.query(PRODUCERS_SQL, {"since_ns": max(0, now - int(since_s * 1e9))})
    out = []
    for r in rows:
        last = int(r["last_ns"])
        age = max(0.0, (now - last) / 1e9)
        ingested_ms = int(r["last_ingested_ms"] or 0)
        out.append(
            Producer(
                producer_id=r["producer"],
                kind=producer_kind(r["producer"]),
                host=r["last_host"],
                pid=producer_pid(r["producer"]),
                first_batch=ns_to_datetime(int(r["first_ns"])),
                last_batch=ns_to_datetime(last),
                last_ingested=ns_to_datetime(ingested_ms * 1_000_000),
                age_s=age,
                batches=int(r["n_batches"]),
                heartbeats=int(r["n_heartbeats"]),
                records=int(r["n_records"]),
                state="alive" if age <= silence else "silent",
            )
        )
    return out


def gap_lines(gaps: list[Gap] | list[dict]) -> list[str]:
    """One plain line per gap: :class:`Gap` objects, or their JSON (``GET /v1/jobs/{id}``'s ``gaps``)."""

    def g(x, k):
        return x.get(k, "") if isinstance(x, dict) else getattr(x, k)

    def when(d: datetime) -> str:
        return d.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S UTC")

    out = []
    for x in gaps:
        start, end = g(x, "start"), g(x, "end")
        if isinstance(start, str):
            start, end = (datetime.fromisoformat(t.replace("Z", "+00:00")) for t in (start, end))
        who = f"agent {g(x, 'producer')}" if g(x, "producer") else "no agent"
        nxt = f"; next heard: {g(x, 'next_producer')}" if g(x, "next_producer") else "; no agent heard since"
        out.append(
            f"host {g(x, 'host')}: {who} silent from {when(start)} to {when(end)} "
            f"({(end - start).total_seconds():.1f} s of the job){nxt}"
        )
    return out


def _time_range(store: Store, job_id: str, now: int) -> tuple[int | None, int | None, bool]:
    """(start ns, end ns, imported from Darshan) of a job: its events, else its records' span;
    a running job ends now."""
    ev = store.query(JOB_EVENTS_SQL, {"job_id": job_id})
    rec = store.query(JOB_RECORDS_SQL, {"job_id": job_id})[0]
    darshan = int(rec["darshan_logs"] or 0) > 0
    start = end = None
    if ev and ev[0]["has_start"]:
        start = int(ev[0]["start_ns"])
        end = int(ev[0]["end_ns"]) if ev[0]["has_end"] else now
    elif int(rec["n"]):
        start = int(rec["first_ns"])
        end = int(ev[0]["end_ns"]) if ev and ev[0]["has_end"] else int(rec["last_ns"])
    if start is not None and end is not None and end < start:
        end = start
    return start, end, darshan


def job_coverage(store: Store, job_id: str, silence_s: float | None = None, now_ns: int | None = None) -> Coverage:
    """Whether agents watched ``job_id``'s hosts for its whole time range, and the gaps where
    they did not (see the module docstring). ``silence_s`` defaults to the settings'
    (``heartbeat_missed`` x ``heartbeat_interval_s``); ``now_ns`` to the wall clock.
    Raises StoreError."""
    silence = default_silence_s() if silence_s is None else silence_s
    now = time.time_ns() if now_ns is None else now_ns
    start, end, darshan = _time_range(store, job_id, now)
    if darshan:
        return Coverage(complete=True, checked="darshan", silence_s=silence)
    if start is None or end is None:
        return Coverage(complete=True, checked="no-time", silence_s=silence)
    hosts = [r["host"] for r in store.query(JOB_HOSTS_SQL, {"job_id": job_id})]
    w = int(silence * 1e9)
    lo, hi = start - w, end + w
    p = {"lo_ns": lo, "hi_ns": hi, "silence_ns": w}
    edges = {}
    if hosts:
        sql, hp = _agents_on(HOST_EDGES_SQL, hosts)
        for r in store.query(sql, {**p, **hp}):
            if int(r["beats"]) and int(r["first_beat_ns"]) <= end:
                edges[r["host"]] = r
    checked = sorted(edges)
    unmonitored = [h for h in hosts if h not in edges]
    if not checked:
        return Coverage(complete=True, checked="no-agent", unmonitored_hosts=unmonitored, silence_s=silence)

    def gap(host: str, a: int, b: int, producer: str, nxt: str) -> Gap | None:
        a, b = max(a, start), min(b, end, now)
        return Gap(host, producer, ns_to_datetime(a), ns_to_datetime(b), nxt) if b > a else None

    found: list[Gap | None] = []
    for host in checked:
        e = edges[host]
        if not int(e["n"]):  # not one batch around the job: silent all along (so far)
            found.append(gap(host, start, end, e["before_producer"], e["after_producer"]))
            continue
        first, last = int(e["first_ns"]), int(e["last_ns"])
        if first > start:  # nothing in the silence before the start: silent since before it
            found.append(gap(host, start, first, e["before_producer"], e["first_producer"]))
        if last < end and now - last > w:  # silent since its last batch, for longer than allowed
            found.append(gap(host, last, end, e["last_producer"], e["after_producer"]))
    sql, hp = _agents_on(HOST_SILENCES_SQL, checked)
    for r in store.query(sql, {**p, **hp}):
        found.append(gap(r["host"], int(r["prev_ns"]), int(r["t_ns"]), r["prev_producer"], r["producer"]))
    gaps = sorted((g for g in found if g is not None), key=lambda g: (g.start, g.host))
    return Coverage(
        complete=not gaps, gaps=gaps, checked="agents", hosts=checked, unmonitored_hosts=unmonitored, silence_s=silence
    )
