"""``llenvs-async run --ray-address``: the same job with every instance in a Ray actor."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from .conftest import REPO, live_actors, node_ids

CLI = (sys.executable, "-m", "llenvs_async.cli")


def test_run_with_ray_address_spreads_the_job_over_the_cluster(
    ray_cluster: Any, tmp_path: Path
) -> None:
    out = tmp_path / "counter.jsonl"
    args = ["run", "--env", "counter", "-n", "2", "-c", "4", "-o", str(out), "-q"]
    proc = subprocess.run(
        [*CLI, *args, "--ray-address", ray_cluster.address],
        capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    records = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(records) == 10  # 5 tasks x 2 rollouts
    trajectories = [r["trajectory"] for r in records]
    assert [t.get("error") for t in trajectories] == [None] * 10
    assert [t["transitions"][-1]["reward"] for t in trajectories] == [1.0] * 10
    assert {t["info"]["node_id"] for t in trajectories} == set(node_ids(ray_cluster).values())
    assert live_actors() == []


def test_ray_address_needs_a_stateful_env_and_a_reachable_cluster(
    ray_cluster: Any, tmp_path: Path
) -> None:
    out = str(tmp_path / "x.jsonl")
    pure = subprocess.run(
        [*CLI, "run", "--env", "arithmetic", "-o", out, "--ray-address", ray_cluster.address],
        capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert pure.returncode != 0
    assert "--ray-address needs a stateful environment" in pure.stderr
    nowhere = subprocess.run(
        [*CLI, "run", "--env", "counter", "-o", out, "--ray-address", "127.0.0.1:1"],
        capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert nowhere.returncode != 0
    assert "cannot connect to the Ray cluster at '127.0.0.1:1'" in nowhere.stderr


def test_run_a_harbor_dataset_on_the_cluster(
    ray_cluster: Any, docker_engine: Any, tmp_path: Path
) -> None:
    out = tmp_path / "harbor.jsonl"
    tasks = ["-t", "csv-totals", "-t", "build-release"]
    proc = subprocess.run(
        [*CLI, "run", str(REPO / "examples" / "tasks"), *tasks, "-n", "2", "-c", "4",
         "-o", str(out), "-q", "--ray-address", ray_cluster.address],
        capture_output=True, text=True, timeout=600, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    trajectories = [json.loads(line)["trajectory"] for line in out.read_text().splitlines()]
    assert [t.get("error") for t in trajectories] == [None] * 4
    assert [t["transitions"][-1]["reward"] for t in trajectories] == [1.0] * 4
    assert {t["info"]["node_id"] for t in trajectories} == set(node_ids(ray_cluster).values())
    assert live_actors() == []
