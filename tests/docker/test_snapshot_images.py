"""Snapshot images: owner labels, reaping those of dead owners, the synchronous backstop."""

from __future__ import annotations

import socket
import subprocess
import sys
import textwrap

from llenvs_async.docker import Container, ContainerSpec, DockerEngine
from llenvs_async.docker.snapshots import (
    SNAPSHOT_OWNER_LABEL,
    SNAPSHOT_SESSION_LABEL,
    list_snapshot_images,
    reap_orphan_snapshots,
    remove_image,
    remove_own_snapshot_images_sync,
    snapshot_labels,
)

from .conftest import dead_pid


async def test_reap_removes_only_snapshots_of_dead_owners_and_the_backstop_ours(
    engine: DockerEngine, busybox_image: str
) -> None:
    host = socket.gethostname()
    owners = {
        "dead": {SNAPSHOT_OWNER_LABEL: f"{host}:{dead_pid()}", SNAPSHOT_SESSION_LABEL: "dead"},
        "other-host": {SNAPSHOT_OWNER_LABEL: f"elsewhere.example:{dead_pid()}"},
        "mine": snapshot_labels("mine", busybox_image),
    }
    ids: dict[str, str] = {}
    async with await Container.create(engine, ContainerSpec(image=busybox_image)) as container:
        for name, labels in owners.items():
            ids[name] = await container.commit("llenvs-test-snapshot", name, labels=labels)
    try:
        reaped = await reap_orphan_snapshots(engine)
        assert [(r.id, r.session) for r in reaped if r.id in ids.values()] == [
            (ids["dead"], "dead")
        ]
        left = {str(i["Id"]) for i in await list_snapshot_images(engine)}
        assert ids["dead"] not in left and {ids["other-host"], ids["mine"]} <= left
        assert {str(i["Id"]) for i in await list_snapshot_images(engine, session="mine")} == {
            ids["mine"]
        }

        assert remove_own_snapshot_images_sync() == [ids["mine"]]
        assert ids["mine"] not in {str(i["Id"]) for i in await list_snapshot_images(engine)}
    finally:
        for image_id in ids.values():
            await remove_image(engine, image_id)


CHILD = textwrap.dedent(
    """
    import asyncio
    from llenvs_async.docker import Container, ContainerSpec, DockerEngine
    from llenvs_async.docker.snapshots import register_snapshot_backstop, snapshot_labels

    async def main():
        engine = await DockerEngine().connect()
        container = await Container.create(engine, ContainerSpec(image={image!r}))
        register_snapshot_backstop(engine.url)
        labels = snapshot_labels("child", {image!r})
        print(await container.commit("llenvs-test-snapshot", "child", labels=labels), flush=True)

    asyncio.run(main())  # exits without removing the container or the image
    """
)


async def test_atexit_backstop_removes_the_snapshot_images_a_process_left(
    engine: DockerEngine, busybox_image: str
) -> None:
    child = subprocess.run(
        [sys.executable, "-c", CHILD.format(image=busybox_image)],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert child.returncode == 0, child.stderr
    image_id = child.stdout.strip()
    assert image_id.startswith("sha256:")
    assert "removed 1 snapshot image(s)" in child.stderr
    assert await engine.inspect_image(image_id) is None
