"""What every router shares: the API version, path and query bounds, the error body.

Units: bytes in bytes, times ISO 8601 UTC, durations in seconds, rates in MiB/s (2**20 B/s).
"""

from __future__ import annotations

import dataclasses
from typing import Annotated, Any, get_type_hints

from fastapi import Path
from pydantic import BaseModel, ConfigDict, Field, create_model
from pydantic.fields import FieldInfo

#: Version of the API's JSON shapes (OpenAPI ``info.version``, /v1/health).
API_VERSION = "1.0.0"

#: A job id in a URL path: 1 to 256 characters (422 otherwise).
JobIdPath = Annotated[str, Path(min_length=1, max_length=256, description="Job id (1-256 characters).")]
#: Longest string a query parameter naming a job, node, user or name may have.
NAME_MAX = 256
#: Most seconds any look-back window may span (100 years: "everything"; in ns it still fits an Int64).
MAX_WINDOW_S = 100 * 365 * 86400.0


class OutModel(BaseModel):
    """A response model that also reads the analytics' dataclasses (``from_attributes``)."""

    model_config = ConfigDict(from_attributes=True)


def model_of(dc: type, name: str, **described: FieldInfo) -> type[OutModel]:
    """A response model ``name`` with the fields of the dataclass ``dc`` (its order, types and
    defaults), so that the API line and the analytics line are defined once; ``described``
    replaces a field's default with a ``Field`` (the same default, plus its description).
    Raises TypeError when ``dc`` is not a dataclass."""
    hints = get_type_hints(dc)
    fields: dict[str, Any] = {}
    for f in dataclasses.fields(dc):
        if f.name in described:
            default: Any = described[f.name]
        elif f.default_factory is not dataclasses.MISSING:
            default = Field(default_factory=f.default_factory)
        elif f.default is not dataclasses.MISSING:
            default = f.default
        else:
            default = ...
        fields[f.name] = (hints[f.name], default)
    return create_model(name, __base__=OutModel, **fields)


class ErrorOut(BaseModel):
    detail: str


#: The ``responses`` entry of a route that answers 404 with an error body.
NOT_FOUND = {404: {"model": ErrorOut}}
