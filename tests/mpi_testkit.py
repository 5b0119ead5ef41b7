"""MPI programs for tests, built with MPICH's ``mpicc`` at test time (Makefile APT_PACKAGES:
``mpich libmpich-dev``): the MPI-IO N-1 writer tests/data/mpi_write_at.c."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
from pharos_testkit import REPO

MPICC = "mpicc.mpich"
MPIEXEC = "mpiexec.mpich"
WRITER_SOURCE = REPO / "tests" / "data" / "mpi_write_at.c"


def build_mpi_writer(d: Path) -> Path:
    """Compile the MPI-IO writer into ``d``; its path. Fails (never skips) without MPICH."""
    for tool in (MPICC, MPIEXEC):
        if shutil.which(tool) is None:
            pytest.fail(f"{tool} not found: apt-get install mpich libmpich-dev (Makefile APT_PACKAGES)")
    exe = d / "mpi_write_at"
    r = subprocess.run(
        [MPICC, "-O2", "-Wall", "-o", str(exe), str(WRITER_SOURCE)], capture_output=True, text=True, timeout=120
    )
    assert r.returncode == 0, f"mpicc failed:\n{r.stdout}\n{r.stderr}"
    return exe
