"""The one way to run cleanup (closing an instance, removing a container, aborting a
request) to completion despite cancellation of the caller, bounded in time.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import TypeVar

__all__ = ["shielded"]

T = TypeVar("T")


async def shielded(work: Awaitable[T], *, within: float | None, grace: float | None = None) -> T:
    """Await ``work`` to its end even if the caller is cancelled meanwhile, then re-raise
    the cancellation.

    ``within`` bounds the work (``TimeoutError`` after it, the work cancelled). Once the
    caller is cancelled the work gets at most ``grace`` more seconds (default: no
    further bound than ``within``). Repeated cancellations (anyio re-delivers them) are
    held back the same way. Runs the work in its own task, so neither asyncio's
    ``Task.cancel()`` nor an anyio cancel scope can interrupt it half-way.
    """

    async def bounded() -> T:
        async with asyncio.timeout(within):
            return await work

    task = asyncio.ensure_future(work if within is None else bounded())
    loop = asyncio.get_running_loop()
    deadline: float | None = None
    cancelled: asyncio.CancelledError | None = None
    while not task.done():
        try:
            if deadline is None:
                await asyncio.shield(task)
            else:
                remaining = deadline - loop.time()
                if remaining <= 0:
                    task.cancel()
                    deadline = None  # wait for the cancelled work to unwind, unbounded
                    continue
                await asyncio.wait({task}, timeout=remaining)
        except asyncio.CancelledError as exc:
            if cancelled is None and grace is not None:
                deadline = loop.time() + grace
            cancelled = cancelled or exc  # the first one: anyio knows its scope's by message
    if cancelled is not None:
        if not task.cancelled():
            task.exception()  # retrieved: the caller's cancellation takes precedence
        raise cancelled
    return task.result()
