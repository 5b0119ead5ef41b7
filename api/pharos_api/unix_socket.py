"""The API's two listeners: the TCP port and the Unix socket whose peers are known by uid.

:func:`api_server` makes one uvicorn server serving the app on both: the TCP socket
(``api_host:api_port``, uvicorn's own ``Config.bind_socket``) and, unless ``api_socket`` is
'', a Unix socket (:func:`bind_unix_socket`, default ``<state_dir>/api.sock``, mode 0666).

The HTTP protocol is uvicorn's (``AutoHTTPProtocol``: httptools, else h11) with one addition
(:func:`peer_protocol`): when a connection is made on a Unix socket, the kernel's record of
the connecting process (``SO_PEERCRED``: pid, uid, gid at ``connect()``) is read from the
socket and put, as a :class:`~pharos_api.auth.Peer`, in the state uvicorn copies into every
request's ASGI scope (``scope["state"]``, which Starlette shows as ``request.state``), under
:data:`~pharos_api.auth.PEER_STATE`. :func:`pharos_api.auth.get_principal` reads it. Nothing a
client sends reaches that entry; a TCP connection never has one. Should a future uvicorn stop
copying that state into the scope, socket requests would carry no peer and be refused (401),
never admitted.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import logging
import os
import socket
import stat
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import uvicorn
from fastapi import FastAPI
from uvicorn.protocols.http.auto import AutoHTTPProtocol

from pharos_core.settings import Settings

from .auth import PEER_STATE, Peer

log = logging.getLogger("pharos.serve")

#: Longest path a Unix socket address holds on Linux (``sun_path`` is 108 bytes with its NUL).
MAX_SOCKET_PATH = 107
_UCRED = struct.Struct("3i")  # struct ucred: pid, uid, gid


class UnixSocketError(RuntimeError):
    """The API's Unix socket cannot be made (path too long, taken by a running API or by a file
    that is not a socket); the message names the ``api_socket`` setting."""


def peer_of(sock: Any) -> Peer | None:
    """The :class:`~pharos_api.auth.Peer` of a connected Unix socket (``SO_PEERCRED``), None for
    any other socket (TCP) or when the kernel gives none."""
    if sock is None or sock.family != socket.AF_UNIX:
        return None
    try:
        raw = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _UCRED.size)
    except OSError:
        return None
    pid, uid, gid = _UCRED.unpack(raw)
    return Peer(pid=pid, uid=uid, gid=gid)


def peer_protocol(base: type[asyncio.Protocol] = AutoHTTPProtocol) -> type[asyncio.Protocol]:
    """uvicorn's HTTP protocol ``base`` putting the connection's :class:`Peer` (Unix sockets
    only) into the state every request of the connection gets in its scope."""

    class PeerCredProtocol(base):  # type: ignore[valid-type, misc]
        def connection_made(self, transport: asyncio.BaseTransport) -> None:  # type: ignore[override]
            # a fresh dict per connection: the server's state (shared) is never written
            state = {k: v for k, v in self.app_state.items() if k != PEER_STATE}
            peer = peer_of(transport.get_extra_info("socket"))
            if peer is not None:
                state[PEER_STATE] = peer
            self.app_state = state
            super().connection_made(transport)

    return PeerCredProtocol


def traversal_problem(path: Path) -> str | None:
    """Why other users cannot reach the socket ``path`` (a directory above it they may not
    search, mode o-x), or None."""
    for d in path.parents:
        try:
            mode = d.stat().st_mode
        except OSError:
            continue
        if not mode & stat.S_IXOTH:
            return f"directory {d} (mode {stat.S_IMODE(mode):04o}) is not searchable by other users"
    return None


def bind_unix_socket(path: Path) -> socket.socket:
    """A bound Unix stream socket at ``path``, mode 0666 (who may connect is decided per request
    from the peer's uid, not by the file mode); uvicorn listens on it. A socket file left by a
    stopped API (nothing accepts on it) is replaced. Raises UnixSocketError when the path is too
    long, another process serves it, or a file that is not a socket is there."""
    raw = os.fsencode(path)
    if len(raw) > MAX_SOCKET_PATH:
        raise UnixSocketError(
            f"api_socket {str(path)!r} is {len(raw)} bytes, longer than a Unix socket address holds "
            f"({MAX_SOCKET_PATH}): set api_socket to a shorter path (or '' for no socket)"
        )
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        st = path.lstat()
    except FileNotFoundError:
        st = None
    if st is not None:
        if not stat.S_ISSOCK(st.st_mode):
            raise UnixSocketError(f"api_socket {str(path)!r} exists and is not a socket: remove it or set api_socket")
        probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            probe.settimeout(2)
            probe.connect(raw)
        except OSError as exc:
            if exc.errno not in (errno.ECONNREFUSED, errno.ENOENT):
                raise UnixSocketError(f"api_socket {str(path)!r}: {exc}") from None
            path.unlink(missing_ok=True)  # stale: its server is gone
        else:
            raise UnixSocketError(f"api_socket {str(path)!r} is served by another process (a running pharos serve?)")
        finally:
            probe.close()
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.bind(raw)
        os.chmod(raw, 0o666)
    except OSError as exc:
        sock.close()
        raise UnixSocketError(f"api_socket {str(path)!r}: cannot bind: {exc}") from None
    return sock


@dataclass
class ApiListeners:
    """A uvicorn ``server`` and its bound ``sockets`` (TCP, then the Unix socket at
    ``socket_path``, inode ``socket_ino``, when there is one)."""

    server: uvicorn.Server
    sockets: list[socket.socket]
    socket_path: Path | None = None
    socket_ino: int | None = None

    def run(self) -> None:
        """Serve until the server is told to exit (SIGTERM/SIGINT in the main thread, or
        ``server.should_exit``); then :meth:`close`."""
        try:
            self.server.run(sockets=self.sockets)
        finally:
            self.close()

    def close(self) -> None:
        """Close the sockets and remove the socket file if it is still this server's."""
        for sock in self.sockets:
            sock.close()
        if self.socket_path is not None:
            with contextlib.suppress(OSError):
                if self.socket_path.lstat().st_ino == self.socket_ino:
                    self.socket_path.unlink()


def api_server(app: FastAPI, settings: Settings) -> ApiListeners:
    """The API's server for ``app`` on its TCP port and, when ``settings.api_socket_path`` is
    not None, its Unix socket (bound now; :meth:`ApiListeners.run` serves them). Raises
    UnixSocketError (the Unix socket) or exits (uvicorn's bind of the TCP port fails)."""
    config = uvicorn.Config(
        app, host=settings.api_host, port=settings.api_port, log_level="warning", http=peer_protocol()
    )
    listeners = ApiListeners(uvicorn.Server(config), [config.bind_socket()])
    path = settings.api_socket_path
    if path is not None:
        try:
            listeners.sockets.append(bind_unix_socket(path))
        except UnixSocketError:
            listeners.close()
            raise
        listeners.socket_path, listeners.socket_ino = path, path.lstat().st_ino
        problem = traversal_problem(path)
        if problem:
            log.warning("API socket %s: %s, so only its owner can use it", path, problem)
    return listeners
