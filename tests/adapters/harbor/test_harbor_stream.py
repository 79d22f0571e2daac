"""runner.stream over a Harbor task from a saved state (snapshot restore); cancel: 0 containers."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from llenvs_async import ScriptedBackend, State, TrajectoryRunner
from llenvs_async.adapters.harbor import HarborAdapter, HarborEnvironment, SnapshotRestore
from llenvs_async.docker.engine import DockerEngine
from llenvs_async.types import Action

from .conftest import EXAMPLES, harbor_containers, solution_policy

pytestmark = pytest.mark.docker

TASK = "csv-totals"


@pytest.mark.parametrize("schedule", ["refill", "async"])
async def test_a_stream_from_a_saved_state_cancelled_leaves_no_container(
    adapter: HarborAdapter, docker_engine: DockerEngine, schedule: str
) -> None:
    async def env_factory() -> HarborEnvironment:
        return await adapter.get_environment(EXAMPLES, max_steps=20)

    live = await env_factory()
    task = live.dataset.tasks[live.dataset.index_of(TASK)]
    solution = task.solution_commands()
    async with live:
        saved = await live.reset(TASK)
        saved = (await live.step(saved, Action(text=solution[0]))).next_state

    async def endless() -> AsyncIterator[State]:
        while True:
            yield saved

    groups: list[list[object]] = []
    got = asyncio.Event()
    async with TrajectoryRunner(
        environment=live,
        backend=ScriptedBackend(solution_policy(task)),
        env_factory=env_factory,
        restore_fn=SnapshotRestore(),
    ) as runner:

        async def consume() -> None:
            async with runner.stream(
                endless(),
                group_size=2,
                batch_size=3,
                schedule=schedule,  # type: ignore[arg-type]
            ) as stream:
                async for group in stream:
                    groups.append(group)
                    got.set()

        consumer = asyncio.create_task(consume())
        async with asyncio.timeout(120):
            await got.wait()
            while runner.stats.live_instances == 0:  # the stream keeps rolling out meanwhile
                await asyncio.sleep(0.01)
        consumer.cancel()
        with pytest.raises(asyncio.CancelledError):
            await consumer
        assert runner.stats.live_instances == 0
        assert await harbor_containers(docker_engine) == []
    assert runner.stats.peak_live_instances <= 3
    for trajectory in groups[0]:
        assert trajectory.error is None and trajectory.success  # type: ignore[attr-defined]
        assert trajectory.initial_state.step == 1  # type: ignore[attr-defined]
        method = trajectory.initial_state.info["restore"]["method"]  # type: ignore[attr-defined]
        assert method in ("replay", "snapshot")
