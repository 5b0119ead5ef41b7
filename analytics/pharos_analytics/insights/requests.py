"""Rules on the job's requests: small, misaligned and random (Drishti P05-P08, P11, P13, P15, P16)."""

from __future__ import annotations

from ..diagnosis_config import DiagnosisConfig
from ..phases import JobPhases
from .evidence import SMALL_BINS, Counters, Trace
from .model import Insight, mib, pct


def _small_insight(
    direction: str,
    n_small: float,
    n_all: float,
    source: str,
    cfg: DiagnosisConfig,
    shared: bool = False,
    mpiio: bool = False,
    exact: tuple[float, float] | None = None,
) -> Insight | None:
    """``exact``: (bytes, seconds) the small requests moved and took, when the trace knows them
    (then :func:`weigh` uses them instead of a pro-rata share of the direction's bytes and time)."""
    if n_all <= 0 or n_small / n_all <= cfg.small_requests_ratio:
        return None
    high = n_small > cfg.small_requests_absolute
    where = " to shared files" if shared else ""
    recs = [f"Buffer {direction}s into larger, contiguous requests (at least {mib(cfg.small_request_bytes)})."]
    if shared:
        recs.append(
            "Use collective MPI-IO (MPI_File_{}_all) so aggregators issue large requests to the shared file.".format(
                "read" if direction == "read" else "write"
            )
        )
    elif mpiio:
        recs.append("The job already uses MPI-IO: collective calls (MPI_File_*_all) aggregate small requests.")
    else:
        recs.append("Consider an I/O library with collective buffering (MPI-IO, HDF5 or PnetCDF on MPI-IO).")
    msg = (
        f"{int(n_small)} of {int(n_all)} {direction} requests{where} ({pct(n_small / n_all)}) are under "
        f"{mib(cfg.small_request_bytes)}"
    )
    if not high:
        msg += f"; only {int(n_small)} of them (high severity above {cfg.small_requests_absolute}), so they cost little"
    return Insight(
        id=f"small_{direction}s" + ("_shared" if shared else ""),
        title=f"Small {direction}s" + (" to shared files" if shared else ""),
        severity="high" if high else "info",
        source=source,  # type: ignore[arg-type]
        message=msg,
        evidence={
            "small_requests": int(n_small),
            "requests": int(n_all),
            "share": n_small / n_all,
            "small_bytes": cfg.small_request_bytes,
            "absolute_threshold": cfg.small_requests_absolute,
        }
        | ({"small_requests_bytes": exact[0], "small_requests_time_s": exact[1]} if exact else {}),
        recommendations=recs,
        rule_source="Drishti P05/P06 (P15/P16 for shared files): small_requests, small_requests_absolute",
    )


def small_requests(c: Counters, t: Trace, cfg: DiagnosisConfig, ph: JobPhases) -> list[Insight]:
    """Small reads / small writes. Source: Drishti P05 (reads) / P06 (writes).

    Fires when more than ``small_requests_ratio`` (share 0-1, default 0.1) of a direction's
    requests are under ``small_request_bytes`` (bytes, default 1 MiB); severity ``high``
    when there are more than ``small_requests_absolute`` (requests, default 1000) of them,
    ``info`` below (a few tiny requests cost little). Counters: POSIX_SIZE_{READ,WRITE}_*
    bins under 1 MiB over POSIX_READS / POSIX_WRITES; trace: request sizes.
    """
    out = []
    if c.present and c.posix:
        for d, D in (("read", "READ"), ("write", "WRITE")):
            small = sum(r.g(f"POSIX_SIZE_{D}_{b}") for r in c.posix for b in SMALL_BINS)
            total = sum(r.g(f"POSIX_{D}S") for r in c.posix)
            if i := _small_insight(d, small, total, "counters", cfg, mpiio=bool(c.mpiio)):
                out.append(i)
    elif t.files:
        for d in ("read", "write"):
            exact = (t.f(f"small_{d}_bytes"), t.f(f"small_{d}_ns") / 1e9)
            if i := _small_insight(d, t.f(f"small_{d}s"), t.f(f"{d}s"), "trace", cfg, exact=exact):
                out.append(i)
    return out


def small_shared(c: Counters, t: Trace, cfg: DiagnosisConfig, ph: JobPhases) -> list[Insight]:
    """Small requests to shared files. Source: Drishti P15 (reads) / P16 (writes).

    Same thresholds as :func:`small_requests`: ``small_requests_ratio`` (share 0-1, default
    0.1), ``small_requests_absolute`` (requests, default 1000), ``small_request_bytes``
    (bytes, default 1 MiB), over the
    requests to files accessed by more than one rank (counters: shared records, rank -1).
    """
    out = []
    if c.present and c.posix:
        shared = [r for r in c.posix if r.rank < 0]
        for d, D in (("read", "READ"), ("write", "WRITE")):
            small = sum(r.g(f"POSIX_SIZE_{D}_{b}") for r in shared for b in SMALL_BINS)
            total = sum(r.g(f"POSIX_{D}S") for r in shared)
            if i := _small_insight(d, small, total, "counters", cfg, shared=True):
                out.append(i)
    elif t.files:
        for d in ("read", "write"):
            exact = (t.f(f"shared_small_{d}_bytes"), t.f(f"shared_small_{d}_ns") / 1e9)
            n, n_all = t.f(f"shared_small_{d}s"), t.f(f"shared_{d}s")
            if i := _small_insight(d, n, n_all, "trace", cfg, shared=True, exact=exact):
                out.append(i)
    return out


def _misaligned_file(source: str, nf: float, ops: float, align: int, what: str, rec: list[str]) -> Insight:
    """The ``misaligned_file`` insight: ``nf`` of ``ops`` requests misaligned (``what`` they do),
    ``align`` the alignment in bytes."""
    return Insight(
        "misaligned_file",
        "Misaligned file requests",
        "high",
        source,  # type: ignore[arg-type]
        f"{pct(nf / ops)} of {int(ops)} requests {what}",
        {"misaligned": int(nf), "requests": int(ops), "share": nf / ops, "alignment_bytes": align},
        rec,
        "Drishti P08: misaligned_requests",
    )


def misaligned(c: Counters, t: Trace, cfg: DiagnosisConfig, ph: JobPhases) -> list[Insight]:
    """Misaligned file accesses and memory buffers. Source: Drishti P08 (file) / P07 (memory).

    Fires when the share (0-1) of data requests at an offset that is not a multiple of the
    alignment exceeds ``misaligned_ratio`` (default 0.1). Counters: POSIX_FILE_NOT_ALIGNED
    against Darshan's POSIX_FILE_ALIGNMENT (bytes: file system block or stripe size) and
    POSIX_MEM_NOT_ALIGNED against POSIX_MEM_ALIGNMENT; trace: offset modulo
    ``alignment_bytes`` (bytes, default 4096).
    """
    out = []
    rec = [
        "Align requests to the file system's block/stripe size (e.g. H5Pset_alignment for HDF5, "
        "striping_unit / cb_buffer_size hints for MPI-IO)."
    ]
    if c.present and c.posix:
        ops = sum(r.g("POSIX_READS") + r.g("POSIX_WRITES") for r in c.posix)
        nf = sum(r.g("POSIX_FILE_NOT_ALIGNED") for r in c.posix)
        nm = sum(r.g("POSIX_MEM_NOT_ALIGNED") for r in c.posix)
        align = max((r.g("POSIX_FILE_ALIGNMENT") for r in c.posix), default=0)
        if ops and nf / ops > cfg.misaligned_ratio:
            what = f"are not aligned to the file alignment ({int(align)} bytes)"
            out.append(_misaligned_file("counters", nf, ops, int(align), what, rec))
        if ops and nm / ops > cfg.misaligned_ratio:
            out.append(
                Insight(
                    "misaligned_memory",
                    "Misaligned memory buffers",
                    "warn",
                    "counters",
                    f"{pct(nm / ops)} of {int(ops)} requests use memory buffers that are not aligned",
                    {
                        "misaligned": int(nm),
                        "requests": int(ops),
                        "share": nm / ops,
                        "alignment_bytes": int(max((r.g("POSIX_MEM_ALIGNMENT") for r in c.posix), default=0)),
                    },
                    ["Allocate I/O buffers aligned (posix_memalign) to the memory alignment."],
                    "Drishti P07: misaligned_requests",
                )
            )
    elif t.files:
        ops = t.f("reads") + t.f("writes")
        nf = t.f("misaligned")
        if ops and nf / ops > cfg.misaligned_ratio:
            what = f"start at an offset that is not a multiple of {cfg.alignment_bytes} bytes"
            out.append(_misaligned_file("trace", nf, ops, cfg.alignment_bytes, what, rec))
    return out


def random_access(c: Counters, t: Trace, cfg: DiagnosisConfig, ph: JobPhases) -> list[Insight]:
    """Random reads / writes. Source: Drishti P11 (reads) / P13 (writes).

    Fires when the share (0-1) of non-sequential requests of a direction exceeds
    ``random_ratio`` (default 0.2) and their count exceeds ``random_absolute`` (requests,
    default 1000). Sequential = at or after the previous request's end, same rank and file
    (Darshan POSIX_SEQ_*).
    """
    out = []
    if c.present and c.posix:
        src = "counters"
        vals = {
            d: (sum(r.g(f"POSIX_{D}S") for r in c.posix), sum(r.g(f"POSIX_SEQ_{D}S") for r in c.posix))
            for d, D in (("read", "READ"), ("write", "WRITE"))
        }
    elif t.files:
        src = "trace"
        vals = {d: (t.f(f"{d}s"), t.f(f"seq_{d}s")) for d in ("read", "write")}
    else:
        return out
    for d, (n, seq) in vals.items():
        rnd = max(n - seq, 0)
        if n and rnd / n > cfg.random_ratio and rnd > cfg.random_absolute:
            out.append(
                Insight(
                    f"random_{d}s",
                    f"Random {d}s",
                    "high",
                    src,  # type: ignore[arg-type]
                    f"{int(rnd)} of {int(n)} {d} requests ({pct(rnd / n)}) are not sequential",
                    {"random": int(rnd), "requests": int(n), "share": rnd / n},
                    [
                        f"Reorder {d}s by offset, or gather them (collective I/O, data sieving) into "
                        "sequential streams.",
                        "If the access is inherently random, a read-ahead/cache layer or a key-value "
                        "format may suit better.",
                    ],
                    "Drishti P11/P13: random_operations, random_operations_absolute",
                )
            )
    return out


#: Independent MPI-IO operations of a direction above which a job without collective ones is
#: flagged (Drishti ``collective_operations_absolute``, 1000).
COLLECTIVE_ABSOLUTE = 1000


def mpiio_independent(c: Counters, t: Trace, cfg: DiagnosisConfig, ph: JobPhases) -> list[Insight]:
    """MPI-IO without collective calls. Source: Drishti M02 (reads) / M03 (writes).

    Fires when a job of more than one rank uses MPI-IO, makes no collective (MPIIO_COLL_*) nor
    split-collective (MPIIO_SPLIT_*) operation of a direction and more than
    ``COLLECTIVE_ABSOLUTE`` (operations, default 1000, Drishti collective_operations_absolute)
    independent ones (MPIIO_INDEP_* + MPIIO_NB_*). Counters only (the MPI-IO module)."""
    out: list[Insight] = []
    if not (c.present and c.mpiio) or max((c.nprocs(r) for r in c.mpiio), default=1) < 2:
        return out
    for d, D in (("read", "READS"), ("write", "WRITES")):
        coll = sum(r.g(f"MPIIO_COLL_{D}") + r.g(f"MPIIO_SPLIT_{D}") for r in c.mpiio)
        indep = sum(r.g(f"MPIIO_INDEP_{D}") + r.g(f"MPIIO_NB_{D}") for r in c.mpiio)
        if coll > 0 or indep <= COLLECTIVE_ABSOLUTE:
            continue
        out.append(
            Insight(
                f"mpiio_independent_{d}s",
                f"MPI-IO {d}s are all independent",
                "high",
                "counters",
                f"the job uses MPI-IO but makes no collective {d}: {int(indep)} independent {d} calls",
                {"independent": int(indep), "collective": 0, "absolute_threshold": COLLECTIVE_ABSOLUTE},
                [
                    f"Use collective calls (MPI_File_{d}_all / _at_all) so ROMIO's aggregators issue few large "
                    "requests (two-phase I/O); tune cb_nodes / cb_buffer_size hints."
                ],
                f"Drishti {'M02' if d == 'read' else 'M03'}: collective_operations_absolute",
            )
        )
    return out
