"""Dependencies of the API routes, as ``Annotated`` aliases.

The store and settings live on ``app.state`` (set by :func:`pharos_api.app.create_app`),
so one process can host the pipeline and the API on the same chDB store.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Request

from pharos_pipeline.settings import Settings
from pharos_pipeline.store import Store


def get_store(request: Request) -> Store:
    """The store the app was created with."""
    return request.app.state.store


def get_app_settings(request: Request) -> Settings:
    """The settings the app was created with."""
    return request.app.state.settings


StoreDep = Annotated[Store, Depends(get_store)]
SettingsDep = Annotated[Settings, Depends(get_app_settings)]
