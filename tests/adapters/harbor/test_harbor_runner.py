"""The seed's call pattern: TrajectoryRunner + env_factory + harbor_restore on saved states."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import pytest

from llenvs_async import ScriptedBackend, TrajectoryRunner
from llenvs_async.adapters.harbor import HarborAdapter, HarborEnvironment, harbor_restore
from llenvs_async.docker.engine import DockerEngine
from llenvs_async.types import Action, SamplingParams

from .conftest import EXAMPLES, harbor_containers, solution_policy

pytestmark = pytest.mark.docker

TASK = "build-release"


@asynccontextmanager
async def peak_containers(engine: DockerEngine) -> AsyncIterator[list[int]]:
    """Poll the engine for this process's Harbor containers; yields ``[peak]``."""
    peak = [0]
    stop = asyncio.Event()

    async def poll() -> None:
        while not stop.is_set():
            peak[0] = max(peak[0], len(await harbor_containers(engine)))
            await asyncio.sleep(0.02)

    poller = asyncio.create_task(poll())
    try:
        yield peak
    finally:
        stop.set()
        await poller


async def test_run_batch_from_states_with_the_seed_call_pattern(
    adapter: HarborAdapter, docker_engine: DockerEngine
) -> None:
    env = await adapter.get_environment(EXAMPLES, max_steps=30)
    created = 0

    async def env_factory() -> HarborEnvironment:
        nonlocal created
        created += 1
        return await adapter.get_environment(EXAMPLES, max_steps=30)

    task = (await adapter.get_dataset(EXAMPLES)).tasks[env.dataset.index_of(TASK)]
    runner = TrajectoryRunner(
        environment=env,
        backend=ScriptedBackend(solution_policy(task)),
        sampling_params=SamplingParams(temperature=0.0),
        env_factory=env_factory,
        restore_fn=harbor_restore,
    )
    async with env:
        (live,) = await runner.run_batch([TASK])
        assert live.success and live.error is None
        solution = task.solution_commands()
        assert len(live) == len(solution) + 1  # every command, then SUBMIT
        saved = [s for s in live.states if 0 < s.step <= len(solution)]  # mid-trajectory states
        assert len(saved) == len(solution) >= 6

        async with peak_containers(docker_engine) as peak:
            trajectories = await runner.run_batch_from_states(saved, batch_size=4)
        assert [t.initial_state.step for t in trajectories] == [s.step for s in saved]
        assert all(t.error is None and t.success for t in trajectories), [
            t.error for t in trajectories
        ]
        assert [len(t) for t in trajectories] == [len(solution) + 1 - s.step for s in saved]
        assert 0 < peak[0] <= 4
        assert runner.stats.peak_live_instances == 4
        assert created == 1 + len(saved)
    assert await harbor_containers(docker_engine) == []


async def test_run_batch_from_state_actions_estimates_q_values(
    adapter: HarborAdapter, docker_engine: DockerEngine
) -> None:
    async def env_factory() -> HarborEnvironment:
        return await adapter.get_environment(EXAMPLES, max_steps=30)

    env = await env_factory()
    task = env.dataset.tasks[env.dataset.index_of(TASK)]
    solution = task.solution_commands()
    async with env:
        state = await env.reset(TASK)
        for command in solution[:3]:  # cd, mkdir build, write VERSION
            state = (await env.step(state, Action(text=command))).next_state

    runner = TrajectoryRunner(
        environment=env,
        backend=ScriptedBackend(solution_policy(task)),
        env_factory=env_factory,
        restore_fn=harbor_restore,
    )
    good = Action(text=f"```bash\n{solution[3]}\n```")  # the right next step (compile)
    bad = Action(text="rm -f build/VERSION")  # breaks the chain: compile will fail
    actions = [good, bad, good, bad, good, bad]
    async with peak_containers(docker_engine) as peak:
        trajectories = await runner.run_batch_from_state_actions(
            [state] * len(actions), actions, batch_size=4
        )
    assert [t.actions[0] for t in trajectories] == actions
    assert [t.final_state.terminated for t in trajectories] == [True] * len(actions)
    assert [t.transitions[-1].reward for t in trajectories] == [1.0, 0.0] * 3
    assert 0 < peak[0] <= 4
    assert await harbor_containers(docker_engine) == []
