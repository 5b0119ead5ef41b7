"""``pharos token create|list|revoke``: API tokens (docs/security.md).

Like ``pharos import darshan``, these work with or without the stack: when an API answers
(``--api URL``, ``PHAROS_API_URL``, else on the API host without a token its Unix socket,
else ``Settings.api_url``: :func:`pharos_api.cli_jobs._api_url`) they go through it
(``/v1/tokens``: role admin, which root (or the server's own user) has on the Unix socket, so
root on the API host mints the first admin token while the stack runs); otherwise they open
the store themselves (the chDB directory is free when ``pharos serve`` is not running). With a
ClickHouse server (``PHAROS_CLICKHOUSE_URL``) they always open the store directly (whoever
holds its credentials manages the tokens). ``--direct`` forces the store.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Annotated, Any

import httpx
import typer
from rich import box
from rich.console import Console
from rich.table import Table

from pharos_core import api_client

from .cli_jobs import ApiError, ApiOption, _api_url, _fail, api_request

DirectOption = Annotated[bool, typer.Option("--direct", help="Open the store directly, never the API.")]


def api_answers(url: str) -> bool:
    """True when ``GET url/v1/health`` answers (any status): the API holds the store. ``url``:
    ``http://host:port`` or ``unix:<socket>``."""
    try:
        api_client.request(url, "GET", "/v1/health", timeout=2)
    except httpx.TransportError:
        return False
    return True


def use_api(url: str, direct: bool) -> bool:
    """Whether a store command goes through the API at ``url`` (see the module docstring)."""
    from pharos_core.settings import get_settings

    return not direct and not get_settings().clickhouse_url and api_answers(url)


def with_store(fn: Callable[[Any], Any]) -> Any:
    """``fn(store)`` on the store opened (and migrated) by this process; ApiError when it is held."""
    from pharos_core.settings import get_settings
    from pharos_core.store import StoreError, migrate, open_store

    settings = get_settings()
    try:
        store = open_store(settings)
    except Exception:  # chDB refuses a directory another process holds
        raise ApiError(
            f"cannot open the store at {settings.chdb_path}: another process holds it (pharos serve?); go "
            "through its API: as root on its host through its Unix socket (api_socket), else --api URL with an "
            "admin token"
        ) from None
    try:
        migrate(store)
        return fn(store)
    except StoreError as exc:
        raise ApiError(f"store error: {str(exc).splitlines()[0]}") from None
    finally:
        store.close()


def _created(t: dict) -> str:
    if "created_ns" in t:
        return datetime.fromtimestamp(t["created_ns"] / 1e9, UTC).strftime("%Y-%m-%d %H:%M:%S")
    return str(t.get("created", "-")).replace("T", " ")[:19]


def register(app: typer.Typer) -> None:
    """Add ``token create|list|revoke`` to ``app``."""
    tok = typer.Typer(help="API tokens: create (shown once), list, revoke.", no_args_is_help=True)
    app.add_typer(tok, name="token")

    @tok.command("create")
    def create_cmd(
        role: Annotated[str, typer.Option("--role", help="admin | operator | user | scheduler.")],
        user: Annotated[str, typer.Option("--user", help="The user (a 'user' token sees this user's jobs).")] = "",
        description: Annotated[str, typer.Option("--description", help="What the token is for.")] = "",
        api: ApiOption = None,
        direct: DirectOption = False,
        as_json: Annotated[bool, typer.Option("--json", help="Print the token and its record as JSON.")] = False,
    ) -> None:
        """Create a token and print it once (only its salted SHA-256 is stored)."""
        from .auth import TokenError, create_token

        url = _api_url(api)
        body = {"role": role, "user": user, "description": description}
        try:
            if use_api(url, direct):
                t = api_request(url, "POST", "/v1/tokens", json=body).json()
            else:
                t = with_store(lambda store: create_token(store, role, user, description))
        except (ApiError, TokenError) as exc:
            _fail(str(exc))
        if as_json:
            typer.echo(json.dumps(t, indent=2, default=str))
            return
        typer.echo(t["token"])
        typer.echo(
            f"token {t['token_id']}: role {t['role']}" + (f", user {t['user']}" if t["user"] else "") + "; "
            "shown once: keep it in a file only its owner reads (api_token_file) or PHAROS_API_TOKEN",
            err=True,
        )

    @tok.command("list")
    def list_cmd(
        api: ApiOption = None,
        direct: DirectOption = False,
        revoked: Annotated[bool, typer.Option("--revoked", help="Also list revoked tokens.")] = False,
        as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
    ) -> None:
        """List tokens (id, role, user, created), never their secrets."""
        from .auth import list_tokens

        url = _api_url(api)
        try:
            if use_api(url, direct):
                items = api_request(url, "GET", "/v1/tokens", params={"revoked": revoked}).json()["items"]
            else:
                items = with_store(lambda store: list_tokens(store, include_revoked=revoked))
        except ApiError as exc:
            _fail(str(exc))
        if as_json:
            typer.echo(json.dumps({"items": items}, indent=2, default=str))
            return
        t = Table("id", "role", "user", "created (UTC)", "revoked", "description", box=box.SIMPLE_HEAD, pad_edge=False)
        for x in items:
            t.add_row(
                x["token_id"], x["role"], x["user"] or "-", _created(x), "yes" if x["revoked"] else "", x["description"]
            )
        Console().print(t)

    @tok.command("revoke")
    def revoke_cmd(
        token_id: Annotated[str, typer.Argument(help="The token's id (12 hex digits, from `pharos token list`).")],
        api: ApiOption = None,
        direct: DirectOption = False,
    ) -> None:
        """Revoke a token: requests with it get 401 from then on (within 5 s in other API processes)."""
        from .auth import revoke_token

        url = _api_url(api)
        try:
            if use_api(url, direct):
                api_request(url, "DELETE", f"/v1/tokens/{token_id}")
            elif not with_store(lambda store: revoke_token(store, token_id)):
                raise ApiError(f"no active token {token_id}")
        except ApiError as exc:
            _fail(str(exc))
        typer.echo(f"token {token_id} revoked")
