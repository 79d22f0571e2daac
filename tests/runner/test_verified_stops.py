"""Every stop the runner makes is verified when the environment can verify: the context
window (after a step, or before any: ``end_reward``) and the runner's ``max_steps``; and
what chat mode re-sends of earlier turns (their reasoning only when kept)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from llenvs_async import TrajectoryRunner
from llenvs_async.env import BaseEnvironment, new_episode_id
from llenvs_async.errors import ContextLengthError
from llenvs_async.serialization import JsonlWriter, read_trajectories
from llenvs_async.types import (
    Action,
    Completion,
    GenerationError,
    GenerationRequest,
    Observation,
    SamplingParams,
    State,
    StepResult,
)


class Solvable(BaseEnvironment):
    """Any step solves it; ``verify_stop`` says so (1.0) and records why it was asked."""

    def __init__(self) -> None:
        super().__init__()
        self.stops: list[tuple[int, str]] = []
        self.solved = False

    async def _reset(self, task: int | str | None, *, seed: int | None) -> State:
        return State(observation=Observation(text="go"), episode_id=new_episode_id())

    async def _step(self, state: State, action: Action) -> StepResult:
        self.solved = True
        return StepResult.of(state.advance(action, Observation(text="ok")))

    async def verify_stop(self, state: State, reason: str) -> tuple[float, Mapping[str, Any]]:
        self.stops.append((state.step, reason))
        return (1.0 if self.solved else 0.5), {"verified": True}


class OverAt:
    """Completions until ``step``, then the context window is full."""

    def __init__(self, step: int) -> None:
        self.step = step

    async def generate(
        self, requests: Sequence[GenerationRequest], params: SamplingParams
    ) -> list[Completion | GenerationError]:
        return [
            GenerationError(error=ContextLengthError("too long"))
            if r.step >= self.step
            else Completion(text="x")
            for r in requests
        ]

    async def aclose(self) -> None:
        return None


async def test_the_context_window_after_a_step_is_verified_onto_that_step() -> None:
    env = Solvable()
    [traj] = await TrajectoryRunner(env, OverAt(1)).run_batch([None])
    assert traj.stop_reason == "context_length" and len(traj) == 1
    assert env.stops == [(1, "context_length")]
    last = traj.transitions[-1]
    assert last.reward == 1.0 and last.info["truncation_reason"] == "context_length"
    assert last.next_state.truncated and traj.success and traj.end_reward == 0.0


async def test_a_start_over_the_window_is_verified_into_end_reward(tmp_path: Path) -> None:
    env = Solvable()
    [traj] = await TrajectoryRunner(env, OverAt(0)).run_batch([None])
    assert traj.stop_reason == "context_length" and len(traj) == 0
    assert env.stops == [(0, "context_length")]
    assert traj.end_reward == 0.5 and traj.total_reward == 0.5
    assert traj.discounted_return(0.9) == 0.5
    assert traj.info["end_verdict"] == {"verified": True, "truncation_reason": "context_length"}
    path = tmp_path / "t.jsonl"
    with JsonlWriter(path) as writer:
        writer.write_trajectory(traj)
    [back] = read_trajectories(path)
    assert back.end_reward == 0.5 and back.total_reward == 0.5


async def test_the_runners_max_steps_is_verified_once() -> None:
    env = Solvable()
    [traj] = await TrajectoryRunner(env, OverAt(99), max_steps=2).run_batch([None])
    assert traj.stop_reason == "max_steps" and len(traj) == 2
    assert env.stops == [(2, "max_steps")]
    assert [t.reward for t in traj.transitions] == [0.0, 1.0]


async def test_chat_mode_resends_reasoning_only_when_kept() -> None:
    """Earlier turns go back without their reasoning (as Qwen3's template does) unless the
    runner keeps it; the completion keeps it either way."""
    from llenvs_async import ScriptedBackend
    from llenvs_async.envs import ChainEnv

    seen: list[GenerationRequest] = []

    def policy(request: GenerationRequest) -> Completion:
        seen.append(request)
        return Completion(text="right", reasoning=f"thought {request.step}")

    for keep in (False, True):
        seen.clear()
        runner = TrajectoryRunner(
            ChainEnv(min_length=2, num_tasks=1), ScriptedBackend(policy), keep_reasoning=keep
        )
        [traj] = await runner.run_batch([0])
        assert traj.transitions[0].completion is not None
        assert traj.transitions[0].completion.reasoning == "thought 0"
        [earlier] = [m for m in seen[-1].messages if m.role == "assistant"][:1]
        assert earlier.reasoning == ("thought 0" if keep else None)
