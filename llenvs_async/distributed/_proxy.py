"""``RayEnvironment``: the driver's proxy for one instance living in a Ray actor, so the runner
sees an ordinary ``Environment``."""

from __future__ import annotations

import asyncio
import itertools
import logging
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, TypeVar

from ray.exceptions import RayActorError, RayError

from .._resource import AsyncResource
from ..env import Environment, VerifiesStops
from ..errors import ClosedError
from ..types import Action, ChatMessage, State, StepResult
from . import _wire
from ._host import Host, kill
from ._remote import Placement, await_ref, translate, unpicklable, unwrap
from .errors import InstanceLostError

__all__ = ["RayEnvironment"]

_log = logging.getLogger("llenvs_async.distributed")
_T = TypeVar("_T")


async def _verify_stop(
    env: Environment, state: State, reason: str
) -> tuple[float, Mapping[str, Any]] | None:
    return await env.verify_stop(state, reason) if isinstance(env, VerifiesStops) else None


class RayEnvironment(AsyncResource):
    """An ``AgentEnvironment`` whose instance lives in a Ray actor (made by ``RayEnvFactory``).

    ``pure_step``, ``max_steps`` and the instance's ``AgentSurface`` (tools, prompts, stop
    sequences, reward range) mirror the instance, ``verify_stop`` runs in it; ``node_id`` and
    ``info`` say where it runs. ``run(fn, *args)`` runs ``fn(instance, *args)`` in the actor
    (what ``remote_restore`` uses).
    """

    def __init__(
        self,
        actor: Any,
        placement: Placement,
        *,
        close_timeout: float = 60.0,
        on_close: Callable[[RayEnvironment], None] | None = None,
        host: Host | None = None,
    ) -> None:
        self._actor = actor
        self.placement = placement
        self.pure_step = placement.pure_step
        self.max_steps = placement.max_steps
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
    def tools(self) -> tuple[Mapping[str, Any], ...]:
        return self.placement.offer.tools

    @property
    def system_prompt(self) -> str | None:
        return self.placement.offer.system_prompt

    @property
    def example_turns(self) -> tuple[ChatMessage, ...]:
        return self.placement.offer.example_turns

    @property
    def stop_sequences(self) -> tuple[str, ...]:
        return self.placement.offer.stop_sequences

    @property
    def reward_range(self) -> tuple[float, float] | None:
        return self.placement.offer.reward_range

    @property
    def info(self) -> dict[str, Any]:
        """``node_id``, ``host``, ``pid`` and ``actor`` of the instance's actor."""
        return self.placement.info

    def __repr__(self) -> str:
        p = self.placement
        slot = f"#{p.slot}" if self._host is not None and self._host.batched else ""
        return f"RayEnvironment({p.actor_name}{slot}, node={p.node_id[:12]}, pid={p.pid})"

    async def _reply(self, ref: Any, doing: str, *, cancel_remote: bool = True) -> Any:
        reply = await await_ref(ref, self.placement, doing, cancel_remote=cancel_remote)
        return unwrap(reply, self.placement)

    async def _call(self, op: str, payload: Any, doing: str) -> Any:
        """One ``reset``/``step``/``run`` call, its ``(status, value)`` reply decoded;
        batched with the other instances of a shared actor (``run`` never is)."""
        data = _wire.dumps(payload)
        if self._host is not None and self._host.batched and op != "run":
            reply = await self._batched(self._host, op, data, doing)
        else:
            ref = getattr(self._actor, op).remote(self.placement.slot, data)
            try:
                reply = await await_ref(ref, self.placement, doing)
            except InstanceLostError:
                self._lost()
                raise
        try:
            return _wire.loads(reply)
        except Exception as exc:  # as when Ray itself could not deserialize a reply
            raise unpicklable(exc, self.placement, doing) from exc

    async def _batched(self, host: Host, op: str, data: Any, doing: str) -> Any:
        item, future = host.submit(self.placement.slot, op, data)
        try:
            return await future
        except asyncio.CancelledError:
            host.cancel(item)  # as ray.cancel: the remote call is cancelled too
            raise
        except RayError as exc:
            if isinstance(exc, RayActorError):
                self._lost()
            raise translate(exc, self.placement, doing) from exc

    def _lost(self) -> None:
        """The actor is gone: no new instance is placed in it."""
        if self._host is not None:
            self._host.usable = False

    async def reset(self, task: int | str | None = None, *, seed: int | None = None) -> State:
        if self._closed:
            raise ClosedError(type(self).__name__)
        key = next(self._keys)
        reply = await self._call("reset", (key, task, seed), "reset")
        state: State = unwrap(reply, self.placement)
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
            value = unwrap((status, value), self.placement)
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
        result: _T = unwrap(reply, self.placement)
        if isinstance(result, State):
            self._held = (key, result)
        return result

    async def verify_stop(
        self, state: State, reason: str
    ) -> tuple[float, Mapping[str, Any]] | None:
        """The instance's own ``verify_stop`` (a stop the runner made), run in its actor."""
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
                kill(self._actor)
