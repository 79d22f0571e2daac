"""gVisor sandboxes (``runsc``) for shell tasks: a container's interface plus checkpoint and
restore of whole sandboxes (processes, memory, in-memory filesystem). Importing this package
registers the ``"gvisor"`` runtime with the docker layer (``GVISOR``)."""

from __future__ import annotations

from .fork import SandboxCheckpoint, SandboxProcessFork
from .reaper import (
    ReapedSandbox,
    reap_orphan_sandboxes,
    remove_own_sandboxes_sync,
)
from .runsc import Runsc, find_runsc
from .runtime import GVISOR, GvisorRuntime
from .sandbox import Sandbox

__all__ = [
    "GVISOR",
    "GvisorRuntime",
    "ReapedSandbox",
    "Runsc",
    "Sandbox",
    "SandboxCheckpoint",
    "SandboxProcessFork",
    "find_runsc",
    "reap_orphan_sandboxes",
    "remove_own_sandboxes_sync",
]
