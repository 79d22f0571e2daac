"""The actor side, run in the Ray worker: ``EnvActor`` holds environment instances on a node,
one per slot, and replies ``(status, value)`` payloads so exceptions travel as values."""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import ray

from ..env import AgentSurface, Environment
from ..errors import ClosedError
from . import _wire
from ._remote import Placement, Reply, failure_of, unpicklable
from .errors import RemoteEnvError

__all__ = ["EnvActor", "actor_class"]


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
            failure = failure_of(unpicklable(exc, None, op, "call"))
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
            return _wire.dumps((_wire.FAILED, failure_of(exc)))
        self.states.remember(key, kept)
        return _wire.dumps(reply)


_CLOSED = _Instance()  # what a closed (or never opened) slot answers with


def _outcome(task: asyncio.Task[Any]) -> Any:
    """A batched call's reply; one cancelled in the actor fails as ``ray.cancel`` would
    (its caller, if it cancelled it, no longer waits for it)."""
    if not task.cancelled():
        return task.result()
    cancelled = RemoteEnvError("the call was cancelled in the actor", remote_type="cancelled")
    return _wire.dumps((_wire.FAILED, failure_of(cancelled)))


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
    ) -> Reply:
        instance = self._slots[slot] = _Instance()
        env: Environment | None = None
        try:
            env = await env_factory()
            node, host, pid, actor = await self.where()
            placement = Placement(
                node_id=node, host=host, pid=pid, actor_id=actor, actor_name=name,
                pure_step=bool(env.pure_step), max_steps=env.max_steps,
                offer=AgentSurface.of(env), slot=slot,
            )  # fmt: skip
        except Exception as exc:
            if env is not None:  # made but not describable: close it before the actor goes
                with contextlib.suppress(Exception):
                    await env.aclose()
            self._slots.pop(slot, None)
            return False, failure_of(exc)
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

    async def close(self, slot: int, wait_open: float) -> Reply:
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
            return False, failure_of(exc)


_actor_classes: list[Any] = []


def actor_class() -> Any:
    """``ray.remote(EnvActor)``, made once per process."""
    if not _actor_classes:
        _actor_classes.append(ray.remote(EnvActor))
    return _actor_classes[0]
