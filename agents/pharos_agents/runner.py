"""``pharos run``: launch the ranks of a job in a job cgroup and record its life cycle.

The job's ranks are started in ``<cgroup2>/<parent>/job_<ID>/rank_<r>`` so the eBPF agent traces
them (and nothing else); each rank gets ``PHAROS_JOB_ID``, ``PHAROS_RANK`` (0..N-1) and
``PHAROS_NRANKS`` in its environment. The agent and the mount take the job from the cgroup and
the rank from ``PHAROS_RANK``, unless a launcher the rank runs (``mpiexec``) gives its processes
their own (``PMI_RANK``...: the innermost wins, ``pharos-attribution``).
Start and end are recorded as ``JobEvent`` messages on the jobs topic; their ``ranks`` is the
number of copies started, times the MPI world size when the command is an MPI launcher
(``pharos run -- mpiexec -n 4 prog`` is a 4-rank job: :mod:`pharos_agents.launchers`).

Before the ranks start (and before the start event), the job asks the API for its DFRA
forwarding-node decision (:func:`request_hint`: ``POST /v1/hints/jobs/{id}?apply=true`` with
the job's name, user and command; Ji et al., FAST'19: decided at dispatch from the job's
earlier runs), which the control loop pushes to the FUSE mount at once, so the job's first
I/O already goes to the nodes decided. An unreachable or failing API never fails the job: one
warning on stderr and the mount's default mapping. ``Settings.run_hint`` (``PHAROS_RUN_HINT``)
or ``pharos run --no-hint`` skips the request.
"""

from __future__ import annotations

import getpass
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import httpx
from confluent_kafka import KafkaException, Producer

from pharos_core import api_client
from pharos_core.settings import Settings
from pharos_pipeline.wire import SCHEMA_VERSION, JobEvent, io_pb2

from .cgroups import cgroup2_mount, job_cgroup, join_cgroup, rank_cgroup, remove_cgroup, validate_job_id
from .launchers import launcher_world_size


class RunError(RuntimeError):
    """The job could not be started (bad arguments, no cgroup v2, Kafka unreachable)."""


@dataclass
class JobResult:
    """Outcome of a job: exit code (first non-zero rank exit code in time order, else 0)."""

    job_id: str
    exit_code: int
    rank_exit_codes: list[int]
    start_ns: int
    end_ns: int
    outputs: list[Path] = field(default_factory=list)
    hint: dict | None = None  # the API's DFRA decision (HintOut), None: not asked or not reachable


def _user() -> str:
    return os.environ.get("SUDO_USER") or getpass.getuser()


class JobEventProducer:
    """Writes JobEvent messages to the jobs topic (key = job id); delivery is confirmed."""

    def __init__(self, settings: Settings, timeout: float = 10.0) -> None:
        self.settings = settings
        self.timeout = timeout
        self._producer = Producer(
            {
                "bootstrap.servers": settings.kafka_bootstrap,
                "enable.idempotence": True,
                "acks": "all",
                "linger.ms": 0,
                "client.id": f"pharos-run-{os.getpid()}",
                "log_level": 3,  # errors only: transient broker warnings are retried anyway
            }
        )
        try:
            self._producer.list_topics(topic=settings.topic_jobs, timeout=timeout)
        except KafkaException as exc:
            raise RunError(
                f"Kafka not reachable at {settings.kafka_bootstrap}: start the stack with `pharos up`"
            ) from exc

    def close(self) -> None:
        """Deliver what is queued (bounded by the timeout)."""
        self._producer.flush(self.timeout)

    def send(self, event: JobEvent) -> None:
        """Produce one event and wait for its delivery. Raises RunError on failure."""
        errors: list[str] = []

        def done(err, _msg):
            if err is not None:
                errors.append(str(err))

        self._producer.produce(
            self.settings.topic_jobs, key=event.job_id.encode(), value=event.SerializeToString(), on_delivery=done
        )
        left = self._producer.flush(self.timeout)
        if left or errors:
            raise RunError(f"job event for {event.job_id} not delivered: {errors or 'timeout'}")


def _stderr(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def request_hint(
    settings: Settings, job_id: str, name: str, user: str, command: list[str], ranks: int = 0
) -> tuple[dict | None, str]:
    """Claim the DFRA decision of ``job_id`` and have it applied before the first I/O.

    ``POST /v1/hints/jobs/{job_id}?apply=true&name=..&user=..&command=..``
    (one ``command`` parameter per argv word: the history is matched by name, user and exact
    command; see :mod:`pharos_analytics.control.dfra`), ``&ranks=N`` when ``ranks`` > 0 (a feature
    of the learned class of a job without exact history, :mod:`pharos_analytics.control.class_model`),
    waiting at most
    ``settings.run_hint_timeout_s`` seconds, at :func:`pharos_core.api_client.client_url` (the
    API's Unix socket on its host when no token is configured, else ``settings.api_url``). Returns (the decision as the API gives it:
    ``class``, ``nodes`` primary first, ``reserved``, ``status`` applied | failed | recorded,
    ``reason``, ...; '') or (None, a one-line reason it could not be had: unreachable, timeout,
    HTTP error, not JSON). Never raises for the API's sake."""
    base = api_client.client_url(settings)  # the API's Unix socket on its host without a token, else TCP
    params: dict = {"apply": "true", "name": name, "user": user, "command": command}
    if ranks > 0:  # the job's ranks: a feature of the learned class when it has no exact history
        params["ranks"] = ranks
    try:  # the API token (settings api_token / PHAROS_API_TOKEN, api_token_file): roles admin or scheduler
        token = settings.api_token_value()
    except OSError as exc:
        return None, f"cannot read the API token file: {exc}"
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    try:
        r = api_client.request(
            base,
            "POST",
            f"/v1/hints/jobs/{job_id}",
            params=params,
            headers=headers,
            timeout=settings.run_hint_timeout_s,
        )
    except httpx.HTTPError as exc:
        return None, f"{base} not reachable ({type(exc).__name__}: {str(exc)[:160]})"
    if r.status_code != 200:
        return None, f"POST /v1/hints/jobs/{job_id}: HTTP {r.status_code} {r.text[:160]}"
    try:
        doc = r.json()
    except ValueError:
        doc = None
    if not isinstance(doc, dict) or "class" not in doc or not isinstance(doc.get("nodes"), list):
        return None, f"POST /v1/hints/jobs/{job_id}: not a hint: {r.text[:160]}"
    return doc, ""


def hint_line(job_id: str, hint: dict) -> str:
    """One line saying what the job got: class, nodes (primary first) and whether it was applied."""
    nodes = ",".join(hint.get("nodes") or []) or "the mount's default node"
    if hint.get("pinned"):
        nodes = ",".join(hint["pinned"]) + " (pinned by an admin)"
    if hint.get("dry_run"):
        state = "dry run: not applied"
    elif hint.get("status") == "failed":
        state = f"NOT applied: {(hint.get('error') or '')[:160]}"
    elif hint.get("new") is False:
        state = "decided earlier"
    else:
        state = hint.get("status") or "recorded"
    return f"pharos run: job {job_id}: forwarding {hint['class']} on {nodes} ({state})"


def job_hint(
    settings: Settings,
    job_id: str,
    name: str,
    user: str,
    command: list[str],
    hint: bool | None = None,
    quiet: bool = False,
    report: Callable[[str], None] = _stderr,
    ranks: int = 0,
) -> dict | None:
    """The hint step of :func:`run_job`: when ``hint`` (None: ``settings.run_hint``), ask for and
    apply the job's DFRA decision (:func:`request_hint`) and say it in one line on ``report``
    (not when ``quiet``); when it cannot be had, one warning line on ``report`` (also when
    ``quiet``) and None: the job runs with the mount's default mapping. Never raises."""
    if not (settings.run_hint if hint is None else hint):
        return None
    decision, why = request_hint(settings, job_id, name, user, command, ranks)
    if decision is None:
        report(f"pharos run: warning: no forwarding hint for job {job_id}, default mapping: {why}")
    elif not quiet:
        report(hint_line(job_id, decision))
    return decision


def node_local_dir(mount_point: Path, job_id: str, rank: int) -> Path:
    """Rank ``rank``'s node-local directory of job ``job_id`` on the pharos-mount at
    ``mount_point``, made if missing (its compute node attaches it: the forwarding daemon's
    ``backend/nodelocal.rs``). Raises RunError when it cannot be made."""
    d = mount_point / ".nodelocal" / job_id / str(rank)
    try:
        d.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise RunError(f"--node-local: cannot make {d}: {exc} (a pharos-mount there?)") from exc
    return d


def run_job(
    settings: Settings,
    job_id: str,
    command: list[str],
    ranks: int = 1,
    name: str | None = None,
    output_dir: Path | None = None,
    events: JobEventProducer | None = None,
    hint: bool | None = None,
    quiet: bool = False,
    report: Callable[[str], None] = _stderr,
    node_local: Path | None = None,
) -> JobResult:
    """Run ``ranks`` copies of ``command`` as job ``job_id`` and wait for all of them.

    ``output_dir``: when set, rank r's standard output goes to ``output_dir/rank_<r>.out``,
    written by this process (outside the job's cgroup, so it is not traced as job I/O);
    otherwise the ranks inherit this process's output. ``hint`` (None: ``settings.run_hint``):
    ask for and apply the job's DFRA decision before the ranks start (:func:`request_hint`);
    its one-line summary goes to ``report`` (stderr) unless ``quiet``; a hint that cannot be
    had is one warning line on ``report`` and the job runs with the mount's default mapping.
    ``node_local``: a pharos-mount's mount point: rank r gets the node-local directory
    ``node_local/.nodelocal/<job>/<r>`` (issue 27, item 2; forwarder/README.md "Node-local
    mode"), made here before it starts and named by ``PHAROS_NODELOCAL`` in its environment.
    Raises RunError when the job cannot start; the ranks' own failures are reported in the
    result's exit code.
    """
    validate_job_id(job_id)
    if ranks < 1:
        raise RunError("--ranks must be at least 1")
    if not command:
        raise RunError("no command given: pharos run --job ID [--ranks N] -- CMD...")
    exe = shutil.which(command[0])
    if exe is None:
        raise RunError(f"command not found: {command[0]}")
    try:
        cg = job_cgroup(job_id, settings.cgroup_parent)
    except Exception as exc:
        raise RunError(str(exc)) from exc
    mount = cgroup2_mount()
    events = events or JobEventProducer(settings)
    host = socket.gethostname()
    name = name or Path(command[0]).name
    job_ranks = ranks * (launcher_world_size(command) or 1)  # the MPI world size when launched
    decision = job_hint(settings, job_id, name, _user(), command, hint, quiet, report, job_ranks)

    def job_event(kind: int, time_ns: int, **fields) -> JobEvent:
        """The job's start or end event: what both carry, plus ``fields`` (the end's exit code)."""
        return JobEvent(
            schema_version=SCHEMA_VERSION,
            job_id=job_id,
            kind=kind,
            time_ns=time_ns,
            name=name,
            command=command,
            user=_user(),
            ranks=job_ranks,
            host=host,
            cgroup="/" + str(cg.relative_to(mount)),
            **fields,
        )

    start_ns = time.time_ns()
    events.send(job_event(io_pb2.JobEvent.KIND_START, start_ns))

    procs: list[subprocess.Popen] = []
    outputs: list[Path] = []
    pumps: list[threading.Thread] = []
    if output_dir is not None:
        output_dir.mkdir(parents=True, exist_ok=True)
    local = [node_local_dir(node_local, job_id, r) for r in range(ranks)] if node_local is not None else []
    for rank in range(ranks):
        env = dict(os.environ, PHAROS_JOB_ID=job_id, PHAROS_RANK=str(rank), PHAROS_NRANKS=str(ranks))
        if local:
            env["PHAROS_NODELOCAL"] = str(local[rank])
        stdout = subprocess.PIPE if output_dir is not None else None
        rank_cg = rank_cgroup(cg, rank)
        p = subprocess.Popen(
            [exe, *command[1:]],
            env=env,
            stdout=stdout,
            preexec_fn=lambda rank_cg=rank_cg: join_cgroup(rank_cg),  # runs in the child before exec
        )
        procs.append(p)
        if output_dir is not None:
            out = output_dir / f"rank_{rank}.out"
            outputs.append(out)
            t = threading.Thread(target=_pump, args=(p.stdout, out), daemon=True)
            t.start()
            pumps.append(t)

    def forward(signum, _frame):
        for p in procs:
            if p.poll() is None:
                p.send_signal(signum)

    old = {s: signal.signal(s, forward) for s in (signal.SIGINT, signal.SIGTERM)}
    codes: dict[int, int] = {}
    first_failure = 0
    try:
        while len(codes) < len(procs):
            for rank, p in enumerate(procs):
                if rank not in codes and p.poll() is not None:
                    codes[rank] = p.returncode
                    if p.returncode != 0 and first_failure == 0:
                        first_failure = p.returncode if p.returncode > 0 else 128 - p.returncode
            time.sleep(0.01)
    finally:
        for s, h in old.items():
            signal.signal(s, h)
    for t in pumps:
        t.join()
    end_ns = time.time_ns()
    events.send(job_event(io_pb2.JobEvent.KIND_END, end_ns, exit_code=first_failure))
    # Leave the cgroup in place for a moment: records flushed at rank exit are still being
    # attributed by the agent through the cgroup's directory.
    threading.Thread(target=_remove_later, args=(cg,), daemon=False).start()
    return JobResult(job_id, first_failure, [codes[r] for r in range(ranks)], start_ns, end_ns, outputs, decision)


def _pump(stream, path: Path) -> None:
    with open(path, "wb") as f:
        shutil.copyfileobj(stream, f)


def _remove_later(cg: Path, delay: float = 2.0) -> None:
    time.sleep(delay)
    remove_cgroup(cg)


def main_exit(result: JobResult) -> None:  # pragma: no cover - thin CLI glue
    sys.exit(result.exit_code)
