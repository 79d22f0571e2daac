"""Where a run's inputs come from: pulled lazily, a few at a time, so a source may be endless."""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Iterable

from ._rollout import RolloutInput

__all__ = ["InputSource", "SpecSource"]


class InputSource:
    """The scheduler's view of its inputs: how many it may take now (``available``),
    taking them (``take``), whether any will ever come again (``done``) and waiting for
    that to change (``changed_since``). Subclasses override ``available``/``take``/``done``
    and call ``changed()`` when more may be taken (an input arrived, admission opened).
    """

    def __init__(self) -> None:
        self.changes = 0
        self._event = asyncio.Event()

    def available(self) -> int:
        raise NotImplementedError

    def take(self, n: int) -> list[RolloutInput]:
        raise NotImplementedError

    @property
    def done(self) -> bool:
        raise NotImplementedError

    @property
    def static(self) -> bool:
        """True when ``available`` changes only by ``take`` (no waiting is ever needed)."""
        return False

    def changed(self) -> None:
        self.changes += 1
        self._event.set()

    async def changed_since(self, seen: int) -> None:
        """Wait until ``changed()`` is called after the ``changes`` count was ``seen``."""
        while self.changes == seen:
            self._event.clear()
            await self._event.wait()


class SpecSource(InputSource):
    """A finite list of inputs, all available at once (the run methods)."""

    def __init__(self, specs: Iterable[RolloutInput]) -> None:
        super().__init__()
        self._pending = deque(specs)

    def available(self) -> int:
        return len(self._pending)

    def take(self, n: int) -> list[RolloutInput]:
        pending = self._pending
        return [pending.popleft() for _ in range(min(n, len(pending)))]

    @property
    def done(self) -> bool:
        return not self._pending

    @property
    def static(self) -> bool:
        return True
