"""The placement document has one schema, shared by the daemons (Rust, serde) and the control
loop (Python): ``proto/placement/placement.schema.json``. The Rust side is checked against it in
forwarder/fwd/src/backend/placement/tests.rs; here the Python side: the pydantic form of the
document has exactly the schema's properties, and the documents the control loop pushes validate."""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema_rs
import pytest
from pydantic import ValidationError

from pharos_analytics.control.config import ControlConfig
from pharos_analytics.control.placement import PlacementDoc, PoolDoc, TargetLoad, plan_placement

SCHEMA_PATH = Path(__file__).resolve().parents[2] / "proto" / "placement" / "placement.schema.json"
SCHEMA = json.loads(SCHEMA_PATH.read_text())
VALIDATOR = jsonschema_rs.validator_for(SCHEMA)
TARGETS = [f"ost{i}" for i in range(4)]
S = 1_000_000_000


def measured() -> dict[str, TargetLoad]:
    return {t: TargetLoad(t, 30, 30, mb * 1e6, mb * 1.1e6) for t, mb in zip(TARGETS, (50, 30, 20, 10), strict=True)}


def test_models_have_exactly_the_schema_properties():
    assert set(PlacementDoc.model_fields) == set(SCHEMA["properties"])
    assert set(PoolDoc.model_fields) == set(SCHEMA["$defs"]["pool"]["properties"])
    assert [n for n, f in PoolDoc.model_fields.items() if f.is_required()] == SCHEMA["$defs"]["pool"]["required"]
    assert not [n for n, f in PlacementDoc.model_fields.items() if f.is_required()]


def test_a_full_document_dumps_to_exactly_the_schema_properties_and_validates():
    pool = PoolDoc(targets=["ost0", "ost1"], max_perf={"ost0": 50.0}, stripe_count=1, component_size=2 << 20)
    doc = PlacementDoc(
        pools={"p": pool}, default_pool="p", job_pools={"42": "p"}, stripe_size=1 << 20, stripe_count=2
    ).model_dump()
    assert set(doc) == set(SCHEMA["properties"])
    assert set(doc["pools"]["p"]) == set(SCHEMA["$defs"]["pool"]["properties"])
    VALIDATOR.validate(doc)
    VALIDATOR.validate(PlacementDoc().model_dump())  # the daemons' document before any PUT


@pytest.mark.parametrize("component_size", [2 << 20, 0])
def test_documents_of_the_control_loop_validate(component_size):
    cfg = ControlConfig(placement_component_size=component_size)
    current = PlacementDoc(pools={"other": PoolDoc(targets=["ost3"])}, job_pools={"7": "other"}).model_dump()
    for cur in ({}, current):
        plan = plan_placement(cur, TARGETS, measured(), {"ost1"}, {"ost1": 900 * S}, 1000 * S, cfg)
        assert plan.changed
        VALIDATOR.validate(plan.doc)
        assert PlacementDoc.model_validate(plan.doc).pools[cfg.placement_pool].targets == ["ost0", "ost2", "ost3"]


def test_misspelled_fields_are_refused_on_both_sides():
    for bad in ({"defualt_pool": "p"}, {"pools": {"p": {"targets": ["ost0"], "max_pref": {}}}}):
        assert not VALIDATOR.is_valid(bad)
        with pytest.raises(ValidationError):
            PlacementDoc.model_validate(bad)
    for bad in ({"pools": {"p": {"targets": []}}}, {"pools": {"p": {"targets": ["a"], "component_size": 1000}}}):
        assert not VALIDATOR.is_valid(bad)
        with pytest.raises(ValidationError):
            PlacementDoc.model_validate(bad)
