"""Serving ``create_app``'s app: ``serving`` (uvicorn on this loop, loopback unless told),
the bearer-token middleware and the loopback check."""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import importlib
import ipaddress
import socket
from collections.abc import AsyncIterator, Awaitable, Callable, MutableMapping
from typing import Any

from llenvs_async import LlenvsError

from .._extras import import_extra

__all__ = ["CLOSE_TIMEOUT", "BearerAuth", "is_loopback", "require_openenv", "serving"]

ASGIApp = Callable[..., Awaitable[None]]
CLOSE_TIMEOUT = 120.0  # seconds a session's close waits for its instance's teardown


def require_openenv() -> str:
    """OpenEnv's version; ``MissingExtraError`` naming the extra when it is missing."""
    import_extra("openenv.core.env_server.http_server", extra="openenv",
                 what="llenvs_async.integrations.openenv", package="OpenEnv")  # fmt: skip
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("openenv-core")
    except PackageNotFoundError:
        return "unknown"


def is_loopback(host: str) -> bool:
    """Whether ``host`` names only this machine (``localhost`` or a loopback address)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


class BearerAuth:
    """ASGI middleware: every HTTP request and WebSocket handshake must carry the token."""

    def __init__(self, app: ASGIApp, *, token: str) -> None:
        self.app = app
        self.expected = f"Bearer {token}".encode()

    async def __call__(
        self,
        scope: MutableMapping[str, Any],
        receive: Callable[[], Awaitable[Any]],
        send: Callable[[Any], Awaitable[None]],
    ) -> None:
        if scope["type"] not in ("http", "websocket"):
            return await self.app(scope, receive, send)
        given = dict(scope.get("headers") or ()).get(b"authorization", b"")
        if hmac.compare_digest(given, self.expected):
            return await self.app(scope, receive, send)
        if scope["type"] == "websocket":  # closing before accept refuses the handshake (403)
            await send({"type": "websocket.close", "code": 1008, "reason": "bad bearer token"})
            return None
        body = b'{"detail": "missing or wrong bearer token"}'
        await send(
            {
                "type": "http.response.start",
                "status": 401,
                "headers": [(b"content-type", b"application/json"),
                            (b"www-authenticate", b"Bearer")],
            }
        )  # fmt: skip
        await send({"type": "http.response.body", "body": body})
        return None


@contextlib.asynccontextmanager
async def serving(
    app: Any, *, host: str = "127.0.0.1", port: int = 0, allow_remote: bool = False
) -> AsyncIterator[str]:
    """Serve ``app`` (from ``create_app``) with uvicorn on this loop; yields its
    ``http://host:port`` URL once it accepts connections; stops it (sessions ended,
    instances closed) on exit. A non-loopback ``host`` needs ``allow_remote=True`` and an
    app made with a ``token``."""
    if not is_loopback(host):
        if not allow_remote:
            raise LlenvsError(
                f"host {host!r} is not a loopback address: pass allow_remote=True "
                "(--allow-remote) and a token to serve other machines",
                host=host,
            )
        if not getattr(app.state, "llenvs_token", False):
            raise LlenvsError(
                f"serving on {host!r} needs a bearer token: create_app(..., token=...)",
                host=host,
            )
    if isinstance(port, bool) or not 0 <= port <= 65535:
        raise ValueError(f"port must be in 0..65535, got {port!r}")
    uvicorn = importlib.import_module("uvicorn")
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(128)  # connections wait in the backlog until uvicorn accepts them
    except OSError as exc:
        sock.close()
        raise LlenvsError(f"cannot listen on {host}:{port} ({exc.strerror})", host=host) from exc
    bound = sock.getsockname()[1]
    config = uvicorn.Config(
        app, log_level="warning", lifespan="on", ws="websockets-sansio",
        timeout_graceful_shutdown=CLOSE_TIMEOUT,
    )  # fmt: skip
    server = uvicorn.Server(config)
    task = asyncio.create_task(server.serve(sockets=[sock]), name="llenvs-openenv-server")
    try:
        yield f"http://{f'[{host}]' if family == socket.AF_INET6 else host}:{bound}"
    finally:
        server.should_exit = True
        try:
            await asyncio.shield(task)
        finally:
            sock.close()
