"""The shared engine fixture: without an engine, docker tests skip locally and FAIL in CI."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
TEST = "tests/docker/test_images.py::test_busybox_image_runs_a_shell"


def _pytest_without_engine(ci: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "DOCKER_HOST": "unix:///nonexistent/docker.sock", "CI": ci}
    return subprocess.run(
        [sys.executable, "-m", "pytest", TEST, "-q", "-p", "no:cacheprovider", "-rs"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip


@pytest.mark.parametrize(("ci", "outcome", "code"), [("", "1 skipped", 0), ("true", "1 error", 1)])
def test_missing_engine_skips_locally_and_fails_in_ci(ci: str, outcome: str, code: int) -> None:
    done = _pytest_without_engine(ci)
    assert done.returncode == code, done.stdout + done.stderr
    assert outcome in done.stdout and "no Docker engine answers" in done.stdout
