"""HarborAdapter(warm_pool=N): resets take started containers; nothing is left behind."""

from __future__ import annotations

import asyncio
import functools
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from llenvs_async import Action, ScriptedBackend, TrajectoryRunner
from llenvs_async._ownership import current_owner
from llenvs_async.adapters.harbor import (
    HarborAdapter,
    HarborEnvironment,
    SnapshotRestore,
    harbor_restore,
)
from llenvs_async.docker.engine import DockerEngine
from llenvs_async.docker.pool import POOL_LABEL
from llenvs_async.fork import SNAPSHOT_REPO
from llenvs_async.policies import fenced

from .conftest import EXAMPLES, harbor_containers, solution_policy

pytestmark = pytest.mark.docker

TASK = "csv-totals"


@dataclass(frozen=True, slots=True)
class Warm:
    """An adapter with a warm pool, and a factory of its environments for the examples."""

    adapter: HarborAdapter

    async def environment(self, max_steps: int = 10) -> HarborEnvironment:
        return await self.adapter.get_environment(EXAMPLES, max_steps=max_steps)


@pytest.fixture
def warm_pool_size() -> int:
    """The adapter's ``warm_pool`` (a test parametrizes this name to change it)."""
    return 2


@pytest.fixture
async def warm(
    tmp_path: Path, docker_engine: DockerEngine, warm_pool_size: int
) -> AsyncIterator[Warm]:
    """The adapter, closed after the test; ``docker_engine`` then checks that no Harbor
    container is left (closing the adapter removes the warm ones)."""
    async with HarborAdapter(cache_dir=tmp_path, warm_pool=warm_pool_size) as adapter:
        yield Warm(adapter)


async def test_resets_take_warm_containers_and_rewards_hold(
    warm: Warm, docker_engine: DockerEngine
) -> None:
    adapter = warm.adapter
    task = (await adapter.get_dataset(EXAMPLES)).tasks[
        (await adapter.get_dataset(EXAMPLES)).index_of(TASK)
    ]
    async with await warm.environment() as env:
        runner = TrajectoryRunner(
            env, ScriptedBackend(solution_policy(task)), env_factory=warm.environment,
            restore_fn=harbor_restore,
        )  # fmt: skip
        first = await runner.run_batch([TASK] * 2, batch_size=2)  # cold: fills the pool
        assert adapter.pool is not None
        await adapter.pool.settle()  # the takes started refills; let them land
        second = await runner.run_batch([TASK] * 2, batch_size=2)
    assert all(t.success for t in (*first, *second))
    assert adapter.pool.hits >= 2  # the second batch took warm containers
    mine = {POOL_LABEL: "warm", **current_owner().labels}  # not another process's pool
    pooled = await docker_engine.list_containers(mine)
    assert len(pooled) == 2  # kept ready, bounded by warm_pool
    await adapter.aclose()
    assert await harbor_containers(docker_engine) == []  # closing the adapter removes them


@pytest.mark.parametrize("warm_pool_size", [3])
async def test_a_cancelled_run_with_a_warm_pool_leaves_no_container(
    warm: Warm, docker_engine: DockerEngine
) -> None:
    factory = functools.partial(warm.environment, max_steps=30)

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
    await warm.adapter.aclose()
    assert await harbor_containers(docker_engine) == []


async def test_forks_from_a_snapshot_neither_take_nor_refill_the_warm_pool(
    warm: Warm, docker_engine: DockerEngine
) -> None:
    # A snapshot image is one state's: warm spares of it would only wait, and would pin the
    # image, so the restore's close failed with "image is being used by running container".
    async with await warm.environment() as env:
        state = await env.reset(TASK)
        state = (await env.step(state, Action(text=fenced("echo a > /app/a")))).next_state
    restore = SnapshotRestore()
    for _ in range(3):  # the first replays and commits, the next two fork from the image
        async with await warm.environment() as fresh:
            restored = await restore(fresh, state)
            assert restored.actions == state.actions
            assert "a" in await fresh.probe("cat /app/a")
    assert restore.stats.snapshots == 1 and restore.stats.forks == 2
    assert warm.adapter.pool is not None
    await warm.adapter.pool.settle()
    pooled = await docker_engine.list_containers({POOL_LABEL: "warm", **current_owner().labels})
    assert len(restore.images) == 1 and restore.images[0].startswith(SNAPSHOT_REPO)
    assert pooled and not [c for c in pooled if c["Image"].startswith(SNAPSHOT_REPO)]
    await restore.aclose()  # nothing pins a snapshot image: its removal succeeds
    assert restore.images == ()
    await warm.adapter.aclose()
    assert await harbor_containers(docker_engine) == []
