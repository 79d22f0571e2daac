"""Docker preconditions the integrations' Harbor tests share (synchronous fixtures: the
trainers call us from plain threads, so these tests are not async)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import pytest

from llenvs_async.adapters.harbor.image import TASK_IMAGE_LABEL
from llenvs_async.docker.engine import DockerEngine
from llenvs_async.docker.images import BASE_IMAGE, ensure_base_image
from llenvs_async.docker.ownership import OWNER_LABEL
from llenvs_async.errors import DockerUnavailableError
from tests._support import require_built_images


async def _task_containers(prepare: bool) -> list[Any]:
    """This process's Harbor task containers; ``prepare``: first check the engine and build
    the base image (skips, failing under CI, when Docker or the images are missing)."""
    engine = DockerEngine()
    try:
        await engine.connect()
    except DockerUnavailableError as exc:
        pytest.skip(f"no Docker engine: {exc}")
    try:
        if prepare:
            await require_built_images(engine, BASE_IMAGE)
            await ensure_base_image(engine)
        owner = engine.labels[OWNER_LABEL]
        return list(await engine.list_containers({OWNER_LABEL: owner, TASK_IMAGE_LABEL: None}))
    finally:
        await engine.aclose()


@pytest.fixture
def docker_images() -> None:
    """Docker answers and the base image is built."""
    asyncio.run(_task_containers(True))


@pytest.fixture
def no_containers_left() -> Iterator[None]:
    """Docker preconditions, and "0 task containers of ours" before and after the test."""
    assert asyncio.run(_task_containers(True)) == []
    yield
    assert asyncio.run(_task_containers(False)) == [], "the test left Harbor containers behind"
