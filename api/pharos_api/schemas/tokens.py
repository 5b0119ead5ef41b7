"""API tokens (pharos_api.auth; docs/security.md): what is created, listed, never the secret but once."""

from __future__ import annotations

from datetime import datetime

from pydantic import BaseModel, Field

from ..auth import USER_RE, Role


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
