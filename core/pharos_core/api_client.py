"""How a Pharos client on the API host reaches the API: its Unix socket or its TCP port.

The API serves two listeners (docs/security.md, "The API"): a Unix socket (``api_socket``,
default ``<state_dir>/api.sock``) where the kernel tells the server who the caller is
(``SO_PEERCRED``), so local commands need no token; and the TCP port (``api_url``) where a
Bearer token says who the caller is. A base URL in this module is either ``http://host:port``
or ``unix:<path of the socket>`` (:data:`UNIX_PREFIX`); :func:`request` speaks to both.

:func:`client_url` is the choice of the CLI and ``pharos run`` when no URL is given: the
socket when it exists and no token is configured, else the TCP URL.
"""

from __future__ import annotations

import stat
from pathlib import Path
from typing import Any

import httpx

from .settings import Settings

#: A base URL naming a Unix socket: ``unix:/path/to/api.sock``.
UNIX_PREFIX = "unix:"


def is_socket(path: Path) -> bool:
    """True when ``path`` names an existing Unix socket this process may stat."""
    try:
        return stat.S_ISSOCK(path.stat().st_mode)
    except OSError:
        return False


def client_url(settings: Settings) -> str:
    """The base URL a local client uses when given none: ``unix:<api_socket_path>`` when that
    socket exists (and this user can reach it) and no token is configured (``api_token`` /
    PHAROS_API_TOKEN, ``api_token_file``), else ``settings.api_url`` (TCP, token needed
    unless ``api_auth = "none"``)."""
    sock = settings.api_socket_path
    try:
        token = settings.api_token_value()
    except OSError:  # a configured but unreadable token file: the TCP request says so
        token = "?"
    if sock is not None and not token and is_socket(sock):
        return UNIX_PREFIX + str(sock)
    return settings.api_url


def request(url: str, method: str, path: str, *, timeout: float, **kwargs: Any) -> httpx.Response:
    """``method`` ``path`` (``/v1/...``) at base ``url`` (``http://host:port`` or
    ``unix:<socket>``); ``kwargs`` go to httpx (params, json, content, headers). Raises what
    httpx raises (``httpx.TransportError`` when nothing listens, ``httpx.TimeoutException``)."""
    if url.startswith(UNIX_PREFIX):
        transport = httpx.HTTPTransport(uds=url[len(UNIX_PREFIX) :])
        with httpx.Client(transport=transport, base_url="http://localhost", timeout=timeout) as client:
            return client.request(method, path, **kwargs)
    return httpx.request(method, url + path, timeout=timeout, **kwargs)
