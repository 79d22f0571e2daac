"""The one shielded primitive: cleanup runs to its end despite cancellation, bounded."""

from __future__ import annotations

import asyncio

import anyio
import pytest

from llenvs_async._shield import shielded


async def test_shielded_finishes_cleanup_then_reraises_cancellation() -> None:
    finished: list[str] = []
    gate = asyncio.Event()

    async def cleanup() -> str:
        await gate.wait()
        finished.append("done")
        return "ok"

    task = asyncio.create_task(shielded(cleanup(), within=10))
    await asyncio.sleep(0)
    task.cancel()
    await asyncio.sleep(0)
    assert not task.done()  # still waiting for the cleanup
    gate.set()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert finished == ["done"]
    assert await shielded(cleanup(), within=1) == "ok"
    with pytest.raises(TimeoutError):
        await shielded(asyncio.Event().wait(), within=0.01)


async def test_grace_bounds_the_work_once_the_caller_is_cancelled() -> None:
    cancelled_inside: list[bool] = []

    async def slow() -> None:
        try:
            await asyncio.sleep(10)
        except asyncio.CancelledError:
            cancelled_inside.append(True)
            raise

    task = asyncio.create_task(shielded(slow(), within=None, grace=0.05))
    await asyncio.sleep(0.01)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert cancelled_inside == [True]  # the work got its grace, then was cancelled


async def test_an_anyio_cancel_scope_cannot_cut_the_work_short() -> None:
    done: list[str] = []

    async def cleanup() -> None:
        await asyncio.sleep(0.05)
        done.append("closed")

    with anyio.move_on_after(0.01):
        await shielded(cleanup(), within=5)
    assert done == ["closed"]
