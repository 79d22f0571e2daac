"""The driver's side of one ``EnvActor``: its slots in use, and the ``reset``/``step`` calls of
one event-loop tick sent as one Ray call (Ray's cost per call dominates a round otherwise)."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
from collections.abc import Mapping
from typing import Any

import ray
from ray.exceptions import RayError

from . import _wire
from .errors import RemoteEnvError

__all__ = ["Host", "kill"]


def kill(actor: Any) -> None:
    with contextlib.suppress(Exception):
        ray.kill(actor, no_restart=True)


class Host:
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
