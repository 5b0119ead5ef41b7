"""I/O pattern identification from file fan-in, after Beacon.

Beacon (Yang et al., "End-to-end I/O Monitoring on a Leading Supercomputer", NSDI'19,
§4 "I/O pattern identification") classifies a job's I/O by how its ranks map onto the
files they read or write: N-N (each rank its own file), N-1 (all ranks one shared file),
1-1 (one rank, one file), N-M (N ranks share M files). We add ``1-N`` (one rank writing
or reading several files) and ``none`` (no data I/O), and classify over *data files*:
regular files outside system paths (:data:`SYSTEM_PREFIXES`) that saw data reads or writes.

A job (or a phase) often mixes modes: e.g. every rank writes its own output (N-N) and all of
them read one input file (N-1). Over all data files together that is N-M, which hides what
dominates. Beacon labels a job by **volume dominance** (NSDI'19 §4): the mode that carries
more than half of the bytes when the job has two modes, more than a third when it has three
or more. :func:`decide_pattern` is that rule, and the ONE place where a job's or a phase's
pattern is decided: the job summary and list (:mod:`~pharos_analytics.summary`), the phases
and profiles (:mod:`~pharos_analytics.phases`, :mod:`~pharos_analytics.profiles`), hence
``pharos job``, ``pharos jobs``, ``pharos diagnose`` and the API all report its result. The
modes are the per-direction patterns (reads alone, writes alone, each weighted by its bytes);
they stay available as detail (``patterns``), as does the fan-in pattern of all data I/O
together (``fan_in_pattern``), which is also the answer when no mode dominates.

Within one direction the same rule applies to its files (:func:`direction_pattern`): a
standard MPI benchmark writing ONE shared file with 4 ranks, whose rank 0 also writes a 4 KiB
results file, touches 2 files with 4 ranks, whose fan-in pattern is N-M. Its files form two
groups by fan-in, *shared* files (read or written by several ranks) and *private* files (one
rank each); each group has its pattern (shared: N-1, or N-M when no one shared file carries
the group's bytes; private: 1-1, 1-N or N-N) and the direction takes the one that carries the
volume, so a side file (results, a log, a restart marker) with a tiny share of the bytes does
not change the job's pattern. The fan-in pattern of all data files together stays as detail
(``fan_in_pattern``), and each file's number of ranks is in the job's file list.

Everything here is pure: no store, no I/O. :mod:`pharos_analytics.summary` computes the
same fan-in statistics in ClickHouse and calls :func:`classify_fan_in` and
:func:`decide_pattern`.
"""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Hashable, Iterable, Mapping
from dataclasses import dataclass
from typing import Literal

Pattern = Literal["none", "1-1", "1-N", "N-1", "N-N", "N-M"]
PATTERNS: tuple[Pattern, ...] = ("none", "1-1", "1-N", "N-1", "N-N", "N-M")

#: Folders whose files are never a job's data files (libraries, configuration, pseudo files).
SYSTEM_PREFIXES: tuple[str, ...] = (
    "/usr",
    "/lib",
    "/lib64",
    "/etc",
    "/proc",
    "/sys",
    "/dev",
    "/bin",
    "/sbin",
    "/run",
    "/var/lib",
    "/var/spool",  # schedulers' spools: Slurm's batch script copies (/var/spool/slurmd), PBS's
)

#: Darshan's names of the standard streams. The eBPF agent gives them to reads and writes on
#: file descriptors 0, 1 and 2 that no process of the job opened (inherited from the launcher:
#: e.g. srun writing its tasks' output to the job's output file that slurmstepd opened). Like
#: Darshan's STDIO records they are standard-stream I/O, not data files.
STREAM_PATHS: tuple[str, ...] = ("<STDIN>", "<STDOUT>", "<STDERR>")

#: The same test as :func:`is_system_path`, as an RE2/PCRE regular expression (ClickHouse
#: ``match``): a system prefix followed by '/' or the end of the path, or a standard stream.
SYSTEM_PATH_REGEX: str = (
    "^(("
    + "|".join(re.escape(p) for p in SYSTEM_PREFIXES)
    + ")(/|$)|("
    + "|".join(re.escape(p) for p in STREAM_PATHS)
    + ")$)"
)
_SYSTEM_PATH_RE = re.compile(SYSTEM_PATH_REGEX)


def is_system_path(path: str) -> bool:
    """True when ``path`` lies in a system folder (``/usr/lib/x.so``, ``/etc``), not ``/usrdata``,
    or is a standard stream (:data:`STREAM_PATHS`): not a data file either way."""
    return _SYSTEM_PATH_RE.match(path) is not None


def classify_fan_in(n_ranks: int, n_files: int, max_ranks_per_file: int) -> Pattern:
    """Beacon's pattern (NSDI'19 §4) from three fan-in statistics of a job's data I/O.

    Args:
        n_ranks: R, distinct ranks that did data I/O on data files (>= 0).
        n_files: M, distinct data files those ranks read or wrote (>= 0).
        max_ranks_per_file: the largest number of distinct ranks touching one data file.

    Returns:
        ``none`` when R or M is 0; ``1-1`` (R=1, M=1); ``1-N`` (R=1, M>1); ``N-1`` (R>1,
        M=1); ``N-N`` (R>1, M>1, no file touched by two ranks); ``N-M`` otherwise (R>1,
        M>1 and some file shared by several ranks, whether M<R or not).

    Raises:
        ValueError: on negative counts or a fan-in above R.
    """
    if min(n_ranks, n_files, max_ranks_per_file) < 0:
        raise ValueError("fan-in statistics must be >= 0")
    if n_ranks == 0 or n_files == 0:
        return "none"
    if max_ranks_per_file > n_ranks:
        raise ValueError(f"a file cannot be touched by {max_ranks_per_file} of {n_ranks} ranks")
    if n_ranks == 1:
        return "1-1" if n_files == 1 else "1-N"
    if n_files == 1:
        return "N-1"
    if max_ranks_per_file <= 1:
        return "N-N"
    return "N-M"


def classify_pattern(pairs: Iterable[tuple[Hashable, Hashable]]) -> Pattern:
    """Beacon's pattern (NSDI'19 §4) of a job from its (rank, data file) pairs.

    Args:
        pairs: one (rank, file) pair per data access (duplicates allowed); ``rank`` is any
            hashable rank id (-1, the unknown rank, counts as one rank), ``file`` any
            hashable file identity (path, or (dev, inode)). Only data files belong here:
            filter system paths (:func:`is_system_path`) and metadata-only files first.

    Returns:
        One of :data:`PATTERNS`, as :func:`classify_fan_in` defines them.
    """
    ranks_per_file: dict[Hashable, set[Hashable]] = defaultdict(set)
    ranks: set[Hashable] = set()
    for rank, file in pairs:
        ranks.add(rank)
        ranks_per_file[file].add(rank)
    fan_in = max((len(r) for r in ranks_per_file.values()), default=0)
    return classify_fan_in(len(ranks), len(ranks_per_file), fan_in)


#: Beacon's dominance shares (NSDI'19 §4): a mode must carry MORE than this share of the bytes,
#: by the number of distinct modes (2 -> one half; 3 or more -> one third).
DOMINANCE_TWO_MODES = 1 / 2
DOMINANCE_MANY_MODES = 1 / 3


def decide_pattern(modes: Iterable[tuple[Pattern, int]], fan_in: Pattern) -> Pattern:
    """The pattern of a job or phase by Beacon's volume dominance (NSDI'19 §4).

    Args:
        modes: (pattern, bytes) of each component of the I/O, e.g. ``[(read pattern,
            bytes read), (write pattern, bytes written)]``; bytes >= 0. Components with
            pattern ``none`` or 0 bytes carry no volume and are ignored; components with the
            same pattern add up.
        fan_in: the pattern of all the data I/O together (:func:`classify_fan_in` over every
            data file); returned when no mode dominates or there is no volume at all.

    Returns:
        The only mode when there is one; with two distinct modes the one with more than
        1/2 of the bytes; with three or more the largest one if it has more than 1/3 of the
        bytes; otherwise ``fan_in``. E.g. 99 GiB of N-N writes and 1 MiB of N-1 reads of one
        input file give ``N-N`` (the fan-in over all files says ``N-M``).

    Raises:
        ValueError: a negative byte count.
    """
    vol: dict[Pattern, int] = defaultdict(int)
    for pattern, nbytes in modes:
        if nbytes < 0:
            raise ValueError("a mode's bytes must be >= 0")
        if pattern != "none" and nbytes > 0:
            vol[pattern] += int(nbytes)
    if not vol:
        return fan_in
    if len(vol) == 1:
        return next(iter(vol))
    total = sum(vol.values())
    ranked = sorted(vol.items(), key=lambda kv: -kv[1])
    share = DOMINANCE_TWO_MODES if len(vol) == 2 else DOMINANCE_MANY_MODES
    (top, top_b), (_, second_b) = ranked[0], ranked[1]
    if top_b / total > share and top_b > second_b:
        return top
    return fan_in


def decide_directions(patterns: Mapping[str, Pattern], bytes_read: int, bytes_written: int, fan_in: Pattern) -> Pattern:
    """:func:`decide_pattern` over the two directions: ``patterns`` is ``{"read": p, "write": p}``
    (Beacon pattern of the reads alone and of the writes alone), bytes in bytes."""
    return decide_pattern(
        [(patterns.get("read", "none"), bytes_read), (patterns.get("write", "none"), bytes_written)], fan_in
    )


#: A direction's shared files form ONE N-1 group when the largest of them carries at least this
#: share of the shared files' bytes; otherwise the shared group is N-M (several shared files
#: with comparable volumes). Pharos' rule, not Beacon's: it keeps a small shared side file (a
#: log every rank appends to) from turning a shared-file job into N-M.
SHARED_FILE_DOMINANCE = 0.9


@dataclass(frozen=True)
class DirectionFanIn:
    """Fan-in statistics of one direction (reads alone, or writes alone) of a job or phase.

    All counts are over *data files* (see the module docstring) that saw that direction;
    bytes are in bytes. ``n_ranks``/``n_files``/``max_fan_in`` are :func:`classify_fan_in`'s
    inputs over every such file. The files split into *shared* files (touched by more than one
    rank in this direction) and *private* files (exactly one rank):

    * ``shared_files``, ``shared_bytes``, ``top_shared_bytes`` (the bytes of the largest shared
      file) and ``shared_ranks`` (distinct ranks on the shared files);
    * ``private_files``, ``private_bytes`` and ``private_ranks`` (distinct ranks on the private
      files).
    """

    n_ranks: int = 0
    n_files: int = 0
    max_fan_in: int = 0
    shared_files: int = 0
    shared_ranks: int = 0
    shared_bytes: int = 0
    top_shared_bytes: int = 0
    private_files: int = 0
    private_ranks: int = 0
    private_bytes: int = 0

    @classmethod
    def of_files(cls, files: Iterable[tuple[Iterable[Hashable], int]]) -> DirectionFanIn:
        """The statistics of ``files``: one (ranks, bytes) pair per data file of the direction
        (ranks: the rank ids that read, or wrote, it; bytes >= 0). Files without a rank are
        ignored."""
        all_ranks: set[Hashable] = set()
        shared_r: set[Hashable] = set()
        private_r: set[Hashable] = set()
        n = fan = sf = sb = top = pf = pb = 0
        for ranks, nbytes in files:
            rs = set(ranks)
            if not rs:
                continue
            n += 1
            fan = max(fan, len(rs))
            all_ranks |= rs
            if len(rs) > 1:
                sf, sb, top = sf + 1, sb + int(nbytes), max(top, int(nbytes))
                shared_r |= rs
            else:
                pf, pb = pf + 1, pb + int(nbytes)
                private_r |= rs
        return cls(len(all_ranks), n, fan, sf, len(shared_r), sb, top, pf, len(private_r), pb)


def direction_pattern(s: DirectionFanIn) -> tuple[Pattern, Pattern]:
    """(pattern by volume, fan-in pattern) of one direction of a job or phase.

    The fan-in pattern is :func:`classify_fan_in` over all the direction's data files. The
    pattern by volume is Beacon's volume dominance (NSDI'19 §4, :func:`decide_pattern`) over
    the direction's two groups of files: the *shared* group is ``N-1`` when its largest file
    carries at least :data:`SHARED_FILE_DOMINANCE` of its bytes (or it has one file), else
    ``N-M``; the *private* group is :func:`classify_fan_in` of its ranks and files with fan-in 1
    (``1-1``, ``1-N`` or ``N-N``). E.g. 4 ranks writing 16 MiB to one shared file and rank 0 a
    4 KiB results file: shared N-1 (16 MiB) vs private 1-1 (4 KiB) -> ``N-1``; the fan-in
    pattern says ``N-M``.

    Raises:
        ValueError: negative counts or bytes, or a fan-in above the ranks.
    """
    if min(s.shared_bytes, s.top_shared_bytes, s.private_bytes) < 0:
        raise ValueError("a group's bytes must be >= 0")
    fan_in = classify_fan_in(s.n_ranks, s.n_files, s.max_fan_in)
    modes: list[tuple[Pattern, int]] = []
    if s.shared_files:
        one = s.shared_files == 1 or (
            s.shared_bytes > 0 and s.top_shared_bytes >= SHARED_FILE_DOMINANCE * s.shared_bytes
        )
        modes.append(("N-1" if one else "N-M", s.shared_bytes))
    if s.private_files:
        modes.append((classify_fan_in(s.private_ranks, s.private_files, 1), s.private_bytes))
    return decide_pattern(modes, fan_in), fan_in
