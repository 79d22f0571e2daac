"""Run one coroutine per request in a task group and return results in order."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine, Iterable
from typing import Any, TypeVar

__all__ = ["gather_in_order"]

T = TypeVar("T")


async def gather_in_order(coros: Iterable[Coroutine[Any, Any, T]]) -> list[T]:
    """Await every coroutine concurrently; the first failure cancels the rest and is re-raised.

    The failure is re-raised unwrapped (not as an ``ExceptionGroup``), with its own
    ``__cause__`` intact, so callers can catch ``BackendError`` directly.
    """
    try:
        async with asyncio.TaskGroup() as tg:
            tasks = [tg.create_task(coro) for coro in coros]
    except BaseExceptionGroup as group:
        first = _first_error(group)
    else:
        return [task.result() for task in tasks]
    raise first


def _first_error(group: BaseExceptionGroup[BaseException]) -> BaseException:
    """The first leaf that is not a cancellation (siblings are cancelled because of it)."""
    leaves: list[BaseException] = []
    stack: list[BaseException] = [group]
    while stack:
        exc = stack.pop(0)
        if isinstance(exc, BaseExceptionGroup):
            stack[:0] = exc.exceptions
        else:
            leaves.append(exc)
    real = [exc for exc in leaves if not isinstance(exc, asyncio.CancelledError)]
    return (real or leaves)[0]
