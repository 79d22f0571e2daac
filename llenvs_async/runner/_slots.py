"""A cap on live instances shared by concurrent runs of one runner (a service's limit)."""

from __future__ import annotations

import asyncio

__all__ = ["Slots"]


class Slots:
    """``limit`` live instances across every run that shares this object. Each run
    reports how many it holds (``update``); ``free`` is what is left for the others.
    """

    def __init__(self, limit: int) -> None:
        if limit < 1:
            raise ValueError(f"instance_limit must be >= 1, got {limit!r}")
        self.limit = limit
        self._used: dict[int, int] = {}
        self._freed = asyncio.Event()
        self.freed = 0  # times slots were given back
        self.peak = 0

    def free(self) -> int:
        return self.limit - sum(self._used.values())

    def update(self, owner: int, used: int) -> None:
        before = self._used.get(owner, 0)
        self._used[owner] = used
        self.peak = max(self.peak, self.limit - self.free())
        if used < before:
            self._give()

    def release(self, owner: int) -> None:
        if self._used.pop(owner, 0):
            self._give()

    def _give(self) -> None:
        self.freed += 1
        self._freed.set()

    async def freed_since(self, seen: int) -> None:
        """Wait until some run gives slots back after the ``freed`` count was ``seen``."""
        while self.freed == seen:
            self._freed.clear()
            await self._freed.wait()
