"""Scale-out on Ray: environment instances as actors on the nodes that run Docker engines.

Needs the ``ray`` extra (``pip install 'llenvs-async[ray]'``). ``import llenvs_async``
never imports Ray; this package imports it only when a Ray name is first used.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .._extras import import_extra
from .errors import InstanceLostError, PlacementTimeoutError, RayConnectError, RemoteEnvError
from .local import LocalRayCluster

if TYPE_CHECKING:
    from .ray import (
        DEFAULT_RESOURCES,
        Placement,
        RayEnvFactory,
        RayEnvironment,
        connect,
        ray_env_factory,
        remote_restore,
    )

__all__ = [
    "DEFAULT_RESOURCES",
    "InstanceLostError",
    "LocalRayCluster",
    "Placement",
    "PlacementTimeoutError",
    "RayConnectError",
    "RayEnvFactory",
    "RayEnvironment",
    "RemoteEnvError",
    "connect",
    "ray_env_factory",
    "remote_restore",
]

_RAY_NAMES = frozenset(
    {
        "DEFAULT_RESOURCES",
        "Placement",
        "RayEnvFactory",
        "RayEnvironment",
        "connect",
        "ray_env_factory",
        "remote_restore",
    }
)


def __getattr__(name: str) -> Any:
    if name in _RAY_NAMES:
        ray = import_extra("llenvs_async.distributed.ray", extra="ray", package="Ray",
                           what=f"llenvs_async.distributed.{name}")  # fmt: skip
        return getattr(ray, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
