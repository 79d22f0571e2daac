"""Fixtures for the CLI tests: in-process invocation, child processes, Docker checks."""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

from llenvs_async.cli import main

from ._docker import docker_ready  # noqa: F401  (a fixture)

REPO = Path(__file__).resolve().parents[2]
EXAMPLE_TASKS = REPO / "examples" / "tasks"
CLI = (sys.executable, "-m", "llenvs_async.cli")


@dataclass(frozen=True, slots=True)
class CliResult:
    code: int
    out: str
    err: str


Invoke = Callable[..., CliResult]


@pytest.fixture
def cli(capsys: pytest.CaptureFixture[str]) -> Invoke:
    """Run ``llenvs-async ARGS...`` in this process; returns exit code, stdout, stderr."""

    def invoke(*args: str) -> CliResult:
        code = main(list(args))
        captured = capsys.readouterr()
        return CliResult(code, captured.out, captured.err)

    return invoke
