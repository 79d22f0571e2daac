"""One run's scheduling state, shared by the lockstep and the async schedulers."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from typing import Any

from .._shield import shielded
from ..types import Trajectory
from ._config import RunConfig
from ._instances import Closer, prepare_one
from ._rollout import Rollout
from ._slots import Slots
from ._source import InputSource

__all__ = ["Run", "first_of"]

_log = logging.getLogger("llenvs_async.runner")


class Run:
    """One call's scheduling state: what is pending, preparing, live and closing."""

    def __init__(
        self,
        source: InputSource,
        cfg: RunConfig,
        limit: int,
        shared: Slots | None,
    ) -> None:
        self.cfg, self.limit, self.shared = cfg, limit, shared
        self.source = source
        self.started: list[Rollout] = []
        self.active: list[Rollout] = []
        self.new: list[Rollout] = []  # prepared: they join the next round
        self.driving = 0  # the async schedule's running rollouts (not kept in ``active``)
        self.preparing: dict[asyncio.Task[None], Rollout] = {}
        self.emitted = 0
        self.closer = Closer(cfg, on_freed=self.freed)
        self.on_change: Callable[[], None] | None = None  # an instance closed: a slot freed

    def live(self) -> int:
        """Rollouts holding (or about to hold) an instance, closing ones included."""
        busy = sum(1 for r in self.active if not r.finished)
        busy += sum(1 for r in self.new if not r.finished)
        return busy + self.driving + len(self.preparing) + self.closer.closing

    def freed(self) -> None:
        self.report()
        if self.on_change is not None:
            self.on_change()

    def report(self) -> None:
        if self.shared is not None:
            self.shared.update(id(self), self.live())

    def room(self) -> int:
        free = min(self.limit - self.live(), self.source.available())
        if self.shared is not None:
            self.report()
            free = min(free, self.shared.free())
        return max(free, 0)

    def take(self, n: int) -> list[Rollout]:
        batch = [Rollout(spec=spec) for spec in self.source.take(n)]
        self.started.extend(batch)
        self.cfg.stats.rollouts_started(n)
        return batch

    def fill(self) -> list[Rollout]:
        """Take inputs for every free slot (a source may offer them a group at a time)."""
        taken: list[Rollout] = []
        while (n := self.room()) > 0:
            batch = self.take(n)
            if not batch:
                break
            taken.extend(batch)
            self.driving += len(batch)  # counted live until the caller accounts for them
        self.driving -= len(taken)
        return taken

    def spawn(self) -> None:
        """Start preparing as many pending inputs as there are free slots (background)."""
        loop = asyncio.get_running_loop()
        for rollout in self.fill():
            task = loop.create_task(prepare_one(rollout, self.cfg, self.closer, own_task=True))
            self.preparing[task] = rollout
        self.report()

    def harvest(self) -> None:
        """Move finished preparations to ``new``; a programming error in one propagates."""
        for task in [t for t in self.preparing if t.done()]:
            rollout = self.preparing.pop(task)
            task.result()
            self.new.append(rollout)

    def room_waits(self) -> list[Coroutine[Any, Any, Any]]:
        """What frees a slot: one of our instances closing, a preparation ending, or
        (shared cap) another run giving slots back."""
        waits: list[Coroutine[Any, Any, Any]] = [self.closer.freed_since(self.closer.freed)]
        running = {t for t in self.preparing if not t.done()}  # a done one wakes nobody again
        if running:
            waits.append(asyncio.wait(running, return_when=asyncio.FIRST_COMPLETED))
        return waits + self.outside_waits()

    def outside_waits(self) -> list[Coroutine[Any, Any, Any]]:
        """What changes the room from outside this run: another run giving slots back
        (shared cap), the source offering more inputs."""
        waits: list[Coroutine[Any, Any, Any]] = []
        if self.shared is not None:
            waits.append(self.shared.freed_since(self.shared.freed))
        if not self.source.done:
            waits.append(self.source.changed_since(self.source.changes))
        return waits

    def emit(self, rollout: Rollout) -> Trajectory:
        """A finished rollout's trajectory, counted in the stats."""
        stats = self.cfg.stats
        stats.active_rollouts -= 1
        if rollout.error is None:
            stats.completed += 1
        else:
            stats.failed += 1
        self.emitted += 1
        return rollout.trajectory()

    async def end(self, stop: Awaitable[None]) -> None:
        """The run ends (done, failed or cancelled): rollouts not emitted leave the stats,
        ``stop`` ends the scheduler's tasks, then every instance is closed (shielded and
        bounded) and the shared slots are given back, whatever ``stop`` raised."""
        self.cfg.stats.active_rollouts -= len(self.started) - self.emitted
        try:
            await stop
        finally:
            await self.closer.drain(self.started)
            if self.shared is not None:
                self.shared.release(id(self))

    async def stop_preparing(self) -> None:
        """Cancel preparations still running (see ``stop``)."""
        await self.stop(self.preparing, "rollout preparation")
        self.preparing.clear()

    async def stop(self, tasks: dict[asyncio.Task[None], Rollout], what: str) -> None:
        """Cancel ``tasks`` (each one rollout's, cancelled by nothing else). One inside its
        factory call first gets ``close_timeout`` to finish it (its instance is then closed
        at once: the closer is shut). A task still running after twice that is logged, not
        raised (teardown goes on)."""
        self.closer.shut = True
        running = {t for t in tasks if not t.done()}
        if not running:
            return
        creating = {t for t in running if tasks[t].creating}
        for task in running - creating:
            task.cancel()
        try:
            if creating:
                await shielded(asyncio.wait(creating), within=self.cfg.close_timeout)
        except TimeoutError:
            pass  # cancelled below
        for task in creating:
            task.cancel()
        try:
            await shielded(asyncio.wait(running), within=self.cfg.close_timeout)
        except TimeoutError:
            still = sum(1 for t in running if not t.done())
            _log.warning("%d %s(s) still running at teardown", still, what)
        for task in tasks:
            if task.done() and not task.cancelled():
                task.exception()  # retrieved: the run is ending for another reason


async def first_of(
    waits: Sequence[Coroutine[Any, Any, Any]], keep: asyncio.Future[Any] | None = None
) -> None:
    """Wait until ``keep`` is done or the first of ``waits`` returns; the waits left are
    cancelled and awaited, so none outlives the call (``keep`` is not cancelled)."""
    tasks = [asyncio.ensure_future(w) for w in waits]
    try:
        await asyncio.wait({*tasks, *([keep] if keep else [])}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        left = {task for task in tasks if not task.done()}
        for task in left:
            task.cancel()
        if left:  # plain waits: each ends at its next step (cheap, no shield needed)
            await asyncio.wait(left)
