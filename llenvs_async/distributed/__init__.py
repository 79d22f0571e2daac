"""Scale-out on Ray: environment instances as actors on the nodes that run Docker engines.

Needs the ``ray`` extra (``pip install 'llenvs-async[ray]'``). ``import llenvs_async``
never imports Ray; this package imports it only when a Ray name is first used.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

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
        try:
            from . import ray as _ray
        except ImportError as exc:
            raise ImportError(
                f"llenvs_async.distributed.{name} needs Ray: pip install 'llenvs-async[ray]'"
            ) from exc
        return getattr(_ray, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
