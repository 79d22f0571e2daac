"""Docker helpers shared by the CLI and example tests: skip/fail without an engine, leak checks."""

from __future__ import annotations

import asyncio
import os
import socket
from collections.abc import Iterator

import pytest


async def _containers(owner: str | None) -> list[str]:
    from llenvs_async._ownership import OWNER_LABEL
    from llenvs_async.docker.engine import DockerEngine

    async with DockerEngine() as engine:
        found = await engine.list_containers({OWNER_LABEL: owner})
    return [str(c["Id"]) for c in found]


async def containers_of(pid: int) -> list[str]:
    """Ids of containers (running or not) labelled as created by process ``pid`` here."""
    return await _containers(f"{socket.gethostname()}:{pid}")


@pytest.fixture
def docker_ready() -> Iterator[None]:
    """Skip (locally) or fail (CI) without a Docker engine; afterwards, check that this
    process left no container behind.
    """
    from llenvs_async.errors import DockerUnavailableError

    try:
        asyncio.run(_containers(None))
    except DockerUnavailableError as exc:
        pytest.skip(f"no Docker engine: {exc}")
    yield
    assert asyncio.run(containers_of(os.getpid())) == [], "the test left containers behind"
