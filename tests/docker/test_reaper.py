"""Leak-proofing: ``reap_orphans`` and the ``atexit`` backstop."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import textwrap
from dataclasses import replace
from pathlib import Path
from typing import Any

from llenvs_async._ownership import (
    OWNER_BOOT_LABEL,
    OWNER_LABEL,
    OWNER_PIDNS_LABEL,
    OWNER_START_LABEL,
    SESSION_LABEL,
    Owner,
    current_owner,
    owner_labels,
    process_alive,
)
from llenvs_async.docker import (
    Container,
    ContainerSpec,
    DockerEngine,
    reap_orphans,
    remove_own_containers_sync,
)

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


async def test_owner_in_another_boot_or_pid_namespace_is_not_provably_dead(
    engine: DockerEngine, busybox_image: str
) -> None:
    # Same host name and a free pid, but another boot or PID namespace: the pid names some
    # other machine's or namespace's process (a live run sharing the engine), so it stays;
    # the same free pid in this boot and namespace is provably gone.
    me = current_owner()
    gone = Owner(host=me.host, pid=dead_pid(), start="1", boot=me.boot, pidns=me.pidns)
    assert me.boot and me.pidns  # Linux: both are read from /proc
    owners = {
        "gone": gone,
        "other-boot": replace(gone, boot="00000000-0000-0000-0000-000000000000"),
        "other-pidns": replace(gone, pidns="1"),
    }
    session = f"reaper-ns-{os.getpid()}"
    ids: dict[str, str] = {}
    try:
        for name, owner in owners.items():
            config: dict[str, Any] = {
                "Image": busybox_image,
                "Cmd": ["true"],
                "Labels": {**owner.labels, SESSION_LABEL: session, "test.name": name},
            }
            ids[name] = (await engine.client.containers.create(config)).id
        reaped = await reap_orphans(engine, session=session)
        assert [r.id for r in reaped] == [ids["gone"]]
        left = {c["Id"] for c in await engine.list_containers({SESSION_LABEL: session})}
        assert left == {ids["other-boot"], ids["other-pidns"]}
        forced = await reap_orphans(engine, force=True, session=session)
        assert {r.id for r in forced} == left
        assert await engine.list_containers({SESSION_LABEL: session}) == []
    finally:
        for container_id in ids.values():
            await engine.remove_container(container_id)


def test_owner_labels_carry_boot_and_pid_namespace() -> None:
    me = current_owner()
    labels = owner_labels("s1")
    assert (
        labels[OWNER_BOOT_LABEL]
        == me.boot
        == Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    )
    assert f"pid:[{labels[OWNER_PIDNS_LABEL]}]" == os.readlink("/proc/self/ns/pid")
    assert Owner.from_labels(labels) == me
    assert process_alive(me)
    # Legacy labels (no boot, no namespace) are checked as before: same host, pid alive.
    assert process_alive(Owner(host=me.host, pid=me.pid, start=me.start))
    assert not process_alive(Owner(host=me.host, pid=dead_pid(), boot=me.boot, pidns=me.pidns))
    assert process_alive(Owner(host=me.host, pid=dead_pid(), boot=me.boot, pidns="1"))


async def test_backstop_matches_every_owner_label(engine: DockerEngine, busybox_image: str) -> None:
    # A container labelled with this host:pid but another PID namespace belongs to another
    # process: this process's exit backstop must not remove it.
    me = current_owner()
    twin = replace(me, pidns="1")
    config: dict[str, Any] = {
        "Image": busybox_image,
        "Cmd": ["true"],
        "Labels": {**twin.labels, SESSION_LABEL: f"twin-{os.getpid()}"},
    }
    twin_id = (await engine.client.containers.create(config)).id
    try:
        assert twin_id not in remove_own_containers_sync()
        assert twin_id in {c["Id"] for c in await engine.list_containers({OWNER_LABEL: None})}
        assert twin_id not in {c["Id"] for c in await engine.own_containers()}
    finally:
        await engine.remove_container(twin_id)
