"""API tokens over HTTP (admin only): what ``pharos token create|list|revoke`` calls when the API
runs (:mod:`pharos_api.auth`; docs/security.md).

* ``POST /v1/tokens`` ``{role, user, description}`` -> ``201`` with the token, shown this once.
* ``GET /v1/tokens``: the tokens (id, role, user, description, created, revoked), never a secret.
* ``DELETE /v1/tokens/{token_id}``: revoke (``204``; ``404`` when no such unrevoked token).
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Annotated, Any

from fastapi import APIRouter, HTTPException, Path, Query, Request
from pydantic import BaseModel, Field

from ..auth import USER_RE, Admin, Role, TokenError, create_token, list_tokens, revoke_token, token_cache
from ..deps import StoreDep
from ..schemas import ErrorOut

router = APIRouter(prefix="/v1/tokens", tags=["tokens"])


class TokenIn(BaseModel):
    role: Role = Field(description="admin | operator | user | scheduler (docs/security.md).")
    user: str = Field(
        "", max_length=64, pattern=USER_RE.pattern + "|^$", description="The user a 'user' token sees the jobs of."
    )
    description: str = Field("", max_length=200)


class TokenOut(BaseModel):
    token_id: str
    role: Role
    user: str
    description: str
    created: datetime
    revoked: bool = False


class NewTokenOut(TokenOut):
    token: str = Field(description="The secret token (pht_<id>_<secret>): shown once, stored only hashed.")


class TokensOut(BaseModel):
    items: list[TokenOut]


def _out(t: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in t.items() if k != "created_ns"} | {
        "created": datetime.fromtimestamp(t["created_ns"] / 1e9, UTC)
    }


@router.post(
    "",
    operation_id="create_token",
    status_code=201,
    response_model=NewTokenOut,
    responses={400: {"model": ErrorOut}},
    summary="Create an API token (the secret is in this response only)",
)
def post_token(body: TokenIn, store: StoreDep, _: Admin) -> dict[str, Any]:
    try:
        return _out(create_token(store, body.role, body.user, body.description))
    except TokenError as exc:
        raise HTTPException(400, str(exc)) from None


@router.get("", operation_id="list_tokens", response_model=TokensOut, summary="API tokens (never their secrets)")
def get_tokens(
    store: StoreDep,
    _: Admin,
    revoked: Annotated[bool, Query(description="Also list revoked tokens.")] = False,
) -> dict[str, Any]:
    return {"items": [_out(t) for t in list_tokens(store, include_revoked=revoked)]}


@router.delete(
    "/{token_id}",
    operation_id="revoke_token",
    status_code=204,
    responses={404: {"model": ErrorOut}},
    summary="Revoke an API token",
)
def delete_token(
    token_id: Annotated[str, Path(pattern=r"^[0-9a-f]{12}$", description="The token's id (12 hex digits).")],
    request: Request,
    store: StoreDep,
    _: Admin,
) -> None:
    if not revoke_token(store, token_id):
        raise HTTPException(404, f"no active token {token_id}")
    token_cache(request).forget()
