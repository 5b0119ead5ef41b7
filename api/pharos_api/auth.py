"""API tokens and roles (docs/security.md), in the conventions of FastAPI's security utilities.

Who a request acts for (:func:`get_principal`), by the listener it came through:

* **The Unix socket** (``api_socket``, :mod:`pharos_api.unix_socket`): the caller's uid as the
  kernel gives it (``SO_PEERCRED``, read when the connection is made and put in the ASGI
  scope's ``state`` under :data:`PEER_STATE`; nothing the client sends can set it):
  :func:`peer_principal`: uid 0 and the server's own uid are ``admin``, any other uid is a
  ``user`` named by its login (``pwd``; the uid as text when it has none). A Bearer token sent
  on the socket is verified and wins (a scheduler token keeps its smaller role).
* **The TCP port** with ``api_auth = "token"`` (the default): every endpoint but
  ``GET /v1/health`` needs ``Authorization: Bearer <token>`` (:data:`bearer_scheme`, an
  ``HTTPBearer`` security scheme in the OpenAPI document). With ``api_auth = "none"``
  (development on loopback) every TCP request acts as ``admin``.

A missing, unknown or revoked token is ``401`` (with ``WWW-Authenticate: Bearer``), a role
lacking the right ``403``, and a ``user`` asking for another user's job ``404`` (the job's
existence is not revealed).

Roles:

* ``admin``: everything: control actions and pins, Darshan imports, job events, tokens,
  live detection runs.
* ``operator``: reads everything (jobs, system views, control audit and pins); changes nothing.
* ``user``: their own jobs only (a job is theirs when its start event in ``job_events`` names
  the token's user); system views (targets, forwarders, anomalies, profiles, I/O classes,
  pipeline counts) without other users' job ids and names.
* ``scheduler``: what a Slurm plugin needs: ``POST /v1/jobs/{id}/events``,
  ``POST /v1/hints/jobs/{id}`` (claim), ``GET /v1/hints/jobs/{id}``, ``GET /v1/hints``,
  ``GET /v1/hints/classes``; nothing else.

Tokens: ``pht_<token_id>_<secret>``, ``token_id`` 12 hex digits, ``secret`` 32 random bytes
(43 URL-safe base64 characters). The store (table ``api_tokens``, migration 008) keeps the
role, user, a 16-byte salt and ``sha256(salt || secret)``, never the token: a token is shown
once, by :func:`create_token`. Verified tokens are cached for :data:`CACHE_TTL_S` seconds per
process, so a token revoked through another process stops working within that time (at once
when revoked through this API).
"""

from __future__ import annotations

import hashlib
import hmac
import os
import pwd
import re
import secrets
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache
from typing import Annotated, Any, Literal, get_args

from fastapi import Depends, HTTPException, Request, Security
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from pharos_core.store import Store, ns_to_datetime64

Role = Literal["admin", "operator", "user", "scheduler"]
ROLES: tuple[str, ...] = get_args(Role)
TOKEN_PREFIX = "pht_"
#: Seconds a verified (or unknown) token is remembered per process.
CACHE_TTL_S = 5.0
#: A user name a token may carry (POSIX-ish login names, also numeric uids of Darshan imports).
USER_RE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.@-]{0,63}$")
_TOKEN_RE = re.compile(r"^pht_([0-9a-f]{12})_([A-Za-z0-9_-]{43})$")

bearer_scheme = HTTPBearer(
    auto_error=False,
    scheme_name="PharosToken",
    description="An API token from `pharos token create` (docs/security.md). Needed when api_auth = 'token'.",
)

TOKENS_SELECT = """
SELECT token_id, role, user, description, salt, token_hash,
       toUnixTimestamp64Nano(created) AS created_ns, revoked
FROM api_tokens FINAL
"""
OWNS_JOB_SQL = (
    "SELECT count() AS n FROM job_events WHERE job_id = {job_id:String} AND kind = 'start' AND user = {user:String}"
)
USER_JOBS_SQL = "SELECT DISTINCT job_id FROM job_events WHERE kind = 'start' AND user = {user:String}"


class TokenError(ValueError):
    """A token request that cannot be honoured (unknown role, bad user name)."""


@dataclass(frozen=True)
class Principal:
    """Who a request acts for: ``role``, ``user`` (a ``user`` token's name, else the token's
    user as given at creation; a socket peer's login name), ``token_id`` (None without a token)
    and ``uid`` (a socket peer's uid, else None)."""

    role: Role
    user: str = ""
    token_id: str | None = None
    uid: int | None = None

    @property
    def sees_all(self) -> bool:
        """False for a ``user`` token: it sees its own jobs only."""
        return self.role != "user"


#: The principal of every TCP request when ``api_auth = "none"``.
OPEN = Principal(role="admin", user="", token_id=None)

#: The key of the socket peer's :class:`Peer` in the ASGI scope's ``state`` (set per connection
#: by :mod:`pharos_api.unix_socket`, never from the request).
PEER_STATE = "pharos_peer"


@dataclass(frozen=True)
class Peer:
    """The process at the other end of a Unix socket connection, from ``SO_PEERCRED`` (the
    kernel's record of it at ``connect()``): ``pid``, ``uid``, ``gid``."""

    pid: int
    uid: int
    gid: int


@lru_cache(maxsize=4096)
def login_name(uid: int) -> str:
    """The login name of ``uid`` (the passwd database, through NSS: remembered per process, since
    a site's may be LDAP), else the uid as text (as Darshan imports name their owner)."""
    try:
        name = pwd.getpwuid(uid).pw_name
    except KeyError:
        return str(uid)
    return name if USER_RE.match(name) else str(uid)


def peer_principal(peer: Peer) -> Principal:
    """The principal of a socket peer: ``admin`` for uid 0 and for the server's own uid (who
    owns the store anyway), else ``user`` named :func:`login_name` (its own jobs only)."""
    role: Role = "admin" if peer.uid in (0, os.geteuid()) else "user"
    return Principal(role=role, user=login_name(peer.uid), uid=peer.uid)


def _digest(salt_hex: str, secret: str) -> str:
    return hashlib.sha256(bytes.fromhex(salt_hex) + secret.encode()).hexdigest()


def create_token(store: Store, role: str, user: str, description: str = "") -> dict[str, Any]:
    """Make a token and store its hash. Returns ``{token_id, token, role, user, description,
    created_ns}``: ``token`` is shown this once. Raises TokenError for an unknown role, a
    ``user`` role without a valid user name, or a description over 200 characters."""
    if role not in ROLES:
        raise TokenError(f"unknown role {role!r}: one of {', '.join(ROLES)}")
    if user and not USER_RE.match(user):
        raise TokenError(f"user {user!r} is not a valid user name (letters, digits, _ . @ -; at most 64)")
    if role == "user" and not user:
        raise TokenError("a 'user' token needs --user NAME: the user whose jobs it sees")
    if len(description) > 200:
        raise TokenError("description longer than 200 characters")
    token_id, secret, salt = secrets.token_hex(6), secrets.token_urlsafe(32), secrets.token_hex(16)
    now = time.time_ns()
    row = {
        "token_id": token_id,
        "role": role,
        "user": user,
        "description": description,
        "salt": salt,
        "token_hash": _digest(salt, secret),
        "created": ns_to_datetime64(now),
        "revoked": 0,
        "updated": ns_to_datetime64(now),
    }
    store.insert_rows("api_tokens", [row])
    return {
        "token_id": token_id,
        "token": f"{TOKEN_PREFIX}{token_id}_{secret}",
        "role": role,
        "user": user,
        "description": description,
        "created_ns": now,
    }


def list_tokens(store: Store, include_revoked: bool = False) -> list[dict[str, Any]]:
    """Tokens, oldest first: ``{token_id, role, user, description, created_ns, revoked}``
    (never the hash)."""
    rows = store.query(TOKENS_SELECT + ("" if include_revoked else " WHERE revoked = 0") + " ORDER BY created_ns")
    return [
        {
            "token_id": r["token_id"],
            "role": r["role"],
            "user": r["user"],
            "description": r["description"],
            "created_ns": int(r["created_ns"]),
            "revoked": bool(int(r["revoked"])),
        }
        for r in rows
    ]


def _token_row(store: Store, token_id: str) -> dict[str, Any] | None:
    rows = store.query(TOKENS_SELECT + " WHERE token_id = {token_id:String}", {"token_id": token_id})
    return rows[0] if rows else None


def revoke_token(store: Store, token_id: str) -> bool:
    """Revoke a token. False when no such (unrevoked) token exists."""
    r = _token_row(store, token_id)
    if r is None or int(r["revoked"]):
        return False
    row = {k: r[k] for k in ("token_id", "role", "user", "description", "salt", "token_hash")}
    row |= {
        "created": ns_to_datetime64(int(r["created_ns"])),
        "revoked": 1,
        "updated": ns_to_datetime64(time.time_ns()),
    }
    store.insert_rows("api_tokens", [row])
    return True


def verify_token(store: Store, token: str) -> Principal | None:
    """The principal of a valid, unrevoked token, else None (malformed, unknown, revoked, wrong secret)."""
    m = _TOKEN_RE.match(token)
    if m is None:
        return None
    r = _token_row(store, m.group(1))
    if r is None or int(r["revoked"]) or r["role"] not in ROLES:
        return None
    if not hmac.compare_digest(_digest(r["salt"], m.group(2)), r["token_hash"]):
        return None
    return Principal(role=r["role"], user=r["user"], token_id=r["token_id"])


class TokenCache:
    """:func:`verify_token` with a per-process memory of :data:`CACHE_TTL_S` seconds."""

    def __init__(self, ttl_s: float = CACHE_TTL_S) -> None:
        self.ttl_s = ttl_s
        self._lock = threading.Lock()
        self._seen: dict[str, tuple[float, Principal | None]] = {}

    def verify(self, store: Store, token: str) -> Principal | None:
        now = time.monotonic()
        with self._lock:
            hit = self._seen.get(token)
        if hit is not None and now - hit[0] < self.ttl_s:
            return hit[1]
        p = verify_token(store, token)
        with self._lock:
            if len(self._seen) > 10000:  # bounded: many bad tokens must not grow it
                self._seen.clear()
            self._seen[token] = (now, p)
        return p

    def forget(self) -> None:
        """Drop every remembered token (after a revocation)."""
        with self._lock:
            self._seen.clear()


def token_cache(request: Request) -> TokenCache:
    """The app's token cache (made on first use)."""
    cache = getattr(request.app.state, "token_cache", None)
    if cache is None:
        cache = request.app.state.token_cache = TokenCache()
    return cache


def unauthorized(detail: str) -> HTTPException:
    return HTTPException(status_code=401, detail=detail, headers={"WWW-Authenticate": "Bearer"})


def get_principal(
    request: Request, credentials: Annotated[HTTPAuthorizationCredentials | None, Security(bearer_scheme)]
) -> Principal:
    """Who the request acts for (the module docstring): on the Unix socket the Bearer token
    when one is sent, else the peer's uid (:func:`peer_principal`); on TCP :data:`OPEN` with
    ``api_auth = "none"``, else the token's principal. Raises 401 for a bad token, or on TCP
    with ``api_auth = "token"`` for a missing one."""
    peer = (request.scope.get("state") or {}).get(PEER_STATE)
    peer = peer if isinstance(peer, Peer) else None
    if peer is not None and credentials is None:
        return peer_principal(peer)
    if peer is None and request.app.state.settings.api_auth == "none":
        return OPEN
    if credentials is None:
        raise unauthorized(
            "authentication required: send Authorization: Bearer <token> (pharos token create), or on the API "
            "host use its Unix socket (api_socket), where your login is your identity"
        )
    p = token_cache(request).verify(request.app.state.store, credentials.credentials)
    if p is None:
        raise unauthorized("invalid or revoked API token")
    return p


def require(*roles: str) -> Callable[[Principal], Principal]:
    """A dependency admitting the given roles (403 for the others); the roles are kept on the
    function as ``roles`` (for tests and docs)."""

    def check(principal: Annotated[Principal, Depends(get_principal)]) -> Principal:
        if principal.role not in roles:
            raise HTTPException(403, f"role {principal.role!r} may not do this: it needs {' or '.join(roles)}")
        return principal

    check.roles = roles  # type: ignore[attr-defined]
    check.__name__ = "require_" + "_".join(roles)
    return check


#: Everything: control actions, pins, imports, job events, tokens.
Admin = Annotated[Principal, Depends(require("admin"))]
#: Read everything; not ``user`` tokens (control audit and pins).
Staff = Annotated[Principal, Depends(require("admin", "operator"))]
#: Read: ``user`` tokens see their own jobs only (the handler filters).
Reader = Annotated[Principal, Depends(require("admin", "operator", "user"))]
#: The scheduler's calls (job events, a job's DFRA hint).
SchedulerCall = Annotated[Principal, Depends(require("admin", "scheduler"))]
#: Hint previews and I/O classes: readers and the scheduler.
HintReader = Annotated[Principal, Depends(require("admin", "operator", "user", "scheduler"))]


def owns_job(store: Store, user: str, job_id: str) -> bool:
    """True when ``job_id`` has a start event naming ``user``."""
    return bool(int(store.query(OWNS_JOB_SQL, {"job_id": job_id, "user": user})[0]["n"]))


def user_jobs(store: Store, user: str) -> set[str]:
    """The job ids whose start event names ``user``."""
    return {r["job_id"] for r in store.query(USER_JOBS_SQL, {"user": user})}


def check_job(principal: Principal, store: Store, job_id: str) -> None:
    """Raise 404 when a ``user`` token asks for a job that is not theirs (the same answer as for
    a job that does not exist)."""
    if not principal.sees_all and not owns_job(store, principal.user, job_id):
        raise HTTPException(404, f"job {job_id!r} not found among the jobs of user {principal.user!r}")


#: What a ``user`` token sees instead of another user's job id.
OTHER_JOB = "(other)"


def redact_job(principal: Principal, job_id: str, mine: set[str]) -> str:
    """``job_id`` when the principal may see it (all roles but ``user``; a user's own job; '' stays
    ''), else :data:`OTHER_JOB`."""
    if principal.sees_all or not job_id or job_id in mine:
        return job_id
    return OTHER_JOB
