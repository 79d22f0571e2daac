"""Synchronous environments for the baseline, over the very environments the framework runs."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Coroutine
from types import TracebackType
from typing import Any, Protocol, TypeVar

from llenvs_async import Action, Environment, State, StepResult

from .._workload import LoggedCounterEnv

__all__ = ["LoopThread", "SyncCounterEnv", "SyncEnvironment", "ThreadedEnv", "drive"]

T = TypeVar("T")


class SyncEnvironment(Protocol):
    """The seed's environment interface: blocking reset, step and close."""

    max_steps: int | None

    def reset(self, task: int | str | None = None, *, seed: int | None = None) -> State: ...

    def step(self, state: State, action: Action) -> StepResult: ...

    def close(self) -> None: ...


def drive(coro: Coroutine[Any, Any, T]) -> T:
    """Run a coroutine that never suspends (its I/O blocks) to completion, synchronously."""
    try:
        coro.send(None)
    except StopIteration as done:
        return done.value  # type: ignore[no-any-return]
    coro.close()
    raise RuntimeError("drive() needs a coroutine that never suspends; this one awaited I/O")


class _BlockingCounterEnv(LoggedCounterEnv):
    """The same CounterEnv and jittered latency, but each I/O blocks in ``time.sleep``."""

    async def _io(self, what: str, base: float) -> None:
        self._bases.append(base)
        jitter = self._rng.uniform(-self.jitter, self.jitter) if self.jitter else 0.0
        time.sleep(max(base + jitter, 0.0))  # noqa: ASYNC251 (blocking on purpose)


class SyncCounterEnv:
    """The sync CounterEnv twin: CounterEnv's own code, driven in the calling thread."""

    def __init__(self, **kwargs: Any) -> None:
        self.env = _BlockingCounterEnv(**kwargs)
        self.max_steps = self.env.max_steps

    @property
    def delays(self) -> list[float]:
        return self.env.delays

    def reset(self, task: int | str | None = None, *, seed: int | None = None) -> State:
        return drive(self.env.reset(task, seed=seed))

    def step(self, state: State, action: Action) -> StepResult:
        return drive(self.env.step(state, action))

    def close(self) -> None:
        drive(self.env.aclose())


class LoopThread:
    """An event loop in a daemon thread: blocking callers submit coroutines to it."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self._thread.start()

    def call(self, coro: Coroutine[Any, Any, T]) -> T:
        """Run ``coro`` on the loop and block until its result."""
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result()

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join()
        self.loop.close()

    def __enter__(self) -> LoopThread:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


class ThreadedEnv:
    """A blocking view of an async ``Environment`` (e.g. a container) living on a LoopThread."""

    def __init__(self, env: Environment, loop: LoopThread) -> None:
        self.env = env
        self.loop = loop
        self.max_steps = env.max_steps

    def reset(self, task: int | str | None = None, *, seed: int | None = None) -> State:
        return self.loop.call(self.env.reset(task, seed=seed))

    def step(self, state: State, action: Action) -> StepResult:
        return self.loop.call(self.env.step(state, action))

    def close(self) -> None:
        self.loop.call(self.env.aclose())
