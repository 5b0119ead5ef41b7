"""The cases of the labelled fault-injection suite (``bench/diagnosis_suite.py``, issue 24): the
running stack's helpers (jobs, waits, target limits, CPU quotas, files, what Pharos names) and one
function per class that runs a case and returns its :class:`~diagnosis_scoring.CaseResult`."""

from __future__ import annotations

import contextlib
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import httpx  # noqa: E402
from cpu_cap import cpu_capped  # noqa: E402
from diagnosis_scoring import CLASSES, CaseResult, Finding, anomaly_finding, insight_finding  # noqa: E402
from pharos_testkit import StackAdmin, pharos_run  # noqa: E402

MiB = 1 << 20
N_TARGETS = 8
FWD_NODES = 4
FIO = "fio --ioengine=psync --disk_util=0 --output-format=terse --thread --name=c"  # one process per rank
#: The server's detection on the suite's scale (as tests/live/test_live_diagnosis.py): fail-slow
#: windows 5/20/60 s judged every 5 s, interference windows of 2 s; 2 worker threads per daemon
#: so that a heavy job on a node queues a light one; the control loop off.
DIAG_ENV = {
    "PHAROS_DIAGNOSIS_FAILSLOW_WINDOWS_S": "[5, 20, 60]",
    "PHAROS_DIAGNOSIS_DETECT_PERIOD_S": "5",
    "PHAROS_DIAGNOSIS_INTERFERENCE_WINDOW_S": "2",
    "PHAROS_DIAGNOSIS_INTERFERENCE_LOOKBACK_S": "120",
    "PHAROS_FWD_WORKERS": "2",
    "PHAROS_CONTROL_PERIOD_S": "0",
    # nor `pharos run`'s DFRA hint: it maps a job by its class (learned from the suite's earlier
    # cases), over the mapping a case sets
    "PHAROS_RUN_HINT": "false",
}
DETECT_GRACE_S = 7.0  # after a system-side fault's job ends: one detection period and its store


def _ts(iso: str | None) -> float | None:
    return datetime.fromisoformat(iso).timestamp() if iso else None


class Suite(StackAdmin):
    """The running stack and the suite's helpers: jobs, waits, target limits, CPU caps, files."""

    def __init__(self, settings, seed: int, log: Callable[[str], None], darshan_lib: Path | None = None) -> None:
        super().__init__(settings)
        self.seed = seed
        self.darshan_lib = darshan_lib
        self.log = log
        self.root = settings.mount_point / f"suite-{seed}-{os.getpid()}"
        self.root.mkdir()
        self.out = Path(tempfile.mkdtemp(prefix="pharos-suite-out-"))
        self._files: dict[int, list[Path]] = {t: [] for t in range(N_TARGETS)}
        from pharos_api.cli_jobs import api_headers

        self.api_headers = api_headers()

    # -- API --------------------------------------------------------------------------------
    def get(self, path: str, **params: Any) -> Any:
        r = httpx.get(self.api + path, params=params, headers=self.api_headers, timeout=60)
        r.raise_for_status()
        return r.json()

    # -- jobs -------------------------------------------------------------------------------
    def start(self, job_id: str, ranks: int, rank_cmd: str, name: str) -> subprocess.Popen:
        """``pharos run`` of ``ranks`` copies of ``sh -c rank_cmd`` (``$PHAROS_RANK`` set)."""
        argv, env = pharos_run(self.settings, job_id, ["sh", "-c", rank_cmd], ranks, name, self.out / job_id)
        return subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)

    @staticmethod
    def finish(p: subprocess.Popen, timeout: float) -> None:
        """Wait for a job; SIGTERM (forwarded to its ranks) after ``timeout`` s; raise on failure."""
        try:
            p.wait(timeout)
        except subprocess.TimeoutExpired:
            p.send_signal(signal.SIGTERM)
            p.wait(20)
        if p.returncode:
            raise RuntimeError(f"pharos run exited {p.returncode}: {p.stderr.read().decode()[-800:]}")

    def wait_stored(self, job_id: str, timeout_s: float = 60) -> dict:
        """The job's client-layer summary once the job has ended and its records count has not
        changed for 2 s (late records settled); raises after ``timeout_s``."""
        deadline = time.monotonic() + timeout_s
        last, since = None, None
        while time.monotonic() < deadline:
            try:
                cur = self.get(f"/v1/jobs/{job_id}")
            except httpx.HTTPError:
                cur = None
            if cur and cur.get("state") in ("finished", "failed"):
                key = (cur.get("records"), cur.get("bytes_read"), cur.get("bytes_written"))
                if last == key:
                    if time.monotonic() - since >= 2.0:
                        return cur
                else:
                    last, since = key, time.monotonic()
            time.sleep(0.5)
        raise RuntimeError(f"job {job_id}: records not settled within {timeout_s} s")

    # -- faults and resources ---------------------------------------------------------------
    @contextlib.contextmanager
    def limited(self, mb_s: float) -> Iterator[None]:
        """Every target limited to ``mb_s`` MB/s (a configured rate, not a fault) for the block."""
        for t in range(N_TARGETS):
            self.set_target(f"ost{t}", max_perf_mb_s=float(mb_s))
        try:
            yield
        finally:
            for t in range(N_TARGETS):
                self.set_target(f"ost{t}", max_perf_mb_s=0.0)

    def cpu_capped(self, fwd: str, of_need: float, seen: dict) -> contextlib.AbstractContextManager:
        """Daemon ``fwd``'s CPU capped at ``of_need`` of its need for the block: :func:`cpu_cap.cpu_capped`."""
        from pharos_api import stack

        pid = stack.pid_of(self.settings, fwd)
        if pid is None:
            raise RuntimeError(f"{fwd} is not running")
        return cpu_capped(pid, of_need, seen)

    def target_files(self, per_target: int) -> dict[int, list[Path]]:
        """``per_target`` pre-sized (sparse, 64 MiB) files on each target, placed by the daemons'
        round-robin and checked in the layout sidecars; made once, reused (fio overwrites them)."""
        d = self.root / "per-target"
        d.mkdir(exist_ok=True)
        i = sum(len(v) for v in self._files.values())
        while min(len(v) for v in self._files.values()) < per_target:
            p = d / f"new{i}"
            i += 1
            with open(p, "wb") as f:
                f.truncate(64 * MiB)
            (t,) = self.layout_targets(p)
            if len(self._files[t]) >= per_target:
                p.unlink()
                continue
            final = d / f"ost{t}-{len(self._files[t])}.dat"
            p.rename(final)
            self._files[t].append(final)
            if i > 40 * N_TARGETS * per_target:
                raise RuntimeError(f"placement reached only {[len(v) for v in self._files.values()]}")
        return self._files

    # -- findings ---------------------------------------------------------------------------
    def findings(self, jobs: list[str], t0: float, until: float, seen: dict[tuple, float]) -> list[Finding]:
        """What Pharos names about ``jobs`` now: their high-severity insights, their interference
        events, and the stored anomalies whose onset is in ``[t0 - 3 s, until]`` (none of an
        earlier case's jobs). ``seen`` maps (class, resource) to when it was first seen (s after t0)."""
        out: list[Finding] = []
        now = time.time() - t0
        for j in jobs:
            for it in self.get(f"/v1/jobs/{j}/insights")["insights"]:
                if f := insight_finding(it, j):
                    out.append(f)
            for ev in self.get(f"/v1/jobs/{j}/interference").get("events", []):
                if ev.get("job_id") in jobs:
                    out.append(anomaly_finding(ev))
        for a in self.get("/v1/anomalies", since_s=max(60.0, time.time() - t0 + 60), limit=1000)["items"]:
            on = _ts(a.get("onset")) or _ts(a.get("first_seen"))
            if on is None or not (t0 - 3.0 <= on <= until):
                continue
            if (a.get("job_id") or a["kind"] == "interference") and a.get("job_id") not in jobs:
                continue  # about another case's job, or about requests of no job (the suite's own set-up)
            out.append(anomaly_finding(a))
        for f in out:
            f.seen_s = seen.setdefault(f.key(), now)
        return out

    def poll_findings(self, jobs: list[str], t0: float, seen: dict[tuple, float], while_: Callable[[], bool]) -> None:
        """Record, every second while ``while_()``, when each stored anomaly is first seen."""
        while while_():
            with contextlib.suppress(httpx.HTTPError):
                now = time.time() - t0
                for a in self.get("/v1/anomalies", since_s=120, limit=1000)["items"]:
                    on = _ts(a.get("onset")) or _ts(a.get("first_seen"))
                    if (
                        on is not None
                        and on >= t0 - 3.0
                        and a.get("job_id", "") in ([*jobs] if a["kind"] == "interference" or a.get("job_id") else [""])
                    ):
                        seen.setdefault(anomaly_finding(a).key(), now)
            time.sleep(1.0)


# -- the cases --------------------------------------------------------------------------------


def _job(s: Suite, idx: int, label: str, part: str = "") -> str:
    return f"suite{s.seed}-{idx:03d}-{label.replace('_', '-')}{part}"


def client_case(
    s: Suite, idx: int, label: str, ranks: int, rank_cmd: str, params: dict, also_true=(), setup=None
) -> CaseResult:
    """A client-side case: one job, the fault in its own workload; findings after its records settle."""
    d = s.root / f"c{idx:03d}"
    d.mkdir()
    if setup:
        setup(d)
    job = _job(s, idx, label)
    res = CaseResult(idx, label, "", job, params, also_true=list(also_true))
    t0 = time.time()
    try:
        s.finish(s.start(job, ranks, rank_cmd.format(d=d), label), 120)
        s.wait_stored(job)
        res.findings = s.findings([job], t0, time.time(), {})
    finally:
        shutil.rmtree(d, ignore_errors=True)
    if s.darshan_lib:
        res.log_findings = darshan_findings(s, job, ranks, rank_cmd, setup)
    return res


def darshan_findings(s: Suite, job: str, ranks: int, rank_cmd: str, setup=None) -> list[Finding]:
    """The same workload again, each rank a process under Darshan's runtime (``LD_PRELOAD`` of
    ``s.darshan_lib``, non-MPI mode: one log per process), the logs imported as job
    ``<job>-log`` (``POST /v1/import/darshan/upload``, ranks numbered in turn) and its insights
    (from the counters, and DXT when the log has it) mapped to findings."""
    d = s.root / f"{job}-darshan"
    d.mkdir()
    logs = s.out / f"{job}-darshan-logs"
    logs.mkdir(parents=True)
    if setup:
        setup(d)
    env = dict(os.environ, LD_PRELOAD=str(s.darshan_lib), DARSHAN_ENABLE_NONMPI="1", DARSHAN_LOGPATH=str(logs))
    try:
        procs = [
            subprocess.Popen(
                ["sh", "-c", rank_cmd.format(d=d)],
                env=env | {"PHAROS_RANK": str(r)},
                stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE,
            )
            for r in range(ranks)
        ]
        for p in procs:
            s.finish(p, 120)
    finally:
        shutil.rmtree(d, ignore_errors=True)
    paths = sorted(logs.rglob("*.darshan"))
    if not paths:
        raise RuntimeError(f"Darshan wrote no log in {logs} (is {s.darshan_lib} the runtime library?)")
    from pharos_api.cli_diagnose import _import_via_api

    got = _import_via_api(s.api, paths, f"{job}-log", job) or []
    if bad := [r for r in got if r["status"] == "failed"]:
        raise RuntimeError(f"Darshan import failed: {bad[0].get('error')}")
    return [f for it in s.get(f"/v1/jobs/{job}-log/insights")["insights"] if (f := insight_finding(it, f"{job}-log"))]


def sparse(d: Path, name: str, size: int) -> None:
    with open(d / name, "wb") as f:
        f.truncate(size)


def case_clean(s: Suite, idx: int, rng: random.Random) -> CaseResult:
    ranks, bs, size = rng.choice([1, 2, 4]), rng.choice([1, 2, 4]), rng.choice([8, 16, 24])
    n1 = ranks > 1 and rng.random() < 0.5
    p = {"ranks": ranks, "bs_mib": bs, "size_mib_per_rank": size, "pattern": "N-1" if n1 else "N-N"}
    if n1:
        cmd = (
            f"exec {FIO} --rw=write --bs={bs}m --size={size}m --offset=$((PHAROS_RANK*{size}))m --filename={{d}}/shared"
        )
        return client_case(s, idx, "clean", ranks, cmd, p, setup=lambda d: sparse(d, "shared", ranks * size * MiB))
    return client_case(
        s, idx, "clean", ranks, f"exec {FIO} --rw=write --bs={bs}m --size={size}m --filename={{d}}/data.$PHAROS_RANK", p
    )


def case_small_writes(s: Suite, idx: int, rng: random.Random) -> CaseResult:
    ranks, bs, n = rng.choice([1, 2, 4]), rng.choice([1, 2, 4, 8]), rng.randint(1500, 4000)
    p = {"ranks": ranks, "bs_kib": bs, "requests_per_rank": n}
    cmd = f"exec {FIO} --rw=write --bs={bs}k --size={bs * n}k --filename={{d}}/data.$PHAROS_RANK"
    # 1-2 KiB requests back to back start at offsets that are not 4 KiB multiples: misaligned too
    return client_case(s, idx, "small_writes", ranks, cmd, p, also_true=["misaligned"] if bs < 4 else [])


def case_small_reads_shared(s: Suite, idx: int, rng: random.Random) -> CaseResult:
    ranks, bs, n = rng.choice([2, 3, 4]), rng.choice([4, 8, 16, 64]), rng.randint(1500, 3000)
    seg = bs * n  # KiB per rank
    p = {"ranks": ranks, "bs_kib": bs, "requests_per_rank": n}
    cmd = f"exec {FIO} --rw=read --bs={bs}k --size={seg}k --offset=$((PHAROS_RANK*{seg}))k --filename={{d}}/shared"
    return client_case(
        s, idx, "small_reads_shared", ranks, cmd, p, setup=lambda d: sparse(d, "shared", ranks * seg * 1024)
    )


def case_misaligned(s: Suite, idx: int, rng: random.Random) -> CaseResult:
    ranks, bs, n, off = (
        rng.choice([1, 2]),
        rng.choice([64, 128, 256]),
        rng.randint(1100, 1600),
        rng.choice([512, 1024, 2048, 3072]),
    )
    p = {"ranks": ranks, "bs_kib": bs, "requests_per_rank": n, "offset_b": off}
    cmd = f"exec {FIO} --rw=write --bs={bs}k --offset={off} --size={bs * n}k --filename={{d}}/data.$PHAROS_RANK"
    return client_case(s, idx, "misaligned", ranks, cmd, p, also_true=["small_writes"])


def case_random_reads(s: Suite, idx: int, rng: random.Random) -> CaseResult:
    ranks, bs, n = rng.choice([1, 2, 4]), rng.choice([4, 8, 16]), rng.randint(1500, 3000)
    p = {"ranks": ranks, "bs_kib": bs, "requests_per_rank": n}

    def setup(d: Path) -> None:
        for r in range(ranks):
            sparse(d, f"data.{r}", 64 * MiB)

    cmd = f"exec {FIO} --rw=randread --bs={bs}k --size=64m --io_size={bs * n}k --filename={{d}}/data.$PHAROS_RANK"
    return client_case(s, idx, "random_reads", ranks, cmd, p, also_true=["small_reads_shared"], setup=setup)


def case_rank_imbalance(s: Suite, idx: int, rng: random.Random) -> CaseResult:
    ranks, base, k = rng.choice([2, 3, 4]), rng.choice([4, 6, 8]), rng.randint(4, 8)
    p = {"ranks": ranks, "mib_per_rank": base, "rank0_factor": k}
    cmd = f's={base}; [ $PHAROS_RANK = 0 ] && s={base * k}; exec {FIO} --rw=write --bs=1m --size="$s"m --filename={{d}}/data.$PHAROS_RANK'
    return client_case(s, idx, "rank_imbalance", ranks, cmd, p)


def case_fsync_per_write(s: Suite, idx: int, rng: random.Random) -> CaseResult:
    ranks, n = rng.choice([1, 2]), rng.randint(120, 200)
    p = {"ranks": ranks, "writes_per_rank": n, "bs_mib": 1}
    cmd = f"exec {FIO} --rw=write --bs=1m --size={n}m --fsync=1 --filename={{d}}/data.$PHAROS_RANK"
    return client_case(s, idx, "fsync_per_write", ranks, cmd, p)


def case_metadata_storm(s: Suite, idx: int, rng: random.Random) -> CaseResult:
    """Rounds of ``files_per_rank`` creates, two stats each and the unlinks, repeated for
    ``storm_s`` seconds: a storm is sustained by definition (Beacon's rate for
    ``metadata_sustained_s``); a fixed number of files outlasted that window until the mount
    answered creates itself (the forwarding layer's write-back creates, issue 29), then took ~1 s."""
    ranks, n, storm_s = rng.choice([4, 5, 6]), rng.randint(700, 1400), rng.randint(5, 8)
    p = {"ranks": ranks, "files_per_rank": n, "storm_s": storm_s}
    # sh builtins per file (no fork per file); one `date` per round
    cmd = (
        f"m={{d}}/m$PHAROS_RANK; end=$(($(date +%s) + {storm_s})); "
        "while [ $(date +%s) -lt $end ]; do mkdir $m; i=0; "
        f"while [ $i -lt {n} ]; do : > $m/f$i; [ -e $m/f$i ]; [ -s $m/f$i ]; i=$((i+1)); done; rm -r $m; done"
    )
    return client_case(s, idx, "metadata_storm", ranks, cmd, p)


def system_case(
    s: Suite,
    idx: int,
    label: str,
    resource: str,
    params: dict,
    jobs: list[tuple[str, int, str, float]],
    victim: int,
    fault: Callable[[], contextlib.AbstractContextManager],
    fault_after_s: float,
    also_true=(),
    grace_s: float = DETECT_GRACE_S,
) -> CaseResult:
    """A system-side case: ``jobs`` = (part, ranks, rank_cmd, start delay s) started on time, the
    ``fault`` held from ``fault_after_s`` until the jobs end; anomalies polled meanwhile."""
    ids = [_job(s, idx, label, part) for part, *_ in jobs]
    res = CaseResult(idx, label, resource, ids[victim], params, also_true=list(also_true))
    seen: dict[tuple, float] = {}
    t_start = time.time()
    procs: list[subprocess.Popen] = []
    pending = sorted(zip(ids, jobs, strict=True), key=lambda x: x[1][3])
    fault_cm = None
    t0 = t_start + fault_after_s
    try:
        while pending or fault_cm is None:
            now = time.time() - t_start
            if pending and now >= pending[0][1][3]:
                jid, (part, ranks, cmd, _) = pending.pop(0)
                procs.append(s.start(jid, ranks, cmd, f"{label}{part}"))
                continue
            if fault_cm is None and now >= fault_after_s:
                fault_cm = fault()
                fault_cm.__enter__()
                t0 = time.time()
                continue
            time.sleep(0.2)
        s.poll_findings(ids, t0, seen, lambda: any(p.poll() is None for p in procs))
        for p in procs:
            s.finish(p, 60)
    finally:
        if fault_cm is not None:
            fault_cm.__exit__(None, None, None)
        for p in procs:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
                p.wait(20)
    t_end = time.time()
    s.poll_findings(ids, t0, seen, lambda: time.time() < t_end + grace_s)
    for j in ids:
        s.wait_stored(j)
    res.findings = s.findings(ids, t0, t_end + grace_s, seen)
    return res


def case_slow_target(s: Suite, idx: int, rng: random.Random) -> CaseResult:
    t, slow, runtime = rng.randrange(N_TARGETS), rng.choice([4, 6, 8]), rng.randint(15, 18)
    fs = s.target_files(2)  # rank r writes two files on target r (a resource is judged on >= 2 files)
    files = " ".join(f"{fs[k][0]}:{fs[k][1]}" for k in range(N_TARGETS))
    cmd = (
        f"set -- {files}; shift $PHAROS_RANK; exec {FIO} --rw=write --bs=1m --size=16m --file_service_type=roundrobin "
        f"--time_based --runtime={runtime} --rate=8m --filename=$1"
    )
    p = {"target": f"ost{t}", "slowdown": slow, "runtime_s": runtime, "ranks": N_TARGETS, "targets_limit_mb_s": 24}

    @contextlib.contextmanager
    def fault():
        s.set_target(f"ost{t}", slowdown=float(slow))
        try:
            yield
        finally:
            s.set_target(f"ost{t}", slowdown=1.0)

    with s.limited(24):  # a slowed target cannot keep up with its rank while the healthy ones can
        return system_case(
            s,
            idx,
            "slow_target",
            f"ost{t}",
            p,
            [("", N_TARGETS, cmd, 0.0)],
            0,
            fault,
            2.0,
            also_true=["rank_imbalance"],
        )


def case_slow_forwarding_node(s: Suite, idx: int, rng: random.Random) -> CaseResult:
    k, of_need, runtime = rng.randrange(FWD_NODES), rng.choice([0.35, 0.5, 0.65]), rng.randint(20, 24)
    fs = s.target_files(N_TARGETS)  # rank r writes its own file on every target, round robin
    per_rank = [":".join(str(fs[t][r]) for t in range(N_TARGETS)) for r in range(N_TARGETS)]
    cmd = (
        f"set -- {' '.join(per_rank)}; shift $PHAROS_RANK; exec {FIO} --rw=write --bs=1m --size=64m "
        f"--file_service_type=roundrobin --time_based --runtime={runtime} --rate=4m --filename=$1"
    )
    job = _job(s, idx, "slow_forwarding_node")
    s.set_mapping({job: [f"fwd{i}" for i in range(FWD_NODES)]})
    p = {"forwarding_node": f"fwd{k}", "cpu_of_need": of_need, "runtime_s": runtime, "ranks": N_TARGETS}
    try:
        return system_case(
            s,
            idx,
            "slow_forwarding_node",
            f"fwd{k}",
            p,
            [("", N_TARGETS, cmd, 0.0)],
            0,
            lambda: s.cpu_capped(f"fwd{k}", of_need, seen=p),  # capped ~3 s in: need measured from 1 s
            1.0,
            also_true=["rank_imbalance"],
            grace_s=15.0,  # a CPU-starved daemon's own records reach the pipeline late
        )
    finally:
        s.set_mapping({})


def case_interference_forwarding_node(s: Suite, idx: int, rng: random.Random) -> CaseResult:
    k, limit, heavy_ranks = rng.randrange(FWD_NODES), rng.choice([12, 16]), rng.choice([3, 4])
    fs = s.target_files(N_TARGETS)
    ts = rng.sample(range(N_TARGETS), 1 + heavy_ranks)
    light_f, heavy_f = fs[ts[0]][N_TARGETS - 1], [str(fs[t][N_TARGETS - 2]) for t in ts[1:]]
    light = f"exec {FIO} --rw=write --bs=256k --size=8m --time_based --runtime=14 --rate=2m --filename={light_f}"
    heavy = f"set -- {' '.join(heavy_f)}; shift $PHAROS_RANK; exec {FIO} --rw=write --bs=1m --size=32m --time_based --runtime=7 --filename=$1"
    ids = [_job(s, idx, "interference_forwarding_node", x) for x in ("-light", "-heavy")]
    s.set_mapping({ids[0]: [f"fwd{k}"], ids[1]: [f"fwd{k}"]})
    p = {
        "forwarding_node": f"fwd{k}",
        "targets_limit_mb_s": limit,
        "heavy_ranks": heavy_ranks,
        "light_target": f"ost{ts[0]}",
    }
    try:
        with s.limited(limit):  # the heavy job's requests wait for their targets' rate, holding the node's workers
            return system_case(
                s,
                idx,
                "interference_forwarding_node",
                f"fwd{k}",
                p,
                [("-light", 1, light, 0.0), ("-heavy", heavy_ranks, heavy, 5.0)],
                0,
                contextlib.nullcontext,
                5.0,
            )
    finally:
        s.set_mapping({})


def case_interference_target(s: Suite, idx: int, rng: random.Random) -> CaseResult:
    t, limit, heavy_ranks = rng.randrange(N_TARGETS), rng.choice([8, 12]), rng.choice([2, 3])
    k_light, k_heavy = rng.sample(range(FWD_NODES), 2)
    fs = s.target_files(N_TARGETS)
    light = f"exec {FIO} --rw=write --bs=256k --size=8m --time_based --runtime=14 --rate=2m --filename={fs[t][N_TARGETS - 1]}"
    heavy_f = " ".join(str(fs[t][i]) for i in range(heavy_ranks))
    heavy = f"set -- {heavy_f}; shift $PHAROS_RANK; exec {FIO} --rw=write --bs=1m --size=32m --time_based --runtime=7 --filename=$1"
    ids = [_job(s, idx, "interference_target", x) for x in ("-light", "-heavy")]
    s.set_mapping({ids[0]: [f"fwd{k_light}"], ids[1]: [f"fwd{k_heavy}"]})
    p = {
        "target": f"ost{t}",
        "targets_limit_mb_s": limit,
        "heavy_ranks": heavy_ranks,
        "light_node": f"fwd{k_light}",
        "heavy_node": f"fwd{k_heavy}",
    }
    try:
        with s.limited(limit):  # the heavy job takes the target's whole rate
            return system_case(
                s,
                idx,
                "interference_target",
                f"ost{t}",
                p,
                [("-light", 1, light, 0.0), ("-heavy", heavy_ranks, heavy, 5.0)],
                0,
                contextlib.nullcontext,
                5.0,
            )
    finally:
        s.set_mapping({})


CASES: dict[str, Callable[[Suite, int, random.Random], CaseResult]] = {
    "clean": case_clean,
    "small_writes": case_small_writes,
    "small_reads_shared": case_small_reads_shared,
    "misaligned": case_misaligned,
    "random_reads": case_random_reads,
    "rank_imbalance": case_rank_imbalance,
    "fsync_per_write": case_fsync_per_write,
    "metadata_storm": case_metadata_storm,
    "slow_target": case_slow_target,
    "slow_forwarding_node": case_slow_forwarding_node,
    "interference_forwarding_node": case_interference_forwarding_node,
    "interference_target": case_interference_target,
}
assert list(CASES) == CLASSES
