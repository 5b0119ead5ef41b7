"""The Python side of the wire contract's test vectors (proto/vectors): each .binpb decodes
to the message its .json describes, and the pipeline accepts it."""

from __future__ import annotations

from pathlib import Path

import pytest
from google.protobuf import json_format

from pharos_core.settings import REPO_ROOT
from pharos_pipeline.messages import decode_batch, decode_job_event, decode_target_metrics
from pharos_pipeline.wire import IoBatch, JobEvent, TargetMetricsBatch

VECTORS = REPO_ROOT / "proto" / "vectors"
KINDS = {
    "batch_": (IoBatch, decode_batch),
    "job_": (JobEvent, decode_job_event),
    "metrics_": (TargetMetricsBatch, decode_target_metrics),
}


def _vectors() -> list[Path]:
    return sorted(VECTORS.glob("*.binpb"))


def _kind(path: Path):
    for prefix, kind in KINDS.items():
        if path.name.startswith(prefix):
            return kind
    raise AssertionError(f"{path.name}: no message type for this vector name (add it to KINDS)")


def test_vectors_exist():
    names = {p.stem for p in _vectors()}
    assert {"batch_basic", "batch_empty", "job_start", "job_end", "metrics_basic"} <= names
    for p in _vectors():
        assert p.with_suffix(".json").exists(), f"{p.name} has no .json"


@pytest.mark.parametrize("path", _vectors(), ids=lambda p: p.stem)
def test_vector_decodes_to_its_json(path: Path):
    cls, decode = _kind(path)
    raw = path.read_bytes()
    got = cls()
    got.ParseFromString(raw)
    want = json_format.Parse(path.with_suffix(".json").read_text(), cls())
    assert got == want
    assert json_format.MessageToDict(got) == json_format.MessageToDict(want)
    assert decode(raw) == want  # the pipeline's validation accepts every contract vector


def test_basic_batch_fields():
    """A few values spelled out, so a vector and its JSON cannot drift together unnoticed."""
    b = IoBatch()
    b.ParseFromString((VECTORS / "batch_basic.binpb").read_bytes())
    assert b.schema_version == 1 and b.seq == 17 and len(b.records) == 3
    r = b.records[0]
    assert (r.start_ns, r.count, r.result, r.offset, r.path) == (
        1_763_700_000_123_456_789,
        256,
        4096,
        1 << 32,
        "/scratch/run/out.3",
    )
    assert b.records[1].result == -2 and b.records[2].target == "ost3"
