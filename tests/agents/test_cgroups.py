"""cgroup v2 detection and job-id validation (pure logic), and `pharos run` argument errors."""

from pathlib import Path

import pytest
from typer.testing import CliRunner

from pharos_agents.cgroups import CgroupError, cgroup2_mount, validate_job_id
from pharos_api.cli import app

HYBRID = """tmpfs /sys/fs/cgroup tmpfs rw,relatime,mode=755 0 0
cgroup /sys/fs/cgroup/memory cgroup rw,relatime,memory 0 0
cgroup2 /sys/fs/cgroup/unified cgroup2 rw,relatime 0 0
"""
UNIFIED = "cgroup2 /sys/fs/cgroup cgroup2 rw,nosuid,nodev,noexec,relatime,nsdelegate 0 0\n"
V1_ONLY = "cgroup /sys/fs/cgroup/memory cgroup rw,relatime,memory 0 0\n"


@pytest.mark.parametrize("text,expected", [(HYBRID, "/sys/fs/cgroup/unified"), (UNIFIED, "/sys/fs/cgroup")])
def test_cgroup2_mount_found(tmp_path: Path, text, expected):
    f = tmp_path / "mounts"
    f.write_text(text)
    assert cgroup2_mount(f) == Path(expected)


def test_no_cgroup2_is_a_clear_error(tmp_path: Path):
    f = tmp_path / "mounts"
    f.write_text(V1_ONLY)
    with pytest.raises(CgroupError, match="no cgroup2 mount"):
        cgroup2_mount(f)


@pytest.mark.parametrize("job_id", ["42", "job.1-a_b", "A" * 64])
def test_valid_job_ids(job_id):
    assert validate_job_id(job_id) == job_id


@pytest.mark.parametrize("job_id", ["", "../etc", "a/b", "-x", ".x", "A" * 65, "a b", "7.scope"])
def test_invalid_job_ids(job_id):
    with pytest.raises(ValueError, match="invalid job id"):
        validate_job_id(job_id)


def test_pharos_run_rejects_bad_job_id():
    res = CliRunner().invoke(app, ["run", "--job", "../x", "--", "true"])
    assert res.exit_code == 2
    assert "invalid job id" in res.output


def test_pharos_run_rejects_missing_command():
    res = CliRunner().invoke(app, ["run", "--job", "x1"])
    assert res.exit_code == 2
    assert "no command given" in res.output
