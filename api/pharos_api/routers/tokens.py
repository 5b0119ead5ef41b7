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

from ..auth import Admin, TokenError, create_token, list_tokens, revoke_token, token_cache
from ..deps import StoreDep, require_found
from ..schemas.common import NOT_FOUND, ErrorOut
from ..schemas.tokens import NewTokenOut, TokenIn, TokensOut
from . import V1

router = APIRouter(prefix=V1, tags=["tokens"])


def _out(t: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in t.items() if k != "created_ns"} | {
        "created": datetime.fromtimestamp(t["created_ns"] / 1e9, UTC)
    }


@router.post(
    "/tokens",
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


@router.get("/tokens", operation_id="list_tokens", response_model=TokensOut, summary="API tokens (never their secrets)")
def get_tokens(
    store: StoreDep,
    _: Admin,
    revoked: Annotated[bool, Query(description="Also list revoked tokens.")] = False,
) -> dict[str, Any]:
    return {"items": [_out(t) for t in list_tokens(store, include_revoked=revoked)]}


@router.delete(
    "/tokens/{token_id}",
    operation_id="revoke_token",
    status_code=204,
    responses=NOT_FOUND,
    summary="Revoke an API token",
)
def delete_token(
    token_id: Annotated[str, Path(pattern=r"^[0-9a-f]{12}$", description="The token's id (12 hex digits).")],
    request: Request,
    store: StoreDep,
    _: Admin,
) -> None:
    require_found(revoke_token(store, token_id), f"no active token {token_id}")
    token_cache(request).forget()
