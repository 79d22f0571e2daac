"""The ``"gvisor"`` runtime: boxes are gVisor sandboxes (``Sandbox``), registered with the
docker layer's runtimes when this package is imported."""

from __future__ import annotations

from dataclasses import dataclass

from ..docker.container import ContainerSpec
from ..docker.engine import DockerEngine
from ..docker.runtime import RuntimeHost, register_runtime
from ..host import Capability
from .fork import SandboxProcessFork
from .runsc import find_runsc
from .sandbox import Sandbox

__all__ = ["GVISOR", "GvisorRuntime"]


@dataclass(frozen=True, slots=True)
class GvisorRuntime:
    """gVisor sandboxes driven through ``runsc`` (root, no network); not Docker containers,
    so no warm pool, commits, sidecars or archive copies, but checkpoints."""

    name: str = "gvisor"
    capabilities: frozenset[Capability] = Sandbox.capabilities

    def check(self) -> None:
        """``GvisorUnavailableError`` naming what is missing (runsc, root, the platform)."""
        find_runsc()

    async def create(self, engine: DockerEngine, spec: ContainerSpec) -> RuntimeHost:
        return await Sandbox.create(engine, spec)

    def process_fork(self, *, timeout: float) -> SandboxProcessFork:
        return SandboxProcessFork(timeout=timeout)


GVISOR = GvisorRuntime()
register_runtime(GVISOR)
