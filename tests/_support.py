"""Small helpers the tiers share: whether this is CI, the built-images check, an engine with
the base image, this process's Harbor containers, and running a child process that is never
left behind."""

from __future__ import annotations

import os
import signal
import subprocess
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from typing import Any

import pytest

from llenvs_async._ownership import OWNER_LABEL
from llenvs_async.docker.engine import DockerEngine
from llenvs_async.docker.images import BASE_IMAGE, ensure_base_image
from llenvs_async.errors import DockerUnavailableError


def in_ci() -> bool:
    """``CI=true`` (or 1/yes): every skip then fails (``tests/conftest.py``)."""
    return os.environ.get("CI", "").lower() in ("1", "true", "yes")


async def require_built_images(engine: DockerEngine, *tags: str) -> None:
    """Skip the test when one of ``tags`` is not built: tests use the local images
    ``make images`` built and never build them (a base or stand-in build downloads)."""
    missing = [tag for tag in tags if await engine.inspect_image(tag) is None]
    if missing:
        pytest.skip(
            f"image(s) {', '.join(missing)} not built: run `make images` "
            "(`llenvs-async images build-all`); tests never download them"
        )


@asynccontextmanager
async def base_image_engine() -> AsyncIterator[DockerEngine]:
    """A connected engine with the Debian base image (built by ``make images``, not here) and
    its aliases tagged, which task Dockerfiles build FROM; without an engine or the image
    the test skips locally and FAILS in CI (``CI=true``)."""
    engine = DockerEngine()
    try:
        await engine.connect()
    except DockerUnavailableError as exc:
        pytest.skip(f"no Docker engine: {exc}")
    try:
        await require_built_images(engine, BASE_IMAGE)
        await ensure_base_image(engine)  # tags debian:bookworm-slim
        yield engine
    finally:
        await engine.aclose()


async def harbor_containers(engine: DockerEngine) -> list[str]:
    """Ids of this process's containers that run Harbor tasks (the "0 left" checks)."""
    # Imported here: every tier imports this module, few need the Harbor adapter.
    from llenvs_async.adapters.harbor.images.image import TASK_IMAGE_LABEL

    owner = engine.labels[OWNER_LABEL]
    found = await engine.list_containers({OWNER_LABEL: owner, TASK_IMAGE_LABEL: None})
    return [str(c["Id"]) for c in found]


def run_child(
    argv: Sequence[str], *, timeout: float, grace: float = 60.0, **popen: Any
) -> subprocess.CompletedProcess[str]:
    """Run a child (an example, the CLI) to its end, capturing its text output.

    Past ``timeout``, or when the test itself is interrupted (pytest-timeout, Ctrl-C), the
    child gets SIGINT as from Ctrl-C, so it tears down its containers and engines, and
    SIGKILL only after ``grace``. A test's own timeout must exceed ``timeout + grace``
    (``@pytest.mark.timeout``): the child's bound fires first and the test fails with its
    output instead of leaving it behind.
    """
    with subprocess.Popen(
        list(argv), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **popen
    ) as proc:
        try:
            out, err = proc.communicate(timeout=timeout)
        except BaseException as exc:
            proc.send_signal(signal.SIGINT)
            try:
                out, err = proc.communicate(timeout=grace)
            except subprocess.TimeoutExpired:
                proc.kill()
                out, err = proc.communicate()
            if not isinstance(exc, subprocess.TimeoutExpired):
                raise
            pytest.fail(f"{' '.join(argv)} ran past {timeout} s: interrupted\n{err[-4000:]}")
    return subprocess.CompletedProcess(list(argv), proc.returncode, out, err)
