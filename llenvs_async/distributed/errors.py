"""Errors of remote environment instances (Ray's own errors are translated to these)."""

from __future__ import annotations

from ..errors import EnvError, LlenvsError

__all__ = ["InstanceLostError", "PlacementTimeoutError", "RayConnectError", "RemoteEnvError"]


class RayConnectError(LlenvsError):
    """The driver could not connect to the Ray cluster at ``address``."""

    def __init__(self, message: str, *, address: str | None = None) -> None:
        super().__init__(message, address=address)
        self.address = address


class RemoteEnvError(EnvError):
    """An environment instance in a Ray actor failed; ``node_id`` says where.

    Raised as is when the remote error could not be rebuilt in the driver (its class
    does not pickle); ``remote_type`` names the class it had there.
    """

    def __init__(
        self,
        message: str,
        *,
        node_id: str | None = None,
        actor_id: str | None = None,
        remote_type: str | None = None,
    ) -> None:
        super().__init__(message, node_id=node_id, actor_id=actor_id, remote_type=remote_type)
        self.node_id = node_id
        self.actor_id = actor_id
        self.remote_type = remote_type


class InstanceLostError(RemoteEnvError):
    """The actor holding an instance died (killed, crashed, or its node went away)."""


class PlacementTimeoutError(RemoteEnvError):
    """No node with the requested resources could take a new instance in time."""
