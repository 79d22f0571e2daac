"""Small helpers the tiers share: whether this is CI, the built-images check, and running a
child process that is never left behind."""

from __future__ import annotations

import os
import signal
import subprocess
from collections.abc import Sequence
from typing import Any

import pytest

from llenvs_async.docker.engine import DockerEngine


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
