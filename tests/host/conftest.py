"""One fixture for the host-facing tests, run on every runtime (as anyio runs its tests on
every backend): ``box`` is a started box of runc (a Docker container) or gVisor (a runsc
sandbox) on the busybox image, removed afterwards, nothing of it left behind."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from llenvs_async.docker import BUSYBOX_IMAGE, ContainerSpec, DockerEngine, ensure_busybox_image
from llenvs_async.docker.runtime import get_runtime
from llenvs_async.errors import DockerUnavailableError, GvisorUnavailableError
from llenvs_async.host import Host

RUNTIMES = [
    pytest.param("runc", marks=pytest.mark.docker),
    pytest.param("gvisor", marks=[pytest.mark.docker, pytest.mark.gvisor]),
]


@pytest.fixture(params=RUNTIMES)
async def box(request: pytest.FixtureRequest) -> AsyncIterator[Host]:
    runtime = get_runtime(request.param)
    try:
        runtime.check()
    except GvisorUnavailableError as exc:
        pytest.skip(f"gVisor is not available ({exc})")
    try:
        async with DockerEngine() as engine:
            await ensure_busybox_image(engine)
            spec = ContainerSpec(image=BUSYBOX_IMAGE, pids_limit=128, memory_bytes=256 << 20)
            host = await runtime.create(engine, spec)
            assert isinstance(host, Host)
            try:
                yield host
            finally:
                await host.aclose()
            assert host.closed
            assert not [c for c in await engine.own_containers() if c["Id"] == host.id]
    except DockerUnavailableError as exc:
        pytest.skip(f"no Docker engine answers ({exc})")
