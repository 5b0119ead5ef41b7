"""GET /v1/jobs/{id}/phases|insights, POST /v1/import/darshan, and the CLI commands
(`pharos diagnose`, `pharos import darshan`, run as real subprocesses)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from pharos_testkit import DARSHAN_LOGS as LOGS
from pharos_testkit import need_darshan

from pharos_api.app import create_app
from pharos_api.routers import diagnosis
from pharos_core.settings import Settings

IMB = LOGS / "imbalanced_io/imbalanced-io.darshan"
H5 = LOGS / "hdf5_diagonal_write_only/hdf5_diagonal_write_1_byte_dxt.darshan"
CLI = "import sys, typer; from pharos_api.cli_diagnose import register; app = typer.Typer(); register(app); app()"


@pytest.fixture(scope="module")
def app(store, tmp_path_factory):
    need_darshan(IMB)
    a = create_app(store, Settings(state_dir=tmp_path_factory.getbasetemp(), api_auth="none"))
    if not any(getattr(r, "path", "") == "/v1/jobs/{job_id}/insights" for r in a.routes):
        a.include_router(diagnosis.router)
    return a


def cli(*args, env=None, timeout=300):
    e = {**os.environ, **(env or {})}
    return subprocess.run([sys.executable, "-c", CLI, *args], capture_output=True, text=True, env=e, timeout=timeout)


def test_import_through_api_then_diagnose(client, api_url):
    r = cli("import", "darshan", str(IMB), "--json", "--api", api_url)
    assert r.returncode == 0, r.stderr
    res = json.loads(r.stdout)
    assert [x["status"] for x in res] == ["imported"] and res[0]["job_id"] == "1452113755"
    again = cli("import", "darshan", str(IMB), "--api", api_url)
    assert again.returncode == 0 and "skipped" in again.stdout and "0 imported, 1 skipped" in again.stdout

    body = client.get("/v1/jobs/1452113755/insights").json()
    assert {"rank_imbalance_bytes", "single_target_shared_file"} <= {i["id"] for i in body["insights"]}
    assert body["phases"]["source"] == "counters"
    ph = client.get("/v1/jobs/1452113755/phases").json()
    assert ph["job"]["io_ranks"] == 496 and ph["phases"] == []

    d = cli("diagnose", "1452113755", "--api", api_url, env={"COLUMNS": "200"})
    assert d.returncode == 0, d.stderr
    assert "ONE storage target" in d.stdout and "HIGH" in d.stdout and "lfs setstripe" in d.stdout
    dj = cli("diagnose", "1452113755", "--api", api_url, "--json")
    assert json.loads(dj.stdout)["job_id"] == "1452113755"


def test_unknown_job_is_404(client, api_url):
    assert client.get("/v1/jobs/nope/insights").status_code == 404
    assert client.get("/v1/jobs/nope/phases").status_code == 404
    r = cli("diagnose", "nope", "--api", api_url)
    assert r.returncode == 1 and "404" in r.stderr


def test_import_direct_without_the_stack(tmp_path):
    need_darshan(H5)
    need_darshan(IMB)
    dead = "http://127.0.0.1:9"  # nothing listens: the CLI opens the store itself
    env = {"PHAROS_STATE_DIR": str(tmp_path / "state")}
    r = cli("import", "darshan", str(H5), str(IMB), "--api", dead, "--json", env=env)
    assert r.returncode == 0, r.stderr
    assert [x["status"] for x in json.loads(r.stdout)] == ["imported", "imported"]
    r2 = cli("import", "darshan", str(H5), "--api", dead, env=env)
    assert r2.returncode == 0 and "0 imported, 1 skipped" in r2.stdout
    bad = tmp_path / "bad.darshan"
    bad.write_text("nope")
    r3 = cli("import", "darshan", str(bad), "--api", dead, env=env)
    assert r3.returncode == 1 and "failed" in r3.stdout
    # The store holds the two logs exactly once.
    check = (
        "from pathlib import Path; from pharos_core.settings import Settings; "
        "from pharos_core.store import open_store; "
        f"s = open_store(Settings(state_dir=Path({str(tmp_path / 'state')!r}))); "
        "print(s.query('SELECT count() AS n FROM darshan_logs FINAL')[0]['n'], "
        "s.query('SELECT count() AS n FROM io_requests')[0]['n']); s.close()"
    )
    out = subprocess.run([sys.executable, "-c", check], capture_output=True, text=True, timeout=120)
    assert out.stdout.split() == ["2", "440"], out.stderr
