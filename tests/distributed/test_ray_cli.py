"""``llenvs-async run --ray-address``: the same job with every instance in a Ray actor."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest

from tests._support import run_child

from .conftest import REPO, live_actors, node_ids

CLI = (sys.executable, "-m", "llenvs_async.cli")


@pytest.mark.timeout(300 + 120)
def test_run_with_ray_address_spreads_the_job_over_the_cluster(
    ray_cluster: Any, tmp_path: Path
) -> None:
    out = tmp_path / "counter.jsonl"
    args = ["run", "--env", "counter", "-n", "2", "-c", "4", "-o", str(out), "-q"]
    proc = run_child(
        [*CLI, *args, "--ray-address", ray_cluster.address],
        timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    records = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(records) == 10  # 5 tasks x 2 rollouts
    trajectories = [r["trajectory"] for r in records]
    assert [t.get("error") for t in trajectories] == [None] * 10
    assert [t["transitions"][-1]["reward"] for t in trajectories] == [1.0] * 10
    assert {t["info"]["node_id"] for t in trajectories} == set(node_ids(ray_cluster).values())
    assert live_actors() == []


@pytest.mark.timeout(2 * (120 + 60) + 60)
def test_ray_address_needs_a_stateful_env_and_a_reachable_cluster(
    ray_cluster: Any, tmp_path: Path
) -> None:
    out = str(tmp_path / "x.jsonl")
    pure = run_child(
        [*CLI, "run", "--env", "arithmetic", "-o", out, "--ray-address", ray_cluster.address],
        timeout=120,
    )  # fmt: skip
    assert pure.returncode != 0
    assert "--ray-address needs a stateful environment" in pure.stderr
    nowhere = run_child(
        [*CLI, "run", "--env", "counter", "-o", out, "--ray-address", "127.0.0.1:1"],
        timeout=120,
    )  # fmt: skip
    assert nowhere.returncode != 0
    assert "cannot connect to the Ray cluster at '127.0.0.1:1'" in nowhere.stderr


@pytest.mark.timeout(600 + 120)
def test_run_a_harbor_dataset_on_the_cluster(
    ray_cluster: Any, docker_engine: Any, tmp_path: Path
) -> None:
    out = tmp_path / "harbor.jsonl"
    tasks = ["-t", "csv-totals", "-t", "build-release"]
    proc = run_child(
        [*CLI, "run", str(REPO / "examples" / "tasks"), *tasks, "-n", "2", "-c", "4",
         "-o", str(out), "-q", "--ray-address", ray_cluster.address],
        timeout=600,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    trajectories = [json.loads(line)["trajectory"] for line in out.read_text().splitlines()]
    assert [t.get("error") for t in trajectories] == [None] * 4
    assert [t["transitions"][-1]["reward"] for t in trajectories] == [1.0] * 4
    assert {t["info"]["node_id"] for t in trajectories} == set(node_ids(ray_cluster).values())
    assert live_actors() == []
