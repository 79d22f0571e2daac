"""How a ``HarborEnvironment`` uses a Docker engine: the adapter's shared one (the last
environment to let go disconnects it, so an adapter never closed leaks no connection) or,
when the adapter has none, one of its own. A verification in flight holds the lease past
the environment's close, since it still needs the engine."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from ....docker.engine import DockerEngine
from .instance import HarborRuntime

__all__ = ["EngineLease"]


class EngineLease:
    """One environment's (``user``'s) use of the engine of ``runtime``, or of its own."""

    __slots__ = ("_ended", "_holds", "_own", "_runtime", "_user")

    def __init__(self, runtime: HarborRuntime, user: object) -> None:
        self._runtime = runtime
        self._user = id(user)
        self._own: DockerEngine | None = None
        self._holds = 0  # work in flight (closing waits for it to let go)
        self._ended = False

    async def get(self) -> DockerEngine:
        """The engine, connected (the adapter's: counted as used by this environment)."""
        shared = self._runtime.engine
        if shared is not None:  # the adapter's: connected on first use
            if self._runtime.engine_users is not None:
                self._runtime.engine_users.add(self._user)
            return await shared.connect()
        if self._own is None:
            self._own = await DockerEngine(self._runtime.docker_url).connect()
        return self._own

    @asynccontextmanager
    async def held(self) -> AsyncIterator[None]:
        """Keep the lease while the body runs; ended meanwhile: it is released at the end."""
        self._holds += 1
        try:
            yield
        finally:
            self._holds -= 1
            if self._ended and not self._holds:  # ended meanwhile: its engine use ends now
                await self._release()

    async def end(self) -> None:
        """The environment closes: close its own engine, and release the adapter's unless
        work in flight still holds it."""
        self._ended = True
        engine, self._own = self._own, None
        try:
            if engine is not None and self._runtime.engine is None:
                await engine.aclose()
        finally:
            if not self._holds:
                await self._release()

    async def _release(self) -> None:
        """Stop using the adapter's engine; the last environment to stop disconnects it."""
        users = self._runtime.engine_users
        if users is not None and self._user in users:
            users.discard(self._user)
            if not users and self._runtime.engine is not None:
                await self._runtime.engine.disconnect()
