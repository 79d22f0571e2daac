"""gVisor sandboxes (``runsc``) for shell tasks: a container's interface plus checkpoint and
restore of whole sandboxes (processes, memory, in-memory filesystem)."""

from __future__ import annotations

from .reaper import (
    ReapedOrphans,
    ReapedSandbox,
    reap_all_orphans,
    reap_orphan_sandboxes,
    remove_own_sandboxes_sync,
)
from .runsc import Runsc, find_runsc
from .sandbox import Sandbox

__all__ = [
    "ReapedOrphans",
    "ReapedSandbox",
    "Runsc",
    "Sandbox",
    "find_runsc",
    "reap_all_orphans",
    "reap_orphan_sandboxes",
    "remove_own_sandboxes_sync",
]
