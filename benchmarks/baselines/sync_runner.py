"""The seed's synchronous multi-instance runner, written from its text (the baseline).

Factory calls run one after another; resets/restores and each round's steps run in a
``ThreadPoolExecutor`` (default ``min(32, cpu + 4)`` workers, a new pool per round);
each round makes one blocking batched ``generate`` call; every instance is closed in
``finally``.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from llenvs_async import (
    Action,
    ChatMessage,
    Completion,
    ErrorInfo,
    GenerationRequest,
    Observation,
    SamplingParams,
    ScriptedBackend,
    State,
    Trajectory,
    Transition,
)
from llenvs_async.backends.scripted import Policy

from .sync_env import SyncEnvironment, drive

__all__ = ["SyncLatencyBackend", "SyncTrajectoryRunner", "sync_replay_restore"]

SyncFactory = Callable[[], SyncEnvironment]
SyncRestoreFn = Callable[[SyncEnvironment, State], State]
Start = int | str | State | None


def sync_replay_restore(env: SyncEnvironment, state: State) -> State:
    """Reset to ``state.task`` and replay ``state.actions``, blocking."""
    current = env.reset(state.task, seed=state.seed)
    for action in state.actions:
        current = env.step(current, action).next_state
    return current


class SyncLatencyBackend:
    """Blocking batched generate taking ``latency`` seconds per call; ScriptedBackend's
    own code turns the policy's answers into completions.
    """

    def __init__(self, latency: float, policy: Policy) -> None:
        self.latency = latency
        self._scripted = ScriptedBackend(policy)

    def generate(
        self, requests: Sequence[GenerationRequest], params: SamplingParams
    ) -> list[Completion]:
        time.sleep(self.latency)
        return drive(self._scripted.generate(requests, params))


@dataclass(slots=True, eq=False)
class _Rollout:
    index: int
    env: SyncEnvironment
    start: Start
    initial: State | None = None
    state: State | None = None
    messages: list[ChatMessage] = field(default_factory=list)
    transitions: list[Transition] = field(default_factory=list)
    error: ErrorInfo | None = None

    def done(self, max_steps: int | None) -> bool:
        if self.error is not None or self.state is None or self.state.done:
            return True
        return max_steps is not None and len(self.transitions) >= max_steps

    def request(self) -> GenerationRequest:
        assert self.state is not None
        return GenerationRequest(
            messages=tuple(self.messages),
            rollout_index=self.index,
            step=self.state.step,
            task=self.state.task,
        )

    def trajectory(self) -> Trajectory:
        return Trajectory(
            episode_id="" if self.initial is None else self.initial.episode_id,
            initial_state=self.initial or State(observation=Observation(text="")),
            transitions=tuple(self.transitions),
            error=self.error,
            index=self.index,
        )


class SyncTrajectoryRunner:
    """The seed's threaded lockstep runner over sync environments (one per rollout)."""

    def __init__(
        self,
        backend: SyncLatencyBackend,
        env_factory: SyncFactory,
        *,
        restore_fn: SyncRestoreFn = sync_replay_restore,
        sampling_params: SamplingParams | None = None,
        max_steps: int | None = None,
        max_workers: int | None = None,
    ) -> None:
        self.backend = backend
        self.env_factory = env_factory
        self.restore_fn = restore_fn
        self.sampling_params = sampling_params or SamplingParams()
        self.max_steps = max_steps
        self.max_workers = max_workers

    def run_batch(
        self, tasks: Sequence[int | str | None], batch_size: int | None = None
    ) -> list[Trajectory]:
        return self._run(list(tasks), batch_size)

    def run_batch_from_states(
        self, states: Sequence[State], batch_size: int | None = None
    ) -> list[Trajectory]:
        return self._run(list(states), batch_size)

    def _run(self, starts: list[Start], batch_size: int | None) -> list[Trajectory]:
        size = batch_size or len(starts)
        results: list[Trajectory] = []
        for first in range(0, len(starts), size):  # chunks run one after another
            results.extend(self._run_chunk(starts[first : first + size], first))
        return results

    def _run_chunk(self, starts: list[Start], offset: int) -> list[Trajectory]:
        rollouts: list[_Rollout] = []
        try:
            for i, start in enumerate(starts, offset):  # instances made one after another
                rollouts.append(_Rollout(index=i, env=self.env_factory(), start=start))
            with ThreadPoolExecutor(self.max_workers) as pool:
                list(pool.map(self._begin, rollouts))
            while active := [r for r in rollouts if not r.done(self.max_steps)]:
                requests = [r.request() for r in active]
                completions = self.backend.generate(requests, self.sampling_params)
                with ThreadPoolExecutor(self.max_workers) as pool:  # a new pool per round
                    list(pool.map(_step, active, completions))
            return [r.trajectory() for r in rollouts]
        finally:
            for rollout in rollouts:
                rollout.env.close()

    def _begin(self, rollout: _Rollout) -> None:
        try:
            if isinstance(rollout.start, State):
                state = self.restore_fn(rollout.env, rollout.start)
            else:
                state = rollout.env.reset(rollout.start)
        except Exception as exc:
            rollout.error = ErrorInfo.from_exception(exc, phase="restore")
            return
        rollout.initial = rollout.state = state
        rollout.messages.append(ChatMessage(role="user", content=state.observation.text))


def _step(rollout: _Rollout, completion: Completion) -> None:
    assert rollout.state is not None
    action = Action(text=completion.text)
    try:
        result = rollout.env.step(rollout.state, action)
    except Exception as exc:
        rollout.error = ErrorInfo.from_exception(exc, phase="step")
        return
    rollout.transitions.append(
        Transition(
            state=rollout.state,
            action=action,
            next_state=result.next_state,
            reward=result.reward,
            completion=completion,
            info=result.info,
        )
    )
    rollout.state = result.next_state
    rollout.messages.append(ChatMessage(role="assistant", content=action.text))
    rollout.messages.append(ChatMessage(role="user", content=rollout.state.observation.text))
