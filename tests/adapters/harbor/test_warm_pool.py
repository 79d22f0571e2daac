"""HarborAdapter(warm_pool=N): resets take started containers; nothing is left behind."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from llenvs_async import Action, ScriptedBackend, TrajectoryRunner
from llenvs_async.adapters.harbor import (
    HarborAdapter,
    HarborEnvironment,
    SnapshotRestore,
    harbor_restore,
)
from llenvs_async.docker.engine import DockerEngine
from llenvs_async.docker.fork import SNAPSHOT_REPO
from llenvs_async.docker.pool import POOL_LABEL
from llenvs_async.policies import fenced

from .conftest import EXAMPLES, harbor_containers, solution_policy

pytestmark = pytest.mark.docker

TASK = "csv-totals"


async def test_resets_take_warm_containers_and_rewards_hold(
    tmp_path: Path, docker_engine: DockerEngine
) -> None:
    async with HarborAdapter(cache_dir=tmp_path, warm_pool=2) as adapter:
        task = (await adapter.get_dataset(EXAMPLES)).tasks[
            (await adapter.get_dataset(EXAMPLES)).index_of(TASK)
        ]

        async def factory() -> HarborEnvironment:
            return await adapter.get_environment(EXAMPLES, max_steps=10)

        async with await factory() as env:
            runner = TrajectoryRunner(
                env, ScriptedBackend(solution_policy(task)), env_factory=factory,
                restore_fn=harbor_restore,
            )  # fmt: skip
            first = await runner.run_batch([TASK] * 2, batch_size=2)  # cold: fills the pool
            assert adapter.pool is not None
            await adapter.pool.settle()  # the takes started refills; let them land
            second = await runner.run_batch([TASK] * 2, batch_size=2)
        assert all(t.success for t in (*first, *second))
        assert adapter.pool.hits >= 2  # the second batch took warm containers
        pooled = await docker_engine.list_containers({POOL_LABEL: "warm"})
        assert len(pooled) == 2  # kept ready, bounded by warm_pool
    assert await harbor_containers(docker_engine) == []  # closing the adapter removes them


async def test_a_cancelled_run_with_a_warm_pool_leaves_no_container(
    tmp_path: Path, docker_engine: DockerEngine
) -> None:
    async with HarborAdapter(cache_dir=tmp_path, warm_pool=3) as adapter:

        async def factory() -> HarborEnvironment:
            return await adapter.get_environment(EXAMPLES, max_steps=30)

        async def slow(request):  # type: ignore[no-untyped-def]
            await asyncio.sleep(0.05)
            return fenced("sleep 0.1")

        async with await factory() as env:
            runner = TrajectoryRunner(env, ScriptedBackend(slow), env_factory=factory)
            task = asyncio.ensure_future(runner.run_batch([TASK] * 6, batch_size=3))
            while runner.stats.rounds < 3:
                await asyncio.sleep(0.02)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
        assert runner.stats.live_instances == 0
    assert await harbor_containers(docker_engine) == []


async def test_forks_from_a_snapshot_neither_take_nor_refill_the_warm_pool(
    tmp_path: Path, docker_engine: DockerEngine
) -> None:
    # A snapshot image is one state's: warm spares of it would only wait, and would pin the
    # image, so the restore's close failed with "image is being used by running container".
    async with HarborAdapter(cache_dir=tmp_path, warm_pool=2) as adapter:

        async def factory() -> HarborEnvironment:
            return await adapter.get_environment(EXAMPLES, max_steps=10)

        async with await factory() as env:
            state = await env.reset(TASK)
            state = (await env.step(state, Action(text=fenced("echo a > /app/a")))).next_state
        restore = SnapshotRestore()
        for _ in range(3):  # the first replays and commits, the next two fork from the image
            async with await factory() as fresh:
                restored = await restore(fresh, state)
                assert restored.actions == state.actions
                assert "a" in await fresh.probe("cat /app/a")
        assert restore.stats.snapshots == 1 and restore.stats.forks == 2
        assert adapter.pool is not None
        await adapter.pool.settle()
        pooled = await docker_engine.list_containers({POOL_LABEL: "warm"})
        assert len(restore.images) == 1 and restore.images[0].startswith(SNAPSHOT_REPO)
        assert pooled and not [c for c in pooled if c["Image"].startswith(SNAPSHOT_REPO)]
        await restore.aclose()  # nothing pins a snapshot image: its removal succeeds
        assert restore.images == ()
    assert await harbor_containers(docker_engine) == []
