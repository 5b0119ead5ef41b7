"""cgroup v2 helpers: find the mount, create a job's cgroup, move processes into it.

A job runs in ``<cgroup2 mount>/<parent>/job_<ID>`` (``parent`` is Settings.cgroup_parent,
"pharos" by default), rank r in its child ``rank_<r>``. The eBPF agent traces exactly the
processes below ``<parent>`` (and Slurm's ``job_<id>/step_<n>/.../task_<r>`` cgroups). Agent and
FUSE mount take the job id from the ``job_<ID>`` component only (``pharos-attribution``,
proto/attribution) and the rank from the innermost launcher's variable (an MPI launcher's
``PMI_RANK`` before ``PHAROS_RANK``), else from ``rank_<r>``.
"""

from __future__ import annotations

import os
import re
import time
from pathlib import Path

JOB_ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")


class CgroupError(RuntimeError):
    """cgroup v2 is missing, or a cgroup could not be created or joined (e.g. not root)."""


def cgroup2_mount(mounts: Path = Path("/proc/mounts")) -> Path:
    """The mount point of the unified (v2) hierarchy, read from /proc/mounts.

    Hybrid systems mount it at /sys/fs/cgroup/unified, modern ones at /sys/fs/cgroup.
    Raises CgroupError when there is none.
    """
    for line in mounts.read_text().splitlines():
        fields = line.split()
        if len(fields) >= 3 and fields[2] == "cgroup2":
            return Path(fields[1])
    raise CgroupError("no cgroup2 mount in /proc/mounts: Pharos needs the unified cgroup hierarchy")


def validate_job_id(job_id: str) -> str:
    """Job ids are 1-64 characters of [A-Za-z0-9_.-], not starting with a dot or dash and not
    ending in ``.scope`` (the attribution rule strips that suffix: ``job_<ID>.scope`` units)."""
    if not JOB_ID_RE.match(job_id) or job_id.endswith(".scope"):
        raise ValueError(
            f"invalid job id {job_id!r}: use 1-64 characters of letters, digits, '_', '.', '-' (not ending in .scope)"
        )
    return job_id


def job_cgroup(job_id: str, parent: str = "pharos") -> Path:
    """Create (if needed) and return the job's cgroup directory. Raises CgroupError."""
    validate_job_id(job_id)
    path = cgroup2_mount() / parent / f"job_{job_id}"
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise CgroupError(f"cannot create cgroup {path}: {exc.strerror} (pharos run needs root)") from exc
    return path


def rank_cgroup(job_cg: Path, rank: int) -> Path:
    """Create (if needed) and return rank ``rank``'s cgroup under a job cgroup. Raises CgroupError."""
    path = job_cg / f"rank_{rank}"
    try:
        path.mkdir(exist_ok=True)
    except OSError as exc:
        raise CgroupError(f"cannot create cgroup {path}: {exc.strerror}") from exc
    return path


def join_cgroup(path: Path, pid: int = 0) -> None:
    """Move ``pid`` (0: the calling process) into the cgroup. Raises OSError."""
    with open(path / "cgroup.procs", "w") as f:
        f.write(str(pid))


def remove_cgroup(path: Path, timeout: float = 5.0) -> bool:
    """Remove a job cgroup and its rank cgroups once empty, waiting up to ``timeout`` s for
    exiting tasks to leave. Returns False if it is still busy then."""
    deadline = time.monotonic() + timeout
    for child in sorted(path.glob("rank_*")) if path.is_dir() else []:
        if not remove_cgroup(child, max(0.0, deadline - time.monotonic())):
            return False
    while True:
        try:
            os.rmdir(path)
            return True
        except FileNotFoundError:
            return True
        except OSError:
            if time.monotonic() > deadline:
                return False
            time.sleep(0.05)
