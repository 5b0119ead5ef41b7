"""I/O pattern identification from file fan-in, after Beacon.

Beacon (Yang et al., "End-to-end I/O Monitoring on a Leading Supercomputer", NSDI'19,
§4 "I/O pattern identification") classifies a job's I/O by how its ranks map onto the
files they read or write: N-N (each rank its own file), N-1 (all ranks one shared file),
1-1 (one rank, one file), N-M (N ranks share M files). We add ``1-N`` (one rank writing
or reading several files) and ``none`` (no data I/O), and classify over *data files*:
regular files outside system paths (:data:`SYSTEM_PREFIXES`) that saw data reads or writes.

Everything here is pure: no store, no I/O. :mod:`pharos_analytics.summary` computes the
same fan-in statistics in ClickHouse and calls :func:`classify_fan_in`.
"""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Hashable, Iterable
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
)

#: The same test as :func:`is_system_path`, as an RE2/PCRE regular expression (ClickHouse
#: ``match``): a system prefix followed by '/' or the end of the path.
SYSTEM_PATH_REGEX: str = "^(" + "|".join(re.escape(p) for p in SYSTEM_PREFIXES) + ")(/|$)"
_SYSTEM_PATH_RE = re.compile(SYSTEM_PATH_REGEX)


def is_system_path(path: str) -> bool:
    """True when ``path`` lies in a system folder (``/usr/lib/x.so``, ``/etc``), not ``/usrdata``."""
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
