"""The aiodocker layer: engine, containers with safe defaults, a persistent shell per
container, a generic shell-task environment, local images, and leak-proofing.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from .._ownership import OWNER_LABEL, SESSION_LABEL
from ..host import CommandResult, ShellKind, ShellSession
from ..shell_task import ShellTaskEnvironment
from .container import DEFAULT_CAP_DROP, Container, ContainerSpec
from .engine import DockerEngine
from .environment import DockerEnvironment, format_observation
from .reaper import ReapedContainer, reap_orphans, remove_own_containers_sync

if TYPE_CHECKING:
    from .images import (
        BASE_ALIASES,
        BASE_IMAGE,
        BUSYBOX_IMAGE,
        ImageInfo,
        ensure_base_image,
        ensure_busybox_image,
        import_rootfs,
    )

# Image helpers load on first use, so `python -m llenvs_async.docker.images` runs cleanly.
_FROM_IMAGES = frozenset(
    {"BASE_ALIASES", "BASE_IMAGE", "BUSYBOX_IMAGE", "ImageInfo", "ensure_base_image",
     "ensure_busybox_image", "import_rootfs"}
)  # fmt: skip

__all__ = [
    "BASE_ALIASES",
    "BASE_IMAGE",
    "BUSYBOX_IMAGE",
    "DEFAULT_CAP_DROP",
    "OWNER_LABEL",
    "SESSION_LABEL",
    "CommandResult",
    "Container",
    "ContainerSpec",
    "DockerEngine",
    "DockerEnvironment",
    "ImageInfo",
    "ReapedContainer",
    "ShellKind",
    "ShellSession",
    "ShellTaskEnvironment",
    "ensure_base_image",
    "ensure_busybox_image",
    "format_observation",
    "import_rootfs",
    "reap_orphans",
    "remove_own_containers_sync",
]


def __getattr__(name: str) -> Any:
    if name in _FROM_IMAGES:
        return getattr(importlib.import_module(".images", __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
