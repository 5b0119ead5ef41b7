"""A forwarding node starved of CPU, the fault of the diagnosis suite's slow_forwarding_node
cases (``bench/diagnosis_cases.py``): the cgroup CPU controller's quota on a running daemon."""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Iterator
from pathlib import Path


@contextlib.contextmanager
def cpu_capped(pid: int, of_need: float, seen: dict, measure_s: float = 2.0) -> Iterator[None]:
    """Process ``pid``'s CPU capped at ``of_need`` of what it needs for the load it serves
    (its CPU over the first ``measure_s`` s, uncapped: every thread's schedstat) for the block
    (the cgroup CPU controller: ``cpu.max`` on cgroup v2 where the controller is enabled, else
    the v1 ``cpu`` hierarchy's CFS quota), every thread of it; released after. A cap relative
    to the need, not a fixed share of a core: the daemon's need for the same load differs from
    run to run (0.45-0.86% of a core here) and between machines, and a fixed 0.5% was, in one
    run of 4, no fault at all (throttled in 11 of 59 periods, its waits its peers'). The
    smallest quota is 1 ms a 400 ms period (0.25% of a core). ``seen`` receives
    ``cpu_need_share`` (the need measured, of one core), ``cpu_share`` (the cap set) and what
    the fault did: ``cpu_used_share`` (the daemon's CPU while capped) and ``throttled_periods``
    / ``periods`` (the cgroup's cpu.stat), so a miss can be told from a cap the daemon never
    reached."""
    cpu0, t0 = _cpu_ns(pid), time.monotonic()
    time.sleep(measure_s)
    need = (_cpu_ns(pid) - cpu0) / 1e9 / max(time.monotonic() - t0, 1e-9)
    period = 400_000  # us (the largest is 1 s)
    quota = max(1000, int(period * need * of_need))
    seen.update(cpu_need_share=round(need, 5), cpu_share=round(quota / period, 5))
    cpu0, t0 = _cpu_ns(pid), time.monotonic()
    v1 = Path("/sys/fs/cgroup/cpu")
    if (v1 / "cpu.cfs_quota_us").exists():
        cg = v1 / f"pharos-suite-{os.getpid()}"
        cg.mkdir(exist_ok=True)
        (cg / "cpu.cfs_period_us").write_text(str(period))
        (cg / "cpu.cfs_quota_us").write_text(str(quota))
        back = v1
    else:
        from pharos_agents.cgroups import cgroup2_mount

        root = cgroup2_mount()
        back = root / Path(Path(f"/proc/{pid}/cgroup").read_text().split("::", 1)[1].strip()).relative_to("/")
        cg = root / f"pharos-suite-{os.getpid()}"
        cg.mkdir(exist_ok=True)
        (cg / "cpu.max").write_text(f"{quota} {period}")
    (cg / "cgroup.procs").write_text(str(pid))
    try:
        yield
    finally:
        st = dict(line.split() for line in (cg / "cpu.stat").read_text().splitlines() if line.strip())
        used = (_cpu_ns(pid) - cpu0) / 1e9 / max(time.monotonic() - t0, 1e-9)
        seen.update(
            cpu_used_share=round(used, 5),
            throttled_periods=int(st.get("nr_throttled", 0)),
            periods=int(st.get("nr_periods", 0)),
        )
        (back / "cgroup.procs").write_text(str(pid))
        cg.rmdir()


def _cpu_ns(pid: int) -> int:
    """CPU time of every thread of ``pid`` so far, ns (the first field of each thread's
    ``/proc/<pid>/task/<tid>/schedstat``: ns, not the clock ticks of ``stat``)."""
    total = 0
    for t in Path(f"/proc/{pid}/task").iterdir():
        with contextlib.suppress(OSError, ValueError, IndexError):
            total += int((t / "schedstat").read_text().split()[0])
    return total
