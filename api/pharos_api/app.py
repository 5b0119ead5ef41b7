"""The Pharos admin API (FastAPI).

:func:`create_app` builds the app on an open store; the embedded stack (``pharos up``)
serves it with uvicorn in the process that owns the chDB store. OpenAPI at ``/docs``
and ``/openapi.json``.
"""

from __future__ import annotations

from fastapi import Depends, FastAPI, Request
from fastapi.responses import JSONResponse

from pharos_core.settings import Settings
from pharos_core.store import Store, StoreError
from pharos_core.telemetry import service_registry

from .auth import get_principal
from .routers import control, diagnosis, jobs, metrics, producers, report, system, system_diag, tokens
from .schemas.common import API_VERSION, ErrorOut
from .telemetry import RequestMetrics

#: Answers every authenticated route may give (documented in the OpenAPI schema).
AUTH_RESPONSES: dict[int | str, dict] = {
    400: {"model": ErrorOut, "description": "A request body that is not valid JSON, or refused by the route."},
    401: {"model": ErrorOut, "description": "No token, or an unknown or revoked one (api_auth = 'token')."},
    403: {"model": ErrorOut, "description": "The token's role lacks the right."},
    503: {"model": ErrorOut, "description": "The store failed."},
}


class ExposureError(RuntimeError):
    """The settings would serve the API beyond loopback without authentication."""


def create_app(store: Store, settings: Settings) -> FastAPI:
    """A FastAPI app serving ``store``. The caller owns the store (opens and closes it).

    Authentication (:mod:`pharos_api.auth`, docs/security.md): with ``settings.api_auth ==
    "token"`` every route but ``GET /v1/health`` needs a Bearer token (every router is included
    with :func:`~pharos_api.auth.get_principal`, so a new route cannot be left open), and each
    route admits the roles it names.

    ``GET /metrics`` (operator or admin) is the Prometheus exposition of this process
    (:mod:`pharos_api.routers.metrics`); every request's latency is measured
    (:class:`~pharos_api.telemetry.RequestMetrics`).

    Errors: a StoreError inside a request becomes ``503 {"detail": "store error: ..."}``;
    invalid parameters ``422``; unknown jobs ``404``; no or a bad token ``401``; a role lacking
    the right ``403``. Raises ExposureError when ``settings.api_host`` is not loopback and
    ``api_auth`` is ``"none"``.
    """
    problem = settings.exposure_error()
    if problem:
        raise ExposureError(problem)
    app = FastAPI(
        title="Pharos API",
        version=API_VERSION,
        description="End-to-end I/O monitoring for HPC storage: jobs, their I/O patterns, the pipeline.",
    )
    app.state.store = store
    app.state.settings = settings
    # GET /metrics: the process-wide families and the pipeline `pharos serve` sets on app.state
    app.state.metrics_registry = service_registry(lambda: getattr(app.state, "pipeline", None))
    app.add_middleware(RequestMetrics)
    app.include_router(system.health_router)  # the one open route
    authenticated = [Depends(get_principal)]
    for r in (system, producers, jobs, diagnosis, system_diag, control, report, tokens, metrics):
        app.include_router(r.router, dependencies=authenticated, responses=AUTH_RESPONSES)

    @app.exception_handler(StoreError)
    async def _store_error(_: Request, exc: StoreError) -> JSONResponse:
        return JSONResponse(status_code=503, content={"detail": f"store error: {str(exc).splitlines()[0]}"})

    return app
