"""A NON-pure in-process environment: mutable state behind simulated async I/O latency."""

from __future__ import annotations

import asyncio
import itertools
import random

from ..env import BaseEnvironment, new_episode_id
from ..errors import EnvError
from ..types import Action, Observation, State, StepResult
from ._tracker import InstanceTracker

__all__ = ["CounterEnv"]

_ids = itertools.count()


class CounterEnv(BaseEnvironment):
    """A counter living inside the instance (like a container's filesystem).

    Task ``t`` (an int) asks to reach the value ``t``; actions are ``inc``, ``dec``,
    ``add N`` and ``submit`` (reward 1.0 when the counter equals the target).
    Each reset/step awaits ``latency`` seconds (+- ``jitter``), modelling container
    I/O. Steps from any state but the current one raise ``StaleStateError``.
    An optional ``tracker`` counts live instances and concurrent resets/steps.
    """

    pure_step = False
    # Range of one episode's return (Gymnasium's attribute): one terminal reward of 0 or 1.
    reward_range = (0.0, 1.0)

    def __init__(
        self,
        *,
        latency: float = 0.0,
        reset_latency: float | None = None,
        jitter: float = 0.0,
        max_steps: int | None = 20,
        tracker: InstanceTracker | None = None,
        fail_on: str | None = None,
    ) -> None:
        super().__init__(max_steps=max_steps)
        self.latency = latency
        self.reset_latency = latency if reset_latency is None else reset_latency
        self.jitter = jitter
        self.tracker = tracker
        self.fail_on = fail_on
        self.ident = next(_ids)
        self._value = 0
        self._rng = random.Random(self.ident)
        if tracker is not None:
            tracker.opened()

    @property
    def value(self) -> int:
        return self._value

    async def _io(self, what: str, base: float) -> None:
        if self.tracker is not None:
            self.tracker.enter(what, self.ident)
        try:
            delay = base + (self._rng.uniform(-self.jitter, self.jitter) if self.jitter else 0.0)
            # sleep(0) still yields, like any real I/O, so concurrency is observable.
            await asyncio.sleep(max(delay, 0.0))
        finally:
            if self.tracker is not None:
                self.tracker.leave(what, self.ident)

    async def _reset(self, task: int | str | None, *, seed: int | None) -> State:
        if task is None:
            task = 3
        if isinstance(task, str) and task.lstrip("-").isdigit():
            task = int(task)
        if not isinstance(task, int) or isinstance(task, bool):
            raise EnvError(
                f"unknown task {task!r}: CounterEnv tasks are integer targets", task=task
            )
        await self._io("reset", self.reset_latency)
        self._value = 0
        return State(
            observation=Observation(text=f"Counter is 0. Reach {task}, then submit."),
            task=task,
            episode_id=new_episode_id(),
            seed=seed,
        )

    async def _step(self, state: State, action: Action) -> StepResult:
        await self._io("step", self.latency)
        words = action.text.strip().lower().split()
        verb = words[0] if words else ""
        if self.fail_on is not None and verb == self.fail_on:
            raise EnvError(f"CounterEnv was told to fail on {verb!r}", verb=verb)
        target = state.task
        assert isinstance(target, int)
        terminated = False
        reward = 0.0
        if verb == "inc":
            self._value += 1
        elif verb == "dec":
            self._value -= 1
        elif verb == "add" and len(words) == 2 and words[1].lstrip("-").isdigit():
            self._value += int(words[1])
        elif verb == "submit":
            terminated = True
            reward = 1.0 if self._value == target else 0.0
        step = state.step + 1
        truncated = not terminated and self.max_steps is not None and step >= self.max_steps
        next_state = state.advance(
            action,
            Observation(text=f"Counter is {self._value}.", data={"value": self._value}),
            terminated=terminated,
            truncated=truncated,
        )
        return StepResult.of(next_state, reward)

    async def _aclose(self) -> None:
        if self.tracker is not None:
            self.tracker.closed_one()
