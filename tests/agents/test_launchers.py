"""The MPI world size read from a launcher's command line (issue 24: ``pharos run -- mpiexec -n 4``
is a 4-rank job, not 1). Pure parsing; the live check is tests/live/test_mpi_ranks.py."""

from __future__ import annotations

import pytest

from pharos_agents.launchers import launcher_world_size


@pytest.mark.parametrize(
    "command, size",
    [
        (["mpiexec", "-n", "4", "./ior"], 4),
        (["mpiexec.mpich", "-launcher", "fork", "-n", "4", "/x/mpi_write_at", "f", "1", "1"], 4),
        (["/usr/bin/mpirun", "-np", "16", "ior", "-a", "POSIX"], 16),
        (["mpirun.openmpi", "--allow-run-as-root", "--np", "8", "./a.out"], 8),
        (["mpirun", "--mca", "btl", "self", "-x", "LD_PRELOAD", "-n", "2", "./a.out"], 2),
        (["mpiexec", "-genv", "A", "1", "-n=3", "./a"], 3),
        (["mpiexec", "-n", "2", "./a", ":", "-n", "3", "./b"], 5),  # MPMD segments add up
        (["mpiexec", "-n", "4", "./ior", "-n", "9", "-c", "7"], 4),  # the program's own -n is not read
        (["srun", "--mpi=pmi2", "-n", "4", "./ior"], 4),
        (["srun", "-N", "2", "-n8", "./ior"], 8),
        (["srun", "--ntasks=6", "--partition", "debug", "./ior"], 6),
        (["srun", "--ntasks", "5", "./ior", "-n", "2"], 5),
        # no count, or not a launcher: the caller keeps its own rank count
        (["mpiexec", "-f", "hosts", "./ior"], None),
        (["mpiexec", "-n", "many", "./ior"], None),
        (["mpiexec", "-n", "0", "./ior"], None),
        (["mpiexec", "-n", "2", "./a", ":", "./b"], None),
        (["./ior", "-n", "4"], None),
        (["python3", "-m", "mpi4py", "x.py"], None),
        (["mpiexec"], None),
        ([], None),
    ],
)
def test_launcher_world_size(command, size):
    assert launcher_world_size(command) == size
