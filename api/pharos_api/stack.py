"""The embedded stack: Kafka broker (or ``kafka_brokers`` nodes), eBPF agent, and pipeline +
analytics + API (chDB).

``pharos up`` starts each component as its own long-running process (``pharos broker``,
``pharos agent``, ``pharos fwd --index I`` for each forwarding node, ``pharos mount``,
``pharos serve``) in a new session, with a pid file in
``<state_dir>/run/`` and a log in ``<state_dir>/logs/``, and waits until each is ready.
``pharos down`` stops them (SIGTERM, then SIGKILL after a grace period);
``pharos status`` reports them. Starting is idempotent: a running component is kept, a dead
one (its process gone) is started again, so re-running ``pharos up`` restarts what died; the
foreground ``pharos up`` does so by itself every few seconds (:class:`Supervisor`).

**Process identity.** A pid file holds JSON: the pid, the process's start time (field 22 of
``/proc/<pid>/stat``, clock ticks since boot) and the boot id
(``/proc/sys/kernel/random/boot_id``). Before any signal, and before a pid counts as running,
the process must still be that one (same boot, same start time) and its command line a Pharos
component's (``python -m pharos_api.cli <part>``, or the binary it execs): a stale pid file
(after a reboot or a crash, the pid reused by an unrelated process) is reported and removed,
never signalled (:func:`identify`). Pid files of older versions (a bare pid) are checked by
command line only.
The forwarding layer's site key and admin token (``<state_dir>/fwd.key``, ``fwd-admin.token``,
mode 0600) are made by ``pharos fwd`` / ``pharos mount`` when missing
(:meth:`~pharos_core.settings.Settings.ensure_fwd_secrets`); the control loop in ``pharos
serve`` reads the token.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import httpx
from pydantic import SecretStr

from pharos_core import api_client
from pharos_core.settings import Settings


class StackError(RuntimeError):
    """A component did not start or become ready; the message names it and its log."""


@dataclass(frozen=True)
class Component:
    """One process of the stack; ``ready_file`` (in <state>/run) is removed before a start;
    ``exe`` is the binary the part execs (its command line afterwards), if any; ``producer``
    says it sends batches with heartbeats (agent, forwarding daemons)."""

    name: str
    argv: list[str]
    ready: Callable[[Settings], bool]
    timeout_s: float
    ready_file: str | None = None
    exe: str | None = None
    producer: bool = False


def _pharos(*args: str) -> list[str]:
    return [sys.executable, "-m", "pharos_api.cli", *args]


def broker_ready(settings: Settings) -> bool:
    from confluent_kafka.admin import AdminClient

    try:
        # log_level 0: "connection refused" while the broker boots is expected, not news
        md = AdminClient({"bootstrap.servers": settings.kafka_bootstrap, "log_level": 0}).list_topics(timeout=2)
    except Exception:
        return False
    return all(t in md.topics for t in (settings.topic_requests, settings.topic_jobs, settings.topic_deadletter))


def ready_file(settings: Settings, name: str) -> Path:
    """The file a component writes once it serves (its content: JSON with its addresses)."""
    return settings.state_dir / "run" / f"{name}.ready"


def _file_ready(name: str) -> Callable[[Settings], bool]:
    return lambda settings: ready_file(settings, name).exists()


def api_ready(settings: Settings) -> bool:
    """True when the API answers ``GET /v1/health`` on its TCP port and on its Unix socket (when
    ``api_socket`` is not '')."""
    sock = settings.api_socket_path
    urls = [settings.api_url] + ([api_client.UNIX_PREFIX + str(sock)] if sock is not None else [])
    try:
        return all(api_client.request(u, "GET", "/v1/health", timeout=2).status_code == 200 for u in urls)
    except httpx.HTTPError:
        return False


def components(settings: Settings) -> list[Component]:
    """The stack's processes in start order (reverse for stop)."""
    comps = [
        Component("broker", _pharos("broker"), broker_ready, 60 + 60 * settings.kafka_brokers),
        Component("agent", _pharos("agent"), _file_ready("agent"), 60, "agent", "pharos-agent", producer=True),
    ]
    for i in range(settings.fwd_nodes):
        argv = _pharos("fwd", "--index", str(i))
        comps.append(Component(f"fwd{i}", argv, _file_ready(f"fwd{i}"), 30, f"fwd{i}", "pharos-fwd", producer=True))
    if settings.fwd_nodes:
        comps.append(Component("mount", _pharos("mount"), _file_ready("mount"), 30, "mount", "pharos-mount"))
    comps.append(Component("serve", _pharos("serve"), api_ready, 90))
    return comps


def settings_env(settings: Settings) -> dict[str, str]:
    """The settings as PHAROS_* environment variables, so child processes see the same. Unset
    fields (None) are left out, so the child keeps their default instead of the text "None";
    secrets are passed as their value (model_dump keeps them masked); lists and tables as JSON."""
    out = {}
    for k, v in settings.model_dump().items():
        if v is None:
            continue
        if isinstance(v, SecretStr):
            v = v.get_secret_value()
        elif isinstance(v, list | dict):
            v = json.dumps(v, default=str)
        out[f"PHAROS_{k.upper()}"] = str(v)
    return out


def _run_dir(settings: Settings) -> Path:
    d = settings.state_dir / "run"
    d.mkdir(parents=True, exist_ok=True)
    return d


def _log_path(settings: Settings, name: str) -> Path:
    d = settings.state_dir / "logs"
    d.mkdir(parents=True, exist_ok=True)
    return d / f"{name}.log"


@dataclass(frozen=True)
class PidRecord:
    """What a pid file says: the pid, its process's start time (clock ticks since boot, field 22
    of /proc/<pid>/stat) and the boot id; the last two are None in a bare-pid file."""

    pid: int
    start_ticks: int | None = None
    boot_id: str | None = None


def boot_id() -> str:
    """This boot's id (/proc/sys/kernel/random/boot_id); '' when unreadable."""
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return ""


def proc_stat(pid: int) -> tuple[str, int, int] | None:
    """(state letter, process group, start time in clock ticks since boot) of ``pid`` from
    /proc/<pid>/stat, None when there is no such process. The command name (field 2) may hold
    spaces and parentheses, so the fields are counted after its last ')'."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None
    rest = text[text.rfind(")") + 2 :].split()
    try:  # rest[0] is field 3 (state): pgrp is field 5, starttime field 22
        return rest[0], int(rest[2]), int(rest[19])
    except (IndexError, ValueError):
        return None


def _cmdline(pid: int) -> list[str]:
    try:
        return [a.decode(errors="replace") for a in Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0") if a]
    except OSError:
        return []


def _pid_file(settings: Settings, name: str) -> Path:
    return _run_dir(settings) / f"{name}.pid"


def write_pid_file(settings: Settings, name: str, pid: int) -> None:
    """Record ``pid`` as component ``name``'s process, with its start time and the boot id."""
    st = proc_stat(pid)
    rec = {"pid": pid, "start_ticks": st[2] if st else None, "boot_id": boot_id()}
    _pid_file(settings, name).write_text(json.dumps(rec) + "\n")


def read_pid_file(settings: Settings, name: str) -> PidRecord | None:
    """Component ``name``'s pid file (JSON, or a bare pid of older versions); None when there is
    none or it does not parse."""
    try:
        text = _pid_file(settings, name).read_text().strip()
    except FileNotFoundError:
        return None
    try:
        if text.startswith("{"):
            d = json.loads(text)
            return PidRecord(int(d["pid"]), d.get("start_ticks"), d.get("boot_id"))
        return PidRecord(int(text))
    except (ValueError, KeyError, TypeError):
        return None


def _component(settings: Settings, name: str) -> Component | None:
    return next((c for c in components(settings) if c.name == name), None)


def identify(settings: Settings, name: str, rec: PidRecord) -> str | None:
    """None when ``rec`` is component ``name``'s live process, else why it is not (a sentence):
    no such process, a zombie, a pid file from before a reboot, a pid reused by a process that
    started at another time, or a command line that is not this component's."""
    st = proc_stat(rec.pid)
    if st is None:
        return f"process {rec.pid} is gone"
    if st[0] in ("Z", "X"):
        return f"process {rec.pid} has exited (zombie)"
    if rec.boot_id and rec.boot_id != boot_id():
        return f"pid file of process {rec.pid} is from before a reboot"
    if rec.start_ticks is not None and int(rec.start_ticks) != st[2]:
        return f"pid {rec.pid} now belongs to another process (started at tick {st[2]}, not {rec.start_ticks})"
    argv = _cmdline(rec.pid)
    if not argv and rec.start_ticks is not None:  # between a part's exec and its new command line
        return None
    comp = _component(settings, name)
    if comp is None:  # not a component of these settings (e.g. fwd_nodes lowered): any Pharos part
        ours = "pharos_api.cli" in argv or (bool(argv) and Path(argv[0]).name.startswith("pharos-"))
    else:  # `python -m pharos_api.cli <part args>`, or the binary the part execs
        cli = argv.index("pharos_api.cli") + 1 if "pharos_api.cli" in argv else None
        ours = (cli is not None and argv[cli:] == comp.argv[3:]) or bool(
            comp.exe and argv and Path(argv[0]).name == comp.exe
        )
    if not ours:
        return f"pid {rec.pid} is not Pharos's {name} (command line: {' '.join(argv)[:120] or '-'})"
    return None


def pid_of(settings: Settings, name: str) -> int | None:
    """The pid of a running component, or None. A pid file whose process is gone or is not the
    component's any more (:func:`identify`) is stale: it is removed."""
    rec = read_pid_file(settings, name)
    if rec is not None and identify(settings, name, rec) is None:
        return rec.pid
    _pid_file(settings, name).unlink(missing_ok=True)
    return None


def probe(settings: Settings, name: str) -> tuple[str, int | None, str]:
    """(state, pid, detail) of component ``name``'s process, leaving its pid file alone:
    ``stopped`` (no pid file: never started, or stopped by `pharos down`), ``dead`` (a pid
    file whose process is gone or is another one: it crashed or was killed; the detail says
    which) or ``running``."""
    rec = read_pid_file(settings, name)
    if rec is None:
        return "stopped", None, ""
    why = identify(settings, name, rec)
    return ("dead", rec.pid, why) if why else ("running", rec.pid, "")


def _tail(path: Path, lines: int = 15) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except FileNotFoundError:
        return "(no log)"


def start(settings: Settings, progress: Callable[[str], None] = lambda s: None, only: set[str] | None = None) -> None:
    """Start every component that is not running (of ``only``, when given) and wait until all
    are ready.

    Raises StackError naming the component and showing its log's last lines.
    """
    if settings.state_dir.exists() is False:
        settings.state_dir.mkdir(parents=True)
    for comp in components(settings):
        if only is not None and comp.name not in only:
            continue
        state, _, why = probe(settings, comp.name)
        if pid_of(settings, comp.name) is None:
            progress(f"starting {comp.name}" + (f" (it was dead: {why})" if state == "dead" else ""))
            if comp.ready_file:
                ready_file(settings, comp.ready_file).unlink(missing_ok=True)
            env = dict(os.environ, **settings_env(settings))
            with open(_log_path(settings, comp.name), "ab") as log:  # the child keeps its own copy
                p = subprocess.Popen(
                    comp.argv,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    stdin=subprocess.DEVNULL,
                    start_new_session=True,
                    env=env,
                )
            write_pid_file(settings, comp.name, p.pid)
        deadline = time.monotonic() + comp.timeout_s
        while not comp.ready(settings):
            if pid_of(settings, comp.name) is None or _exited(comp.name, settings):
                raise StackError(
                    f"{comp.name} exited during start; its log "
                    f"({_log_path(settings, comp.name)}) ends with:\n{_tail(_log_path(settings, comp.name))}"
                )
            if time.monotonic() > deadline:
                raise StackError(
                    f"{comp.name} not ready after {comp.timeout_s:.0f} s; log "
                    f"{_log_path(settings, comp.name)}:\n{_tail(_log_path(settings, comp.name))}"
                )
            time.sleep(0.2)
        progress(f"{comp.name} ready")


def _exited(name: str, settings: Settings) -> bool:
    pid = pid_of(settings, name)
    if pid is None:
        return True
    try:  # reap our own child if it died (a zombie still answers kill(pid, 0))
        done, _ = os.waitpid(pid, os.WNOHANG)
        return done == pid
    except ChildProcessError:
        return False


def stop(settings: Settings, grace_s: float = 20.0, progress: Callable[[str], None] = lambda s: None) -> None:
    """Stop the components in reverse order: SIGTERM, then SIGKILL after ``grace_s``."""
    for comp in reversed(components(settings)):
        stop_component(settings, comp.name, grace_s, progress)


def stop_component(
    settings: Settings, name: str, grace_s: float = 20.0, progress: Callable[[str], None] = lambda s: None
) -> None:
    """Stop one component (its whole process group): SIGTERM, SIGKILL after ``grace_s``.

    Only a process that is still the component's (:func:`identify`, checked again before the
    SIGKILL) is signalled; a stale pid file is reported through ``progress`` and removed."""
    rec = read_pid_file(settings, name)
    if rec is None:
        _pid_file(settings, name).unlink(missing_ok=True)
        return
    why = identify(settings, name, rec)
    if why is not None:
        if proc_stat(rec.pid) is not None:  # someone else's process now: say so, leave it alone
            progress(f"{name}: stale pid file, not signalling: {why}")
        _pid_file(settings, name).unlink(missing_ok=True)
        return
    pid = rec.pid
    progress(f"stopping {name} (pid {pid})")
    _signal(pid, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline and not _gone(settings, name, rec):
        time.sleep(0.1)
    if not _gone(settings, name, rec):
        progress(f"{name} did not stop in {grace_s:.0f} s: SIGKILL")
        _signal(pid, signal.SIGKILL)
    _pid_file(settings, name).unlink(missing_ok=True)


def _signal(pid: int, sig: int) -> None:
    """``sig`` to the process group ``pid`` leads (each component runs in its own session), or to
    ``pid`` alone when it does not lead one."""
    st = proc_stat(pid)
    with contextlib.suppress(ProcessLookupError):
        if st is not None and st[1] == pid:
            os.killpg(pid, sig)
        else:
            os.kill(pid, sig)


def _gone(settings: Settings, name: str, rec: PidRecord) -> bool:
    """True when the component's process has ended (reaped if it is our child) or the pid is no
    longer its process."""
    with contextlib.suppress(ChildProcessError):
        done, _ = os.waitpid(rec.pid, os.WNOHANG)
        if done == rec.pid:
            return True
    return identify(settings, name, rec) is not None


class Supervisor:
    """What the foreground `pharos up` runs every few seconds (:meth:`tick`): it starts again the
    components whose process died (:func:`probe` says ``dead``), leaving the running and the
    stopped ones alone (`pharos down` from another terminal is obeyed). A component that does
    not come back is tried again after 5 s, then 10, 20, ... at most 60 s, so a crash loop does
    not spin; its log says why."""

    def __init__(self, settings: Settings, progress: Callable[[str], None] = lambda s: None) -> None:
        self.settings = settings
        self.progress = progress
        self.retry: dict[str, tuple[float, float]] = {}  # name -> (next try, monotonic s; delay s)

    def tick(self) -> list[str]:
        """Restart what died (and what is due for another try); returns the names restarted."""
        now = time.monotonic()
        states = {c.name: probe(self.settings, c.name)[0] for c in components(self.settings)}
        if all(st == "stopped" for st in states.values()):  # `pharos down` ran: nothing to keep up
            self.retry.clear()
            return []
        due = [
            n
            for n, st in states.items()
            if st == "dead" or (st == "stopped" and n in self.retry and self.retry[n][0] <= now)
        ]
        restarted = []
        for name in due:
            try:
                start(self.settings, self.progress, only={name})
            except StackError as exc:
                delay = min(60.0, 2 * self.retry[name][1]) if name in self.retry else 5.0
                self.retry[name] = (time.monotonic() + delay, delay)
                self.progress(f"{name} did not come back (next try in {delay:.0f} s): {exc}")
                continue
            self.retry.pop(name, None)
            restarted.append(name)
        return restarted


def process_age_s(pid: int) -> float | None:
    """Seconds since process ``pid`` started (its start time in /proc against /proc/uptime)."""
    st = proc_stat(pid)
    try:
        uptime = float(Path("/proc/uptime").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None
    return None if st is None else max(0.0, uptime - st[2] / os.sysconf("SC_CLK_TCK"))


def _producer_of(comp: Component, pid: int, producers: list[dict]) -> dict | None:
    """The newest producer row (``GET /v1/producers`` item) of component ``comp``'s process ``pid``:
    an agent's producer id carries its pid, a forwarding daemon's its node name and pid."""
    kind = "agent" if comp.name == "agent" else "fwd"
    rows = [
        p
        for p in producers
        if p.get("kind") == kind and p.get("pid") == pid and (kind == "agent" or p.get("host") == comp.name)
    ]
    return min(rows, key=lambda p: p.get("age_s", 0.0), default=None)


def status(settings: Settings, producers: list[dict] | None = None) -> list[dict]:
    """One dict per component: name, state, pid (or None), ready (bool), detail, heartbeat_age_s,
    log path. ``state``:

    * ``running``: its process is alive (:func:`identify`) and ready; for the agent and the
      forwarding daemons also heartbeating (their newest batch is at most ``settings.silence_s``
      old in ``producers``, the items of ``GET /v1/producers``; not checked when None);
    * ``starting``: alive, not ready or not heard from yet, started less than its start timeout
      (or ``silence_s``) ago;
    * ``stale``: alive but not ready, or a producer silent for more than ``silence_s`` (hung, or
      cut off from Kafka);
    * ``dead``: its pid file names a process that is gone or another one (it crashed or was
      killed): `pharos up` starts it again;
    * ``stopped``: no pid file (not started, or stopped by `pharos down`).
    """
    rows = []
    for c in components(settings):
        state, pid, detail = probe(settings, c.name)
        ready = state == "running" and c.ready(settings)
        beat = None
        if state == "running":
            age = process_age_s(pid) or 0.0
            if not ready:
                state = "starting" if age < c.timeout_s else "stale"
                detail = "not ready yet" if state == "starting" else f"not ready after {age:.0f} s"
            elif c.producer and producers is not None:
                prod = _producer_of(c, pid, producers)
                beat = None if prod is None else float(prod["age_s"])
                if beat is None and age > settings.silence_s + 5:
                    state, detail = "stale", f"no batch or heartbeat of it reached the store in {age:.0f} s"
                elif beat is None:
                    state, detail = "starting", "no heartbeat stored yet"
                elif beat > settings.silence_s:
                    state = "stale"
                    detail = f"no heartbeat for {beat:.0f} s (more than {settings.silence_s:g} s): hung or cut off"
        rows.append(
            {
                "name": c.name,
                "state": state,
                "pid": pid,
                "ready": ready,
                "detail": detail,
                "heartbeat_age_s": beat,
                "log": str(_log_path(settings, c.name)),
            }
        )
    return rows
