"""``GET /metrics``: the Prometheus exposition of ``pharos serve`` (self-monitoring,
docs/dashboards.md).

It serves the process-wide families of :mod:`pharos_core.telemetry` (store inserts, the
detection and control loops' cycles, API latency, build, process) and the counters of the
pipeline this process runs (``app.state.pipeline``). With ``api_auth = "token"`` it needs an
``operator`` or ``admin`` token, like every read of the system views: Prometheus sends it with
``authorization: {credentials_file: ...}`` (deploy/prometheus/prometheus.yml). Unlike
``/v1/health`` it is not open: the metrics name the topics and the routes."""

from __future__ import annotations

from fastapi import APIRouter, Request, Response

from pharos_core.telemetry import exposition

from ..auth import Staff

#: Outside the versioned API (the Prometheus convention): the one router without the ``/v1`` prefix.
router = APIRouter(prefix="", tags=["system"])


@router.get(
    "/metrics",
    operation_id="metrics",
    response_class=Response,
    responses={200: {"content": {"text/plain": {"schema": {"type": "string"}}}, "description": "Prometheus text"}},
    summary="Prometheus metrics of this server",
)
def metrics(request: Request, _: Staff) -> Response:
    """Prometheus text format 0.0.4: pipeline counters and consumer lag, store insert latency,
    loop cycle times, API request latency by route template, build and process metrics."""
    body, content_type = exposition(request.app.state.metrics_registry)
    return Response(content=body, media_type=content_type)
