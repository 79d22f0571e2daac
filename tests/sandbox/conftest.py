"""Fixtures for the gVisor tier: runsc present (skipped locally, FAILED in CI without it),
a one-task Harbor dataset on the busybox image, and a check that nothing is left behind."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from llenvs_async._ownership import current_owner
from llenvs_async.docker import BUSYBOX_IMAGE, DockerEngine, ensure_busybox_image
from llenvs_async.errors import DockerUnavailableError, GvisorUnavailableError
from llenvs_async.sandbox import Runsc, find_runsc
from llenvs_async.sandbox.reaper import list_sandboxes

TASK_TOML = """schema_version = "1.4"
[task]
name = "llenvs-tests/gvisor-fork"
[agent]
timeout_sec = 120.0
[verifier]
timeout_sec = 30.0
[environment]
workdir = "/"
memory_mb = 512
network_mode = "no-network"
"""


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        fixtures = getattr(item, "fixturenames", ())
        if "runsc" in fixtures:
            item.add_marker(pytest.mark.gvisor)
        if "runsc" in fixtures or "gvisor_image" in fixtures:
            item.add_marker(pytest.mark.docker)


def own_leftovers(runsc: Runsc) -> list[str]:
    """This process's sandboxes and checkpoint images under the state root."""
    here = current_owner().label
    found = [
        str(item["id"])
        for item in list_sandboxes(runsc)
        if (item.get("annotations") or {}).get("llenvs.owner") == here
    ]
    for directory in runsc.checkpoints.iterdir():
        if here in (directory / "owner.json").read_text():
            found.append(directory.name)
    return found


@pytest.fixture(scope="session")
def runsc_binary() -> Runsc:
    try:
        return find_runsc()
    except GvisorUnavailableError as exc:
        pytest.skip(f"gVisor is not available ({exc})")
        raise


@pytest.fixture
def runsc(runsc_binary: Runsc) -> Iterator[Runsc]:
    """runsc, and afterwards: no sandbox or checkpoint image of this process remains."""
    yield runsc_binary
    assert own_leftovers(runsc_binary) == [], "the test left sandboxes or checkpoints behind"


@pytest.fixture(scope="session")
def gvisor_image() -> str:
    async def build() -> None:
        async with DockerEngine() as engine:
            await ensure_busybox_image(engine)

    try:
        asyncio.run(build())
    except DockerUnavailableError as exc:
        pytest.skip(f"no Docker engine answers ({exc})")
    return BUSYBOX_IMAGE


@pytest.fixture
def task_dir(tmp_path: Path, gvisor_image: str) -> Path:
    """A dataset of one task on the busybox image (ash, httpd, wget)."""
    root = tmp_path / "tasks" / "gvisor-fork"
    (root / "environment").mkdir(parents=True)
    (root / "tests").mkdir()
    (root / "task.toml").write_text(TASK_TOML)
    (root / "instruction.md").write_text("Serve a page.\n")
    (root / "environment" / "Dockerfile").write_text(f"FROM {gvisor_image}\n")
    (root / "tests" / "test.sh").write_text(
        "mkdir -p /logs/verifier; echo 1 > /logs/verifier/reward.txt\n"
    )
    return tmp_path / "tasks"


@pytest.fixture
async def engine() -> AsyncIterator[DockerEngine]:
    async with DockerEngine() as engine:
        yield engine
