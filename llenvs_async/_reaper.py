"""The one reaper: removes every leftover of llenvs processes that are provably gone, of every
kind, in the order they depend on each other: vLLM engine processes (no Docker needed), then
containers (an image a container uses cannot be removed), snapshot images, and gVisor
sandboxes, checkpoint images and bundles (none to look for where gVisor is unavailable).

Each kind's own reaper lives with the resource (``docker.reaper``, ``docker.snapshots``,
``sandbox.reaper``, ``backends._vllm_orphans``); this sweep, above them all, is what
``llenvs-async cleanup`` runs.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from .backends import ReapedProcess, reap_orphan_engines
from .docker.engine import DockerEngine
from .docker.reaper import ReapedContainer, reap_orphans
from .docker.snapshots import ReapedImage, reap_orphan_snapshots
from .errors import GvisorUnavailableError
from .sandbox.reaper import ReapedSandbox, reap_orphan_sandboxes
from .sandbox.runsc import find_runsc

__all__ = ["ReapedOrphans", "reap_all_orphans"]


@dataclass(frozen=True, slots=True, kw_only=True)
class ReapedOrphans:
    """What ``reap_all_orphans`` removed, by kind."""

    engines: tuple[ReapedProcess, ...] = ()
    containers: tuple[ReapedContainer, ...]
    images: tuple[ReapedImage, ...]
    sandboxes: tuple[ReapedSandbox, ...]


async def reap_all_orphans(
    engine: DockerEngine | None = None, *, force: bool = False
) -> ReapedOrphans:
    """Remove every leftover of owners provably gone (see the module doc); ``force``: also
    those of owners this process cannot check (``reap_orphans``' rule)."""
    engines = await asyncio.to_thread(reap_orphan_engines, force=force)
    if engine is None:
        async with DockerEngine() as own:
            return await _reap_boxes(own, force, tuple(engines))
    return await _reap_boxes(engine, force, tuple(engines))


async def _reap_boxes(
    engine: DockerEngine, force: bool, engines: tuple[ReapedProcess, ...]
) -> ReapedOrphans:
    containers = await reap_orphans(engine, force=force)
    images = await reap_orphan_snapshots(engine)
    try:
        runsc = find_runsc()
    except GvisorUnavailableError:
        sandboxes: list[ReapedSandbox] = []
    else:
        sandboxes = await asyncio.to_thread(reap_orphan_sandboxes, runsc, force=force)
    return ReapedOrphans(
        engines=engines,
        containers=tuple(containers),
        images=tuple(images),
        sandboxes=tuple(sandboxes),
    )
