"""Fixtures for tests against a real Docker engine.

A test needing the engine requests ``docker_ready`` (directly or through another
fixture) and gets the ``docker`` marker. No engine: skipped locally, FAILED in CI
(``CI=true``). Every factory fixture removes what it created in ``finally``, and
``no_leaked_containers`` fails a test that leaves a container of this process behind.
"""

from __future__ import annotations

import asyncio
import subprocess
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from typing import Any

import pytest

from llenvs_async.docker import (
    BASE_IMAGE,
    BUSYBOX_IMAGE,
    Container,
    ContainerSpec,
    DockerEngine,
    ShellSession,
    ensure_base_image,
    ensure_busybox_image,
    remove_own_containers_sync,
)
from llenvs_async.errors import DockerUnavailableError
from tests._support import require_built_images

ContainerFactory = Callable[..., Awaitable[Container]]
ShellFactory = Callable[..., Awaitable[ShellSession]]
_engine_answered: list[str] = []


def dead_pid() -> int:
    """The pid of a process that has exited (an orphan's owner, for reaper tests)."""
    child = subprocess.Popen(["true"])
    child.wait()
    return child.pid


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if "docker_ready" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.docker)


async def _probe() -> str:
    async with DockerEngine() as engine:
        version = await engine.version()
    return str(version.get("Version", "?"))


@pytest.fixture(scope="session")
def docker_ready() -> str:
    """The engine's version; skip (locally) or fail (CI) when no engine answers."""
    try:
        _engine_answered.append(asyncio.run(_probe()))
        return _engine_answered[-1]
    except DockerUnavailableError as exc:
        pytest.skip(f"no Docker engine answers ({exc}); run scripts/ensure-docker.sh")


@pytest.fixture(scope="session")
def busybox_image(docker_ready: str) -> str:
    async def build() -> None:
        async with DockerEngine() as engine:
            await ensure_busybox_image(engine)

    asyncio.run(build())
    return BUSYBOX_IMAGE


@pytest.fixture(scope="session")
def base_image(docker_ready: str) -> str:
    """The Debian base image (``make images`` builds it by debootstrap; tests never do)."""

    async def build() -> None:
        async with DockerEngine() as engine:
            await require_built_images(engine, BASE_IMAGE)
            await ensure_base_image(engine)

    asyncio.run(build())
    return BASE_IMAGE


@pytest.fixture(autouse=True)
def no_leaked_containers(request: pytest.FixtureRequest) -> Iterator[None]:
    """After a docker test (and its fixtures' cleanup), no container of ours may remain."""
    yield
    if _engine_answered and "docker_ready" in request.fixturenames:
        leaked = remove_own_containers_sync()
        assert leaked == [], f"test leaked containers: {leaked}"


@pytest.fixture
async def engine(docker_ready: str) -> AsyncIterator[DockerEngine]:
    async with DockerEngine() as engine:
        yield engine


@pytest.fixture
async def make_container(
    engine: DockerEngine, busybox_image: str
) -> AsyncIterator[ContainerFactory]:
    """``await make_container(image=..., **spec_fields)``; all removed at teardown."""
    created: list[Container] = []

    async def make(image: str = busybox_image, **fields: Any) -> Container:
        container = await Container.create(engine, ContainerSpec(image=image, **fields))
        created.append(container)
        return container

    try:
        yield make
    finally:
        for container in created:
            await container.aclose()


@pytest.fixture
async def make_shell(make_container: ContainerFactory) -> ShellFactory:
    """``await make_shell(image=..., shell=..., **spec_fields)``: a shell in a fresh container."""

    async def make(image: str | None = None, shell: Any = "auto", **fields: Any) -> ShellSession:
        container = await make_container(**({"image": image} if image else {}), **fields)
        return await container.shell(shell=shell)

    return make
