"""Run cleanup to completion despite cancellation of the caller, bounded in time."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any, TypeVar

__all__ = ["shielded"]

T = TypeVar("T")


async def shielded(coro: Coroutine[Any, Any, T], *, within: float | None) -> T:
    """Await ``coro`` to its end even if the caller is cancelled meanwhile, then re-raise
    the cancellation; ``TimeoutError`` after ``within`` seconds.
    """

    async def bounded() -> T:
        async with asyncio.timeout(within):
            return await coro

    task = asyncio.ensure_future(bounded())
    cancelled = False
    while not task.done():
        try:
            await asyncio.shield(task)
        except asyncio.CancelledError:
            cancelled = True
    if cancelled:
        if not task.cancelled():
            task.exception()  # retrieved: the caller's cancellation takes precedence
        raise asyncio.CancelledError
    return task.result()
