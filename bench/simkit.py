"""The simulated machine's load (issue 28, item 1): job shapes taken from real traces, jobs placed on
compute nodes, and the agents' and forwarding daemons' ``IoBatch`` messages of one 200 ms tick,
built once and re-stamped cheaply (used by ``bench/simulate.py``).

**Shapes** (:data:`SHAPES`): per-rank request rates (requests/s, averaged over the job's run
time, compute phases included), request sizes, durations, files per rank and N-N / N-1. The
Darshan rows are :func:`shape_from_darshan` of the Darshan project's real logs
(``../shared/darshan-logs``; ``bench/simulate.py --derive-shapes`` prints them again): POSIX
counters ``POSIX_OPENS``, ``_READS``, ``_WRITES``, ``_STATS``, ``_FSYNCS``, the size histograms
``POSIX_SIZE_{READ,WRITE}_*`` (each bin stands for its geometric middle), the cumulative
``POSIX_F_{READ,WRITE,META}_TIME`` (mean duration per request), the run time (job end - start)
and the ranks; a file opened by more than one rank (or a shared record, rank -1) makes N-1.
Closes are as many as opens (Darshan does not count closes; the agent traces them).
The fio and MPI-IO rows come from Pharos's own traced runs: ``make demo``'s fio jobs
(api/pharos_api/demo.py: N-N 1 MiB, N-1 256 KiB psync writes) at the forwarding layer's
measured 260 MB/s for 32 ranks (docs/architecture.md, placement hints), and the MPI-IO writer
of tests/live/test_mpi_ranks.py (4 MiB ``MPI_File_write_at_all`` per rank into one file, 1 MiB
FUSE requests at the forwarder, rank 0 then writes a 4 KiB results file).

Every traced request is one record (the agent's merge of contiguous same-size requests,
Beacon's compression, is not applied: an upper bound on records). A client request of up to
1 MiB is one forwarder record; larger ones are split into 1 MiB FUSE requests (``max_write``),
each one forwarder record; stats are answered by the mount's attribute cache (issue 29) and
make no forwarder record.

**Machine** (Beacon, Yang et al., NSDI'19, §2: Sunway TaihuLight's 40,960 compute nodes and
240 forwarding nodes; compute nodes statically mapped to forwarding nodes in contiguous
blocks). ``ranks_per_node`` 4: one MPI rank per SW26010 core group.
"""

from __future__ import annotations

import math
import random
import zlib
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from pharos_pipeline.wire import IoBatch, JobEvent
from pharos_pipeline.wire.pharos.v1 import io_pb2

MiB = 1 << 20
TICK_NS = 200_000_000  #: the agent's batch_max_ms (proto/rust/src/sink.rs): one batch per node per tick
HEARTBEAT_TICKS = 10  #: an idle producer's empty batch every 2 s (the sink's heartbeat)
BATCH_MAX_RECORDS = 4096  #: the sink's batch_max_records
BATCH_MAX_BYTES = 900_000  #: the sink's batch_max_bytes
FUSE_MAX = MiB  #: the mount's largest FUSE request: larger client requests split at the forwarder

#: Darshan's size bins -> the size a request of the bin gets (geometric middle, bytes)
DARSHAN_BINS = {
    "0_100": 40,
    "100_1K": 316,
    "1K_10K": 3_162,
    "10K_100K": 31_623,
    "100K_1M": 316_228,
    "1M_4M": 2 * MiB,
    "4M_10M": 6_476_800,
    "10M_100M": 33_554_432,
    "100M_1G": 335_544_320,
    "1G_PLUS": 1 << 30,
}


@dataclass(frozen=True)
class Shape:
    """One kind of job. Rates are requests per rank per second over the whole run; sizes are
    (bytes, weight) lists; durations ns per request."""

    name: str
    source: str
    comm: str
    rate: dict[str, float]  # op -> requests/s per rank: read, write, open, close, stat, fsync
    read_sizes: tuple[tuple[int, float], ...]
    write_sizes: tuple[tuple[int, float], ...]
    files_per_rank: int
    shared: bool  # N-1: every rank's data requests go to the job's shared file(s)
    dur_ns: dict[str, int] = field(default_factory=dict)  # read, write, meta

    def per_rank_rate(self) -> float:
        return sum(self.rate.values())


def _sizes(counters: dict[str, float], kind: str) -> tuple[tuple[int, float], ...]:
    out = [(size, counters.get(f"POSIX_SIZE_{kind}_{b}", 0.0)) for b, size in DARSHAN_BINS.items()]
    total = sum(w for _, w in out)
    return tuple((s, round(w / total, 4)) for s, w in out if w) if total else ()


def shape_from_darshan(path: Path, name: str) -> Shape:
    """A :class:`Shape` from one real Darshan log's POSIX counters (see the module doc), read by
    Pharos's own importer (:func:`pharos_pipeline.darshan_log.read_log`, PyDarshan)."""
    from pharos_pipeline.darshan_log import read_log

    log = read_log(path)
    c: dict[str, float] = {}
    ranks_of: dict[int, set[int]] = {}
    for mod, rank, rid, counter, value in log.counters:
        if mod != "POSIX":
            continue
        c[counter] = c.get(counter, 0.0) + float(value)
        ranks_of.setdefault(rid, set()).add(rank)
    run_s = max((log.end_ns - log.start_ns) / 1e9, 1.0)
    nprocs = max(log.nprocs, 1)
    ops = {
        "read": c.get("POSIX_READS", 0.0),
        "write": c.get("POSIX_WRITES", 0.0),
        "open": c.get("POSIX_OPENS", 0.0),
        "close": c.get("POSIX_OPENS", 0.0),
        "stat": c.get("POSIX_STATS", 0.0),
        "fsync": c.get("POSIX_FSYNCS", 0.0),
    }
    shared = any(-1 in r or len(r) > 1 for r in ranks_of.values())

    def mean_ns(t: str, n: float) -> int:
        return int(c.get(t, 0.0) / n * 1e9) if n else 0

    meta_n = ops["open"] + ops["stat"] + ops["fsync"]
    return Shape(
        name=name,
        source=f"Darshan log {path.parent.name}/{path.name}: {nprocs} ranks, {run_s:.0f} s",
        comm=Path(log.exe.split()[0]).name[:15] if log.exe else name,
        rate={k: round(v / nprocs / run_s, 4) for k, v in ops.items() if v > 0},
        read_sizes=_sizes(c, "READ"),
        write_sizes=_sizes(c, "WRITE"),
        files_per_rank=max(1, round(len(ranks_of) / nprocs)) if not shared else max(1, len(ranks_of) // nprocs),
        shared=shared,
        dur_ns={
            "read": mean_ns("POSIX_F_READ_TIME", ops["read"]),
            "write": mean_ns("POSIX_F_WRITE_TIME", ops["write"]),
            "meta": mean_ns("POSIX_F_META_TIME", meta_n),
        },
    )


#: Logs the Darshan rows of :data:`SHAPES` come from (relative to the Darshan corpus).
DARSHAN_SOURCES = {
    "mpi-io-test": "mpi_io_test_with_dxt/treddy_mpi-io-test_id4373053_6-2-60198-9815401321915095332_1.darshan",
    "e3sm-io": "e3sm_io_heatmaps_and_dxt/e3sm_io_heatmap_only.darshan",
    "imbalanced-io": "imbalanced_io/imbalanced-io.darshan",
    "dlio": "dlio_logs/snyder_python3_id3116902-2111501_12-19-67036-12180819651629393424_1.darshan",
    "h5py-diagonal": "hdf5_diagonal_write_only/hdf5_diagonal_write_half_ranks_dxt.darshan",
    "ior-posix": "ior_daos/snyder_ior-POSIX_id1057716-202103_11-8-64415-6936117869459351096_1.darshan",
}

# __SHAPES__ (the Darshan rows are printed by `bench/simulate.py --derive-shapes`; a test checks them)
SHAPES: dict[str, Shape] = {
    "mpi-io-test": Shape(
        name="mpi-io-test",
        source="Darshan log mpi_io_test_with_dxt/treddy_mpi-io-test_id4373053_6-2-60198-9815401321915095332_1.darshan: 32 ranks, 13 s",
        comm="mpi-io-test",
        rate={"read": 0.3077, "write": 0.4615, "open": 0.6154, "close": 0.6154},
        read_sizes=((33554432, 1.0),),
        write_sizes=((40, 0.3333), (33554432, 0.6667)),
        files_per_rank=1,
        shared=True,
        dur_ns={"read": 433121549, "write": 5393054, "meta": 3971886},
    ),
    "e3sm-io": Shape(
        name="e3sm-io",
        source="Darshan log e3sm_io_heatmaps_and_dxt/e3sm_io_heatmap_only.darshan: 512 ranks, 726 s",
        comm="e3sm_io",
        rate={"read": 0.8453, "write": 0.8253, "open": 0.0017, "close": 0.0017, "stat": 0.0},
        read_sizes=((40, 0.9756), (316, 0.0033), (3162, 0.0212), (316228, 0.0)),
        write_sizes=((40, 0.0008), (3162, 0.0), (31623, 0.0001), (316228, 0.9992)),
        files_per_rank=1,
        shared=True,
        dur_ns={"read": 36046854, "write": 10219502, "meta": 179892583},
    ),
    "imbalanced-io": Shape(
        name="imbalanced-io",
        source="Darshan log imbalanced_io/imbalanced-io.darshan: 496 ranks, 1478 s",
        comm="407752450",
        rate={"read": 0.0926, "write": 0.0693, "open": 0.0228, "close": 0.0228, "stat": 0.0014, "fsync": 0.0007},
        read_sizes=((40, 0.0003), (316, 0.0367), (3162, 0.2163), (316228, 0.744), (2097152, 0.0027)),
        write_sizes=((40, 0.0008), (316, 0.0059), (3162, 0.0), (316228, 0.9932)),
        files_per_rank=2,
        shared=True,
        dur_ns={"read": 2747993, "write": 123252260, "meta": 1070709},
    ),
    "dlio": Shape(
        name="dlio",
        source="Darshan log dlio_logs/snyder_python3_id3116902-2111501_12-19-67036-12180819651629393424_1.darshan: 1 ranks, 64 s",
        comm="python3",
        rate={"read": 22.4665, "write": 0.0156, "open": 1.012, "close": 1.012, "stat": 1.806},
        read_sizes=((40, 0.0963), (316, 0.0319), (3162, 0.0021), (316228, 0.0104), (2097152, 0.8593)),
        write_sizes=((316, 1.0),),
        files_per_rank=31,
        shared=False,
        dur_ns={"read": 2575042, "write": 3814, "meta": 5684960},
    ),
    "h5py-diagonal": Shape(
        name="h5py-diagonal",
        source="Darshan log hdf5_diagonal_write_only/hdf5_diagonal_write_half_ranks_dxt.darshan: 10 ranks, 2 s",
        comm="python",
        rate={"read": 20.0, "write": 1.75, "open": 11.0, "close": 11.0, "stat": 53.5},
        read_sizes=((40, 0.5), (316, 0.05), (3162, 0.25), (31623, 0.2)),
        write_sizes=((40, 0.7143), (316, 0.1429), (3162, 0.1429)),
        files_per_rank=7,
        shared=True,
        dur_ns={"read": 3758, "write": 6805, "meta": 201237},
    ),
    "ior-posix": Shape(
        name="ior-posix",
        source="Darshan log ior_daos/snyder_ior-POSIX_id1057716-202103_11-8-64415-6936117869459351096_1.darshan: 16 ranks, 1 s",
        comm="ior",
        rate={"read": 4.0, "write": 4.0, "open": 2.0, "close": 2.0, "stat": 2.0},
        read_sizes=((316228, 1.0),),
        write_sizes=((316228, 1.0),),
        files_per_rank=1,
        shared=True,
        dur_ns={"read": 105638, "write": 2316091, "meta": 3542799},
    ),
    # make demo's fio N-N job (api/pharos_api/demo.py: --rw=write --bs=1m, a file per rank) at the
    # forwarding layer's measured 260 MB/s for 32 ranks (docs/architecture.md): 7.75 writes/s per
    # rank; one open, close and stat per 32 MiB file
    "fio-nn": Shape(
        name="fio-nn",
        source="make demo fio N-N, 260 MB/s / 32 ranks (Pharos run)",
        comm="fio",
        rate={"write": 7.75, "open": 0.2422, "close": 0.2422, "stat": 0.2422},
        read_sizes=(),
        write_sizes=((MiB, 1.0),),
        files_per_rank=1,
        shared=False,
        dur_ns={"write": 4_000_000, "meta": 200_000},
    ),
    # tests/live/test_mpi_ranks.py's MPI-IO writer (MPI_File_write_at_all, 4 MiB per rank at its own
    # offset of one file; rank 0's 4 KiB results file not modelled), as a checkpoint every 10 s
    # (period assumed): open, stat, write, close per rank per period
    "mpiio-n1": Shape(
        name="mpiio-n1",
        source="tests/live/test_mpi_ranks.py writer, a checkpoint per 10 s (assumed)",
        comm="mpi_writer",
        rate={"write": 0.1, "open": 0.1, "close": 0.1, "stat": 0.1},
        read_sizes=(),
        write_sizes=((4 * MiB, 1.0),),
        files_per_rank=1,
        shared=True,
        dur_ns={"write": 16_000_000, "meta": 500_000},
    ),
}


# -- the machine: jobs on nodes, producers, one tick's messages ----------------------------------

_TEMPLATE_NS = 1 << 60  #: template times: any value in [2^56, 2^63) is a 9-byte varint, as now is
_OPS = {
    "read": io_pb2.OP_READ,
    "write": io_pb2.OP_WRITE,
    "open": io_pb2.OP_OPEN,
    "close": io_pb2.OP_CLOSE,
    "stat": io_pb2.OP_STAT,
    "fsync": io_pb2.OP_FSYNC,
}
_FWD_QUEUE_WAIT_NS = 20_000  #: queue wait of a forwarder record (assumed: the daemon's idle queue)


def varint(v: int) -> bytes:
    out = bytearray()
    while True:
        b = v & 0x7F
        v >>= 7
        if v:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


@dataclass
class Job:
    """A job of ``shape`` on compute nodes ``first .. first + nodes - 1``, ``ranks_per_node`` each."""

    job_id: str
    shape: Shape
    first: int
    nodes: int
    ranks_per_node: int

    @property
    def ranks(self) -> int:
        return self.nodes * self.ranks_per_node


def place_jobs(nodes: int, jobs: int, ranks_per_node: int, rng: random.Random, occupancy: float = 0.9) -> list[Job]:
    """``jobs`` jobs (at most ``nodes``) on contiguous nodes, sizes log-uniform from 1 to 64 relative
    units scaled so the jobs fill ``occupancy`` of the machine, shapes drawn uniformly per job."""
    jobs = max(1, min(jobs, nodes))
    raw = [math.exp(rng.uniform(0.0, math.log(64))) for _ in range(jobs)]
    scale = occupancy * nodes / sum(raw)
    names = sorted(SHAPES)
    out, first = [], 0
    for j, r in enumerate(raw):
        left = nodes - first - (jobs - j - 1)  # every later job keeps at least one node
        n = max(1, min(left, round(r * scale)))
        out.append(Job(f"sim{j:06d}", SHAPES[rng.choice(names)], first, n, ranks_per_node))
        first += n
    return out


def job_event(job: Job, kind: int, time_ns: int) -> bytes:
    """The JobEvent ``pharos run`` produces (agents/pharos_agents/runner.py), key = job id."""
    ev = JobEvent(
        schema_version=1,
        job_id=job.job_id,
        kind=kind,
        time_ns=time_ns,
        name=job.shape.comm,
        command=[job.shape.comm],
        user="sim",
        ranks=job.ranks,
        host=f"cn{job.first:05d}",
        cgroup=f"/pharos.slice/job_{job.job_id}",
    )
    return ev.SerializeToString()


@dataclass
class _Msg:
    producer: int
    a: int
    b: int
    records: int


@dataclass
class _Plan:
    """One tick's messages of every producer: the records' bytes, where each message's records
    are, and where their times are (to re-stamp)."""

    buf: np.ndarray
    pos: np.ndarray  # byte positions of 9-byte start_ns/end_ns varints
    rel: np.ndarray  # their values minus the tick's start, ns
    msgs: list[_Msg]
    records: int


class Machine:
    """N compute nodes' agents and F forwarding daemons producing the records of ``jobs`` (see
    the module doc). :meth:`tick` gives one 200 ms tick's Kafka messages; ``variants`` different
    ticks are pre-built and cycled (the offsets of a cycle repeat)."""

    def __init__(
        self, nodes: int, forwarders: int, targets: int, jobs: list[Job], seed: int = 1, variants: int = 4
    ) -> None:
        self.nodes, self.forwarders, self.targets, self.jobs = nodes, forwarders, targets, jobs
        rng = np.random.default_rng(seed)
        self.rng = random.Random(seed)
        # producers: agents cn00000..., then the forwarding daemons (their ids as main.rs makes them)
        start = 1_700_000_000_000_000_000 + seed
        self.producer_ids = [f"cn{n:05d}:agent:{1000 + n % 30000}:{start}" for n in range(nodes)]
        self.producer_ids += [f"pharos-fwd-fwd{f:03d}-{2000 + f}-{start:x}" for f in range(forwarders)]
        self.hosts = [f"cn{n:05d}" for n in range(nodes)] + [f"fwd{f:03d}" for f in range(forwarders)]
        self.keys = [p.encode() for p in self.producer_ids]
        self.seq = np.zeros(len(self.producer_ids), dtype=np.int64)
        self.idle = np.zeros(len(self.producer_ids), dtype=np.int64)  # ticks since the last batch
        self._offsets: dict[tuple[str, int, int], int] = {}
        self._request_id = 0
        self.plans = [self._build(rng) for _ in range(max(1, variants))]
        self.ticks = 0

    def fwd_of(self, node: int) -> int:
        """The forwarding node of compute node ``node``: contiguous blocks (TaihuLight's static mapping)."""
        return node * self.forwarders // self.nodes

    # -- building ------------------------------------------------------------------------------
    def _client_records(self, job: Job, node: int, rng: np.random.Generator) -> list[io_pb2.IoRecord]:
        sh, host, out = job.shape, f"cn{node:05d}", []
        for local in range(job.ranks_per_node):
            rank = (node - job.first) * job.ranks_per_node + local
            for op, rate in sh.rate.items():
                for _ in range(int(rng.poisson(rate * TICK_NS / 1e9))):
                    out.append(self._record(job, sh, host, rank, op, rng))
        return out

    def _record(self, job: Job, sh: Shape, host: str, rank: int, op: str, rng) -> io_pb2.IoRecord:
        fidx = int(rng.integers(sh.files_per_rank))
        path = f"/scratch/{job.job_id}/shared.{fidx}" if sh.shared else f"/scratch/{job.job_id}/out.{rank}.{fidx}"
        sizes = sh.read_sizes if op == "read" else sh.write_sizes if op == "write" else ()
        size = int(rng.choice([s for s, _ in sizes], p=_norm([w for _, w in sizes]))) if sizes else 0
        dur = sh.dur_ns.get(op if op in ("read", "write") else "meta", 0) or 10_000
        dur = min(int(dur * rng.uniform(0.5, 1.5)) + 1, TICK_NS // 2)
        t = int(rng.integers(0, TICK_NS - dur))
        key = (path, rank, 0)
        offset = 0
        if size:
            offset = self._offsets.get(key, (rank * 64 * MiB) if sh.shared else 0)
            self._offsets[key] = offset + size
        inode = 10_000 + (zlib.crc32(path.encode()) & 0xFFFFFF)
        path_op = op == "stat"
        return io_pb2.IoRecord(
            start_ns=_TEMPLATE_NS + t,
            duration_ns=dur,
            end_ns=_TEMPLATE_NS + t + dur,
            layer=io_pb2.LAYER_CLIENT,
            host=host,
            job_id=job.job_id,
            rank=rank,
            pid=10_000 + rank % 50_000,
            tid=10_000 + rank % 50_000,
            comm=sh.comm,
            op=_OPS[op],
            dev=0x2B00001,
            inode=inode,
            path=path,
            file_type=io_pb2.FILE_TYPE_REGULAR,
            fd=-1 if path_op else 3 + fidx,
            offset=offset,
            size=size,
            result=size,
            count=1,
        )

    def _forwarder_records(self, node: int, client: io_pb2.IoRecord) -> list[io_pb2.IoRecord]:
        """pharos-fwd's records of one client request (forwarder/fwd/src/server/exec.rs): none for
        a stat (the mount's attribute cache), else one per FUSE request of up to 1 MiB."""
        if client.op == io_pb2.OP_STAT:
            return []
        op = {io_pb2.OP_READ: io_pb2.OP_PREAD, io_pb2.OP_WRITE: io_pb2.OP_PWRITE}.get(client.op, client.op)
        pieces = max(1, -(-client.size // FUSE_MAX))
        fwd, out = self.fwd_of(node), []
        oid = zlib.crc32(client.path.encode())
        for k in range(pieces):
            off = client.offset + k * FUSE_MAX
            size = min(FUSE_MAX, client.size - k * FUSE_MAX) if client.size else 0
            dur = max(1, client.duration_ns // pieces)
            start = client.start_ns + k * dur
            self._request_id += 1
            out.append(
                io_pb2.IoRecord(
                    start_ns=start,
                    duration_ns=dur,
                    end_ns=start + dur + _FWD_QUEUE_WAIT_NS,
                    layer=io_pb2.LAYER_FORWARDER,
                    host=f"fwd{fwd:03d}",
                    job_id=client.job_id,
                    rank=client.rank,
                    pid=client.pid,
                    op=op,
                    path=client.path,
                    file_type=io_pb2.FILE_TYPE_REGULAR,
                    fd=-1,
                    offset=off,
                    size=size,
                    result=size,
                    count=1,
                    compute_node=client.host,
                    forwarding_node=f"fwd{fwd:03d}",
                    target=f"ost{(oid + off // FUSE_MAX) % self.targets:04d}",
                    object_id=oid,
                    queue_wait_ns=_FWD_QUEUE_WAIT_NS,
                    request_id=self._request_id,
                )
            )
        return out

    def _build(self, rng: np.random.Generator) -> _Plan:
        per_producer: dict[int, list[io_pb2.IoRecord]] = {}
        for job in self.jobs:
            for node in range(job.first, job.first + job.nodes):
                recs = self._client_records(job, node, rng)
                if not recs:
                    continue
                per_producer.setdefault(node, []).extend(recs)
                fwd = per_producer.setdefault(self.nodes + self.fwd_of(node), [])
                for r in recs:
                    fwd.extend(self._forwarder_records(node, r))
        chunks: list[bytes] = []
        pos: list[int] = []
        msgs: list[_Msg] = []
        at = total = 0
        for producer in sorted(per_producer):
            a, n, size = at, 0, 0
            for r in per_producer[producer]:
                rb = r.SerializeToString()
                entry = b"\x32" + varint(len(rb)) + rb
                if n and (n >= BATCH_MAX_RECORDS or size + len(entry) > BATCH_MAX_BYTES):
                    msgs.append(_Msg(producer, a, at, n))
                    total += n  # a full batch's records count too, not only the producer's last
                    a, n, size = at, 0, 0
                p0 = at + len(entry) - len(rb)
                pos.extend((p0 + 1, p0 + _end_at(rb)))
                chunks.append(entry)
                at += len(entry)
                size += len(entry)
                n += 1
            msgs.append(_Msg(producer, a, at, n))
            total += n
        buf = np.frombuffer(b"".join(chunks), dtype=np.uint8).copy()
        p = np.asarray(pos, dtype=np.int64)
        return _Plan(buf, p, _read_varint9(buf, p) - _TEMPLATE_NS, msgs, total)

    # -- one tick ------------------------------------------------------------------------------
    def records_per_tick(self) -> float:
        return sum(p.records for p in self.plans) / len(self.plans)

    def tick(self, now_ns: int) -> tuple[list[tuple[bytes, bytes]], int]:
        """The Kafka messages (key, IoBatch bytes) of one tick starting at ``now_ns`` and the
        records in them: each producer with records sends its batch(es), seq rising; one idle for
        :data:`HEARTBEAT_TICKS` ticks sends an empty batch (heartbeat)."""
        plan = self.plans[self.ticks % len(self.plans)]
        self.ticks += 1
        buf = plan.buf.copy()
        _write_varint9(buf, plan.pos, plan.rel + now_ns)
        data = buf.tobytes()
        out: list[tuple[bytes, bytes]] = []
        sent = np.zeros(len(self.producer_ids), dtype=bool)
        for m in plan.msgs:
            out.append((self.keys[m.producer], self._header(m.producer, now_ns) + data[m.a : m.b]))
            sent[m.producer] = True
        self.idle += 1
        self.idle[sent] = 0
        for p in np.flatnonzero(self.idle >= HEARTBEAT_TICKS):
            out.append((self.keys[p], self._header(int(p), now_ns)))
            self.idle[p] = 0
        return out, plan.records

    def _header(self, p: int, now_ns: int) -> bytes:
        seq = int(self.seq[p])
        self.seq[p] = seq + 1
        b = IoBatch(schema_version=1, producer_id=self.producer_ids[p], seq=seq, created_ns=now_ns, host=self.hosts[p])
        return b.SerializeToString()


def _norm(w: Iterable[float]) -> list[float]:
    w = list(w)
    s = sum(w)
    return [x / s for x in w]


def _end_at(rb: bytes) -> int:
    """Offset in a serialized IoRecord of its end_ns value (after start_ns and duration_ns)."""
    i = 10  # tag 0x08 + 9-byte start_ns
    if rb[i] == 0x10:
        i += 1
        while rb[i] & 0x80:
            i += 1
        i += 1
    assert rb[0] == 0x08 and rb[i] == 0x18, "unexpected IoRecord layout"
    return i + 1


def _read_varint9(buf: np.ndarray, pos: np.ndarray) -> np.ndarray:
    v = np.zeros(len(pos), dtype=np.int64)
    for k in range(9):
        v |= (buf[pos + k].astype(np.int64) & 0x7F) << (7 * k)
    return v


def _write_varint9(buf: np.ndarray, pos: np.ndarray, vals: np.ndarray) -> None:
    for k in range(9):
        byte = (vals >> (7 * k)) & 0x7F
        buf[pos + k] = (byte | 0x80 if k < 8 else byte).astype(np.uint8)
