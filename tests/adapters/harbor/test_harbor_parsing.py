"""Pure helpers: observation text, Dockerfile base-image aliases."""

from __future__ import annotations

import pytest

from llenvs_async.adapters.harbor.images.image import rewrite_from_lines
from llenvs_async.host import CommandResult
from llenvs_async.shell_task import observation_text


@pytest.mark.parametrize(
    ("result", "text"),
    [
        (CommandResult(output="hi\n", exit_code=0), "hi"),
        (CommandResult(output="", exit_code=0), "(no output)"),
        (CommandResult(output="nope\n", exit_code=2), "nope\n[exit code: 2]"),
        (CommandResult(output="", exit_code=None, timed_out=True), "[command timed out after 5s"),
        (
            CommandResult(output="", exit_code=None, continuation_prompt=True),
            "[the shell was waiting for more input",
        ),
        (
            CommandResult(output="x", exit_code=0, shell_restarted=True),
            "x\n[the shell was restarted",
        ),
    ],
)
def test_observation_shows_output_and_non_zero_exit_codes(result: CommandResult, text: str) -> None:
    observation = observation_text(result, 5.0)
    assert observation.startswith(text)
    assert ("[exit code:" in observation) is (result.exit_code not in (0, None))


def test_from_lines_are_rewritten_through_aliases() -> None:
    dockerfile = (
        "FROM python:3.11-slim AS build\nRUN echo FROM python:3.11-slim\n"
        "from --platform=linux/amd64 ubuntu:24.04\nFROM keep:me\n"
    )
    aliases = {"python:3.11-slim": "debian:bookworm-slim", "ubuntu:24.04": "llenvs/base:bookworm"}
    assert rewrite_from_lines(dockerfile, aliases) == (
        "FROM debian:bookworm-slim AS build\nRUN echo FROM python:3.11-slim\n"
        "from --platform=linux/amd64 llenvs/base:bookworm\nFROM keep:me\n"
    )
    assert rewrite_from_lines(dockerfile, {}) == dockerfile
