"""Environment instances as Ray actors: ``ray_env_factory`` and the ``RayEnvironment`` proxy.

Each instance lives in its own async Ray actor (one event loop) on a node that has the
requested resources (``{"docker": 1}``: a node with a Docker engine); the runner and
the backend stay in the driver and see an ordinary ``Environment``. Remote errors come
back as the exceptions the instance raised (their remote traceback in a note); Ray's
own errors become ``InstanceLostError`` / ``RemoteEnvError`` at this edge. Closing a
proxy closes the instance in its actor (its containers are removed there), then kills
the actor.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import os
import pickle
import socket
import traceback
import uuid
from collections.abc import Awaitable, Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

import ray
from ray.exceptions import RayActorError, RayError

from .._resource import AsyncResource
from ..env import Environment, RestoreFn
from ..errors import ClosedError, LlenvsError
from ..types import Action, State, StepResult
from ._loopback import is_loopback, keep_loopback
from .errors import InstanceLostError, PlacementTimeoutError, RayConnectError, RemoteEnvError

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
_T = TypeVar("_T")


@dataclass(frozen=True, slots=True, kw_only=True)
class Placement:
    """Where an instance runs and what it declared (sent back by its actor)."""

    node_id: str
    host: str
    pid: int
    actor_id: str
    actor_name: str
    pure_step: bool
    max_steps: int | None
    reward_range: tuple[float, float] | None = None

    @property
    def info(self) -> dict[str, Any]:
        return {"node_id": self.node_id, "host": self.host, "pid": self.pid, "actor": self.actor_id}


@dataclass(frozen=True, slots=True)
class _Failure:
    """An exception raised in an actor: pickled when it survives a round trip."""

    pickled: bytes | None
    type_name: str
    message: str
    traceback: str


def _failure(exc: BaseException) -> _Failure:
    blob: bytes | None
    try:
        blob = pickle.dumps(exc)
        pickle.loads(blob)  # classes whose __init__ cannot be re-called fail here
    except Exception:
        blob = None
    kind = type(exc)
    return _Failure(
        pickled=blob,
        type_name=f"{kind.__module__}.{kind.__qualname__}",
        message=str(exc),
        traceback="".join(traceback.format_exception(exc)),
    )


_Reply = tuple[bool, Any]


class EnvActor:
    """Holds one environment instance on its node; every method replies ``(ok, value)``
    so remote exceptions travel as values (Ray's wrapping loses our error classes).
    """

    def __init__(self) -> None:
        self._env: Environment | None = None
        self._opened = asyncio.Event()

    async def where(self) -> tuple[str, str, int, str]:
        """Node id, host, pid and actor id: answers once the actor is placed and running."""
        ctx = ray.get_runtime_context()
        return ctx.get_node_id(), socket.gethostname(), os.getpid(), ctx.get_actor_id() or ""

    async def open(self, env_factory: Callable[[], Awaitable[Environment]], name: str) -> _Reply:
        env: Environment | None = None
        try:
            env = await env_factory()
            node, host, pid, actor = await self.where()
            span = getattr(env, "reward_range", None)
            placement = Placement(
                node_id=node, host=host, pid=pid, actor_id=actor, actor_name=name,
                pure_step=bool(env.pure_step), max_steps=env.max_steps,
                reward_range=None if span is None else (float(span[0]), float(span[1])),
            )  # fmt: skip
        except Exception as exc:
            if env is not None:  # made but not describable: close it before the actor goes
                with contextlib.suppress(Exception):
                    await env.aclose()
            return False, _failure(exc)
        else:
            self._env = env
            return True, placement
        finally:
            self._opened.set()

    async def call(self, method: str, *args: Any, **kwargs: Any) -> _Reply:
        try:
            if self._env is None:
                raise ClosedError("remote environment (not opened)")
            return True, await getattr(self._env, method)(*args, **kwargs)
        except Exception as exc:
            return False, _failure(exc)

    async def run(self, fn: Callable[..., Awaitable[Any]], *args: Any) -> _Reply:
        try:
            if self._env is None:
                raise ClosedError("remote environment (not opened)")
            return True, await fn(self._env, *args)
        except Exception as exc:
            return False, _failure(exc)

    async def close(self, wait_open: float) -> _Reply:
        """Close the instance; an ``open`` still running is awaited first (bounded), so a
        container it is creating is removed too."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._opened.wait(), wait_open)
        env, self._env = self._env, None
        try:
            if env is not None:
                await env.aclose()
            return True, None
        except Exception as exc:
            return False, _failure(exc)


def _rebuild(failure: _Failure, placement: Placement | None) -> BaseException:
    where = "a Ray actor" if placement is None else f"node {placement.node_id} ({placement.host})"
    exc: BaseException | None = None
    if failure.pickled is not None:
        with contextlib.suppress(Exception):
            exc = pickle.loads(failure.pickled)
    if exc is None:
        exc = RemoteEnvError(
            f"{failure.type_name}: {failure.message} (on {where})",
            node_id=None if placement is None else placement.node_id,
            actor_id=None if placement is None else placement.actor_id,
            remote_type=failure.type_name,
        )
    exc.add_note(f"raised on {where}:\n{failure.traceback}")
    return exc


def _unwrap(reply: _Reply, placement: Placement | None) -> Any:
    ok, value = reply
    if ok:
        return value
    raise _rebuild(value, placement)


def _translate(exc: RayError, placement: Placement | None, doing: str) -> RemoteEnvError:
    """Ray's error as ours: a dead actor or node is ``InstanceLostError``."""
    node = None if placement is None else placement.node_id
    actor = None if placement is None else placement.actor_id
    where = "" if placement is None else f" on node {node} ({placement.host})"
    kind = InstanceLostError if isinstance(exc, RayActorError) else RemoteEnvError
    first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    return kind(
        f"{doing}: the Ray actor{where} failed ({type(exc).__name__}: {first})",
        node_id=node,
        actor_id=actor,
        remote_type=type(exc).__name__,
    )


async def _await(
    ref: Any, placement: Placement | None, doing: str, *, cancel_remote: bool = True
) -> Any:
    """Await one actor call; cancelling the caller cancels the remote coroutine too, as a
    local one would be (``cancel_remote=False``: it runs on, for creation and close)."""
    try:
        return await ref
    except asyncio.CancelledError:
        if cancel_remote:
            with contextlib.suppress(Exception):
                ray.cancel(ref)
        raise
    except RayError as exc:
        raise _translate(exc, placement, doing) from exc


_actor_classes: list[Any] = []


def _actor_class() -> Any:
    """``ray.remote(EnvActor)``, made once per process."""
    if not _actor_classes:
        _actor_classes.append(ray.remote(EnvActor))
    return _actor_classes[0]


def _kill(actor: Any) -> None:
    with contextlib.suppress(Exception):
        ray.kill(actor, no_restart=True)


class RayEnvironment(AsyncResource):
    """An ``Environment`` whose instance lives in a Ray actor (made by ``RayEnvFactory``).

    ``pure_step``, ``max_steps`` (and ``reward_range`` when the instance has one) mirror
    the instance; ``node_id`` and ``info`` say where it runs. ``run(fn, *args)`` runs
    ``fn(instance, *args)`` in the actor (what ``remote_restore`` uses).
    """

    def __init__(
        self,
        actor: Any,
        placement: Placement,
        *,
        close_timeout: float = 60.0,
        on_close: Callable[[RayEnvironment], None] | None = None,
    ) -> None:
        self._actor = actor
        self.placement = placement
        self.pure_step = placement.pure_step
        self.max_steps = placement.max_steps
        if placement.reward_range is not None:
            self.reward_range = placement.reward_range
        self.close_timeout = close_timeout
        self._on_close = on_close
        self._closed = False

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def node_id(self) -> str:
        return self.placement.node_id

    @property
    def info(self) -> dict[str, Any]:
        """``node_id``, ``host``, ``pid`` and ``actor`` of the instance's actor."""
        return self.placement.info

    def __repr__(self) -> str:
        p = self.placement
        return f"RayEnvironment({p.actor_name}, node={p.node_id[:12]}, pid={p.pid})"

    async def _reply(self, ref: Any, doing: str, *, cancel_remote: bool = True) -> Any:
        reply = await _await(ref, self.placement, doing, cancel_remote=cancel_remote)
        return _unwrap(reply, self.placement)

    async def reset(self, task: int | str | None = None, *, seed: int | None = None) -> State:
        if self._closed:
            raise ClosedError(type(self).__name__)
        state: State = await self._reply(self._actor.call.remote("reset", task, seed=seed), "reset")
        return state

    async def step(self, state: State, action: Action) -> StepResult:
        if self._closed:
            raise ClosedError(type(self).__name__)
        if not isinstance(action, Action):
            raise TypeError(f"step() expects an Action, got {type(action).__name__}")
        result: StepResult = await self._reply(
            self._actor.call.remote("step", state, action), "step"
        )
        return result

    async def run(self, fn: Callable[..., Awaitable[_T]], *args: Any) -> _T:
        """``await fn(instance, *args)`` in the actor (``fn`` and results must pickle)."""
        if self._closed:
            raise ClosedError(type(self).__name__)
        name = getattr(fn, "__name__", "function")
        result: _T = await self._reply(self._actor.run.remote(fn, *args), name)
        return result

    async def aclose(self) -> None:
        """Close the instance in its actor (removing its containers), then kill the actor.

        A lost actor has nothing left to close: that is logged, not raised.
        """
        if self._closed:
            return
        self._closed = True
        try:
            ref = self._actor.close.remote(self.close_timeout)
            async with asyncio.timeout(self.close_timeout):
                await self._reply(ref, "close", cancel_remote=False)
        except InstanceLostError:
            _log.warning("%r was lost before it could be closed", self)
        finally:
            _kill(self._actor)
            if self._on_close is not None:
                self._on_close(self)


_counter = itertools.count()


class RayEnvFactory:
    """An ``EnvFactory`` whose instances are ``RayEnvironment`` proxies (see ``ray_env_factory``).

    Counts what it made: ``live`` and ``peak_live`` instances, ``created``; ``live_names``
    are the Ray actor names of the open ones (for leak checks).
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
    ) -> None:
        if not callable(env_factory):
            raise TypeError(f"env_factory must be an async callable, got {env_factory!r}")
        for key, amount in resources.items():
            if not isinstance(amount, int | float) or isinstance(amount, bool) or amount < 0:
                raise ValueError(f"resources[{key!r}] must be a number >= 0, got {amount!r}")
        if placement_timeout is not None and not placement_timeout > 0:
            raise ValueError(f"placement_timeout must be > 0 or None, got {placement_timeout!r}")
        self.env_factory = env_factory
        self.resources = dict(resources)
        self.placement_timeout = placement_timeout
        self.num_cpus = num_cpus
        self.spread = spread
        self.close_timeout = close_timeout
        self.actor_options = dict(actor_options)
        self.session = uuid.uuid4().hex[:8]
        self.created = 0
        self.peak_live = 0
        self._live: dict[str, RayEnvironment] = {}
        self._factory_ref: Any = None

    @property
    def live(self) -> int:
        return len(self._live)

    @property
    def live_names(self) -> list[str]:
        return sorted(self._live)

    def _options(self, name: str) -> dict[str, Any]:
        options: dict[str, Any] = {
            "name": name,
            "namespace": ACTOR_PREFIX,
            "num_cpus": self.num_cpus,
            "resources": self.resources,
            "max_restarts": 0,
            "max_task_retries": 0,
            "max_concurrency": 1000,
        }
        if self.spread:
            options["scheduling_strategy"] = "SPREAD"
        options.update(self.actor_options)
        return options

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
        name = f"{ACTOR_PREFIX}-{self.session}-{next(_counter)}"
        actor = _actor_class().options(**self._options(name)).remote()
        try:
            await self._wait_placed(actor)
            opening = actor.open.remote(self._factory_ref[1], name)
        except BaseException:
            _kill(actor)  # pending or just started: it holds nothing yet
            raise
        try:
            reply = await _await(opening, None, "env_factory", cancel_remote=False)
        except BaseException:
            # Cancelled mid-open: let the actor close what the factory made (bounded).
            await asyncio.shield(self._abandon(actor))
            raise
        try:
            placement: Placement = _unwrap(reply, None)
        except BaseException:
            _kill(actor)  # the factory failed in the actor: no instance to close
            raise
        proxy = RayEnvironment(
            actor, placement, close_timeout=self.close_timeout, on_close=self._forget
        )
        self._live[name] = proxy
        self.created += 1
        self.peak_live = max(self.peak_live, len(self._live))
        return proxy

    async def _wait_placed(self, actor: Any) -> None:
        """Until a node took the actor; past ``placement_timeout``, ``PlacementTimeoutError``."""
        try:
            async with asyncio.timeout(self.placement_timeout):
                await _await(actor.where.remote(), None, "placing an instance")
        except TimeoutError as exc:
            raise PlacementTimeoutError(
                f"no node with free {self.resources} took a new instance within "
                f"placement_timeout={self.placement_timeout}s",
                remote_type="placement",
            ) from exc

    async def _abandon(self, actor: Any) -> None:
        try:
            async with asyncio.timeout(self.close_timeout):
                await actor.close.remote(self.close_timeout)
        except Exception:  # the actor may be dead or stuck: it is killed regardless
            _log.warning("closing an abandoned instance failed", exc_info=True)
        finally:
            _kill(actor)

    def _forget(self, proxy: RayEnvironment) -> None:
        self._live.pop(proxy.placement.actor_name, None)


def ray_env_factory(
    env_factory: Callable[[], Awaitable[Environment]],
    *,
    resources: Mapping[str, float] = DEFAULT_RESOURCES,
    placement_timeout: float | None = 300.0,
    num_cpus: float = 0,
    spread: bool = True,
    close_timeout: float = 60.0,
    actor_options: Mapping[str, Any] | None = None,
) -> RayEnvFactory:
    """Wrap ``env_factory`` (an async zero-argument callable, shipped to the nodes) so each
    instance is made inside its own Ray actor on a node that has ``resources``.

    ``spread``: Ray's SPREAD strategy (instances over all nodes). A new instance waits for
    a node with free resources at most ``placement_timeout`` seconds, then fails with
    ``PlacementTimeoutError`` (recorded by the runner as a ``factory`` error). The runner's
    ``batch_size`` bounds how many exist at once across the cluster. ``actor_options`` go
    to ``ActorClass.options`` (e.g. a ``runtime_env``).
    """
    return RayEnvFactory(
        env_factory,
        resources=resources,
        placement_timeout=placement_timeout,
        num_cpus=num_cpus,
        spread=spread,
        close_timeout=close_timeout,
        actor_options=actor_options or {},
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
