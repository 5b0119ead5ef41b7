"""Dependencies of the API routes, as ``Annotated`` aliases, and the checks routes share.

The store and settings live on ``app.state`` (set by :func:`pharos_api.app.create_app`),
so one process can host the pipeline and the API on the same chDB store.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, HTTPException, Request

from pharos_analytics.summary import job_known
from pharos_core.settings import Settings
from pharos_core.store import Store

from .auth import Principal, check_job


def get_store(request: Request) -> Store:
    """The store the app was created with."""
    return request.app.state.store


def get_app_settings(request: Request) -> Settings:
    """The settings the app was created with."""
    return request.app.state.settings


StoreDep = Annotated[Store, Depends(get_store)]
SettingsDep = Annotated[Settings, Depends(get_app_settings)]


def require_found(found: bool, detail: str) -> None:
    """Raise HTTPException 404 with ``detail`` unless ``found``."""
    if not found:
        raise HTTPException(status_code=404, detail=detail)


def require_job(store: Store, job_id: str, principal: Principal) -> None:
    """Raise HTTPException 404 unless the job has an event, a record or a Darshan counter and,
    for a ``user`` token, is theirs (:func:`~pharos_api.auth.check_job`)."""
    check_job(principal, store, job_id)
    require_found(job_known(store, job_id), f"job {job_id!r} not found: no event, record or Darshan counter")
