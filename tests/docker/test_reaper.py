"""Leak-proofing: ``reap_orphans`` and the ``atexit`` backstop."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import textwrap
from typing import Any

from llenvs_async.docker import Container, ContainerSpec, DockerEngine, reap_orphans
from llenvs_async.docker.ownership import OWNER_LABEL, OWNER_START_LABEL, SESSION_LABEL

from .conftest import dead_pid


async def test_reap_orphans_removes_only_containers_of_dead_owners(
    engine: DockerEngine, busybox_image: str
) -> None:
    host = socket.gethostname()
    me = os.getpid()
    owners = {
        "dead": {OWNER_LABEL: f"{host}:{dead_pid()}"},
        "reused-pid": {OWNER_LABEL: f"{host}:{me}", OWNER_START_LABEL: "1"},
        "live": {OWNER_LABEL: f"{host}:1"},
        "other-host": {OWNER_LABEL: f"elsewhere.example:{dead_pid()}"},
        "malformed": {OWNER_LABEL: "no-pid-here"},
    }
    ids: dict[str, str] = {}
    mine = await Container.create(engine, ContainerSpec(image=busybox_image))
    try:
        for name, labels in owners.items():
            config: dict[str, Any] = {
                "Image": busybox_image,
                "Cmd": ["true"],
                "Labels": {**labels, SESSION_LABEL: name},
            }
            ids[name] = (await engine.client.containers.create(config)).id
        reaped = await reap_orphans(engine)
        assert {r.id for r in reaped if r.id in ids.values()} == {ids["dead"], ids["reused-pid"]}
        assert {r.session for r in reaped if r.id in ids.values()} == {"dead", "reused-pid"}
        remaining = {c["Id"] for c in await engine.list_containers({OWNER_LABEL: None})}
        assert remaining >= {ids["live"], ids["other-host"], ids["malformed"], mine.id}
        assert not remaining & {ids["dead"], ids["reused-pid"]}
    finally:
        await mine.aclose()
        for container_id in ids.values():
            await engine.remove_container(container_id)


CHILD = textwrap.dedent(
    """
    import asyncio
    from llenvs_async.docker import Container, ContainerSpec, DockerEngine

    async def main():
        engine = DockerEngine()
        await engine.connect()
        container = await Container.create(engine, ContainerSpec(image={image!r}))
        print(container.id, flush=True)  # exits without closing anything

    asyncio.run(main())
    """
)


async def test_atexit_backstop_removes_what_a_process_left(
    engine: DockerEngine, busybox_image: str
) -> None:
    child = subprocess.run(
        [sys.executable, "-c", CHILD.format(image=busybox_image)],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert child.returncode == 0, child.stderr
    container_id = child.stdout.strip()
    assert len(container_id) == 64
    assert "removed 1 leftover container(s)" in child.stderr
    assert await engine.remove_container(container_id) is False  # already gone
