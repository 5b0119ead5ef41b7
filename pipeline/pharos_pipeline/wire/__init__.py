"""Python binding of the wire contract ``proto/pharos/v1/io.proto``.

The protobuf classes are generated at set-up (``make proto``, run by ``make demo`` and
``make test``) into ``wire/pharos/v1/`` and are not checked in. Enum values are also
exposed as the lower-case names the store uses (``OP_PWRITE`` -> ``"pwrite"``).
"""

from __future__ import annotations

try:
    from .pharos.v1 import io_pb2
except ImportError as exc:  # pragma: no cover - set-up error
    raise ImportError(
        "the wire contract's Python code is not generated: run `make proto` (part of `make test`)"
    ) from exc

IoRecord = io_pb2.IoRecord
IoBatch = io_pb2.IoBatch
DropCounters = io_pb2.DropCounters
JobEvent = io_pb2.JobEvent
TargetMetrics = io_pb2.TargetMetrics
TargetMetricsBatch = io_pb2.TargetMetricsBatch

SCHEMA_VERSION = 1


def _names(enum, prefix: str) -> dict[int, str]:
    return {v.number: ("" if v.number == 0 else v.name[len(prefix) :].lower()) for v in enum.DESCRIPTOR.values}


#: enum number -> store name, e.g. OP_NAMES[io_pb2.OP_PWRITE] == "pwrite"; 0 maps to "".
OP_NAMES = _names(io_pb2.Op, "OP_")
LAYER_NAMES = _names(io_pb2.Layer, "LAYER_")
FILE_TYPE_NAMES = _names(io_pb2.FileType, "FILE_TYPE_")
JOB_EVENT_KIND_NAMES = _names(io_pb2.JobEvent.Kind, "KIND_")

__all__ = [
    "FILE_TYPE_NAMES",
    "JOB_EVENT_KIND_NAMES",
    "LAYER_NAMES",
    "OP_NAMES",
    "SCHEMA_VERSION",
    "DropCounters",
    "IoBatch",
    "IoRecord",
    "JobEvent",
    "TargetMetrics",
    "TargetMetricsBatch",
    "io_pb2",
]
