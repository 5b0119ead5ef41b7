"""System: liveness of the API and its store, and what the pipeline has stored."""

from __future__ import annotations

from datetime import UTC, datetime

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

from pharos_core.store import StoreError
from pharos_pipeline.stored import pipeline_stats

from ..auth import Reader
from ..deps import StoreDep
from ..schemas.common import API_VERSION
from ..schemas.jobs import DropsOut
from ..schemas.system import HealthOut, PipelineOut
from . import V1

router = APIRouter(prefix=V1, tags=["system"])
#: Open without a token (load balancers, `pharos up`'s readiness check).
health_router = APIRouter(prefix=V1, tags=["system"])


@health_router.get(
    "/health",
    operation_id="health",
    response_model=HealthOut,
    responses={503: {"model": HealthOut, "description": "The store does not answer."}},
    summary="API and store liveness",
)
def health(store: StoreDep):
    try:
        store.query("SELECT 1 AS ok")
    except StoreError as exc:
        body = HealthOut(status="degraded", store=str(exc).splitlines()[0], version=API_VERSION)
        return JSONResponse(status_code=503, content=body.model_dump())
    return HealthOut(status="ok", store="ok", version=API_VERSION)


def _utc(value) -> datetime | None:
    """The store's DateTime text (both back ends: :meth:`pharos_core.store.Store.query`) as an aware
    UTC datetime."""
    if value in (None, ""):
        return None
    dt = datetime.fromisoformat(str(value))
    return dt.replace(tzinfo=UTC) if dt.tzinfo is None else dt


@router.get("/pipeline", operation_id="pipeline_stats", response_model=PipelineOut, summary="Pipeline counts")
def pipeline(store: StoreDep, request: Request, _: Reader) -> PipelineOut:
    """Counts over every producer and job (no job ids): open to every reading role."""
    s = pipeline_stats(store)
    loss = s["ringbuf_drops"] + s["delivery_failures"] + s["overflow_drops"]
    live = getattr(request.app.state, "pipeline", None)
    return PipelineOut(
        records=s["records"],
        bytes=s["bytes"],
        batches=s["batches"],
        producers=s["producers"],
        gaps=s["missing_batches"],
        dead_letters=s["dead_letters"],
        jobs=s["jobs"],
        dropped_records=loss,
        drops=DropsOut(
            total=loss,
            ringbuf_drops=s["ringbuf_drops"],
            delivery_failures=s["delivery_failures"],
            overflow_drops=s["overflow_drops"],
            unmerged_fallbacks=s["unmerged_fallbacks"],
            producers=s["producers"],
        ),
        last_ingested=_utc(s["last_ingested"]),
        live=live.stats() if live is not None else None,
    )
