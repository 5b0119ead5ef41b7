"""Helpers of the deployment tests (tests/deploy): docker-compose.yml as Debian's docker-compose
(1.29) renders it, the Dockerfile's stages. No Docker engine runs here: the files are validated by the real
tools (docker-compose, promtool, amtool, hadolint, Kafka, Alertmanager), not run as containers."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
COMPOSE_FILE = REPO / "docker-compose.yml"
DOCKERFILE = REPO / "Dockerfile"
if str(REPO / "dashboards") not in sys.path:  # the dashboards' generator (its plugin version)
    sys.path.insert(0, str(REPO / "dashboards"))

#: The variables docker-compose.yml requires (``${VAR:?...}``), with test values.
REQUIRED_ENV = {
    "CLICKHOUSE_PASSWORD": "0123abcd",
    "GRAFANA_CLICKHOUSE_PASSWORD": "4567ef01",
    "GRAFANA_ADMIN_PASSWORD": "89abcdef",
    "KAFKA_EXTERNAL_HOST": "pharos-head.example.org",
}


def docker_compose() -> str:
    exe = shutil.which("docker-compose")
    if exe is None:
        pytest.skip("docker-compose missing: apt-get install docker-compose (make setup)")
    return exe


def compose_env(**overrides: str | None) -> dict[str, str]:
    """The environment for docker-compose: this process's without any variable the compose file
    reads (so a developer's own settings do not leak in), plus REQUIRED_ENV and ``overrides``
    (None removes a variable)."""
    text = COMPOSE_FILE.read_text()
    used = set(re.findall(r"\$\{([A-Z_][A-Z0-9_]*)", text))
    env = {k: v for k, v in os.environ.items() if k not in used and k != "COMPOSE_PROJECT_NAME"}
    env.update(REQUIRED_ENV)
    for k, v in overrides.items():
        if v is None:
            env.pop(k, None)
        else:
            env[k] = v
    return env


def run_compose(*args: str, **env_overrides: str | None) -> subprocess.CompletedProcess:
    """``docker-compose -f docker-compose.yml ARGS`` in the repository, with an empty env file
    instead of the repository's .env (a developer's own, git-ignored)."""
    with tempfile.NamedTemporaryFile("w", suffix=".env") as empty:
        return subprocess.run(
            [docker_compose(), "-f", str(COMPOSE_FILE), "--env-file", empty.name, *args],
            cwd=REPO,
            env=compose_env(**env_overrides),
            capture_output=True,
            text=True,
            timeout=120,
        )


def render_compose(**env_overrides: str | None) -> dict:
    """The compose file as ``docker-compose config`` resolves it (variables, anchors, paths)."""
    res = run_compose("config", **env_overrides)
    assert res.returncode == 0, f"docker-compose config refused the file:\n{res.stderr}"
    return yaml.safe_load(res.stdout)


def dockerfile_stages(path: Path = DOCKERFILE) -> dict[str, list[tuple[str, str]]]:
    """Stage name -> its instructions as (INSTRUCTION, arguments), continuation lines joined and
    comments dropped. An unnamed stage is called by its index."""
    lines: list[str] = []
    buf = ""
    for raw in path.read_text().splitlines():
        if not buf and (not raw.strip() or raw.lstrip().startswith("#")):
            continue
        if raw.rstrip().endswith("\\"):
            buf += raw.rstrip()[:-1] + " "
            continue
        lines.append(buf + raw)
        buf = ""
    stages: dict[str, list[tuple[str, str]]] = {}
    current: list[tuple[str, str]] | None = None
    for line in lines:
        instr, _, args = line.strip().partition(" ")
        instr = instr.upper()
        if instr == "FROM":
            m = re.match(r"(\S+)(?:\s+AS\s+(\S+))?", args.strip(), re.IGNORECASE)
            assert m, line
            current = stages.setdefault(m.group(2) or str(len(stages)), [])
        if current is not None:
            current.append((instr, args.strip()))
    return stages
