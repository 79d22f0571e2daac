"""WarmPool: ready containers with an open shell, refilled in the background, never leaked."""

from __future__ import annotations

import asyncio

import pytest

from llenvs_async.docker import ContainerSpec, DockerEngine
from llenvs_async.docker.pool import POOL_LABEL, WarmPool
from llenvs_async.errors import ClosedError


async def _labelled(engine: DockerEngine) -> int:
    return len(await engine.list_containers({POOL_LABEL: "warm", **engine.labels}))


async def test_take_hands_over_a_ready_container_and_refills(
    engine: DockerEngine, busybox_image: str
) -> None:
    spec = ContainerSpec(image=busybox_image)
    async with WarmPool(engine, size=2) as pool:
        await pool.fill(spec)
        assert pool.ready(spec) == 2 and pool.created == 2
        warm = await pool.take(spec)
        try:
            assert pool.hits == 1 and pool.misses == 0
            result = await warm.shell.run("echo ready")
            assert result.output == "ready\n" and result.exit_code == 0
            await pool.fill(spec)  # the background refill brings it back to size
            assert pool.ready(spec) == 2 and pool.created == 3
            assert await _labelled(engine) == 3  # two pooled + the one taken
        finally:
            await warm.container.aclose()
    assert await _labelled(engine) == 0


async def test_a_cold_take_creates_one_and_the_pool_stays_bounded(
    engine: DockerEngine, busybox_image: str
) -> None:
    spec = ContainerSpec(image=busybox_image)
    async with WarmPool(engine, size=2) as pool:
        taken = await asyncio.gather(*(pool.take(spec) for _ in range(3)))
        try:
            assert pool.misses == 3
            await pool.fill(spec)
            assert pool.ready(spec) == 2  # bounded by size, whatever was taken
        finally:
            for warm in taken:
                await warm.container.aclose()


async def test_closing_mid_refill_leaves_no_container(
    engine: DockerEngine, busybox_image: str
) -> None:
    spec = ContainerSpec(image=busybox_image)
    pool = WarmPool(engine, size=4)
    warm = await pool.take(spec)  # starts 3 creations in the background
    await warm.container.aclose()
    await pool.aclose()  # while they are still being created
    assert await _labelled(engine) == 0
    with pytest.raises(ClosedError):
        await pool.take(spec)


@pytest.mark.parametrize("phase", ["creating", "opening_the_shell"])
async def test_a_cancelled_take_leaves_no_container(
    engine: DockerEngine, busybox_image: str, monkeypatch: pytest.MonkeyPatch, phase: str
) -> None:
    """The take is cancelled while its own container is being created, or once it exists
    and its shell is being opened; the refills it started run in their own tasks."""
    from llenvs_async.docker import pool as pool_module

    real_create = pool_module.Container.create
    reached = asyncio.Event()
    made: list[str] = []

    async def create(*args, **kwargs):  # type: ignore[no-untyped-def]
        if asyncio.current_task() is not task:
            return await real_create(*args, **kwargs)
        if phase == "creating":
            reached.set()  # the test cancels at this create's first await (its request)
            return await real_create(*args, **kwargs)
        container = await real_create(*args, **kwargs)
        made.append(container.id)
        reached.set()  # the test cancels at the shell's first await (an engine call)
        return container

    monkeypatch.setattr(pool_module.Container, "create", create)
    spec = ContainerSpec(image=busybox_image)
    async with WarmPool(engine, size=2) as pool:
        task = asyncio.ensure_future(pool.take(spec))
        async with asyncio.timeout(60):
            await reached.wait()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        # The take's own container existed when it was cancelled (the second phase).
        assert len(made) == (1 if phase == "opening_the_shell" else 0)
    assert await _labelled(engine) == 0  # the take's container included: it is labelled too


async def test_background_refills_are_bounded_by_refill_concurrency(
    engine: DockerEngine, busybox_image: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from llenvs_async.docker import pool as pool_module

    in_flight, peak = 0, 0
    real_create = pool_module.Container.create

    async def counting_create(*args, **kwargs):  # type: ignore[no-untyped-def]
        nonlocal in_flight, peak
        in_flight += 1
        peak = max(peak, in_flight)
        try:
            return await real_create(*args, **kwargs)
        finally:
            in_flight -= 1

    monkeypatch.setattr(pool_module.Container, "create", counting_create)
    spec = ContainerSpec(image=busybox_image)
    async with WarmPool(engine, size=4, refill_concurrency=2) as pool:
        await pool.fill(spec)
        assert pool.ready(spec) == 4
    assert peak == 2
    assert await _labelled(engine) == 0


async def test_close_removes_ready_containers_even_while_a_creation_hangs(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Engine-free: the third creation hangs; closing still removes the ready ones, is
    bounded by close_timeout and raises nothing; the hung one removes its own later."""
    from llenvs_async.docker.pool import WarmContainer

    open_containers: set[object] = set()  # made and not yet closed
    hang = asyncio.Event()

    class Fake:
        def __init__(self) -> None:
            open_containers.add(self)

        async def aclose(self) -> None:
            open_containers.discard(self)

    made = 0

    async def fake_create(self: WarmPool, spec: ContainerSpec) -> WarmContainer:
        nonlocal made
        made += 1
        if made > 2:
            await hang.wait()
        return WarmContainer(container=Fake(), shell=None)  # type: ignore[arg-type]

    monkeypatch.setattr(WarmPool, "_create", fake_create)
    pool = WarmPool(engine=None, size=2, close_timeout=0.2)  # type: ignore[arg-type]
    spec = ContainerSpec(image="x")
    await pool.fill(spec)
    warm = await pool.take(spec)  # the refill it starts hangs
    await warm.container.aclose()
    while made < 3:  # let the refill reach the engine
        await asyncio.sleep(0)
    await pool.aclose()  # bounded: returns though a creation still hangs
    assert open_containers == set() and made == 3  # the ready one is gone
    hang.set()
    await pool.settle()
    assert open_containers == set()  # made after the close: it removed itself
