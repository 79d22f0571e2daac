"""Fixtures for the Harbor adapter tests: example tasks and local git registries."""

from __future__ import annotations

import json
import shutil
import subprocess
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from pathlib import Path

import pytest

from llenvs_async.adapters.harbor import HarborAdapter, HarborTask
from llenvs_async.docker.engine import DockerEngine
from llenvs_async.policies import shell_reply
from llenvs_async.types import GenerationRequest
from tests._support import base_image_engine, harbor_containers

EXAMPLES = Path(__file__).resolve().parents[3] / "examples" / "tasks"
# Task directories: their tests/test_*.py run inside task containers, never here.
collect_ignore_glob = ["tasks_real/*"]

# version -> ordered (registry task name, example directory) pairs
RegistrySpec = Mapping[str, Sequence[tuple[str, str]]]
MakeRegistry = Callable[[RegistrySpec], Path]


def _git(cwd: Path, *args: str) -> str:
    out = subprocess.run(
        ["git", "-c", "user.name=t", "-c", "user.email=t@example.com", *args],
        cwd=cwd,
        check=True,
        capture_output=True,
        text=True,
    )
    return out.stdout.strip()


@pytest.fixture
def make_registry(tmp_path: Path) -> MakeRegistry:
    """Build a git repository with one commit per dataset version and a ``registry.json``
    pointing each version's tasks at that commit (over ``file://``).
    """

    def make(spec: RegistrySpec) -> Path:
        repo = tmp_path / "tasks-repo"
        repo.mkdir()
        _git(repo, "init", "--quiet")
        datasets = []
        for version, tasks in spec.items():
            shutil.rmtree(repo / "tasks", ignore_errors=True)
            entries = []
            for name, example in tasks:
                shutil.copytree(EXAMPLES / example, repo / "tasks" / name)
                entries.append({"name": name, "path": f"tasks/{name}"})
            _git(repo, "add", "--all")
            _git(repo, "commit", "--quiet", "--allow-empty", "-m", f"version {version}")
            commit = _git(repo, "rev-parse", "HEAD")
            datasets.append(
                {
                    "name": "examples",
                    "version": version,
                    "description": f"examples {version}",
                    "tasks": [
                        {**e, "git_url": repo.as_uri(), "git_commit_id": commit} for e in entries
                    ],
                }
            )
        registry = tmp_path / "registry.json"
        registry.write_text(json.dumps(datasets, indent=2))
        return registry

    return make


@pytest.fixture
async def docker_engine() -> AsyncIterator[DockerEngine]:
    """A connected engine with the Debian base image (``base_image_engine``); afterwards no
    Harbor container of this process may remain."""
    async with base_image_engine() as engine:
        yield engine
        assert await harbor_containers(engine) == [], "the test left Harbor containers behind"


@pytest.fixture
async def adapter(tmp_path: Path, docker_engine: DockerEngine) -> AsyncIterator[HarborAdapter]:
    """An adapter with a private cache dir (the engine fixture guarantees Docker is up)."""
    async with HarborAdapter(cache_dir=tmp_path / "harbor-cache") as adapter:
        yield adapter


def solution_policy(task: HarborTask) -> Callable[[GenerationRequest], str]:
    """A scripted agent: the task's solution commands by step (fenced), then ``SUBMIT``."""
    commands = task.solution_commands()

    def policy(request: GenerationRequest) -> str:
        return shell_reply(commands[request.step] if request.step < len(commands) else "SUBMIT")

    return policy
