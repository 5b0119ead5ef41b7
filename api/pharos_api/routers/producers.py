"""Producers: which eBPF agents and forwarding daemons are alive, from their batches (heartbeats)."""

from __future__ import annotations

import time
from typing import Annotated

from fastapi import APIRouter, Query

from pharos_analytics.coverage import producers
from pharos_analytics.summary_sql import ns_to_datetime

from ..auth import Reader
from ..deps import SettingsDep, StoreDep
from ..schemas.common import MAX_WINDOW_S
from ..schemas.system import ProducerOut, ProducersOut
from . import V1

router = APIRouter(prefix=V1, tags=["system"])


@router.get("/producers", operation_id="list_producers", response_model=ProducersOut, summary="Producers' liveness")
def get_producers(
    store: StoreDep,
    settings: SettingsDep,
    _: Reader,
    since_s: Annotated[
        float, Query(gt=0, le=MAX_WINDOW_S, description="Producers whose newest batch is at most this old (s).")
    ] = 3600.0,
) -> ProducersOut:
    """Every producer heard in the last ``since_s`` seconds: host, kind, pid, last batch, heartbeats;
    ``silent`` when no batch of it came for more than ``silence_s`` (heartbeat_missed x
    heartbeat_interval_s): it died, hung or cannot reach Kafka. `pharos status` reads it."""
    now = time.time_ns()
    items = producers(store, since_s=since_s, silence_s=settings.silence_s, now_ns=now)
    return ProducersOut(
        items=[ProducerOut.model_validate(p) for p in items],
        silence_s=settings.silence_s,
        since_s=since_s,
        now=ns_to_datetime(now),
    )
