"""Container lifecycle: exec, files, commit, removal, errors, cancellation."""

from __future__ import annotations

import asyncio

import pytest

from llenvs_async._ownership import OWNER_LABEL
from llenvs_async.docker import Container, ContainerSpec, DockerEngine
from llenvs_async.errors import ClosedError, ContainerError, DockerUnavailableError, ImageError

from .conftest import ContainerFactory


async def test_exec_reports_output_and_exit_code(make_container: ContainerFactory) -> None:
    container = await make_container()
    result = await container.exec(["sh", "-c", "echo out; echo err >&2; exit 4"])
    assert (result.exit_code, result.timed_out) == (4, False)
    assert sorted(result.output.splitlines()) == ["err", "out"]  # two pipes: any order
    missing = await container.exec(["no-such-binary"])
    assert missing.exit_code == 127 and "no-such-binary" in missing.output


async def test_exec_timeout_kills_the_whole_process_group(make_container: ContainerFactory) -> None:
    container = await make_container()
    async with asyncio.timeout(20):
        result = await container.exec("sleep 1003 & sleep 1004; echo never", timeout=1)
    assert result.timed_out and "never" not in result.output
    listing = (await container.exec("ps -o args")).output
    assert "sleep 1003" not in listing and "sleep 1004" not in listing


async def test_files_round_trip_and_parents_are_created(make_container: ContainerFactory) -> None:
    container = await make_container()
    payload = bytes(range(256)) * 10
    await container.put_files({"/work/deep/dir/data.bin": payload, "/work/note.txt": "héllo\n"})
    assert await container.get_file("/work/deep/dir/data.bin") == payload
    assert (await container.exec("cat /work/note.txt")).output == "héllo\n"
    with pytest.raises(ContainerError) as info:
        await container.get_file("/work/missing")
    assert info.value.status == 404


async def test_commit_snapshots_the_filesystem_without_our_labels(
    engine: DockerEngine, make_container: ContainerFactory
) -> None:
    container = await make_container()
    await container.put_file("/state.txt", "saved")
    image_id = await container.commit("llenvs-test/commit", "t1", labels={"purpose": "test"})
    try:
        data = await engine.inspect_image(image_id)
        assert data is not None
        labels = data["Config"]["Labels"]
        assert labels["purpose"] == "test" and labels[OWNER_LABEL] == ""
        clone = await make_container(image="llenvs-test/commit:t1")
        assert await clone.get_file("/state.txt") == b"saved"
        await clone.aclose()
    finally:
        await engine.client.images.delete(image_id, force=True)


async def test_aclose_is_idempotent_and_removes(engine: DockerEngine, busybox_image: str) -> None:
    container = await Container.create(engine, ContainerSpec(image=busybox_image))
    try:
        assert (await container.inspect())["State"]["Running"]
    finally:
        await container.aclose()
    await container.aclose()
    assert await engine.remove_container(container.id) is False  # already gone
    with pytest.raises(ClosedError):
        await container.exec("true")


async def test_missing_image_is_an_image_error_and_never_pulled(engine: DockerEngine) -> None:
    with pytest.raises(ImageError, match="no-such-image"):
        await Container.create(engine, ContainerSpec(image="llenvs-test/no-such-image:none"))
    assert await engine.own_containers() == []


async def test_cancelled_create_leaves_no_container(
    engine: DockerEngine, busybox_image: str
) -> None:
    for delay in (0.0, 0.01, 0.05):
        task = asyncio.create_task(Container.create(engine, ContainerSpec(image=busybox_image)))
        await asyncio.sleep(delay)
        task.cancel()
        try:
            container = await task
        except asyncio.CancelledError:
            pass
        else:  # it finished before the cancel arrived
            await container.aclose()
        assert await engine.own_containers() == []


async def test_cancelled_aclose_still_removes(engine: DockerEngine, busybox_image: str) -> None:
    container = await Container.create(engine, ContainerSpec(image=busybox_image))
    task = asyncio.create_task(container.aclose())
    await asyncio.sleep(0)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert await engine.own_containers() == []


async def test_unreachable_engine_is_docker_unavailable() -> None:
    engine = DockerEngine(url="unix:///nonexistent/docker.sock")
    with pytest.raises(DockerUnavailableError):
        await engine.connect()
    await engine.aclose()
    with pytest.raises(ClosedError):
        _ = engine.client


async def test_aclose_after_the_engine_closed_still_removes(busybox_image: str) -> None:
    engine = await DockerEngine().connect()
    container = await Container.create(engine, ContainerSpec(image=busybox_image))
    await container.shell()
    await engine.aclose()
    await container.aclose()
    async with DockerEngine() as fresh:
        assert await fresh.remove_container(container.id) is False


async def test_create_timing_out_mid_request_leaves_no_container(
    engine: DockerEngine, busybox_image: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The daemon made the container but the create call was cut off by ``create_timeout``
    before returning its id: the container must still be found and removed."""
    containers = engine.client.containers
    real_create = containers.create

    async def slow_create(*args: object, **kwargs: object) -> object:
        await real_create(*args, **kwargs)  # type: ignore[arg-type]
        await asyncio.sleep(60)  # the response never reaches the caller in time
        raise AssertionError("unreachable")

    monkeypatch.setattr(containers, "create", slow_create)
    with pytest.raises(ContainerError, match="took over"):
        await Container.create(engine, ContainerSpec(image=busybox_image), create_timeout=1.0)
    monkeypatch.undo()
    assert await engine.own_containers() == []
