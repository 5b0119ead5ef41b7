"""The embedded stack: Kafka broker, eBPF agent, and pipeline + analytics + API (chDB).

``pharos up`` starts each component as its own long-running process (``pharos broker``,
``pharos agent``, ``pharos fwd --index I`` for each forwarding node, ``pharos mount``,
``pharos serve``) in a new session, with a pid file in
``<state_dir>/run/`` and a log in ``<state_dir>/logs/``, and waits until each is ready.
``pharos down`` stops them (SIGTERM, then SIGKILL after a grace period);
``pharos status`` reports them. Starting is idempotent: a running component is kept.
The forwarding layer's site key and admin token (``<state_dir>/fwd.key``, ``fwd-admin.token``,
mode 0600) are made by ``pharos fwd`` / ``pharos mount`` when missing
(:meth:`~pharos_pipeline.settings.Settings.ensure_fwd_secrets`); the control loop in ``pharos
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

from pharos_pipeline.settings import Settings


class StackError(RuntimeError):
    """A component did not start or become ready; the message names it and its log."""


@dataclass(frozen=True)
class Component:
    """One process of the stack; ``ready_file`` (in <state>/run) is removed before a start."""

    name: str
    argv: list[str]
    ready: Callable[[Settings], bool]
    timeout_s: float
    ready_file: str | None = None


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
    try:
        return httpx.get(f"{settings.api_url}/v1/health", timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


def components(settings: Settings) -> list[Component]:
    """The stack's processes in start order (reverse for stop)."""
    comps = [
        Component("broker", _pharos("broker"), broker_ready, 120),
        Component("agent", _pharos("agent"), _file_ready("agent"), 60, "agent"),
    ]
    for i in range(settings.fwd_nodes):
        comps.append(Component(f"fwd{i}", _pharos("fwd", "--index", str(i)), _file_ready(f"fwd{i}"), 30, f"fwd{i}"))
    if settings.fwd_nodes:
        comps.append(Component("mount", _pharos("mount"), _file_ready("mount"), 30, "mount"))
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


def pid_of(settings: Settings, name: str) -> int | None:
    """The pid of a running component, or None (stale pid files are removed)."""
    f = _run_dir(settings) / f"{name}.pid"
    try:
        pid = int(f.read_text().strip())
        os.kill(pid, 0)
        return pid
    except (FileNotFoundError, ValueError, ProcessLookupError):
        f.unlink(missing_ok=True)
        return None


def _tail(path: Path, lines: int = 15) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except FileNotFoundError:
        return "(no log)"


def start(settings: Settings, progress: Callable[[str], None] = lambda s: None) -> None:
    """Start every component that is not running and wait until all are ready.

    Raises StackError naming the component and showing its log's last lines.
    """
    if settings.state_dir.exists() is False:
        settings.state_dir.mkdir(parents=True)
    for comp in components(settings):
        if pid_of(settings, comp.name) is None:
            progress(f"starting {comp.name}")
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
            (_run_dir(settings) / f"{comp.name}.pid").write_text(str(p.pid))
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
    """Stop one component (its whole process group): SIGTERM, SIGKILL after ``grace_s``."""
    pid = pid_of(settings, name)
    if pid is None:
        return
    progress(f"stopping {name} (pid {pid})")
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pid, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline and not _gone(pid):
        time.sleep(0.1)
    if not _gone(pid):
        progress(f"{name} did not stop in {grace_s:.0f} s: SIGKILL")
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pid, signal.SIGKILL)
    (_run_dir(settings) / f"{name}.pid").unlink(missing_ok=True)


def _gone(pid: int) -> bool:
    try:
        done, _ = os.waitpid(pid, os.WNOHANG)
        if done == pid:
            return True
    except ChildProcessError:
        pass
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    # a zombie whose parent is not us still answers; check /proc
    try:
        return Path(f"/proc/{pid}/stat").read_text().split()[2] == "Z"
    except (FileNotFoundError, IndexError):
        return True


def status(settings: Settings) -> list[dict]:
    """One dict per component: name, pid (or None), ready (bool), log path."""
    return [
        {
            "name": c.name,
            "pid": pid_of(settings, c.name),
            "ready": c.ready(settings),
            "log": str(_log_path(settings, c.name)),
        }
        for c in components(settings)
    ]
