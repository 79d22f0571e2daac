"""The curated public API: names in __all__ exist and the lazy ones resolve."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest

import llenvs_async

REQUIRED = {
    "TrajectoryRunner",
    "Action",
    "Observation",
    "State",
    "StepResult",
    "Transition",
    "Trajectory",
    "Completion",
    "SamplingParams",
    "ChatMessage",
    "GenerationRequest",
    "GenerationError",
    "ContextLengthError",
    "Environment",
    "BaseEnvironment",
    "EnvFactory",
    "RestoreFn",
    "replay_restore",
    "Backend",
    "ScriptedBackend",
    "OpenAIBackend",
    "VLLMBackend",
    "LlenvsError",
    "estimate_values",
    "estimate_q_values",
    # decided in turn 3: training loops and the gVisor runtime
    "RolloutStream",
    "StreamStats",
    "TrainableBackend",
    "GvisorUnavailableError",
    # decided 2026-12-02: the agent protocol
    "AgentProtocol",
    "TextProtocol",
    "ToolsProtocol",
    # decided 2026-12-07: the agent-environment contract, declared
    "AgentEnvironment",
}


def test_all_lists_the_design_contract() -> None:
    missing = REQUIRED - set(llenvs_async.__all__)
    assert not missing, f"missing from __all__: {sorted(missing)}"


def test_every_exported_name_resolves() -> None:
    for name in llenvs_async.__all__:
        assert getattr(llenvs_async, name) is not None, name


def test_all_is_sorted_and_unique() -> None:
    names = [n for n in llenvs_async.__all__ if n != "__version__"]
    assert len(names) == len(set(names))
    assert names == sorted(names)


def test_unknown_attribute_raises() -> None:
    with pytest.raises(AttributeError, match="NoSuchThing"):
        _ = llenvs_async.NoSuchThing  # type: ignore[attr-defined]


def test_errors_share_one_root() -> None:
    from llenvs_async import errors

    for name in errors.__all__:
        assert issubclass(getattr(errors, name), llenvs_async.LlenvsError), name
    assert not issubclass(errors.EnvError, EnvironmentError)


async def test_resource_owners_share_the_context_manager_rules() -> None:
    from llenvs_async import ClosedError, ScriptedBackend, TrajectoryRunner
    from llenvs_async.envs import ChainEnv
    from llenvs_async.testing import RecordingBackend

    backend = RecordingBackend(ScriptedBackend(lambda r: "right"))
    async with backend, ChainEnv() as env:
        runner = TrajectoryRunner(env, backend)
        async with runner:
            assert not runner.closed
    assert backend.closed and backend.inner.closed and env.closed and runner.closed  # type: ignore[attr-defined]
    for resource in (backend, env, runner):
        with pytest.raises(ClosedError):
            async with resource:
                pass
        await resource.aclose()  # idempotent


def test_the_version_is_the_projects_and_the_changelogs_latest_release() -> None:
    root = Path(llenvs_async.__file__).resolve().parents[1]
    project = tomllib.loads((root / "pyproject.toml").read_text())["project"]["version"]
    assert llenvs_async.__version__ == project
    changelog = (root / "CHANGELOG.md").read_text()
    releases = re.findall(r"^## \[(\d+\.\d+\.\d+)\] - \d{4}-\d{2}-\d{2}$", changelog, re.MULTILINE)
    assert releases and releases[0] == project
