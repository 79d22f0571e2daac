"""Offline image resolution: normalised names, pattern aliases, stand-ins, ARG and COPY --from."""

from __future__ import annotations

import shutil
import uuid
from pathlib import Path
from typing import Any

import pytest

from llenvs_async.adapters.harbor import HarborAdapter, normalise_image_ref
from llenvs_async.adapters.harbor.images.dockerfile import image_uses as _image_uses
from llenvs_async.adapters.harbor.images.image import (
    CA_BUNDLE_PATH,
    ImageResolver,
    parse_alias,
    rewrite_from_lines,
)
from llenvs_async.docker.engine import DockerEngine
from llenvs_async.docker.images import BASE_IMAGE, PYTHON_STANDIN
from llenvs_async.types import Action

from .conftest import EXAMPLES

DIGEST = "sha256:" + "0" * 64


@pytest.mark.parametrize(
    ("ref", "normal"),
    [
        (f"public.ecr.aws/docker/library/debian:bookworm-slim@{DIGEST}", "debian:bookworm-slim"),
        ("docker.io/library/python:3.12-slim", "python:3.12-slim"),
        ("docker.io/ubuntu:24.04", "ubuntu:24.04"),
        ("library/ubuntu", "ubuntu:latest"),
        (f"ubuntu@{DIGEST}", "ubuntu:latest"),
        ("ghcr.io/astral-sh/uv:0.5", "ghcr.io/astral-sh/uv:0.5"),
        ("localhost:5000/team/img", "localhost:5000/team/img:latest"),
    ],
)
def test_image_refs_normalise_to_repository_and_tag(ref: str, normal: str) -> None:
    assert normalise_image_ref(ref) == normal


def test_image_uses_expand_args_and_skip_stages() -> None:
    dockerfile = (
        "ARG BASE=python:3.12-slim\nARG TAG\n"
        "FROM ${BASE} AS build\nRUN echo FROM nothing\n"
        "FROM build AS again\nFROM scratch\n"
        "FROM debian:${TAG:-bookworm}\n"
        "COPY --from=build /a /a\nCOPY --from=0 /b /b\n"
        "COPY --chown=1:1 --from=ghcr.io/astral-sh/uv:0.5 /uv /bin/\n"
    )
    assert _image_uses(dockerfile) == [
        (2, "FROM", "python:3.12-slim"),
        (6, "FROM", "debian:bookworm"),
        (9, "COPY --from", "ghcr.io/astral-sh/uv:0.5"),
    ]


def test_aliases_are_patterns_on_the_written_or_normalised_name() -> None:
    dockerfile = f"FROM docker.io/library/python:3.11-slim@{DIGEST}\nFROM ubuntu:22.04\n"
    assert rewrite_from_lines(dockerfile, {"python:3.*": "mine:py", "ubuntu:2?.04": "mine:u"}) == (
        "FROM mine:py\nFROM mine:u\n"
    )
    assert parse_alias(" python:3.* = mine:py ") == ("python:3.*", "mine:py")
    with pytest.raises(ValueError, match="PATTERN=IMAGE"):
        parse_alias("python:3.12")


class _Engine:
    """Only what ``ImageResolver`` asks an engine: whether an image exists locally."""

    def __init__(self, *present: str) -> None:
        self.present = set(present)
        self.asked: list[str] = []

    async def inspect_image(self, ref: str) -> dict[str, Any] | None:
        self.asked.append(ref)
        return {"Id": ref} if ref in self.present else None


async def test_resolution_order_alias_then_local_then_standin() -> None:
    engine: Any = _Engine(BASE_IMAGE, PYTHON_STANDIN, "debian:bookworm-slim")
    plain = ImageResolver()
    assert await plain.resolve(engine, f"debian:bookworm-slim@{DIGEST}") == "debian:bookworm-slim"
    assert await plain.resolve(engine, "ubuntu:24.04") == BASE_IMAGE
    assert await plain.resolve(engine, "python:3.10-slim-bookworm") == PYTHON_STANDIN
    assert await plain.resolve(engine, "golang:1.22") is None
    assert "--base-image 'golang:1.22=IMAGE'" in plain.how_to_map("golang:1.22")
    assert "build-standins" in plain.how_to_map("python:3.13")
    mapped = ImageResolver([("golang:*", BASE_IMAGE), ("ubuntu:*", "mine:u")])
    assert await mapped.resolve(engine, "docker.io/library/golang:1.22") == BASE_IMAGE
    assert await mapped.resolve(engine, "ubuntu:24.04") == "mine:u"  # the user's alias first


@pytest.mark.docker
async def test_a_command_gets_180_s_or_the_tasks_agent_timeout_when_asked(
    adapter: HarborAdapter, docker_engine: DockerEngine
) -> None:
    async with await adapter.get_environment(EXAMPLES) as env:
        assert env.command_timeout_sec == 180.0  # the default, separate from the budget
        await env.reset("csv-totals")
        assert env.task is not None and env.budget_left_sec is not None
        assert env.command_timeout_sec == 180.0
    async with await adapter.get_environment(EXAMPLES, command_timeout_sec="task") as env:
        assert env.command_timeout_sec == 180.0  # no task yet: the fallback
        await env.reset("csv-totals")
        assert env.task is not None
        assert env.command_timeout_sec == env.task.config.agent.timeout_sec
    fixed = await adapter.get_environment(EXAMPLES, command_timeout_sec=7.5)
    assert fixed.command_timeout_sec == 7.5
    await fixed.aclose()


@pytest.mark.docker
async def test_build_ca_bundle_is_trusted_in_every_stage(
    tmp_path: Path, docker_engine: DockerEngine
) -> None:
    task = tmp_path / "tasks" / "ca"
    shutil.copytree(EXAMPLES / "csv-totals", task)
    (task / "environment" / "Dockerfile").write_text(
        'FROM debian:bookworm-slim AS one\nRUN test -s "$SSL_CERT_FILE"\n'
        "FROM debian:bookworm-slim\nCOPY sales.csv /app/sales.csv\nWORKDIR /app\n"
    )
    bundle = tmp_path / "host-ca.pem"
    bundle.write_text(f"-----BEGIN CERTIFICATE-----\n{uuid.uuid4().hex}\n")
    adapter = HarborAdapter(cache_dir=tmp_path / "cache", build_ca_bundle=bundle)
    async with await adapter.get_environment(tmp_path / "tasks") as env:
        state = await env.reset(0)
        step = await env.step(state, Action(text='echo "$PIP_CERT"; cat "$SSL_CERT_FILE"'))
        assert step.next_state.observation.text == f"{CA_BUNDLE_PATH}\n{bundle.read_text()}".strip()
    with pytest.raises(ValueError, match=r"build_ca_bundle .*missing\.pem': no such file"):
        HarborAdapter(build_ca_bundle=tmp_path / "missing.pem")
