"""``provision_verifier``: exactly which ``test.sh`` shapes are recognised, what the image and
the uploaded script become, and (real Docker, a build reaching only a package index this
test serves on 127.0.0.1) a provisioned uv/uvx verifier scoring 1.0 without a network."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from llenvs_async.adapters.harbor import HarborAdapter, HarborSettings
from llenvs_async.adapters.harbor.images.provision import (
    detect_provision,
    offline_test_sh,
    provision_dockerfile,
    rewrite_test_sh,
)
from llenvs_async.cli import main
from llenvs_async.docker.engine import DockerEngine

from ._local_index import WHEELS, cached_packages, serve, simple_tree
from .conftest import harbor_containers

TASK = Path(__file__).resolve().parent / "tasks_real" / "uv-verifier"
TB_SHAPE = (TASK / "tests" / "test.sh").read_text()


def test_the_terminal_bench_shape_is_recognised() -> None:
    found = detect_provision(TB_SHAPE)
    assert found is not None
    assert found.uv_version == "0.9.5"
    (run,) = found.runs
    assert run.python == "3.11"
    assert run.with_packages == ("pytest==8.4.1", "pytest-json-ctrf==0.3.5")
    assert run.tool == "pytest"


@pytest.mark.parametrize(
    "variant",
    [
        "wget -qO- https://astral.sh/uv/0.7.13/install.sh | bash\n"
        "uvx --with=pytest==8.4.1 --python=3.12 pytest /tests -q\n",
        "curl -LsSf 'https://astral.sh/uv/0.7.13/install.sh' | sh\nuvx pytest /tests\n",
    ],
)
def test_other_spellings_of_the_shape(variant: str) -> None:
    assert detect_provision(variant) is not None


@pytest.mark.parametrize(
    "script",
    [
        "curl -LsSf https://astral.sh/uv/install.sh | sh\nuvx -w pytest pytest /tests\n",  # no pin
        "curl -LsSf https://astral.sh/uv/0.9.5/install.sh | sh\npytest /tests\n",  # no uvx
        "curl -LsSf https://astral.sh/uv/0.9.5/install.sh | sh\n"
        "uvx --from x pytest /tests\n",  # an option we do not provision
        "curl -LsSf https://astral.sh/uv/0.9.5/install.sh | sh\nuvx ruff check\n",  # not pytest
        "curl -LsSf https://astral.sh/uv/0.7.13/install.sh | sh\nuv venv .v\n"
        "uv pip install pytest==8.4.1\nuv run pytest /tests\n",  # the uv-venv shape: not ours
        "pip install pytest 2>/dev/null || true\npytest /tests\n",
    ],
)
def test_anything_else_is_left_untouched(script: str) -> None:
    assert detect_provision(script) is None
    assert offline_test_sh(script) is None


def test_the_uploaded_script_skips_the_downloads_and_runs_offline() -> None:
    found = offline_test_sh(TB_SHAPE)
    assert found is not None
    script, env = found
    assert env == {"UV_OFFLINE": "1"}
    lines = script.splitlines()
    removed = [line for line in lines if line.startswith(": llenvs-async provisioned")]
    assert len(removed) == 3  # apt-get update, apt-get install -y curl, the installer
    assert not any(line.startswith(("curl ", "apt-get ")) for line in lines)
    assert "source $HOME/.local/bin/env" in lines
    assert script == rewrite_test_sh(TB_SHAPE)
    assert script.count("\n") == TB_SHAPE.count("\n")  # line numbers in errors still match


def test_the_dockerfile_gains_a_uv_stage_and_a_cache_warming_step() -> None:
    found = detect_provision(TB_SHAPE)
    assert found is not None
    text = provision_dockerfile(
        "ARG BASE=debian:bookworm-slim\nFROM $BASE\nUSER app\nWORKDIR /app\n", found
    )
    lines = text.splitlines()
    assert lines[0] == "ARG BASE=debian:bookworm-slim"  # global ARGs stay before every FROM
    assert lines[1].startswith("FROM python:3.12-slim AS llenvs-uv-provision")
    assert "uv==0.9.5" in lines[2]
    assert lines[3] == "FROM $BASE"
    assert "uvx -p 3.11 --with pytest==8.4.1 --with pytest-json-ctrf==0.3.5 pytest --version" in (
        text
    )
    assert lines[lines.index("USER app") + 1 :].count("USER root") == 1
    assert lines[-1] == "USER app"  # the task's user is back for the agent


def test_provisioning_needs_a_build_network() -> None:
    with pytest.raises(ValueError, match="build_network"):
        HarborAdapter(provision_verifier=True)
    assert main(["run", str(TASK), "--provision-verifier", "-o", "/dev/null"]) == 2


@pytest.mark.docker
@pytest.mark.slow
async def test_a_provisioned_uvx_verifier_scores_one_without_a_network(
    tmp_path: Path, docker_engine: DockerEngine
) -> None:
    """The build downloads uv and pytest from a package index on 127.0.0.1 that this test
    serves (wheels from ``scripts/ensure-test-packages.sh``), never from the internet."""
    projects = simple_tree(cached_packages(WHEELS), tmp_path / "index")
    assert {"uv", "pytest", "pytest-json-ctrf"} <= set(projects)
    out = tmp_path / "uv.jsonl"
    with serve(tmp_path / "index") as (url, requests):
        index_url = f"{url}/simple"
        args = ["run", str(TASK), "-o", str(out), "-q", "--build-network", "--provision-verifier"]
        await asyncio.to_thread(main, [*args, "--provision-index-url", index_url])
    (record,) = [json.loads(line) for line in out.read_text().splitlines()]
    trajectory = record["trajectory"]
    assert trajectory["error"] is None, trajectory["error"]
    assert "/simple/uv/" in requests and "/simple/pytest-json-ctrf/" in requests  # ours served
    assert record["source"]["harbor"]["provision_index_url"] == index_url
    final = trajectory["transitions"][-1]
    assert final["reward"] == 1.0
    output = final["info"]["verifier_output"]
    assert "pytest-8.4.1" in output and "json-ctrf-0.3.5" in output  # the pinned versions ran
    assert "PASSED ../tests/test_outputs.py::test_answer_is_42" in output
    assert await harbor_containers(docker_engine) == []


def test_the_index_url_reaches_both_downloads_and_needs_provisioning() -> None:
    found = detect_provision(TB_SHAPE)
    assert found is not None
    url = "http://127.0.0.1:9/simple"
    text = provision_dockerfile("FROM debian:bookworm-slim\n", found, index_url=url)
    assert f"pip download --index-url {url} " in text
    assert f"UV_DEFAULT_INDEX={url} uvx -p 3.11" in text
    assert "ENV UV_DEFAULT_INDEX" not in text  # build time only: never baked into the image
    assert "index" not in provision_dockerfile("FROM debian:bookworm-slim\n", found)
    offline = offline_test_sh(TB_SHAPE, index_url=url)
    assert offline is not None and offline[1] == {"UV_OFFLINE": "1", "UV_DEFAULT_INDEX": url}
    with pytest.raises(ValueError, match="provision_index_url"):
        HarborAdapter(build_network=True, provision_index_url=url)
    assert main(["run", str(TASK), "--build-network", "--provision-index-url", url]) == 2


def test_the_flag_is_recorded_with_the_results() -> None:
    options = HarborSettings(build_network=True, provision_verifier=True)
    assert HarborSettings.from_json(options.to_json()) == options
    assert HarborSettings.from_json({}).provision_verifier is False  # older results files
