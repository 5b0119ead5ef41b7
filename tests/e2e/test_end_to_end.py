"""End to end with real components: the Kafka broker, the eBPF agent on this kernel, the
forwarding daemons and the FUSE mount, the pipeline on chDB, the API, and real fio jobs
launched by ``pharos run`` on the mount.

Asserts, per job, exact bytes and operation counts against fio's own JSON output, and the
job's I/O pattern, on the client layer (eBPF) and on the forwarder layer (pharos-fwd's
per-request records). Needs root (eBPF, cgroups, FUSE); without root it is skipped.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from pharos_testkit import assert_one_pattern, stack_settings

from pharos_agents.runner import run_job
from pharos_api import stack
from pharos_api.demo import DEMO_JOBS, fio_command, fio_totals, wait_for_summary
from pharos_core.settings import Settings

pytestmark = [pytest.mark.e2e, pytest.mark.root]

needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="the eBPF agent and job cgroups need root")


@pytest.fixture(scope="module")
def live_stack(tmp_path_factory):
    """A whole embedded stack on its own ports and state dir, stopped afterwards."""
    state = tmp_path_factory.mktemp("stack")
    settings = stack_settings(state, "pharos-test")
    try:
        stack.start(settings)
        yield settings
    finally:
        stack.stop(settings)


@needs_root
@pytest.mark.parametrize("job", DEMO_JOBS, ids=[j.kind for j in DEMO_JOBS])
def test_fio_job_traced_exactly(live_stack: Settings, job, tmp_path: Path):
    settings = live_stack
    job_id = f"e2e-{job.kind.lower().replace('-', '')}-{os.getpid()}"
    data_dir = settings.mount_point / job_id
    data_dir.mkdir()
    job.prepare(data_dir)
    res = run_job(settings, job_id, fio_command(job, data_dir, job.kind), ranks=job.ranks, output_dir=tmp_path / "out")
    assert res.exit_code == 0, f"fio failed: {res.rank_exit_codes}"
    fio = fio_totals(res.outputs)
    assert fio["bytes_written"] > 0

    s = wait_for_summary(settings.api_url, job_id, fio["bytes_written"], timeout_s=90)
    assert s is not None, "the job never reached the API"
    assert s["pattern"] == job.kind
    assert s["bytes_written"] == fio["bytes_written"]
    assert s["bytes_read"] == fio["bytes_read"] == 0
    writes = sum(v for k, v in s["ops"].items() if k in ("write", "pwrite", "writev"))
    assert writes == fio["writes"]
    assert s["ops"].get("pwrite", 0) == fio["writes"], "fio's psync engine issues pwrite"
    assert s["ops"].get("fsync", 0) == job.ranks, "end_fsync=1: one fsync per rank"
    assert s["io_ranks"] == job.ranks
    assert s["ranks"] == job.ranks
    assert s["dropped_records"] == 0
    expected_files = {"N-N": job.ranks, "N-1": 1, "1-1": 1}[job.kind]
    assert s["n_files"] == expected_files
    assert all(f["path"].startswith(str(data_dir)) for f in s["files"])
    # Beacon's online compression: sequential same-size requests arrive merged.
    assert s["data_records"] < s["data_requests"] == fio["writes"]

    # the same job as the forwarding daemons served it
    f = wait_for_summary(settings.api_url, job_id, fio["bytes_written"], timeout_s=60, layer="forwarder")
    assert f is not None, "no forwarder-layer records"
    assert f["bytes_written"] == fio["bytes_written"]
    assert f["pattern"] == job.kind
    assert f["io_ranks"] == job.ranks
    assert f["n_files"] == expected_files
    # one pattern in every view (issue 10): pharos job/jobs/diagnose and the API, both layers
    assert_one_pattern(settings.api_url, [job_id])
    assert_one_pattern(settings.api_url, [job_id], layer="forwarder")
