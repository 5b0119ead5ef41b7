"""The MPI world size of a command that starts an MPI launcher (``mpiexec -n 4 ./ior``).

``pharos run -- mpiexec -n 4 prog`` starts ONE process (the launcher) in the job's ``rank_0``
cgroup, and the launcher starts the 4 MPI processes, whose ranks come from the launcher's own
variables (``PMI_RANK``...). The job's ranks are then the launcher's world size, not the one
copy ``pharos run`` started: :func:`launcher_world_size` reads it from the launcher's command
line, so the job's start event (and with it the job list, the report and DFRA's class at
dispatch) says 4 ranks before the first I/O.

Launchers known (the executable's base name, any ``.suffix`` such as ``mpiexec.mpich`` or
``mpirun.openmpi`` allowed): MPICH's Hydra and Open MPI's ``mpiexec``/``mpirun``/``orterun``/
``prterun`` (``-n N``, ``-np N``, ``--np N``, ``-c N``, ``--n=N``; MPMD segments separated by
``:`` add up), and Slurm's ``srun`` (``-n N``, ``-nN``, ``--ntasks N``, ``--ntasks=N``). The
launcher's options are read up to the program it starts: an option known to take a value skips
that value, any other token not starting with ``-`` is the program, so a program's own ``-n``
is never read. A launcher started without a count (a host file's slots, an allocation's
default) gives ``None``: the caller keeps its own rank count.
"""

from __future__ import annotations

from pathlib import Path

#: Base names (before any ``.suffix``) of the MPI launchers whose world size is read.
MPI_LAUNCHERS: frozenset[str] = frozenset({"mpiexec", "mpirun", "orterun", "prterun", "srun"})

#: Options that give the number of processes, per launcher family.
_COUNT_OPTIONS = {
    "mpi": frozenset({"-n", "-np", "--np", "--n", "-c"}),
    "srun": frozenset({"-n", "--ntasks"}),
}

#: Options of Hydra (MPICH) and Open MPI that take one value (a separate token unless ``=``).
_MPI_VALUE_OPTIONS = frozenset(
    {
        "-f", "-hostfile", "-machinefile", "--hostfile", "--machinefile", "-hosts", "-host", "-H", "--host",
        "-launcher", "-launcher-exec", "-bootstrap", "-bootstrap-exec", "-rmk", "-ppn", "-npernode",
        "--npernode", "-N", "-wdir", "--wdir", "-dir", "-configfile", "-genvlist", "-envlist", "-bind-to",
        "--bind-to", "-binding", "-map-by", "--map-by", "-rank-by", "--rank-by", "-iface", "-x", "--prefix",
        "-prefix", "--output-filename", "-output-filename", "-outfile-pattern", "-errfile-pattern",
        "-prepend-pattern", "-timeout", "--timeout", "-topolib", "-demux", "-profile", "--personality",
        "-s", "--stdin",
    }
)  # fmt: skip
#: Options that take two values (a name and a value).
_MPI_PAIR_OPTIONS = frozenset({"-genv", "-env", "--mca", "-mca", "--gmca", "-gmca"})

#: srun's short options that take a value (``-N 2`` or ``-N2``) and long ones that may take it as
#: the next token (``--nodes 2``; ``--nodes=2`` is one token).
_SRUN_SHORT_VALUE = frozenset("ANcpt JwoeiDmdCqxGBSW".replace(" ", ""))
_SRUN_LONG_VALUE = frozenset(
    {
        "--nodes", "--ntasks", "--cpus-per-task", "--partition", "--time", "--job-name", "--account",
        "--nodelist", "--output", "--error", "--input", "--chdir", "--distribution", "--mpi", "--mem",
        "--mem-per-cpu", "--export", "--gres", "--constraint", "--qos", "--ntasks-per-node", "--exclude",
        "--dependency", "--reservation", "--cpu-bind", "--mem-bind", "--jobid", "--label-format",
    }
)  # fmt: skip


def _family(exe: str) -> str | None:
    base = Path(exe).name.split(".", 1)[0]
    if base not in MPI_LAUNCHERS:
        return None
    return "srun" if base == "srun" else "mpi"


def _count(value: str) -> int | None:
    return int(value) if value.isdigit() and int(value) > 0 else None


def _takes_value(tok: str, family: str) -> bool:
    """The option ``tok`` (no ``=value`` attached) takes the next token as its value."""
    if family == "srun":
        return tok in _SRUN_LONG_VALUE or (len(tok) == 2 and tok[1] in _SRUN_SHORT_VALUE)
    return tok in _MPI_VALUE_OPTIONS


def _segment_size(args: list[str], family: str) -> tuple[int | None, int]:
    """(count given in this MPMD segment or None, index after the segment's options)."""
    counts = _COUNT_OPTIONS[family]
    size: int | None = None
    i = 0
    while i < len(args):
        tok = args[i]
        if not tok.startswith("-") or tok == "-":
            return size, i  # the program
        name, eq, value = tok.partition("=")
        if name in counts:
            if eq:
                size = _count(value)
            elif i + 1 < len(args):
                size = _count(args[i + 1])
                i += 1
        elif family == "srun" and len(tok) > 2 and tok[0] == "-" and tok[1] != "-":
            # short option with its value attached: -n4, -N2
            if tok[1] == "n":
                size = _count(tok[2:])
        elif not eq and _takes_value(tok, family):
            i += 1
        elif family == "mpi" and tok in _MPI_PAIR_OPTIONS:
            i += 2
        i += 1
    return size, i


def launcher_world_size(command: list[str]) -> int | None:
    """The number of processes an MPI launcher command starts, or None.

    Args:
        command: the job's command line, e.g. ``["mpiexec", "-n", "4", "./ior", "-n", "9"]``.

    Returns:
        The launcher's process count (4 above; MPMD ``mpiexec -n 2 a : -n 3 b`` gives 5), or
        ``None`` when ``command[0]`` is not a known launcher (:data:`MPI_LAUNCHERS`) or no
        segment gives a count.
    """
    if not command:
        return None
    family = _family(command[0])
    if family is None:
        return None
    total = 0
    rest = command[1:]
    while True:
        size, end = _segment_size(rest, family)
        if size is None:
            return None
        total += size
        if family == "srun" or ":" not in rest[end:]:
            return total
        rest = rest[rest.index(":", end) + 1 :]
