"""The price of every insight: the seconds of the job's run time it is estimated to have cost.

One function per rule (``PRICES``, by insight id), each returning ``(seconds, basis)``: seconds
of wall clock on the job's critical path (``None`` when it cannot be priced), and a short
string saying how they were computed (``evidence["seconds_lost_basis"]``). Every estimate is a
difference of two times: what the requests took, minus what the same bytes or operations take
at a reference rate measured on the same system:

* **request-shaped findings** (small, random, misaligned requests; Drishti P05/P06, P11/P13,
  P08, P15/P16; MPI-IO independent requests, M02/M03): the requests' time minus their bytes
  at the job's own bandwidth of requests without the defect (large / consecutive / aligned
  requests of the same direction, per stream: bytes / summed request time), or, when the job
  has none, the *site's* large-request bandwidth: the same layer's requests of at least
  ``small_request_bytes`` of other jobs within ``SITE_WINDOW_S`` of the job;
* **time-shaped findings**: fsync per write, the time in fsync beyond one sync per file;
  metadata (P17, Beacon's rate, many small files), the metadata time beyond the operations at
  the site's median metadata latency; rank imbalance (P18/P19, P21/P22), the slowest rank's
  time minus the median rank's; redundant reads and reads after writes (P09), the bytes read
  again at the job's read bandwidth; STDIO (S01), its time minus its bytes at the job's POSIX
  bandwidth; a slow resource (TOKIO's darshan_bad_ost), its files' time minus their bytes at
  the peers' median performance; interference, the job's requests in the interfered windows
  times the latency above the baseline.

Sums over ranks become critical-path seconds per rank: each rank's own excess where the
evidence is per rank (a traced job, or Darshan records of one rank), the largest of them
kept; a shared Darshan record's time is spread evenly over its ranks (Darshan keeps shared
records' time summed over ranks, darshan-parser's POSIX_F_*_TIME). A rank whose excess is
negative (the reference is slower than what it did) counts 0.

Findings overlap (4 KiB random writes are small and random): each price is what fixing that
finding alone would save, so the prices of one job need not add up to its run time.

Sources: Drishti (Bez et al., PDSW'22; hpc-io/drishti-io ``includes/module.py`` triggers and
``config.py`` codes), Darshan's POSIX/STDIO/MPI-IO counter descriptions (darshan-parser
``--show-incomplete``; ``darshan-posix-log-format.h``), TOKIO ``darshan_bad_ost``, Beacon
(NSDI'19 §4, §5.3).
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from pharos_core.store import ns_to_datetime64

from ..diagnosis_config import DiagnosisConfig
from .evidence import SMALL_BINS, Counters, Trace
from .model import Insight, mib

#: How far (s) before and after a job the site's reference rates are read (other jobs' requests).
SITE_WINDOW_S = 7 * 86400.0
#: A typical size (bytes) of a request in each of Darshan's size bins under 1 MiB (the bin's
#: geometric middle; ``POSIX_SIZE_{READ,WRITE}_0_100`` ... ``_100K_1M``), used to estimate the
#: bytes small requests moved when only the counters are known.
BIN_TYPICAL_BYTES = {"0_100": 10.0, "100_1K": 316.0, "1K_10K": 3162.0, "10K_100K": 31623.0, "100K_1M": 316228.0}
#: Darshan counters of metadata operations (each takes POSIX_F_META_TIME): opens, stats, seeks
#: are not metadata to the file system, fsyncs are timed as writes by Darshan.
META_COUNTERS = ("POSIX_OPENS", "POSIX_STATS", "POSIX_RENAME_SOURCES", "POSIX_RENAME_TARGETS")

Price = tuple[float | None, str]

# ======================================================================================
# Evidence: per rank, from the trace

from .price_sql import JOB_SPAN_SQL, PRICE_RANKS_SQL, SHARED_FILE_TIMES_SQL, SITE_BANDWIDTH_SQL, SITE_META_LATENCY_SQL  # noqa: E402


@dataclass
class RankIO:
    """One rank's traced I/O of one direction (``read`` / ``write``) and file sharing: bytes
    and seconds per kind of request (see PRICE_RANKS_SQL)."""

    v: dict[str, float] = field(default_factory=dict)

    def add(self, row: dict[str, Any]) -> None:
        for k, x in row.items():
            if k not in ("rank", "shared", "is_read"):
                self.v[k] = self.v.get(k, 0.0) + float(x or 0)

    def __getitem__(self, k: str) -> float:
        return self.v.get(k, 0.0)


def bw(b: float, ns: float) -> float | None:
    """Bytes per second of ``b`` bytes in ``ns`` summed nanoseconds; None without both."""
    return b / (ns / 1e9) if b > 0 and ns > 0 else None


class Pricer:
    """The job's evidence for pricing (trace per rank, counters, the site's reference rates),
    read once per diagnosis and only when an insight needs it."""

    def __init__(self, c: Counters, t: Trace, cfg: DiagnosisConfig):
        self.c, self.t, self.cfg = c, t, cfg
        self._ranks: list[dict[str, Any]] | None = None
        self._site: dict[str, Any] = {}

    # -- trace ----------------------------------------------------------------------
    def rank_rows(self) -> list[dict[str, Any]]:
        if self._ranks is None:
            self._ranks = self.t.store.query(PRICE_RANKS_SQL, self.t.p) if self.t.present else []
        return self._ranks

    def per_rank(self, direction: str | None = None, shared: bool | None = None) -> dict[int, RankIO]:
        """rank -> its traced I/O, of one direction (None: both; metadata rows count with writes)
        and of shared files only (True), private files only (False) or all (None)."""
        out: dict[int, RankIO] = {}
        for r in self.rank_rows():
            if direction is not None and bool(int(r["is_read"])) != (direction == "read"):
                continue
            if shared is not None and bool(int(r["shared"])) != shared:
                continue
            out.setdefault(int(r["rank"]), RankIO()).add(r)
        return out

    def job_bw(self, direction: str, kind: str) -> float | None:
        """The job's per-stream bandwidth (B/s) of its ``kind`` requests (``large``, ``cons``,
        ``ali``, ``data``) of ``direction``, summed over ranks."""
        rs = self.per_rank(direction).values()
        return bw(sum(r[f"{kind}_b"] for r in rs), sum(r[f"{kind}_ns"] for r in rs))

    # -- the site ---------------------------------------------------------------------
    def _window(self) -> dict[str, Any] | None:
        span = self.t.store.query(JOB_SPAN_SQL, {"job_id": self.t.job_id})
        if not span or int(span[0]["n"]) == 0:
            return None
        w = int(SITE_WINDOW_S * 1e9)
        return {
            "job_id": self.t.job_id,
            "layer": "client",
            "since": ns_to_datetime64(max(int(span[0]["first_ns"]) - w, 0)),
            "until": ns_to_datetime64(int(span[0]["last_ns"]) + w),
            "small": self.cfg.small_request_bytes,
        }

    def site_bw(self, direction: str) -> float | None:
        """The site's large-request bandwidth (B/s per stream) of ``direction`` near the job
        (SITE_BANDWIDTH_SQL); None when no other job moved large requests then."""
        if "bw" not in self._site:
            p = self._window()
            rows = self.t.store.query(SITE_BANDWIDTH_SQL, p) if p else []
            self._site["bw"] = {
                ("read" if int(r["is_read"]) else "write"): bw(float(r["b"]), float(r["ns"])) for r in rows
            }
        return self._site["bw"].get(direction)

    def site_meta_s(self, op: str = "") -> tuple[float, str]:
        """Seconds of one metadata operation ``op`` (``open``, ``close``, ``stat``; '': any but
        fsync) at the site: the median of other jobs' near the job, else of all their metadata
        operations, else 1 / ``metadata_rate_ops_s`` (Beacon's metadata-heavy rate); and where
        it comes from."""
        if "meta" not in self._site:
            p = self._window()
            rows = self.t.store.query(SITE_META_LATENCY_SQL, p) if p else []
            self._site["meta"] = {r["op"]: float(r["ns"]) / 1e9 for r in rows if int(r["n"]) > 0}
        site = self._site["meta"]
        if op in site:
            return site[op], f"the site's median {op or 'metadata'} latency"
        if "" in site:
            return site[""], "the site's median metadata latency"
        return 1.0 / self.cfg.metadata_rate_ops_s, "Beacon's metadata rate"

    def reference_bw(self, direction: str, kind: str = "large") -> tuple[float | None, str]:
        """The bandwidth to price ``direction``'s defective requests against: the job's own
        ``kind`` requests, else the site's large requests. (B/s per stream or None, its name)."""
        own = self.job_bw(direction, kind)
        what = {"large": "large-", "cons": "consecutive ", "ali": "aligned "}[kind]
        if own:
            return own, f"the job's {what}{direction} bandwidth ({mib(own)}/s)"
        site = self.site_bw(direction)
        if site:
            return site, f"the site's large-{direction} bandwidth ({mib(site)}/s)"
        return None, ""


def worst(per: dict[int, float]) -> tuple[float, int | None]:
    """(largest value >= 0, its rank) of a per-rank excess."""
    if not per:
        return 0.0, None
    r = max(per, key=per.get)  # type: ignore[arg-type]
    return max(per[r], 0.0), r


def on_rank(seconds: float, rank: int | None) -> str:
    return f"rank {rank}" if rank is not None and rank >= 0 else "per rank"


# ======================================================================================
# Counters: what the Darshan records say per rank


def counter_ranks(c: Counters, recs: list, fn: Callable[[Any], dict[str, float]]) -> dict[int, dict[str, float]]:
    """rank -> the sums of ``fn(record)`` over ``recs``; a shared record (rank -1) is spread
    evenly over the ranks of its log (its counters are summed over them)."""
    out: dict[int, dict[str, float]] = {}
    for r in recs:
        ranks = c.ranks_of(r)
        vals = fn(r)
        for k in ranks:
            d = out.setdefault(k, {})
            for name, x in vals.items():
                d[name] = d.get(name, 0.0) + x / len(ranks)
    return out


def data_ranks(c: Counters, recs: list, module: str) -> dict[int, dict[str, float]]:
    """Per rank, the bytes (``b``) and read + write time (``t``, s) of ``module``'s records."""
    return counter_ranks(
        c,
        recs,
        lambda r: {
            "b": r.g(f"{module}_BYTES_READ") + r.g(f"{module}_BYTES_WRITTEN"),
            "t": r.g(f"{module}_F_READ_TIME") + r.g(f"{module}_F_WRITE_TIME"),
        },
    )


def counters_small(c: Counters, recs: list, D: str) -> dict[int, dict[str, float]]:
    """Per rank, from POSIX records: all requests, small ones (bins under 1 MiB), their bytes
    (estimated: each bin's count x BIN_TYPICAL_BYTES), all bytes and the direction's time (s)."""
    B = "READ" if D == "READ" else "WRITTEN"
    return counter_ranks(
        c,
        recs,
        lambda r: {
            "n": r.g(f"POSIX_{D}S"),
            "small_n": sum(r.g(f"POSIX_SIZE_{D}_{b}") for b in SMALL_BINS),
            "small_b": sum(r.g(f"POSIX_SIZE_{D}_{b}") * BIN_TYPICAL_BYTES[b] for b in SMALL_BINS),
            "b": r.g(f"POSIX_BYTES_{B}"),
            "t": r.g(f"POSIX_F_{D}_TIME"),
        },
    )


# ======================================================================================
# The price of each rule


def price_small(p: Pricer, i: Insight) -> Price:
    """Small reads/writes (Drishti P05/P06; P15/P16 on shared files): per rank, the small
    requests' time minus their bytes at the reference bandwidth (the job's large requests of
    the direction, else the site's); the worst rank. From the trace when the job has one (DXT
    or agents), else from the counters: the direction's time split by request count (each
    request costs about the same when small requests dominate), the small bytes estimated from
    Darshan's size bins, the reference the job's other requests (bytes / remaining time)."""
    d = "read" if "read" in i.id else "write"
    shared = True if i.id.endswith("_shared") else None
    if p.t.present and p.per_rank(d):
        ref, what = p.reference_bw(d)
        if ref is None:
            return None, f"no large {d}s of this job or of the site to compare with"
        per = {k: r["small_ns"] / 1e9 - r["small_b"] / ref for k, r in p.per_rank(d, shared).items()}
        s, k = worst(per)
        return s, f"time of the small {d}s of {on_rank(s, k)} minus their bytes at {what} (trace)"
    D = d.upper()
    recs = [r for r in p.c.posix if shared is None or r.rank < 0]
    per_c = counters_small(p.c, recs, D)
    tot = {k: sum(v.get(k, 0.0) for v in per_c.values()) for k in ("n", "small_n", "small_b", "b", "t")}
    big_b, big_t = tot["b"] - tot["small_b"], tot["t"] * (1 - tot["small_n"] / tot["n"]) if tot["n"] else 0.0
    ref = bw(big_b, big_t * 1e9) if tot["small_n"] < tot["n"] else None
    what = f"the job's other {d}s' bandwidth ({mib(ref)}/s)" if ref else ""
    if ref is None:
        ref = p.site_bw(d)
        what = f"the site's large-{d} bandwidth ({mib(ref)}/s)" if ref else ""
    if ref is None:
        return None, f"no large {d}s of this job or of the site to compare with"
    per = {k: v["t"] * v["small_n"] / v["n"] - v["small_b"] / ref for k, v in per_c.items() if v.get("n", 0) > 0}
    s, k = worst(per)
    return s, f"{d} time of {on_rank(s, k)} pro rata to its small requests minus their bytes at {what} (counters)"


def price_random(p: Pricer, i: Insight) -> Price:
    """Random reads/writes (Drishti P11/P13): per rank, the time of the requests that start
    before the previous one's end minus their bytes at the job's consecutive-request bandwidth
    of the direction (else the site's large-request one); the worst rank. Trace only: the
    counters do not time random requests apart."""
    d = "read" if i.id == "random_reads" else "write"
    if not (p.t.present and p.per_rank(d)):
        return None, "Darshan counters do not time random requests apart (no trace)"
    ref, what = p.reference_bw(d, "cons")
    if ref is None:
        return None, f"no consecutive {d}s of this job nor large ones of the site to compare with"
    per = {k: r["rnd_ns"] / 1e9 - r["rnd_b"] / ref for k, r in p.per_rank(d).items()}
    s, k = worst(per)
    return s, f"time of the random {d}s of {on_rank(s, k)} minus their bytes at {what} (trace)"


def price_misaligned(p: Pricer, i: Insight) -> Price:
    """Misaligned file requests (Drishti P08): per rank and direction, the misaligned
    requests' time minus their bytes at the job's aligned-request bandwidth of the direction;
    summed over directions, the worst rank. Trace only; memory misalignment (P07) is not priced."""
    if i.id != "misaligned_file" or not p.t.present:
        return None, "Darshan counters do not time misaligned requests apart" if p.c.present else "not priced"
    per: dict[int, float] = {}
    used = []
    for d in ("read", "write"):
        ref = p.job_bw(d, "ali")
        if ref is None:
            continue
        used.append(f"{d}s at {mib(ref)}/s")
        for k, r in p.per_rank(d).items():
            per[k] = per.get(k, 0.0) + r["mis_ns"] / 1e9 - r["mis_b"] / ref
    if not used:
        return None, "no aligned requests of the job to compare with"
    s, k = worst(per)
    return (
        s,
        f"time of the misaligned requests of {on_rank(s, k)} minus their bytes at the job's aligned {', '.join(used)}",
    )


def price_fsync(p: Pricer, i: Insight) -> Price:
    """fsync storm (Pharos): per rank, the time in fsync/fdatasync beyond one sync per file it
    synced (the share (n - files) / n of its sync time); the worst rank. Trace only: Darshan
    times fsync as write time (POSIX_F_WRITE_TIME)."""
    if not (p.t.present and p.per_rank()):
        return None, "Darshan counts fsync time in POSIX_F_WRITE_TIME (no trace)"
    per = {
        k: r["fsync_ns"] / 1e9 * (1 - r["fsync_files"] / r["fsync_n"])
        for k, r in p.per_rank().items()
        if r["fsync_n"] > 0
    }
    s, k = worst(per)
    return s, f"time of {on_rank(s, k)} in fsync beyond one sync per file (trace)"


def _meta_per_rank(p: Pricer) -> tuple[dict[int, tuple[float, float]], str]:
    """rank -> (metadata seconds but fsync's, the same operations' seconds at the site's
    latency), from the trace (opens, closes and stats each at the site's latency of that
    operation) or the counters (POSIX_F_META_TIME; META_COUNTERS at the site's metadata latency)."""
    if p.t.present and p.per_rank():
        out = {}
        for k, r in p.per_rank().items():
            base = sum(r[f"{op}_n"] * p.site_meta_s(op)[0] for op in ("open", "close", "stat"))
            other = r["meta_n"] - r["open_n"] - r["close_n"] - r["stat_n"]
            out[k] = (r["meta_ns"] / 1e9, base + other * p.site_meta_s()[0])
        return out, "trace"
    per = counter_ranks(
        p.c,
        p.c.posix,
        lambda r: {"t": r.g("POSIX_F_META_TIME"), "n": sum(r.g(x) for x in META_COUNTERS)},
    )
    return {k: (v["t"], v["n"] * p.site_meta_s()[0]) for k, v in per.items()}, "counters"


def price_metadata(p: Pricer, i: Insight) -> Price:
    """Metadata time (Drishti P17) and metadata-heavy I/O (Beacon): per rank, its metadata
    time (fsync excluded: it flushes data, priced by fsync_storm) minus the same operations at
    the site's median latency of each (1 / metadata_rate_ops_s when the site has none traced);
    the worst rank."""
    per, src = _meta_per_rank(p)
    if not per:
        return None, "no metadata operations"
    s, k = worst({r: t - base for r, (t, base) in per.items()})
    op_s, what = p.site_meta_s()
    return s, f"metadata time of {on_rank(s, k)} but fsync minus its operations at {what} ({op_s * 1e3:.3g} ms) ({src})"


def price_many_small_files(p: Pricer, i: Insight) -> Price:
    """Many small files (Pharos): per rank, the metadata time spent on them (counters: the
    records of files that moved under ``small_file_bytes``; trace: the rank's metadata time x
    the share of small files); the worst rank."""
    share = i.evidence["small_files"] / max(i.evidence["files"], 1)
    if p.c.present and (p.c.posix or p.c.stdio):
        small = {
            p.c.name(r)
            for r in p.c.posix
            if 0 < r.g("POSIX_BYTES_READ") + r.g("POSIX_BYTES_WRITTEN") < p.cfg.small_file_bytes
        }
        per = counter_ranks(
            p.c, [r for r in p.c.posix if p.c.name(r) in small], lambda r: {"t": r.g("POSIX_F_META_TIME")}
        )
        s, k = worst({r: v["t"] for r, v in per.items()})
        return s, f"metadata time of {on_rank(s, k)} on files that moved under {mib(p.cfg.small_file_bytes)} (counters)"
    per_t, _ = _meta_per_rank(p)
    s, k = worst({r: t * share for r, (t, _base) in per_t.items()})
    return s, f"metadata time of {on_rank(s, k)} x the share of small files (trace)"


def _read_bw(p: Pricer) -> tuple[float | None, int]:
    """The job's read bandwidth (B/s per stream) and its reading ranks."""
    if p.c.present and p.c.posix:
        per = counter_ranks(p.c, p.c.posix, lambda r: {"b": r.g("POSIX_BYTES_READ"), "t": r.g("POSIX_F_READ_TIME")})
        readers = [v for v in per.values() if v.get("b", 0) > 0]
        return bw(sum(v["b"] for v in readers), sum(v["t"] for v in readers) * 1e9), len(readers)
    rs = [r for r in p.per_rank("read").values() if r["data_b"] > 0]
    return bw(sum(r["data_b"] for r in rs), sum(r["data_ns"] for r in rs)), len(rs)


def price_reread(p: Pricer, i: Insight) -> Price:
    """Redundant reads (Drishti P09) and reads of bytes the job wrote (Pharos): the bytes read
    again at the job's read bandwidth, spread over the ranks that read (the reads run side by
    side)."""
    b = float(i.evidence.get("redundant_bytes", i.evidence.get("bytes", 0)))
    ref, readers = _read_bw(p)
    if ref is None or readers == 0:
        return None, "no read time to price the bytes at"
    return (
        b / ref / readers,
        f"bytes read again at the job's read bandwidth ({mib(ref)}/s), over {readers} reading rank(s)",
    )


def price_shared_imbalance(p: Pricer, i: Insight) -> Price:
    """Rank imbalance on shared files (Drishti P18 bytes / P19 time), summed over the files
    above ``imbalance_stragglers`` (a rank meets them one after the other). Counters, per shared
    record: time, POSIX_F_SLOWEST_RANK_TIME minus the mean rank time (F_READ + F_WRITE +
    F_META time / ranks; Darshan keeps no median); bytes, the slowest rank's time x the share of
    its bytes above the mean (POSIX_SLOWEST_RANK_BYTES). Trace: per file, the slowest rank's
    data time minus the median rank's."""
    kind = "bytes" if i.id == "rank_imbalance_bytes" else "time"
    if i.source == "counters":
        total = 0.0
        for r in p.c.posix:
            if r.rank >= 0:
                continue
            n = p.c.nprocs(r)
            t = r.g("POSIX_F_READ_TIME") + r.g("POSIX_F_WRITE_TIME") + r.g("POSIX_F_META_TIME")
            b = r.g("POSIX_BYTES_READ") + r.g("POSIX_BYTES_WRITTEN")
            slow_t = r.g("POSIX_F_SLOWEST_RANK_TIME")
            if kind == "time":
                diff = slow_t - r.g("POSIX_F_FASTEST_RANK_TIME")
                if t > 0 and abs(diff) / t > p.cfg.imbalance_stragglers:
                    total += max(slow_t - t / n, 0.0)
            else:
                diff = r.g("POSIX_SLOWEST_RANK_BYTES") - r.g("POSIX_FASTEST_RANK_BYTES")
                sb = r.g("POSIX_SLOWEST_RANK_BYTES")
                if b > 0 and abs(diff) / b > p.cfg.imbalance_stragglers and sb > 0:
                    total += slow_t * max(1 - b / n / sb, 0.0)
        basis = (
            "slowest rank's time minus the mean rank's"
            if kind == "time"
            else "slowest rank's time x the share of its bytes above the mean rank's"
        )
        return total, f"{basis}, summed over the shared files (counters)"
    rows = p.t.store.query(SHARED_FILE_TIMES_SQL, p.t.p)
    s = sum(
        (float(r["slow_ns"]) - float(r["median_ns"])) / 1e9
        for r in rows
        if float(r["imbalance"]) > p.cfg.imbalance_stragglers
    )
    return s, "slowest rank's data time minus the median rank's, summed over the shared files (trace)"


def price_rank_imbalance(p: Pricer, i: Insight) -> Price:
    """Imbalance across ranks (Drishti P21/P22, time: Pharos): time, the slowest rank's data
    time minus the median rank's; bytes, the time of the rank with the most bytes x the share
    of its bytes above the median rank's (what it would take with the median's bytes at its
    own speed). Over the ranks the rule judged (counters: non-shared records)."""
    per: dict[int, list[float]] = {}
    if i.source == "counters":
        for r in p.c.posix:
            if r.rank < 0:
                continue
            v = per.setdefault(r.rank, [0.0, 0.0])
            v[0] += r.g("POSIX_BYTES_READ") + r.g("POSIX_BYTES_WRITTEN")
            v[1] += r.g("POSIX_F_READ_TIME") + r.g("POSIX_F_WRITE_TIME")
    else:
        for k, r in p.per_rank().items():
            per[k] = [r["data_b"], r["data_ns"] / 1e9]
    per = {k: v for k, v in per.items() if v[0] > 0}
    if len(per) < 2:
        return None, "fewer than two ranks"
    if i.id.endswith("time_per_rank"):
        times = [v[1] for v in per.values()]
        return max(times) - statistics.median(times), f"slowest rank's data time minus the median rank's ({i.source})"
    hi = max(per, key=lambda k: per[k][0])
    med_b = statistics.median(v[0] for v in per.values())
    s = per[hi][1] * max(1 - med_b / per[hi][0], 0.0)
    return s, f"data time of rank {hi} (most bytes) x the share of its bytes above the median rank's ({i.source})"


def price_stdio(p: Pricer, i: Insight) -> Price:
    """STDIO carrying much of the data (Drishti S01): per rank, its STDIO read + write time
    minus its STDIO bytes at the job's POSIX bandwidth (bytes / F_READ + F_WRITE time); the
    worst rank. Counters only."""
    px = data_ranks(p.c, p.c.posix, "POSIX")
    ref = bw(sum(v.get("b", 0) for v in px.values()), sum(v.get("t", 0) for v in px.values()) * 1e9)
    if ref is None:
        return None, "no POSIX data time to compare with"
    per = data_ranks(p.c, p.c.stdio, "STDIO")
    s, k = worst({r: v["t"] - v["b"] / ref for r, v in per.items()})
    return s, f"STDIO time of {on_rank(s, k)} minus its bytes at the job's POSIX bandwidth ({mib(ref)}/s) (counters)"


def price_mpiio(p: Pricer, i: Insight) -> Price:
    """Independent MPI-IO without collective calls (Drishti M02/M03): per rank, its MPI-IO
    time of the direction (MPIIO_F_{READ,WRITE}_TIME) minus its MPI-IO bytes at the bandwidth
    collective buffering would reach: the job's large-request bandwidth of the direction
    (trace), else the site's; the worst rank."""
    d = "read" if i.id.endswith("reads") else "write"
    D, B = ("READ", "READ") if d == "read" else ("WRITE", "WRITTEN")
    ref, what = p.reference_bw(d) if p.t.present else (p.site_bw(d), "the site's large-request bandwidth")
    if ref is None:
        return None, f"no large {d}s of this job or of the site to compare with"
    per = counter_ranks(p.c, p.c.mpiio, lambda r: {"b": r.g(f"MPIIO_BYTES_{B}"), "t": r.g(f"MPIIO_F_{D}_TIME")})
    s, k = worst({r: v["t"] - v["b"] / ref for r, v in per.items()})
    return s, f"MPI-IO {d} time of {on_rank(s, k)} minus its bytes at {what} (counters)"


def price_straggler_resource(p: Pricer, i: Insight) -> Price:
    """A slow resource (TOKIO darshan_bad_ost + Beacon §5.3): the time its files took beyond
    their bytes at the peers' median performance (:mod:`pharos_analytics.straggler`), over the
    ranks that used it (they wait side by side)."""
    ex, n = float(i.evidence.get("excess_time_s", 0.0)), max(int(i.evidence.get("n_ranks", 1)), 1)
    return ex / n, f"time of its files beyond the peers' median performance, over its {n} rank(s)"


def price_interference(p: Pricer, i: Insight) -> Price:
    """Interference (Pharos): computed by the rule (:func:`pharos_analytics.system_diag.interference_price`)."""
    return i.seconds_lost, str(i.evidence.get("seconds_lost_basis", ""))


def no_price(why: str) -> Callable[[Pricer, Insight], Price]:
    return lambda p, i: (None, why)


#: insight id -> its price.
PRICES: dict[str, Callable[[Pricer, Insight], Price]] = {
    "small_reads": price_small,
    "small_writes": price_small,
    "small_reads_shared": price_small,
    "small_writes_shared": price_small,
    "random_reads": price_random,
    "random_writes": price_random,
    "misaligned_file": price_misaligned,
    "misaligned_memory": no_price("memory alignment is not timed"),
    "fsync_storm": price_fsync,
    "metadata_time": price_metadata,
    "metadata_heavy": price_metadata,
    "many_small_files": price_many_small_files,
    "redundant_reads": price_reread,
    "read_after_write": price_reread,
    "rank_imbalance_bytes": price_shared_imbalance,
    "rank_imbalance_time": price_shared_imbalance,
    "rank_imbalance_bytes_per_rank": price_rank_imbalance,
    "rank_imbalance_time_per_rank": price_rank_imbalance,
    "stdio_heavy": price_stdio,
    "mpiio_independent_reads": price_mpiio,
    "mpiio_independent_writes": price_mpiio,
    "straggler_resource": price_straggler_resource,
    "interference": price_interference,
    "single_target_shared_file": no_price(
        "the targets the file could be striped over were not measured (the slow-resource insight prices a slow one)"
    ),
}


def price(p: Pricer, i: Insight) -> tuple[float | None, str]:
    """(seconds lost or None, basis) of one insight."""
    fn = PRICES.get(i.id)
    if fn is None:
        return None, "no price for this rule"
    s, basis = fn(p, i)
    return (None if s is None else round(max(s, 0.0), 6)), basis
