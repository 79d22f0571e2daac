"""``llenvs-async run`` flags for what the Harbor adapter offers: ``--artifacts-dir`` and
``--start-step``, on the real task shapes in ``tasks_real/``."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest

from llenvs_async.cli import main
from llenvs_async.docker.engine import DockerEngine

from .conftest import harbor_containers

TASKS = Path(__file__).resolve().parent / "tasks_real"


def _only(path: Path) -> dict[str, Any]:
    (record,) = [json.loads(line) for line in path.read_text().splitlines()]
    trajectory: dict[str, Any] = record["trajectory"]
    return trajectory


@pytest.mark.docker
async def test_artifacts_dir_keeps_the_verified_episodes_artifacts(
    tmp_path: Path, docker_engine: DockerEngine
) -> None:
    out, kept = tmp_path / "a.jsonl", tmp_path / "kept"
    args = ["run", str(TASKS), "-t", "separate-verifier", "-o", str(out), "-q"]
    assert await asyncio.to_thread(main, [*args, "--artifacts-dir", str(kept)]) == 0
    trajectory = _only(out)
    assert trajectory["error"] is None
    info = trajectory["transitions"][-1]["info"]
    where = Path(info["artifacts_dir"])
    assert where.parent == kept / "separate-verifier"
    assert [p.read_text() for p in where.rglob("numbers.txt")] == ["3\n4\n5\n"]
    assert (where / "out" / "total.txt").read_text().strip() == "12"
    assert [p.read_text().strip() for p in where.rglob("lines.txt")] == ["3"]  # collect hook
    assert not list(where.rglob("*.tmp"))  # excluded by the task
    assert await harbor_containers(docker_engine) == []


@pytest.mark.docker
async def test_start_step_replays_earlier_steps_then_runs_from_there(
    tmp_path: Path, docker_engine: DockerEngine
) -> None:
    out = tmp_path / "s.jsonl"
    args = ["run", str(TASKS), "-t", "multi-step", "-o", str(out), "-q"]
    assert await asyncio.to_thread(main, [*args, "--start-step", "extend"]) == 0
    trajectory = _only(out)
    assert trajectory["error"] is None
    start = trajectory["initial_state"]
    assert start["hidden"]["step_name"] == "extend"  # step 1 replayed by its oracle solution
    assert [r["name"] for r in start["hidden"]["step_results"]] == ["create"]
    verified = [t["info"].get("verified_step") for t in trajectory["transitions"]]
    assert verified == [None, "extend", None, "report"]  # the rollout itself: steps 2 and 3
    final = trajectory["transitions"][-1]
    assert final["info"]["multi_step_end"] == "completed"
    assert [r["name"] for r in final["info"]["step_results"]] == ["create", "extend", "report"]
    assert final["reward"] == 1.0
    assert await harbor_containers(docker_engine) == []


@pytest.mark.docker
async def test_start_step_names_an_unknown_step(
    tmp_path: Path, docker_engine: DockerEngine, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "u.jsonl"
    args = ["run", str(TASKS), "-t", "multi-step", "-o", str(out), "-q"]
    assert await asyncio.to_thread(main, [*args, "--start-step", "nope"]) == 1
    error = _only(out)["error"]
    assert error["type"] == "EnvError"
    assert "no step 'nope'" in error["message"] and "'extend'" in error["message"]
    assert await harbor_containers(docker_engine) == []
