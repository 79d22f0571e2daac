"""Environment instances as Ray actors: ``ray_env_factory`` and the ``RayEnvironment`` proxy.

Each instance lives in its own async Ray actor (one event loop) on a node that has the
requested resources (``{"docker": 1}``: a node with a Docker engine); the runner and
the backend stay in the driver and see an ordinary ``Environment``. Remote errors come
back as the exceptions the instance raised (their remote traceback in a note); Ray's
own errors become ``InstanceLostError`` / ``RemoteEnvError`` at this edge. Closing a
proxy closes the instance in its actor (its containers are removed there), then kills
the actor.

With ``instances_per_actor=N`` up to N instances share one actor (it reserves N times
the resources): the ``reset``/``step`` calls the driver makes to them in one event-loop
tick (a lockstep round) travel as one Ray call, their replies streamed back as each
finishes; the actor is killed once its last instance is closed. A Ray call costs about
a millisecond of CPU on each side, so one call per actor per round instead of one per
instance is what makes large batches cheap; the price is that the actor's death fails
all of its instances.

Calls carry one payload each way (``_wire``): a state the actor already holds travels
as a key, a next state as the steps its history adds, pickled once.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import os
import socket
import uuid
from collections.abc import Awaitable, Callable, Iterator, Mapping
from typing import Any

import ray

from ..env import Environment, RestoreFn
from ..errors import LlenvsError
from ..types import State
from ._actor import actor_class
from ._host import Host, kill
from ._loopback import is_loopback, keep_loopback
from ._proxy import RayEnvironment
from ._remote import Placement, await_ref, unwrap
from .errors import InstanceLostError, PlacementTimeoutError, RayConnectError

__all__ = [
    "DEFAULT_RESOURCES",
    "Placement",
    "RayEnvFactory",
    "RayConnectError",
    "RayEnvironment",
    "connect",
    "ray_env_factory",
    "remote_restore",
]

DEFAULT_RESOURCES: Mapping[str, float] = {"docker": 1}
ACTOR_PREFIX = "llenvs-env"

_log = logging.getLogger("llenvs_async.distributed")


_counter = itertools.count()


class RayEnvFactory:
    """An ``EnvFactory`` whose instances are ``RayEnvironment`` proxies (see ``ray_env_factory``).

    Counts what it made: ``live`` and ``peak_live`` instances, ``created``; ``live_names``
    are the Ray actor names of the open ones (for leak checks; ``name#slot`` when
    instances share actors), ``actors`` how many actors are alive.
    """

    def __init__(
        self,
        env_factory: Callable[[], Awaitable[Environment]],
        *,
        resources: Mapping[str, float],
        placement_timeout: float | None,
        num_cpus: float,
        spread: bool,
        close_timeout: float,
        actor_options: Mapping[str, Any],
        instances_per_actor: int = 1,
    ) -> None:
        if not callable(env_factory):
            raise TypeError(f"env_factory must be an async callable, got {env_factory!r}")
        for key, amount in resources.items():
            if not isinstance(amount, int | float) or isinstance(amount, bool) or amount < 0:
                raise ValueError(f"resources[{key!r}] must be a number >= 0, got {amount!r}")
        if placement_timeout is not None and not placement_timeout > 0:
            raise ValueError(f"placement_timeout must be > 0 or None, got {placement_timeout!r}")
        if (
            not isinstance(instances_per_actor, int)
            or isinstance(instances_per_actor, bool)
            or instances_per_actor < 1
        ):
            raise ValueError(
                f"instances_per_actor must be an int >= 1, got {instances_per_actor!r}"
            )
        self.env_factory = env_factory
        self.resources = dict(resources)
        self.placement_timeout = placement_timeout
        self.num_cpus = num_cpus
        self.spread = spread
        self.close_timeout = close_timeout
        self.actor_options = dict(actor_options)
        self.instances_per_actor = instances_per_actor
        self.session = uuid.uuid4().hex[:8]
        self.created = 0
        self.peak_live = 0
        self._live: dict[str, RayEnvironment] = {}
        self._hosts: list[Host] = []
        self._host_of: dict[str, Host] = {}
        self._factory_ref: Any = None

    @property
    def live(self) -> int:
        return len(self._live)

    @property
    def live_names(self) -> list[str]:
        return sorted(self._live)

    @property
    def actors(self) -> int:
        """Actors alive (or being placed) for this factory's instances."""
        return len(self._hosts)

    def _options(self, name: str) -> dict[str, Any]:
        n = self.instances_per_actor  # an actor reserves what its instances would
        options: dict[str, Any] = {
            "name": name,
            "namespace": ACTOR_PREFIX,
            "num_cpus": self.num_cpus * n,
            "resources": {key: amount * n for key, amount in self.resources.items()},
            "max_restarts": 0,
            "max_task_retries": 0,
            "max_concurrency": 1000,
        }
        if self.spread:
            options["scheduling_strategy"] = "SPREAD"
        options.update(self.actor_options)
        return options

    def _reserve(self) -> tuple[Host, int]:
        """A slot in an actor with room (the oldest first), or in a new actor."""
        for host in self._hosts:
            if host.usable and host.used < host.capacity:
                return host, host.reserve()
        name = f"{ACTOR_PREFIX}-{self.session}-{next(_counter)}"
        actor = actor_class().options(**self._options(name)).remote()
        host = Host(actor, name, self.instances_per_actor)
        self._hosts.append(host)
        return host, host.reserve()

    def _release(self, host: Host) -> None:
        """One slot of ``host`` is free again; an actor that holds no instance is killed."""
        host.used -= 1
        if host.used <= 0:
            host.usable = False
            if host in self._hosts:
                self._hosts.remove(host)
            kill(host.actor)

    async def __call__(self) -> RayEnvironment:
        if not ray.is_initialized():
            raise LlenvsError(
                "ray_env_factory: Ray is not connected; call llenvs_async.distributed.connect("
                "address) (or ray.init) first"
            )
        job = ray.get_runtime_context().get_job_id()
        if self._factory_ref is None or self._factory_ref[0] != job:
            # Shipped once per connection, not once per instance.
            self._factory_ref = (job, ray.put(self.env_factory))
        host, slot = self._reserve()
        try:
            await self._wait_placed(host)
            opening = host.actor.open.remote(slot, self._factory_ref[1], host.name)
        except BaseException:
            self._release(host)  # pending or just started: the slot holds nothing yet
            raise
        try:
            reply = await await_ref(opening, None, "env_factory", cancel_remote=False)
        except BaseException as exc:
            if isinstance(exc, InstanceLostError):
                host.usable = False
            # Cancelled mid-open: let the actor close what the factory made (bounded).
            await asyncio.shield(self._abandon(host, slot))
            raise
        try:
            placement: Placement = unwrap(reply, None)
        except BaseException:
            self._release(host)  # the factory failed in the actor: no instance to close
            raise
        proxy = RayEnvironment(
            host.actor, placement, close_timeout=self.close_timeout, on_close=self._forget,
            host=host,
        )  # fmt: skip
        key = self._key(proxy)
        self._live[key] = proxy
        self._host_of[key] = host
        self.created += 1
        self.peak_live = max(self.peak_live, len(self._live))
        return proxy

    def _key(self, proxy: RayEnvironment) -> str:
        p = proxy.placement
        return p.actor_name if self.instances_per_actor == 1 else f"{p.actor_name}#{p.slot}"

    async def _wait_placed(self, host: Host) -> None:
        """Until a node took the actor; past ``placement_timeout``, ``PlacementTimeoutError``."""
        try:
            async with asyncio.timeout(self.placement_timeout):
                await await_ref(host.actor.where.remote(), None, "placing an instance")
        except InstanceLostError:
            host.usable = False
            raise
        except TimeoutError as exc:
            host.usable = False  # new instances try a new actor
            raise PlacementTimeoutError(
                f"no node with free {self.resources} took a new instance within "
                f"placement_timeout={self.placement_timeout}s",
                remote_type="placement",
            ) from exc

    async def _abandon(self, host: Host, slot: int) -> None:
        try:
            async with asyncio.timeout(self.close_timeout):
                await host.actor.close.remote(slot, self.close_timeout)
        except Exception:  # the actor may be dead or stuck: it is killed regardless
            _log.warning("closing an abandoned instance failed", exc_info=True)
            kill(host.actor)
        finally:
            self._release(host)

    def _forget(self, proxy: RayEnvironment) -> None:
        key = self._key(proxy)
        self._live.pop(key, None)
        host = self._host_of.pop(key, None)
        if host is not None:
            self._release(host)
        else:
            kill(proxy._actor)


def ray_env_factory(
    env_factory: Callable[[], Awaitable[Environment]],
    *,
    resources: Mapping[str, float] = DEFAULT_RESOURCES,
    placement_timeout: float | None = 300.0,
    num_cpus: float = 0,
    spread: bool = True,
    close_timeout: float = 60.0,
    actor_options: Mapping[str, Any] | None = None,
    instances_per_actor: int = 1,
) -> RayEnvFactory:
    """Wrap ``env_factory`` (an async zero-argument callable, shipped to the nodes) so each
    instance is made inside its own Ray actor on a node that has ``resources``.

    ``spread``: Ray's SPREAD strategy (instances over all nodes). A new instance waits for
    a node with free resources at most ``placement_timeout`` seconds, then fails with
    ``PlacementTimeoutError`` (recorded by the runner as a ``factory`` error). The runner's
    ``batch_size`` bounds how many exist at once across the cluster. ``actor_options`` go
    to ``ActorClass.options`` (e.g. a ``runtime_env``).

    ``instances_per_actor=N``: up to N instances share one actor, which reserves N times
    ``resources`` and ``num_cpus`` (so set N to what one node can hold, or a divisor of
    it); their ``reset``/``step`` calls of one lockstep round go as one Ray call per
    actor instead of one per instance (Ray's cost per call dominates a round otherwise),
    the replies streamed back as each finishes. Killing that actor, or losing its node,
    fails all of its instances; it is killed once its last instance is closed.
    """
    return RayEnvFactory(
        env_factory,
        resources=resources,
        placement_timeout=placement_timeout,
        num_cpus=num_cpus,
        spread=spread,
        close_timeout=close_timeout,
        actor_options=actor_options or {},
        instances_per_actor=instances_per_actor,
    )


def remote_restore(restore_fn: RestoreFn) -> RestoreFn:
    """``restore_fn`` run where the instance is: in its actor for a ``RayEnvironment``
    (``harbor_restore`` needs the real ``HarborEnvironment``, and a replay costs no round
    trip per action), as is for a local instance. ``restore_fn`` is copied to each actor,
    so one that holds resources (an ``aclose``, e.g. ``SnapshotRestore``'s images) is
    refused: each copy would make its own and none would be closed.
    """
    if callable(getattr(restore_fn, "aclose", None)):
        raise TypeError(
            f"remote_restore cannot ship {type(restore_fn).__name__}: it holds resources "
            "(it has aclose) that a copy in each actor would leak; use harbor_restore or "
            "replay_restore"
        )

    async def restore(env: Environment, state: State) -> State:
        if isinstance(env, RayEnvironment):
            return await env.run(restore_fn, state)
        return await restore_fn(env, state)

    restore.__name__ = restore.__qualname__ = f"remote_{getattr(restore_fn, '__name__', 'restore')}"
    return restore


@contextlib.contextmanager
def connect(
    address: str | None = None, *, probe_timeout: float = 10.0, **init_kwargs: Any
) -> Iterator[None]:
    """Connect this process (the driver) to the Ray cluster at ``address`` (``host:port``,
    else ``RAY_ADDRESS``); disconnect on exit. A loopback address keeps every connection
    on loopback (Ray would otherwise switch to the machine's routable IP). An address
    nothing listens on fails within ``probe_timeout`` (``ray.init`` would retry for minutes).
    """
    address = address or os.environ.get("RAY_ADDRESS")
    if not address:
        raise RayConnectError("no Ray cluster address: pass host:port or set RAY_ADDRESS")
    host, _, port = address.removeprefix("ray://").rpartition(":")
    if not host or not port.isdigit():
        raise RayConnectError(f"Ray cluster address {address!r} is not host:port", address=address)
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=probe_timeout).close()
    except OSError as exc:
        raise RayConnectError(
            f"cannot connect to the Ray cluster at {address!r}: {exc}", address=address
        ) from exc
    kwargs: dict[str, Any] = {"logging_level": logging.WARNING, "log_to_driver": False}
    if is_loopback(host):
        keep_loopback()
        kwargs["_node_ip_address"] = "127.0.0.1"
    kwargs.update(init_kwargs)
    try:
        ray.init(address=address, **kwargs)
    except (ConnectionError, RuntimeError, ValueError) as exc:
        raise RayConnectError(
            f"cannot connect to the Ray cluster at {address!r}: {exc}", address=address
        ) from exc
    try:
        yield
    finally:
        ray.shutdown()
