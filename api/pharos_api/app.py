"""The Pharos admin API (FastAPI).

:func:`create_app` builds the app on an open store; the embedded stack (``pharos up``)
serves it with uvicorn in the process that owns the chDB store. OpenAPI at ``/docs``
and ``/openapi.json``.
"""

from __future__ import annotations

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from pharos_pipeline.settings import Settings
from pharos_pipeline.store import Store, StoreError

from .routers import control, diagnosis, jobs, report, system, system_diag
from .schemas import API_VERSION


def create_app(store: Store, settings: Settings) -> FastAPI:
    """A FastAPI app serving ``store``. The caller owns the store (opens and closes it).

    Errors: a StoreError inside a request becomes ``503 {"detail": "store error: ..."}``;
    invalid parameters ``422``; unknown jobs ``404``.
    """
    app = FastAPI(
        title="Pharos API",
        version=API_VERSION,
        description="End-to-end I/O monitoring for HPC storage: jobs, their I/O patterns, the pipeline.",
    )
    app.state.store = store
    app.state.settings = settings
    app.include_router(system.router)
    app.include_router(jobs.router)
    app.include_router(diagnosis.router)
    app.include_router(system_diag.router)
    app.include_router(control.router)
    app.include_router(report.router)

    @app.exception_handler(StoreError)
    async def _store_error(_: Request, exc: StoreError) -> JSONResponse:
        return JSONResponse(status_code=503, content={"detail": f"store error: {str(exc).splitlines()[0]}"})

    return app
