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


def _batch_header_class():
    """``IoBatchHeader``: IoBatch as the pipeline's dispatcher needs it, built from the
    contract's own descriptor at import (so it cannot drift from io.proto): the same fields
    and numbers, but ``records`` (6) as ``repeated bytes``, which has the same wire encoding
    as an embedded message. Parsing it splits the records without decoding them (about 10x
    less than a full IoBatch parse of 1,000 records), ``len(h.records)`` is the record count;
    the store decodes the records themselves (:mod:`pharos_pipeline.columnar`)."""
    from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

    msg = descriptor_pb2.DescriptorProto()
    io_pb2.IoBatch.DESCRIPTOR.CopyToProto(msg)
    msg.name = "IoBatchHeader"
    (records,) = [f for f in msg.field if f.name == "records"]
    records.type = descriptor_pb2.FieldDescriptorProto.TYPE_BYTES
    records.ClearField("type_name")
    for f in msg.field:  # message types of the contract, by their full name
        if f.type_name and not f.type_name.startswith("."):
            f.type_name = f".{io_pb2.DESCRIPTOR.package}.{f.type_name}"
    file = descriptor_pb2.FileDescriptorProto(
        name="pharos/v1/io_batch_header.proto",
        package=f"{io_pb2.DESCRIPTOR.package}.pipeline",
        syntax="proto3",
        dependency=[io_pb2.DESCRIPTOR.name],
    )
    file.message_type.append(msg)
    pool = descriptor_pool.Default()
    try:
        fd = pool.FindFileByName(file.name)
    except KeyError:
        fd = pool.Add(file) or pool.FindFileByName(file.name)
    return message_factory.GetMessageClass(fd.message_types_by_name["IoBatchHeader"])


IoBatchHeader = _batch_header_class()


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
    "IoBatchHeader",
    "IoRecord",
    "JobEvent",
    "TargetMetrics",
    "TargetMetricsBatch",
    "io_pb2",
]
