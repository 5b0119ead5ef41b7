"""Parsing a Darshan log in a child process with CPU-time and memory limits, so that one hostile
or huge log cannot hold a server worker (issue 26, item 8).

PyDarshan (libdarshan-util, C) parses the whole log in memory; a crafted or very large log can
spin or allocate without bound, and a C parser cannot be interrupted from Python. So
:func:`read_log_bounded` hands the already-checked file descriptor (see
:func:`pharos_pipeline.darshan_log.open_regular`) to a child process forked from a
``multiprocessing`` *forkserver* (started once per process, PyDarshan preloaded: a parse costs a
fork, not an interpreter start), which sets its own limits before reading a byte:

* CPU time: ``setitimer(ITIMER_PROF, cpu_s)`` (SIGPROF ends the child at ``cpu_s`` of CPU, to the
  millisecond) and ``RLIMIT_CPU`` one second later as a backstop (SIGXCPU/SIGKILL);
* memory: ``RLIMIT_DATA`` (the heap and every private writable mapping, what numpy and pandas
  allocate) and ``RLIMIT_AS`` at four times that (address space, for a parser that maps rather
  than allocates);
* wall time: the parent kills the child after ``wall_s``.

The result comes back as JSON (never pickle: the child parsed hostile bytes, the parent must not
run anything it sends), and the parent rebuilds the :class:`DarshanLog`. Every failure is a
:class:`DarshanImportError` that names the limit: the import records a ``failed`` result and the
server worker moves on.
"""

from __future__ import annotations

import json
import math
import multiprocessing
import os
import resource
import signal
import threading
from dataclasses import asdict, dataclass
from multiprocessing import reduction
from pathlib import Path

from .darshan_log import DarshanImportError, DarshanLog, read_log

#: Default CPU seconds one log's parse may use (``Settings.import_parse_cpu_s``).
PARSE_CPU_S = 120.0
#: Default bytes of memory one log's parse may allocate (``Settings.import_parse_memory_bytes``).
PARSE_MEMORY_BYTES = 4 * 2**30

_LOCK = threading.Lock()
_CTX: multiprocessing.context.ForkServerContext | None = None


@dataclass(frozen=True)
class ParseLimits:
    """Limits of one parse: ``cpu_s`` CPU seconds, ``memory_bytes`` bytes of data memory,
    ``wall_s`` elapsed seconds (default: ``2 * cpu_s + 10``)."""

    cpu_s: float = PARSE_CPU_S
    memory_bytes: int = PARSE_MEMORY_BYTES
    wall_s: float | None = None

    @property
    def wall(self) -> float:
        return self.wall_s if self.wall_s is not None else 2 * self.cpu_s + 10


def _context() -> multiprocessing.context.ForkServerContext:
    global _CTX
    with _LOCK:
        if _CTX is None:
            ctx = multiprocessing.get_context("forkserver")
            ctx.set_forkserver_preload(["__main__", "pharos_pipeline.darshan_parse", "darshan"])
            _CTX = ctx
        return _CTX


def _mib(n: int) -> str:
    return f"{n / 2**20:g} MiB"


def _child(conn, label: str, cpu_s: float, memory_bytes: int) -> None:
    """In the forked child: receive the log's descriptor, limit ourselves, parse, send JSON."""
    fd = reduction.recv_handle(conn)
    hard_cpu = math.ceil(cpu_s) + 1
    resource.setrlimit(resource.RLIMIT_CPU, (hard_cpu, hard_cpu + 1))
    resource.setrlimit(resource.RLIMIT_DATA, (memory_bytes, memory_bytes))
    resource.setrlimit(resource.RLIMIT_AS, (4 * memory_bytes, 4 * memory_bytes))
    signal.signal(signal.SIGPROF, signal.SIG_DFL)
    signal.setitimer(signal.ITIMER_PROF, cpu_s)
    try:
        log = read_log(Path(f"/proc/self/fd/{fd}"), label)
        out = {"log": asdict(log)}
    except MemoryError:
        out = {"memory": True}
    except DarshanImportError as exc:
        # libdarshan-util reports a failed malloc as a failed open or decompression
        near_limit = _data_bytes() >= 0.75 * memory_bytes
        out = {"memory": True} if "MemoryError" in str(exc) or near_limit else {"error": str(exc)}
    try:
        conn.send_bytes(json.dumps(out).encode())
    except MemoryError:
        conn.send_bytes(b'{"memory": true}')
    finally:
        os.close(fd)


def _data_bytes() -> int:
    """This process's data memory (VmData, bytes), what RLIMIT_DATA limits; 0 if unknown."""
    try:
        with open("/proc/self/status") as f:
            return next((int(line.split()[1]) * 1024 for line in f if line.startswith("VmData:")), 0)
    except OSError:
        return 0


def _rebuild(d: dict) -> DarshanLog:
    d["names"] = {int(k): v for k, v in d["names"].items()}
    d["counters"] = [tuple(c) for c in d["counters"]]
    d["segments"] = [tuple(s) for s in d["segments"]]
    return DarshanLog(**d)


def read_log_bounded(fd: int, label: str, limits: ParseLimits | None = None) -> DarshanLog:
    """Parse the Darshan log open on ``fd`` (a regular file, read from its start) in a child
    process within ``limits`` (default :class:`ParseLimits()`). Returns the
    :class:`DarshanLog`; raises :class:`DarshanImportError` for an unreadable log and for a
    parse over its CPU-time, memory or wall-time limit (the message names the limit), or one that
    crashed."""
    limits = limits or ParseLimits()
    ctx = _context()
    parent, child = ctx.Pipe()
    proc = ctx.Process(
        target=_child, args=(child, label, limits.cpu_s, limits.memory_bytes), name="pharos-darshan-parse"
    )
    proc.start()
    child.close()
    data, timed_out = None, False
    try:
        reduction.send_handle(parent, fd, proc.pid)
        if parent.poll(limits.wall):
            data = parent.recv_bytes()
        else:
            timed_out = True
    except (EOFError, OSError):
        data = None
    finally:
        if proc.is_alive() and data is None:
            proc.kill()
        proc.join(timeout=10)
        parent.close()
    if timed_out:
        raise DarshanImportError(f"{label}: parsing took longer than {limits.wall:g} s (the import's wall-time limit)")
    if data is None:
        code = proc.exitcode
        if code in (-signal.SIGPROF, -signal.SIGXCPU, -signal.SIGKILL):
            raise DarshanImportError(f"{label}: parsing used more than {limits.cpu_s:g} s of CPU (the import limit)")
        if code in (-signal.SIGSEGV, -signal.SIGBUS, -signal.SIGABRT):
            raise DarshanImportError(
                f"{label}: the Darshan parser crashed (signal {-code}; memory limit {_mib(limits.memory_bytes)})"
            )
        raise DarshanImportError(f"{label}: the Darshan parser exited without a result (exit code {code})")
    out = json.loads(data)
    if out.get("memory"):
        raise DarshanImportError(
            f"{label}: parsing needed more than {_mib(limits.memory_bytes)} of memory (the import limit)"
        )
    if "error" in out:
        raise DarshanImportError(out["error"])
    return _rebuild(out["log"])
