from __future__ import annotations

import json

import httpx
import pytest
import typer
from typer.testing import CliRunner

from pharos_api.cli_jobs import register


@pytest.fixture(scope="module")
def cli():
    app = typer.Typer()
    register(app)
    return app


runner = CliRunner()


def test_jobs_table(cli, api_url):
    r = runner.invoke(cli, ["jobs", "--api", api_url], env={"COLUMNS": "160"})
    assert r.exit_code == 0, r.output
    for word in ("mix", "ior", "finished", "1-1", "n1", "running", "N-1", "failed", "4.0 MiB"):
        assert word in r.output


def test_jobs_json_and_env_url(cli, api_url):
    r = runner.invoke(cli, ["jobs", "--json", "--limit", "2"], env={"PHAROS_API_URL": api_url})
    assert r.exit_code == 0, r.output
    assert json.loads(r.output) == httpx.get(f"{api_url}/v1/jobs", params={"limit": 2}).json()


def test_job_report(cli, api_url):
    r = runner.invoke(cli, ["job", "mix", "--api", api_url], env={"COLUMNS": "160"})
    assert r.exit_code == 0, r.output
    for word in (
        "mix",
        "pattern 1-1",  # volume dominance: reads (1-1) carry 50.04% of the bytes
        "all files together N-N",
        "finished",
        "/scratch/a.0",
        "pwrite",
        "1M-4M",
        "█",
        "dropped records 11",
        "block_write",
    ):
        assert word in r.output, word


def test_job_json_is_the_api_json(cli, api_url):
    r = runner.invoke(cli, ["job", "mix", "--json", "--api", api_url])
    assert r.exit_code == 0, r.output
    assert json.loads(r.output) == httpx.get(f"{api_url}/v1/jobs/mix").json()
    assert r.output.rstrip("\n") == httpx.get(f"{api_url}/v1/jobs/mix").text


def test_unknown_job(cli, api_url):
    r = runner.invoke(cli, ["job", "nope", "--api", api_url])
    assert r.exit_code == 1
    assert "404" in r.output and "nope" in r.output


def test_api_not_reachable(cli, dead_url):
    url = dead_url
    for args in (["jobs", "--api", url], ["job", "mix", "--api", url]):
        r = runner.invoke(cli, args)
        assert r.exit_code == 1
        lines = r.output.strip().splitlines()
        assert lines == [f"Pharos API not reachable at {url}: start it with `pharos up`"]
