"""gVisor sandboxes (``runsc``) for shell tasks: a container's interface plus checkpoint and
restore of whole sandboxes (processes, memory, in-memory filesystem)."""

from __future__ import annotations

from .reaper import ReapedSandbox, reap_orphan_sandboxes, remove_own_sandboxes_sync
from .runsc import Runsc, find_runsc
from .sandbox import Sandbox

__all__ = [
    "ReapedSandbox",
    "Runsc",
    "Sandbox",
    "find_runsc",
    "reap_orphan_sandboxes",
    "remove_own_sandboxes_sync",
]
