"""`WarmPool`: started containers (shell open) kept ready per spec, so a reset takes one
instead of paying container creation (the engine serializes creates) on the critical path.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections import deque
from dataclasses import dataclass, replace

from .._resource import AsyncResource
from .._shield import shielded
from ..errors import ClosedError
from ..host import DEFAULT_MAX_OUTPUT_BYTES, ShellKind, ShellSession
from .container import Container, ContainerSpec
from .engine import DockerEngine

__all__ = ["POOL_LABEL", "WarmContainer", "WarmPool"]

POOL_LABEL = "llenvs.pool"
_log = logging.getLogger("llenvs_async.docker.pool")


@dataclass(frozen=True, slots=True)
class WarmContainer:
    """A started container and its open shell; the taker owns both (close the container)."""

    container: Container
    shell: ShellSession


class _Bucket:
    """The ready containers of one spec and the creations filling it."""

    __slots__ = ("filling", "ready", "spec")

    def __init__(self, spec: ContainerSpec) -> None:
        self.spec = spec
        self.ready: deque[WarmContainer] = deque()
        self.filling: set[asyncio.Task[None]] = set()


class WarmPool(AsyncResource):
    """Keeps up to ``size`` started containers with their shell open for each spec taken.

    ``take(spec)`` hands a ready one over (or creates one when none is ready) and starts
    refilling in the background, bounded: ready + being created never exceeds ``size``
    per spec; at most ``refill_concurrency`` are created at once in the background (a
    take that finds none ready creates its own at once). Pooled containers carry the
    owner labels (the reaper and ``llenvs-async cleanup`` find them) and ``llenvs.pool``.
    ``aclose`` stops refilling and removes every container still in the pool, shielded
    and bounded by ``close_timeout``.
    """

    def __init__(
        self,
        engine: DockerEngine,
        size: int,
        *,
        shell: ShellKind = "auto",
        max_output_bytes: int = DEFAULT_MAX_OUTPUT_BYTES,
        create_timeout: float = 120.0,
        close_timeout: float = 60.0,
        refill_concurrency: int = 2,
    ) -> None:
        if size < 1:
            raise ValueError(f"WarmPool size must be >= 1, got {size!r}")
        if refill_concurrency < 1:
            raise ValueError(f"refill_concurrency must be >= 1, got {refill_concurrency!r}")
        self.engine = engine
        self.size = size
        self._shell: ShellKind = shell
        self._max_output_bytes = max_output_bytes
        self._create_timeout = create_timeout
        self._close_timeout = close_timeout
        self._buckets: dict[str, _Bucket] = {}
        # Background creations yield to foreground work: the engine creates containers one
        # at a time anyway, and a burst of them would compete with the replays just started.
        self._refilling = asyncio.Semaphore(refill_concurrency)
        self._closed = False
        self.created = 0
        self.hits = 0
        self.misses = 0

    @property
    def closed(self) -> bool:
        return self._closed

    def ready(self, spec: ContainerSpec) -> int:
        bucket = self._buckets.get(_key(spec))
        return 0 if bucket is None else len(bucket.ready)

    async def take(self, spec: ContainerSpec) -> WarmContainer:
        """A started container of ``spec`` with its shell open; the caller owns it."""
        if self._closed:
            raise ClosedError("WarmPool")
        if spec.name is not None:  # a named container cannot be made ahead of time
            return await self._create(spec)
        bucket = self._bucket(spec)
        if bucket.ready:
            self.hits += 1
            warm = bucket.ready.popleft()
            self._refill(bucket)
            return warm
        self.misses += 1
        self._refill(bucket)
        return await self._create(bucket.spec)  # this one is the taker's, not the pool's

    async def fill(self, spec: ContainerSpec) -> None:
        """Start ``size`` containers of ``spec`` and wait until they are ready."""
        if self._closed:
            raise ClosedError("WarmPool")
        bucket = self._bucket(spec)
        self._refill(bucket)
        while bucket.filling:
            await asyncio.wait(set(bucket.filling))

    async def settle(self) -> None:
        """Wait until no container is being created (every refill started so far ended)."""
        while filling := {t for b in self._buckets.values() for t in b.filling}:
            await asyncio.wait(filling)

    def _bucket(self, spec: ContainerSpec) -> _Bucket:
        key = _key(spec)
        bucket = self._buckets.get(key)
        if bucket is None:
            pooled = replace(spec, labels={**spec.labels, POOL_LABEL: "warm"})
            bucket = self._buckets[key] = _Bucket(pooled)
        return bucket

    def _refill(self, bucket: _Bucket) -> None:
        missing = self.size - len(bucket.ready) - len(bucket.filling)
        for _ in range(max(missing, 0)):
            task = asyncio.get_running_loop().create_task(self._fill_one(bucket))
            bucket.filling.add(task)
            task.add_done_callback(bucket.filling.discard)

    async def _fill_one(self, bucket: _Bucket) -> None:
        try:
            async with self._refilling:
                if self._closed:
                    return
                warm = await self._create(bucket.spec)
        except Exception as exc:  # a later take creates its own and reports the error
            _log.warning("warm pool: creating a %s container failed: %r", bucket.spec.image, exc)
            return
        if self._closed:
            await warm.container.aclose()
        else:
            bucket.ready.append(warm)

    async def _create(self, spec: ContainerSpec) -> WarmContainer:
        container = await Container.create(self.engine, spec, create_timeout=self._create_timeout)
        try:
            shell = await container.shell(
                shell=self._shell, max_output_bytes=self._max_output_bytes
            )
        except BaseException:
            await container.aclose()
            raise
        self.created += 1
        return WarmContainer(container=container, shell=shell)

    async def aclose(self) -> None:
        """Remove every ready container, then wait (bounded by ``close_timeout``) for the
        creations in flight, which remove their own container once the pool is closed;
        one still running after that is logged, not raised. Idempotent."""
        if self._closed:
            return
        self._closed = True
        ready = [w for b in self._buckets.values() for w in b.ready]
        for bucket in self._buckets.values():
            bucket.ready.clear()
        await shielded(
            asyncio.gather(*(w.container.aclose() for w in ready), return_exceptions=True),
            within=None,  # each container's removal is bounded by its own remove_timeout
        )
        filling = {t for b in self._buckets.values() for t in b.filling}
        if not filling:
            return
        try:
            await shielded(asyncio.wait(filling), within=self._close_timeout)
        except TimeoutError:
            _log.warning("warm pool: %d container creation(s) still running at close", len(filling))


def _key(spec: ContainerSpec) -> str:
    """Specs that make the same container share a bucket."""
    return json.dumps(spec.to_config({}), sort_keys=True, default=str)
