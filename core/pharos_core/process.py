"""Set-up shared by Pharos's long-running processes: ``pharos serve`` (API, pipeline and loops in
one process) and the standalone pipeline (``python -m pharos_pipeline.ingest``, the scale-out
processes)."""

from __future__ import annotations

import gc


def freeze_startup_objects() -> int:
    """Move every object alive now into the garbage collector's permanent generation
    (:func:`gc.freeze`, after one full collection), so that the full collections of a running
    process traverse only the objects made since.

    Call once the process is set up (modules imported, store opened, pipeline and loops made):
    those objects live as long as the process, yet every full collection walked them all. A
    pipeline's polls make and drop ~18,000 message headers each (a 64 MiB poll of the realistic
    mix), so full collections come every few polls; with the API, the analytics and their
    libraries imported a process holds ~239,000 objects (a full collection ~40-80 ms here), the
    pipeline alone ~38,000. Returns the number of objects frozen (:func:`gc.get_freeze_count`).
    A frozen object is still freed when its last reference goes, but a reference cycle among
    frozen objects is never collected: call it after set-up, not in a loop. Measured
    (docs/operations.md): gc 0.12-0.25 -> 0.04-0.10 s a 2 M-record ingest round.
    """
    gc.collect()
    gc.freeze()
    return gc.get_freeze_count()
