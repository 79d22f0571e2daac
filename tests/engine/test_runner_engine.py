"""The runner end to end with the real engine: a pure env, and a Harbor task in a container."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import pytest

from llenvs_async import TrajectoryRunner
from llenvs_async.adapters.harbor import HarborAdapter
from llenvs_async.backends.vllm import VLLMBackend
from llenvs_async.env import Environment
from llenvs_async.envs import ArithmeticEnv
from llenvs_async.types import ChatMessage, SamplingParams, State, Trajectory, Transition

from ..cli._docker import docker_ready  # noqa: F401  (a fixture)
from .conftest import MAX_MODEL_LEN, Engine

pytestmark = pytest.mark.asyncio(loop_scope="session")

EXAMPLE_TASKS = Path(__file__).resolve().parents[2] / "examples" / "tasks"


def params(seed: int | None) -> SamplingParams:
    return SamplingParams(max_tokens=16, temperature=1.0, logprobs=0, seed=seed)


def check_generated(trajectory: Trajectory) -> None:
    """Every generated action carries the engine's token ids and one logprob per token."""
    assert trajectory.error is None, trajectory.error
    assert trajectory.transitions
    for transition in trajectory.transitions:
        completion = transition.completion
        assert completion is not None
        assert completion.token_ids and completion.prompt_token_ids
        assert completion.logprobs is not None
        assert len(completion.logprobs) == len(completion.token_ids)
        assert completion.text == transition.action.text


def actions(trajectories: Sequence[Trajectory]) -> list[tuple[tuple[int, ...], ...]]:
    return [
        tuple(t.completion.token_ids for t in tr.transitions if t.completion is not None)
        for tr in trajectories
    ]


async def test_pure_env_rollouts_carry_token_ids_and_logprobs(engine: Engine) -> None:
    async with ArithmeticEnv(max_steps=3) as env:
        runner = TrajectoryRunner(env, VLLMBackend(engine.llm), params(seed=0))
        trajectories = await runner.run_batch(list(range(6)))
    assert len(trajectories) == 6
    for trajectory in trajectories:
        check_generated(trajectory)
        assert trajectory.stop_reason in ("terminated", "truncated")


async def test_sixteen_rollouts_from_one_state_differ_and_a_base_seed_reproduces_them(
    engine: Engine,
) -> None:
    async with ArithmeticEnv(max_steps=3) as env:
        runner = TrajectoryRunner(env, VLLMBackend(engine.llm), params(seed=0))
        [start] = await runner.run_batch([4], max_steps=1)
        state = start.final_state
        assert not state.done
        rerun = TrajectoryRunner(env, VLLMBackend(engine.llm), params(seed=123))
        first = await rerun.run_batch_from_states([state] * 16)
        again = await rerun.run_batch_from_states([state] * 16)
        other = await TrajectoryRunner(
            env, VLLMBackend(engine.llm), params(seed=124)
        ).run_batch_from_states([state] * 16)
    for trajectory in first:
        check_generated(trajectory)
    assert len(set(actions(first))) > 1  # independent samples, not 16 copies
    assert actions(again) == actions(first)  # same base seed: the same samples
    assert actions(other) != actions(first)


async def test_one_prompt_over_the_context_window_ends_only_its_rollout(engine: Engine) -> None:
    def prompt(initial: State, transitions: Sequence[Transition]) -> list[ChatMessage]:
        text = str(initial.observation.text)
        if initial.task == 1:  # this rollout's prompt does not fit the context window
            text = "pad " * (MAX_MODEL_LEN * 2)
        return [ChatMessage(role="user", content=text)]

    async with ArithmeticEnv(max_steps=2) as env:
        backend = VLLMBackend(engine.llm)
        runner = TrajectoryRunner(env, backend, params(seed=1), prompt_builder=prompt)
        trajectories = await runner.run_batch([0, 1, 2, 3])
    long = trajectories[1]
    assert long.stop_reason == "context_length"
    assert long.error is None and long.transitions == ()
    for i in (0, 2, 3):
        check_generated(trajectories[i])
        assert trajectories[i].stop_reason in ("terminated", "truncated")


@pytest.mark.docker
@pytest.mark.usefixtures("docker_ready")
async def test_harbor_task_in_a_container_with_the_real_engine(engine: Engine) -> None:
    adapter = HarborAdapter()
    env = await adapter.get_environment(EXAMPLE_TASKS, max_steps=2, command_timeout_sec=20)

    async def factory() -> Environment:
        return await adapter.get_environment(EXAMPLE_TASKS, max_steps=2, command_timeout_sec=20)

    backend = VLLMBackend(engine.llm)
    runner = TrajectoryRunner(env, backend, params(seed=2), env_factory=factory, step_timeout=60)
    async with env:
        trajectories = await runner.run_batch(["json-config", "csv-totals"])
        await runner.aclose()
    assert len(trajectories) == 2
    for trajectory in trajectories:
        check_generated(trajectory)
        assert trajectory.stop_reason in ("terminated", "truncated")
    # docker_ready's teardown asserts this process left no container behind.
