"""The async schedule: no round barrier. Each rollout generates as soon as its last step
returned; requests that become ready close together share one ``generate`` call.

Every rollout runs in one task (a driver) for its whole life: prepare (instance, restore),
then generate, step, repeat. The ``Batcher`` holds a ready request for at most
``coalesce_window`` seconds so that others becoming ready meanwhile join its call, and
flushes at once when no rollout is busy (preparing or stepping: nobody else could join).
Slots, refill, preparation and background teardown are the lockstep scheduler's (``Run``,
``prepare_one``, ``Closer``); generate and step are its functions too, so caps and failure
recording are the same.
"""

from __future__ import annotations

import asyncio
import copy
import logging
from collections import deque
from collections.abc import AsyncGenerator

from .._shield import shielded
from ..types import Trajectory
from ._config import RunConfig
from ._instances import prepare_one
from ._lockstep import generate_actions, hand_steps, step_rollout
from ._rollout import Rollout
from ._run import Run, first_of
from ._slots import Slots
from ._source import InputSource

__all__ = ["Batcher", "run_async"]

_log = logging.getLogger("llenvs_async.runner")


class Batcher:
    """Coalesces generate requests into backend calls (several calls may be in flight)."""

    def __init__(self, cfg: RunConfig) -> None:
        self.cfg = cfg
        self.window = cfg.coalesce_window
        self.busy = 0  # drivers that may still ask: stepping, or about to
        self._waiting: list[tuple[Rollout, asyncio.Future[None]]] = []
        self._timer: asyncio.TimerHandle | None = None
        self.calls: set[asyncio.Task[None]] = set()
        self.stopped = False

    async def generate(self, rollout: Rollout) -> None:
        """Give ``rollout`` its next action (or record why it has none)."""
        future = asyncio.get_running_loop().create_future()
        entry = (rollout, future)
        self._waiting.append(entry)
        self.busy -= 1
        if self.busy <= 0:
            self.flush()
        elif self._timer is None:
            self._timer = asyncio.get_running_loop().call_later(self.window, self.flush)
        try:
            await future
        except asyncio.CancelledError:
            if entry in self._waiting:  # not sent yet: it will not be
                self._waiting.remove(entry)
                self.busy += 1
            raise

    def left(self) -> None:
        """A driver ended: if everyone else is waiting, nobody else will join."""
        self.busy -= 1
        if self.busy <= 0 and self._waiting:
            self.flush()

    def flush(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if not self._waiting or self.stopped:
            return
        batch, self._waiting = self._waiting, []
        task = asyncio.get_running_loop().create_task(self._call(batch))
        self.calls.add(task)
        task.add_done_callback(self.calls.discard)

    async def _call(self, batch: list[tuple[Rollout, asyncio.Future[None]]]) -> None:
        try:
            await generate_actions([rollout for rollout, _ in batch], self.cfg)
        except BaseException as exc:  # a programming error or a cancellation: to the drivers
            self.busy += len(batch)
            for i, (_, future) in enumerate(batch):
                if not future.done():
                    if isinstance(exc, asyncio.CancelledError):
                        future.cancel()
                    else:  # one object raised in several tasks would chain into itself
                        future.set_exception(exc if i == 0 else _copy(exc))
            return
        # Counted busy before any of them resumes: the first to ask again must wait for
        # its batch-mates, not flush alone.
        self.busy += len(batch)
        for _, future in batch:
            if not future.done():
                future.set_result(None)

    def stop(self) -> set[asyncio.Task[None]]:
        """Cancel the calls in flight (returned, to be awaited); nothing is sent after this."""
        self.stopped = True
        if self._timer is not None:
            self._timer.cancel()
        for task in self.calls:
            task.cancel()
        return set(self.calls)


async def _drive(rollout: Rollout, cfg: RunConfig, batcher: Batcher, run: Run) -> None:
    """One rollout in one task: its instance and start state, then generate, step, repeat.
    Counted busy from its creation: a rollout still being prepared may ask soon."""
    tokens, closer = cfg.tokens, run.closer
    try:
        # A failure is recorded (and closed) there; a teardown mid-creation ends it.
        await prepare_one(rollout, cfg, closer, own_task=True)
        if closer.shut:
            return
        if tokens is not None and not rollout.finished:
            await tokens.start([rollout], cfg.preamble)
        while not rollout.finished:
            if rollout.pending_action is None:
                await batcher.generate(rollout)
                if rollout.finished:  # failed or over the context window in generate
                    break
            await step_rollout(rollout, cfg, closer)
            if tokens is not None:
                await tokens.extend([rollout])
            hand_steps((rollout,), cfg)
    finally:
        batcher.left()
        run.driving -= 1  # now, not when the loop sees it: its instance counts as closing
        if rollout.finished:
            closer.close(rollout)  # in the background; idempotent


async def run_async(
    source: InputSource, cfg: RunConfig, limit: int, shared: Slots | None = None
) -> AsyncGenerator[Trajectory, None]:
    """Like ``run_rollouts`` (same slots, refill, teardown, yields as rollouts finish) with
    the async schedule. Drivers are plain tasks, none open across a ``yield``; ``finally``
    cancels them and closes every instance, shielded and bounded."""
    run = Run(source, cfg, limit, shared)
    batcher = Batcher(cfg)
    loop = asyncio.get_running_loop()
    wake = asyncio.Event()
    drivers: dict[asyncio.Task[None], Rollout] = {}
    ended: deque[asyncio.Task[None]] = deque()

    def on_end(task: asyncio.Task[None]) -> None:
        ended.append(task)
        wake.set()

    run.on_change = wake.set  # an instance closed: its slot is free
    try:
        while True:
            while ended:  # emitted before their slots are refilled
                task = ended.popleft()
                rollout = drivers.pop(task)
                task.result()  # a programming error propagates
                yield run.emit(rollout)
            for rollout in run.fill():
                batcher.busy += 1
                task = loop.create_task(_drive(rollout, cfg, batcher, run))
                drivers[task] = rollout
                run.driving += 1
                task.add_done_callback(on_end)
            run.report()
            if source.done and not drivers:
                break
            if not ended:
                wake.clear()
                if run.shared is None and (source.done or source.static):
                    await wake.wait()  # the common case: no helper tasks per wake-up
                    continue
                await first_of([wake.wait(), *run.outside_waits()])
    finally:
        await run.end(_stop(drivers, batcher, run))


async def _stop(drivers: dict[asyncio.Task[None], Rollout], batcher: Batcher, run: Run) -> None:
    """Cancel every generate call and driver still running (bounded, shielded; a driver
    inside its factory call gets ``close_timeout`` to finish it: ``Run.stop``)."""
    calls = batcher.stop()  # first: a driver that ends now sends nothing
    try:
        await run.stop(drivers, "rollout")
    finally:
        if calls:
            try:
                await shielded(asyncio.wait(calls), within=run.cfg.close_timeout)
            except TimeoutError:  # logged, not raised: it would mask why the run ends
                still = sum(1 for t in calls if not t.done())
                _log.warning("%d generate call(s) still running at teardown", still)


def _copy(exc: BaseException) -> BaseException:
    """A fresh instance of ``exc`` (same type and arguments), else ``exc`` itself."""
    try:
        twin = copy.copy(exc)
    except Exception:
        return exc
    twin.__traceback__ = None
    return twin
