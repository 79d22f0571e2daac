"""A rollout stream for training loops: complete groups as they finish, staleness-bounded.

Admission control (AReaL-style) keeps a yielded group's oldest action at most
``max_staleness`` policy versions behind the backend: a new group starts only when, in
the worst case (every group started before it is consumed first, the trainer bumps the
version once per ``groups_per_version`` consumed groups, learned from what it does), it
would still be yielded in bound. A group that is nevertheless too stale when it would be
yielded (a long-tailed rollout outlived several updates) is discarded, counted, and its
input rolled out again: never silently dropped.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import deque
from collections.abc import AsyncGenerator, AsyncIterable, AsyncIterator, Iterable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, Self

from .._resource import AsyncResource
from .._shield import shielded
from ..errors import ClosedError
from ..types import State, Trajectory
from ._rollout import RolloutInput
from ._source import InputSource

if TYPE_CHECKING:
    from ._lockstep import Schedule

__all__ = ["RolloutStream", "StreamInput", "StreamStats"]

_log = logging.getLogger("llenvs_async.runner")


class StreamRunner(Protocol):
    """What a stream needs of its runner (a ``TrajectoryRunner``)."""

    backend: Any
    close_timeout: float

    def _run(
        self,
        source: InputSource,
        batch_size: int,
        max_steps: int | None,
        schedule: Schedule | None,
    ) -> AsyncGenerator[Trajectory, None]: ...


StreamInput = int | str | State | None
"""A stream input: a task to ``reset`` to, or a saved ``State`` to restore and continue."""


@dataclass(slots=True)
class StreamStats:
    """Counters of a stream; ``max_staleness_seen`` is over the groups yielded."""

    groups_started: int = 0
    groups_yielded: int = 0
    rollouts_started: int = 0
    discarded_stale: int = 0  # groups too stale at yield time (their inputs were rerun)
    max_staleness_seen: int = 0
    queue_high_water: int = 0  # complete groups waiting for the consumer
    outstanding_high_water: int = 0  # groups started and not yet yielded
    groups_per_version: int = 1  # the most groups the consumer asked for at one version


class _Groups(InputSource):
    """The stream's inputs, each expanded into ``group_size`` rollouts, admitted one group
    at a time by the stream. A sync iterable is pulled inline; an async one by a pump task
    that reads one item ahead, only when the scheduler wants one."""

    def __init__(
        self, stream: RolloutStream, inputs: Iterable[Any] | AsyncIterable[Any], group_size: int
    ) -> None:
        super().__init__()
        self.stream, self.group_size = stream, group_size
        self._sync: Iterator[Any] | None = None
        self._async: AsyncIterator[Any] | None = None
        if isinstance(inputs, AsyncIterable):
            self._async = aiter(inputs)
        else:
            self._sync = iter(inputs)
        self._buffer: deque[tuple[int, Any]] = deque()  # (input number, item)
        self._retry: deque[tuple[int, Any]] = deque()  # discarded groups' inputs, first
        self._pulled = 0
        self._exhausted = False
        self._want = asyncio.Event()
        self._pump: asyncio.Task[None] | None = None
        self._error: BaseException | None = None  # raised by the async input iterator
        self.items: dict[int, tuple[int, Any]] = {}  # group -> (input number, item)
        self.start_versions: dict[int, int | None] = {}  # outstanding group -> version
        self._group = -1
        self._left = 0  # rollouts of the open group not yet taken

    def start(self) -> None:
        if self._async is not None:
            self._pump = asyncio.get_running_loop().create_task(self._run_pump(self._async))

    async def stop(self) -> None:
        """Cancel the pump and wait for it (its own errors are kept in ``_error``)."""
        if self._pump is not None and not self._pump.done():
            self._pump.cancel()
            await asyncio.wait({self._pump})

    def retry(self, group: int) -> None:
        self._retry.append(self.items.pop(group))
        self.changed()

    def available(self) -> int:
        if self._left:
            return self._left
        return self.group_size if self._next() is not None and self.stream.admits() else 0

    def take(self, n: int) -> list[RolloutInput]:
        specs: list[RolloutInput] = []
        while len(specs) < n:
            if not self._left:
                if self._next() is None or not self.stream.admits():
                    break
                self._open()
            j = self.group_size - self._left
            specs.append(_spec(self._group * self.group_size + j, self.items[self._group][1]))
            self._left -= 1
        self.stream.stats.rollouts_started += len(specs)
        return specs

    @property
    def done(self) -> bool:
        # An outstanding group may still come back (too stale to yield: rerun).
        pending = self._buffer or self._retry or self._left or self.start_versions
        return self._error is None and self._exhausted and not pending

    def _next(self) -> tuple[int, Any] | None:
        """The next input to open a group for (not taken yet), fetching it if needed."""
        if self._error is not None:
            raise self._error
        if self._retry:
            return self._retry[0]
        if not self._buffer and not self._exhausted:
            if self._sync is not None:
                try:
                    item = next(self._sync)
                except StopIteration:
                    self._exhausted = True
                else:
                    check_input(self._pulled, item)
                    self._buffer.append((self._pulled, item))
                    self._pulled += 1
            else:
                self._want.set()
        return self._buffer[0] if self._buffer else None

    def _open(self) -> None:
        queue = self._retry if self._retry else self._buffer
        self._group += 1
        self.items[self._group] = queue.popleft()
        self.start_versions[self._group] = self.stream.version()
        self._left = self.group_size
        self.stream.opened()

    async def _run_pump(self, source: AsyncIterator[Any]) -> None:
        try:
            while True:
                await self._want.wait()
                self._want.clear()
                try:
                    item = await anext(source)
                    check_input(self._pulled, item)
                except StopAsyncIteration:
                    return
                except Exception as exc:  # the user's iterator failed: the stream raises it
                    self._error = exc
                    return
                self._buffer.append((self._pulled, item))
                self._pulled += 1
                self.changed()
        finally:
            self._exhausted = True
            self.changed()


def _spec(index: int, item: Any) -> RolloutInput:
    if isinstance(item, State):
        return RolloutInput(index=index, task=item.task, state=item)
    return RolloutInput(index=index, task=item)


def check_input(number: int, item: Any) -> None:
    if not (item is None or isinstance(item, State | str) or type(item) is int):
        raise TypeError(
            f"stream inputs[{number}] must be a task (int, str or None) or a State, "
            f"got {type(item).__name__} {item!r:.60}"
        )


class RolloutStream(AsyncResource):
    """``async with runner.stream(...) as stream: async for group in stream: ...``.

    Yields ``list[Trajectory]``: the ``group_size`` rollouts of one input, in order, as soon
    as the group is complete. Rollouts run in a background task while the consumer trains;
    at most ``queue_size`` groups are outstanding (running or waiting), so a slow consumer
    pauses new work without stalling rollouts in flight. Closing it (or cancelling the
    consumer inside ``async with``) tears every instance down.
    """

    def __init__(
        self,
        runner: StreamRunner,
        inputs: Iterable[Any] | AsyncIterable[Any],
        *,
        group_size: int,
        batch_size: int,
        max_staleness: int | None,
        schedule: Schedule | None,
        max_steps: int | None,
        queue_size: int | None,
    ) -> None:
        for name, value in (("group_size", group_size), ("batch_size", batch_size)):
            if type(value) is not int or value < 1:
                raise ValueError(f"{name} must be an int >= 1, got {value!r}")
        if max_staleness is not None and (type(max_staleness) is not int or max_staleness < 0):
            raise ValueError(f"max_staleness must be an int >= 0 or None, got {max_staleness!r}")
        if queue_size is None:  # two batches' worth of groups
            queue_size = 2 * max(1, -(-batch_size // group_size))
        elif type(queue_size) is not int or queue_size < 1:
            raise ValueError(f"queue_size must be an int >= 1 or None, got {queue_size!r}")
        if isinstance(inputs, str | bytes) or not isinstance(inputs, Iterable | AsyncIterable):
            raise TypeError(
                "inputs must be an iterable or async iterable of tasks or States, "
                f"got {type(inputs).__name__}"
            )
        self._runner = runner
        self.group_size, self.batch_size = group_size, batch_size
        self.max_staleness, self.queue_size = max_staleness, queue_size
        self._schedule, self._max_steps = schedule, max_steps
        self.stats = StreamStats()
        self._source = _Groups(self, inputs, group_size)
        self._parts: dict[int, list[Trajectory | None]] = {}
        self._queue: deque[tuple[int, list[Trajectory]]] = deque()
        self._ready = asyncio.Event()
        self._producer: asyncio.Task[None] | None = None
        self._taken_at: tuple[int | None, int] = (None, 0)  # (version, groups taken at it)
        self._closed = False
        self._raised = False  # the producer's error reached the consumer

    # -- admission (called by the scheduler through the source) -------------------------

    def version(self) -> int | None:
        version = getattr(self._runner.backend, "policy_version", None)
        return version if isinstance(version, int) else None

    def outstanding(self) -> int:
        return len(self._source.start_versions)

    def admits(self) -> bool:
        """May a new group start now and still be yielded within the bounds?"""
        after = self.outstanding() + 1
        if after > self.queue_size:
            return False
        now = self.version()
        if self.max_staleness is None or now is None:
            return True
        starts = [v for v in self._source.start_versions.values() if v is not None]
        oldest = min(starts, default=now)
        per = self.stats.groups_per_version
        taken = self._taken_at[1] if self._taken_at[0] == now else 0
        return (now - oldest) + (taken + after - 1) // per <= self.max_staleness

    def opened(self) -> None:
        self.stats.groups_started += 1
        self.stats.outstanding_high_water = max(
            self.stats.outstanding_high_water, self.outstanding()
        )

    # -- production ---------------------------------------------------------------------

    def _start(self) -> None:
        if self._closed:
            raise ClosedError("RolloutStream")
        if self._producer is None:
            self._source.start()
            self._producer = asyncio.get_running_loop().create_task(self._produce())
            self._producer.add_done_callback(lambda _: self._ready.set())

    async def _produce(self) -> None:
        runs: AsyncGenerator[Trajectory, None] = self._runner._run(
            self._source, self.batch_size, self._max_steps, self._schedule
        )
        async with contextlib.aclosing(runs) as it:
            async for trajectory in it:
                assert trajectory.index is not None
                group, j = divmod(trajectory.index, self.group_size)
                parts = self._parts.setdefault(group, [None] * self.group_size)
                parts[j] = trajectory
                if all(p is not None for p in parts):
                    del self._parts[group]
                    self._queue.append((group, [p for p in parts if p is not None]))
                    self.stats.queue_high_water = max(self.stats.queue_high_water, len(self._queue))
                    self._ready.set()

    # -- consumption --------------------------------------------------------------------

    def __aiter__(self) -> Self:
        return self

    async def __anext__(self) -> list[Trajectory]:
        self._start()
        version, taken = self._taken_at
        if version == self.version():  # it wants another group at this version
            self.stats.groups_per_version = max(self.stats.groups_per_version, taken + 1)
        self._source.changed()  # admission may have opened (a version bump, a wider step)
        while True:
            while self._queue:
                group, trajectories = self._queue.popleft()
                staleness = self._staleness(trajectories)
                if self.max_staleness is not None and staleness > self.max_staleness:
                    self.stats.discarded_stale += 1
                    del self._source.start_versions[group]
                    self._source.retry(group)
                    continue
                self._yielded(group, staleness)
                return trajectories
            producer = self._producer
            assert producer is not None
            if producer.done():
                self._raised = producer.exception() is not None
                producer.result()  # a programming error or a failing input iterator
                raise StopAsyncIteration
            self._ready.clear()
            await self._ready.wait()

    def _staleness(self, trajectories: list[Trajectory]) -> int:
        now = self.version()
        versions = [v for t in trajectories for v in t.policy_versions]
        if now is None or not versions:
            return 0
        return max(now - min(versions), 0)

    def _yielded(self, group: int, staleness: int) -> None:
        del self._source.start_versions[group]
        self._source.items.pop(group, None)
        stats = self.stats
        stats.groups_yielded += 1
        stats.max_staleness_seen = max(stats.max_staleness_seen, staleness)
        now = self.version()
        version, taken = self._taken_at
        self._taken_at = (now, taken + 1 if version == now else 1)
        self._source.changed()  # a slot for a new group may have opened

    # -- lifetime -----------------------------------------------------------------------

    @property
    def closed(self) -> bool:
        return self._closed

    async def __aenter__(self) -> Self:
        await super().__aenter__()
        self._start()
        return self

    async def aclose(self) -> None:
        """Stop producing and tear every instance down (idempotent, shielded). A producer
        error the consumer never saw (it left early) is raised here."""
        if self._closed:
            return
        self._closed = True
        producer = self._producer
        if producer is not None and not producer.done():
            producer.cancel()
        try:
            if producer is not None:  # the run bounds its own teardown (close_timeout)
                await shielded(asyncio.wait({producer}), within=None)
        finally:
            timeout = self._runner.close_timeout
            try:  # the user's input iterator may ignore the cancellation
                await shielded(self._source.stop(), within=timeout)
            except TimeoutError:
                _log.warning("stream input iterator still running %ss after close", timeout)
        if producer is not None and not producer.cancelled():
            error = producer.exception()
            if error is not None and not self._raised:
                raise error
