"""One leak-proofing for every kind: a single ``atexit`` hook removes the containers, snapshot
images and gVisor sandboxes a process left, and ``reap_all_orphans`` those of a killed one."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

from llenvs_async import reap_all_orphans
from llenvs_async.docker import DockerEngine
from llenvs_async.docker.snapshots import list_snapshot_images, remove_image
from llenvs_async.sandbox import Runsc
from llenvs_async.sandbox.reaper import list_sandboxes

ROOT = Path(__file__).resolve().parents[2]

# Makes a container, a snapshot image of it and a gVisor sandbox, prints the number of
# atexit hooks that added and "ready", then exits (or waits to be killed) without closing.
CHILD = textwrap.dedent(
    """
    import asyncio, atexit, sys
    from llenvs_async.docker import Container, ContainerSpec, DockerEngine
    from llenvs_async.docker.snapshots import register_snapshot_backstop, snapshot_labels
    from llenvs_async.sandbox import Sandbox

    async def main(image):
        engine = await DockerEngine().connect()
        before = atexit._ncallbacks()
        container = await Container.create(engine, ContainerSpec(image=image))
        register_snapshot_backstop(engine.url)
        await container.commit("llenvs-test-snapshot", "one-reaper",
                               labels=snapshot_labels("one-reaper", image))
        await Sandbox.create(engine, ContainerSpec(image=image))
        print(atexit._ncallbacks() - before, "ready", flush=True)
        if sys.argv[2] == "wait":
            await asyncio.sleep(600)

    asyncio.run(main(sys.argv[1]))
    """
)


def _start(image: str, then: str) -> subprocess.Popen[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.Popen(
        [sys.executable, "-c", CHILD, image, then],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
    )  # fmt: skip


async def _leftovers(engine: DockerEngine, runsc: Runsc, pid: int) -> dict[str, int]:
    """How many containers, snapshot images and sandboxes of process ``pid`` exist."""
    owner = f":{pid}"
    containers = [
        c
        for c in await engine.list_containers({"llenvs.owner": None})
        if (c.get("Labels") or {}).get("llenvs.owner", "").endswith(owner)
    ]
    images = [
        i
        for i in await list_snapshot_images(engine, session="one-reaper")
        if (i.get("Labels") or {}).get("llenvs.snapshot.owner", "").endswith(owner)
    ]
    sandboxes = [
        s
        for s in list_sandboxes(runsc)
        if (s.get("annotations") or {}).get("llenvs.owner", "").endswith(owner)
    ]
    return {"containers": len(containers), "images": len(images), "sandboxes": len(sandboxes)}


async def test_one_atexit_hook_removes_every_kind_a_process_left(
    runsc: Runsc, gvisor_image: str, engine: DockerEngine
) -> None:
    child = _start(gvisor_image, "exit")
    out, err = child.communicate(timeout=120)
    assert child.returncode == 0, err
    assert out.split() == ["1", "ready"]  # three kinds armed, one hook
    assert "removed 1 leftover container(s)" in err
    assert "removed 1 snapshot image(s)" in err
    assert "removed 1 leftover sandbox(es)" in err
    assert await _leftovers(engine, runsc, child.pid) == {
        "containers": 0, "images": 0, "sandboxes": 0
    }  # fmt: skip


async def test_reap_all_orphans_removes_every_kind_of_a_killed_owner(
    runsc: Runsc, gvisor_image: str, engine: DockerEngine
) -> None:
    child = _start(gvisor_image, "wait")
    try:
        assert child.stdout is not None
        assert child.stdout.readline().split() == ["1", "ready"]
    finally:
        child.send_signal(signal.SIGKILL)  # no atexit, no aclose: everything is an orphan
        child.communicate(timeout=30)
    assert await _leftovers(engine, runsc, child.pid) == {
        "containers": 1, "images": 1, "sandboxes": 1
    }  # fmt: skip
    reaped = await reap_all_orphans(engine)
    owner = f":{child.pid}"
    assert len([c for c in reaped.containers if c.owner.endswith(owner)]) == 1
    assert [i.session for i in reaped.images if i.owner.endswith(owner)] == ["one-reaper"]
    assert [s.kind for s in reaped.sandboxes if s.owner.endswith(owner)] == ["sandbox"]
    left = await _leftovers(engine, runsc, child.pid)
    if left["images"]:  # never expected; removed so a failure leaves nothing behind
        for item in await list_snapshot_images(engine, session="one-reaper"):
            await remove_image(engine, str(item["Id"]))
    assert left == {"containers": 0, "images": 0, "sandboxes": 0}
