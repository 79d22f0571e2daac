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
import pickle
import socket
import traceback
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

import ray
from ray.exceptions import RayActorError, RayError

from .._resource import AsyncResource
from ..env import Environment, RestoreFn
from ..errors import ClosedError, LlenvsError
from ..types import Action, State, StepResult
from . import _wire
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
    slot: int = 0  # the instance's number in its actor (0 unless instances share one)

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


class _Instance:
    """One environment instance in an actor, and the states it last exchanged with the
    driver. Every call replies ``(status, value)``, so remote exceptions travel as values
    (Ray's wrapping loses our error classes)."""

    def __init__(self) -> None:
        self.env: Environment | None = None
        self.opened = asyncio.Event()
        self.states = _wire.StateCache()

    def live(self) -> Environment:
        if self.env is None:
            raise ClosedError("remote environment (not opened)")
        return self.env

    async def call(self, op: str, payload: Any) -> Any:
        """``reset``/``step``/``run``: one payload in, one ``(status, value)`` out (``_wire``)."""
        try:
            args = _wire.loads(payload)
        except Exception as exc:  # as when Ray could not deserialize the arguments
            failure = _failure(_unpicklable(exc, None, op, "call"))
            return _wire.dumps((_wire.FAILED, failure))
        try:
            if op == "step":
                key, wire, action = args
                state = self.states.decode(wire)
                if state is None:
                    return _wire.dumps((_wire.MISS, None))
                result = await self.live().step(state, action)
                reply = _wire.encode_result(result, state, action)
                kept = getattr(result, "next_state", None)
            elif op == "reset":
                key, task, seed = args
                kept = await self.live().reset(task, seed=seed)
                reply = _wire.OK, kept
            else:
                key, fn, fn_args = args
                kept = await fn(self.live(), *fn_args)
                reply = _wire.OK, kept
        except Exception as exc:
            return _wire.dumps((_wire.FAILED, _failure(exc)))
        self.states.remember(key, kept)
        return _wire.dumps(reply)


_CLOSED = _Instance()  # what a closed (or never opened) slot answers with


def _outcome(task: asyncio.Task[Any]) -> Any:
    """A batched call's reply; one cancelled in the actor fails as ``ray.cancel`` would
    (its caller, if it cancelled it, no longer waits for it)."""
    if not task.cancelled():
        return task.result()
    cancelled = RemoteEnvError("the call was cancelled in the actor", remote_type="cancelled")
    return _wire.dumps((_wire.FAILED, _failure(cancelled)))


class EnvActor:
    """Holds one environment instance on its node, or several (``instances_per_actor``),
    each in a numbered slot."""

    def __init__(self) -> None:
        self._slots: dict[int, _Instance] = {}
        self._items: dict[int, asyncio.Task[Any]] = {}  # batched calls in progress

    async def where(self) -> tuple[str, str, int, str]:
        """Node id, host, pid and actor id: answers once the actor is placed and running."""
        ctx = ray.get_runtime_context()
        return ctx.get_node_id(), socket.gethostname(), os.getpid(), ctx.get_actor_id() or ""

    async def open(
        self, slot: int, env_factory: Callable[[], Awaitable[Environment]], name: str
    ) -> _Reply:
        instance = self._slots[slot] = _Instance()
        env: Environment | None = None
        try:
            env = await env_factory()
            node, host, pid, actor = await self.where()
            span = getattr(env, "reward_range", None)
            placement = Placement(
                node_id=node, host=host, pid=pid, actor_id=actor, actor_name=name,
                pure_step=bool(env.pure_step), max_steps=env.max_steps,
                reward_range=None if span is None else (float(span[0]), float(span[1])),
                slot=slot,
            )  # fmt: skip
        except Exception as exc:
            if env is not None:  # made but not describable: close it before the actor goes
                with contextlib.suppress(Exception):
                    await env.aclose()
            self._slots.pop(slot, None)
            return False, _failure(exc)
        else:
            instance.env = env
            return True, placement
        finally:
            instance.opened.set()

    async def reset(self, slot: int, payload: Any) -> Any:
        return await self._slots.get(slot, _CLOSED).call("reset", payload)

    async def step(self, slot: int, payload: Any) -> Any:
        return await self._slots.get(slot, _CLOSED).call("step", payload)

    async def run(self, slot: int, payload: Any) -> Any:
        return await self._slots.get(slot, _CLOSED).call("run", payload)

    async def batch(self, items: Any) -> AsyncIterator[Any]:
        """Several ``(item, slot, op, payload)`` calls at once (pickled as one); yields
        ``[(item, reply)]`` (pickled as one) for those that finished, as they finish (a
        streaming generator)."""
        tasks: dict[asyncio.Task[Any], int] = {}
        for item, slot, op, payload in _wire.loads(items):
            task = asyncio.ensure_future(self._slots.get(slot, _CLOSED).call(op, payload))
            tasks[task] = self._track(item, task)
        try:
            pending = set(tasks)
            while pending:
                done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
                yield _wire.dumps([(tasks[t], _outcome(t)) for t in done])
        finally:
            for task, item in tasks.items():
                task.cancel()
                self._items.pop(item, None)

    def _track(self, item: int, task: asyncio.Task[Any]) -> int:
        self._items[item] = task
        return item

    async def cancel(self, items: list[int]) -> None:
        """Cancel batched calls (their callers were cancelled), as ``ray.cancel`` does one."""
        for item in items:
            task = self._items.get(item)
            if task is not None:
                task.cancel()

    async def close(self, slot: int, wait_open: float) -> _Reply:
        """Close the instance; an ``open`` still running is awaited first (bounded), so a
        container it is creating is removed too."""
        instance = self._slots.get(slot)
        if instance is None:
            return True, None
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(instance.opened.wait(), wait_open)
        env, instance.env = instance.env, None
        self._slots.pop(slot, None)
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


def _unpicklable(
    exc: Exception, placement: Placement | None, doing: str, what: str = "reply"
) -> RemoteEnvError:
    """A call or reply one side could not unpickle, as Ray's own failure to would be."""
    where = "" if placement is None else f" on node {placement.node_id} ({placement.host})"
    side = "in the actor" if what == "call" else f"of the Ray actor{where} here"
    return RemoteEnvError(
        f"{doing}: the {what} could not be unpickled {side} ({type(exc).__name__}: {exc})",
        node_id=None if placement is None else placement.node_id,
        actor_id=None if placement is None else placement.actor_id,
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


class _Host:
    """The driver's side of one ``EnvActor``: its slots in use and, when it holds several
    instances, the ``reset``/``step`` calls to send it as one batch."""

    def __init__(self, actor: Any, name: str, capacity: int) -> None:
        self.actor = actor
        self.name = name
        self.capacity = capacity
        self.used = 0  # slots reserved: instances opening or open
        self.usable = True  # False once lost or unplaceable: no new instance goes here
        self._slots = itertools.count()
        self._items = itertools.count()
        self._pending: list[tuple[int, int, str, Any, asyncio.Future[Any]]] = []
        self._collecting: set[asyncio.Task[None]] = set()
        self._batch: Any = None  # actor.batch as a streaming generator (made on first use)

    @property
    def batched(self) -> bool:
        return self.capacity > 1

    def reserve(self) -> int:
        self.used += 1
        return next(self._slots)

    def submit(self, slot: int, op: str, payload: Any) -> tuple[int, asyncio.Future[Any]]:
        """Queue one call; the queue goes out at the end of this event-loop tick. The future
        gets the reply, or the ``RayError`` that ended the batch."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Any] = loop.create_future()
        item = next(self._items)
        self._pending.append((item, slot, op, payload, future))
        if len(self._pending) == 1:
            loop.call_soon(self._flush)
        return item, future

    def cancel(self, item: int) -> None:
        with contextlib.suppress(Exception):
            self.actor.cancel.remote([item])

    def _flush(self) -> None:
        batch, self._pending = self._pending, []
        waiting = {item: future for item, _, _, _, future in batch}
        try:
            if self._batch is None:
                self._batch = self.actor.batch.options(num_returns="streaming")
            replies = self._batch.remote(
                _wire.dumps([(item, slot, op, payload) for item, slot, op, payload, _ in batch])
            )
        except Exception as exc:
            _settle(waiting, exc)
            return
        task = asyncio.ensure_future(self._collect(replies, waiting))
        self._collecting.add(task)
        task.add_done_callback(self._collecting.discard)

    async def _collect(self, replies: Any, waiting: dict[int, asyncio.Future[Any]]) -> None:
        error: BaseException | None = None
        try:
            async for ref in replies:
                for item, reply in _wire.loads(await ref):
                    future = waiting.pop(item, None)
                    if future is not None and not future.done():
                        future.set_result(reply)
        except RayError as exc:
            error = exc
        except asyncio.CancelledError:
            for future in waiting.values():
                future.cancel()
            raise
        except Exception as exc:  # never leave a caller waiting
            error = RemoteEnvError(f"a batch of calls to {self.name} failed: {exc!r}")
        _settle(waiting, error)


def _settle(waiting: Mapping[int, asyncio.Future[Any]], error: BaseException | None) -> None:
    """Fail the calls of a batch that ended without their replies."""
    for future in waiting.values():
        if not future.done():
            future.set_exception(
                error or RemoteEnvError("a batch of calls ended without this call's reply")
            )


async def _verify_stop(
    env: Environment, state: State, reason: str
) -> tuple[float, Mapping[str, Any]] | None:
    verify = getattr(env, "verify_stop", None)
    return None if verify is None else await verify(state, reason)


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
        host: _Host | None = None,
    ) -> None:
        self._actor = actor
        self.placement = placement
        self.pure_step = placement.pure_step
        self.max_steps = placement.max_steps
        if placement.reward_range is not None:
            self.reward_range = placement.reward_range
        self.close_timeout = close_timeout
        self._on_close = on_close
        self._host = host
        self._closed = False
        self._keys = itertools.count()
        self._held: tuple[int, State] | None = None  # (key, state) the actor holds too

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
        slot = f"#{p.slot}" if self._host is not None and self._host.batched else ""
        return f"RayEnvironment({p.actor_name}{slot}, node={p.node_id[:12]}, pid={p.pid})"

    async def _reply(self, ref: Any, doing: str, *, cancel_remote: bool = True) -> Any:
        reply = await _await(ref, self.placement, doing, cancel_remote=cancel_remote)
        return _unwrap(reply, self.placement)

    async def _call(self, op: str, payload: Any, doing: str) -> Any:
        """One ``reset``/``step``/``run`` call, its ``(status, value)`` reply decoded;
        batched with the other instances of a shared actor (``run`` never is)."""
        data = _wire.dumps(payload)
        if self._host is not None and self._host.batched and op != "run":
            reply = await self._batched(self._host, op, data, doing)
        else:
            ref = getattr(self._actor, op).remote(self.placement.slot, data)
            try:
                reply = await _await(ref, self.placement, doing)
            except InstanceLostError:
                self._lost()
                raise
        try:
            return _wire.loads(reply)
        except Exception as exc:  # as when Ray itself could not deserialize a reply
            raise _unpicklable(exc, self.placement, doing) from exc

    async def _batched(self, host: _Host, op: str, data: Any, doing: str) -> Any:
        item, future = host.submit(self.placement.slot, op, data)
        try:
            return await future
        except asyncio.CancelledError:
            host.cancel(item)  # as ray.cancel: the remote call is cancelled too
            raise
        except RayError as exc:
            if isinstance(exc, RayActorError):
                self._lost()
            raise _translate(exc, self.placement, doing) from exc

    def _lost(self) -> None:
        """The actor is gone: no new instance is placed in it."""
        if self._host is not None:
            self._host.usable = False

    async def reset(self, task: int | str | None = None, *, seed: int | None = None) -> State:
        if self._closed:
            raise ClosedError(type(self).__name__)
        key = next(self._keys)
        reply = await self._call("reset", (key, task, seed), "reset")
        state: State = _unwrap(reply, self.placement)
        self._held = (key, state)
        return state

    async def step(self, state: State, action: Action) -> StepResult:
        if self._closed:
            raise ClosedError(type(self).__name__)
        if not isinstance(action, Action):
            raise TypeError(f"step() expects an Action, got {type(action).__name__}")
        key = next(self._keys)
        wire = _wire.encode_state(state, self._held)
        status, value = await self._call("step", (key, wire, action), "step")
        if status == _wire.MISS:  # the actor no longer holds the state referred to
            status, value = await self._call("step", (key, state, action), "step")
        if status != _wire.DELTA:
            value = _unwrap((status, value), self.placement)
        result: StepResult = _wire.decode_result(status, value, state, action)
        after = getattr(result, "next_state", None)
        if isinstance(after, State):
            self._held = (key, after)
        return result

    async def run(self, fn: Callable[..., Awaitable[_T]], *args: Any) -> _T:
        """``await fn(instance, *args)`` in the actor (``fn`` and results must pickle)."""
        if self._closed:
            raise ClosedError(type(self).__name__)
        key = next(self._keys)
        name = getattr(fn, "__name__", "function")
        reply = await self._call("run", (key, fn, args), name)
        result: _T = _unwrap(reply, self.placement)
        if isinstance(result, State):
            self._held = (key, result)
        return result

    async def verify_stop(
        self, state: State, reason: str
    ) -> tuple[float, Mapping[str, Any]] | None:
        """The instance's own ``verify_stop`` (a stop the runner made), run in its actor;
        None when the instance has none."""
        return await self.run(_verify_stop, state, reason)

    async def aclose(self) -> None:
        """Close the instance in its actor (removing its containers), then kill the actor
        (a shared one once its last instance is closed).

        A lost actor has nothing left to close: that is logged, not raised.
        """
        if self._closed:
            return
        self._closed = True
        try:
            ref = self._actor.close.remote(self.placement.slot, self.close_timeout)
            async with asyncio.timeout(self.close_timeout):
                await self._reply(ref, "close", cancel_remote=False)
        except InstanceLostError:
            self._lost()
            _log.warning("%r was lost before it could be closed", self)
        finally:
            if self._on_close is not None:
                self._on_close(self)  # the factory kills the actor once it holds none
            else:
                _kill(self._actor)


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
        self._hosts: list[_Host] = []
        self._host_of: dict[str, _Host] = {}
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

    def _reserve(self) -> tuple[_Host, int]:
        """A slot in an actor with room (the oldest first), or in a new actor."""
        for host in self._hosts:
            if host.usable and host.used < host.capacity:
                return host, host.reserve()
        name = f"{ACTOR_PREFIX}-{self.session}-{next(_counter)}"
        actor = _actor_class().options(**self._options(name)).remote()
        host = _Host(actor, name, self.instances_per_actor)
        self._hosts.append(host)
        return host, host.reserve()

    def _release(self, host: _Host) -> None:
        """One slot of ``host`` is free again; an actor that holds no instance is killed."""
        host.used -= 1
        if host.used <= 0:
            host.usable = False
            if host in self._hosts:
                self._hosts.remove(host)
            _kill(host.actor)

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
            reply = await _await(opening, None, "env_factory", cancel_remote=False)
        except BaseException as exc:
            if isinstance(exc, InstanceLostError):
                host.usable = False
            # Cancelled mid-open: let the actor close what the factory made (bounded).
            await asyncio.shield(self._abandon(host, slot))
            raise
        try:
            placement: Placement = _unwrap(reply, None)
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

    async def _wait_placed(self, host: _Host) -> None:
        """Until a node took the actor; past ``placement_timeout``, ``PlacementTimeoutError``."""
        try:
            async with asyncio.timeout(self.placement_timeout):
                await _await(host.actor.where.remote(), None, "placing an instance")
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

    async def _abandon(self, host: _Host, slot: int) -> None:
        try:
            async with asyncio.timeout(self.close_timeout):
                await host.actor.close.remote(slot, self.close_timeout)
        except Exception:  # the actor may be dead or stuck: it is killed regardless
            _log.warning("closing an abandoned instance failed", exc_info=True)
            _kill(host.actor)
        finally:
            self._release(host)

    def _forget(self, proxy: RayEnvironment) -> None:
        key = self._key(proxy)
        self._live.pop(key, None)
        host = self._host_of.pop(key, None)
        if host is not None:
            self._release(host)
        else:
            _kill(proxy._actor)


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
