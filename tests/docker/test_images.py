"""Local images: busybox import, the Debian base and its alias, mirror discovery."""

from __future__ import annotations

import io
import tarfile
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from llenvs_async.docker import BASE_ALIASES, BASE_IMAGE, DockerEngine, ensure_busybox_image
from llenvs_async.docker.images import IMAGE_LABEL, apt_mirror, build_image
from llenvs_async.errors import ImageError
from tests._support import require_built_images

from .conftest import ContainerFactory


async def test_busybox_image_is_built_once(engine: DockerEngine, docker_ready: str) -> None:
    tag = "llenvs-test/busybox:rebuild"
    try:
        built = await ensure_busybox_image(engine, tag=tag, force=True)
        assert built.built and built.id.startswith("sha256:")
        reused = await ensure_busybox_image(engine, tag=tag)
        assert (reused.built, reused.id) == (False, built.id)
        data = await engine.inspect_image(tag)
        assert data is not None and data["Config"]["Labels"][IMAGE_LABEL] == "busybox"
    finally:
        await engine.client.images.delete(tag, force=True)


async def test_busybox_image_runs_a_shell(make_container: ContainerFactory) -> None:
    container = await make_container()
    result = await container.exec("echo $((6 * 7)); ls /bin | wc -l")
    answer, applets = result.output.split()
    assert answer == "42" and int(applets) > 100


async def test_base_image_alias_builds_dockerfiles_offline(
    engine: DockerEngine, base_image: str, make_container: ContainerFactory
) -> None:
    base = await engine.inspect_image(base_image)
    alias = await engine.inspect_image(BASE_ALIASES[0])
    assert base is not None and alias is not None and base["Id"] == alias["Id"]
    dockerfile = b"FROM debian:bookworm-slim\nRUN echo built > /built.txt\n"
    context = io.BytesIO()
    with tarfile.open(fileobj=context, mode="w") as tar:
        member = tarfile.TarInfo("Dockerfile")
        member.size = len(dockerfile)
        tar.addfile(member, io.BytesIO(dockerfile))
    context.seek(0)
    tag = "llenvs-test/offline:latest"
    try:
        await engine.client.images.build(fileobj=context, encoding="identity", tag=tag)
        container = await make_container(image=tag)
        assert await container.get_file("/built.txt") == b"built\n"
        versions = await container.exec("python3 --version; bash --version | head -1")
        assert "Python 3" in versions.output and "bash" in versions.output
        await container.aclose()
    finally:
        await engine.client.images.delete(tag, force=True)


def test_apt_mirror_reads_deb822_and_list_files(tmp_path: Path) -> None:
    (tmp_path / "sources.list.d").mkdir()
    (tmp_path / "sources.list.d" / "debian.sources").write_text(
        "Types: deb\nURIs: http://deb.debian.org/debian-security\nSuites: bookworm-security\n\n"
        "Types: deb\n# a comment\nURIs: http://mirror.example/debian/\n"
        "Suites: bookworm bookworm-updates\nComponents: main\n"
    )
    assert apt_mirror(tmp_path) == "http://mirror.example/debian"
    (tmp_path / "sources.list.d" / "debian.sources").unlink()
    (tmp_path / "sources.list").write_text(
        "deb [arch=amd64] http://other.example/d bookworm main\n"
    )
    assert apt_mirror(tmp_path) == "http://other.example/d"
    assert apt_mirror(tmp_path, suite="trixie") == "http://deb.debian.org/debian"


async def _context(dockerfile: bytes) -> AsyncIterator[bytes]:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        member = tarfile.TarInfo("Dockerfile")
        member.size = len(dockerfile)
        tar.addfile(member, io.BytesIO(dockerfile))
    yield buf.getvalue()


async def test_failed_build_shows_the_log_tail_and_builds_have_no_network(
    engine: DockerEngine, base_image: str
) -> None:
    token = uuid.uuid4().hex  # never cached
    dockerfile = (
        f"FROM {base_image}\nRUN echo step-{token} && (getent hosts deb.debian.org || "
        "echo no-dns-in-build) && false\n"
    ).encode()
    tag = f"llenvs-test/fails:{token[:12]}"
    with pytest.raises(ImageError) as info:
        await build_image(engine, _context(dockerfile), tag=tag)
    message = str(info.value)
    assert "returned a non-zero code: 1" in message
    assert f"step-{token}" in message and "no-dns-in-build" in message  # the log's tail
    assert await engine.inspect_image(tag) is None
    log = await build_image(
        engine, _context(f"FROM {base_image}\nRUN echo ok-{token}\n".encode()), tag=tag
    )
    try:
        assert f"ok-{token}" in log
    finally:
        await engine.client.images.delete(tag, force=True)


async def test_a_missing_image_skips_with_the_command_to_build_it(
    engine: DockerEngine, docker_ready: str
) -> None:
    """Tests never build (download) a missing base image: they say ``make images`` (and
    under CI the skip fails the run: tests/test_ci_skips.py)."""
    missing = "llenvs-test/never-built:nope"
    await require_built_images(engine, BASE_IMAGE)  # present: nothing happens
    with pytest.raises(pytest.skip.Exception, match=f"{missing} not built: run `make images`"):
        await require_built_images(engine, BASE_IMAGE, missing)
