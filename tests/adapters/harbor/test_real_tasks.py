"""Third-party task shapes (``tasks_real/``) run by ``llenvs-async run`` with Harbor's oracle:
every solvable task scores 1.0, every unsupported one records its own clear error.

The shapes: digest-pinned and registry-qualified ``FROM``, python/ubuntu bases (local
stand-ins), ``ARG``-expanded ``FROM``, ``COPY --from`` a stage and an external image,
apt/pip installs at build time (no build network: a clear error; with one, apt reaches only
a repository the test serves on 127.0.0.1), heredoc and multi-line
``solve.sh`` with files under ``solution/``, ``set -euo pipefail``, ``[solution].env``, a
three-step task (and one whose second step misses its ``min_reward``, which ends the
episode), a separate verifier with artifacts and a collect hook, a compose sidecar the main
container talks to (pod-style), a verifier that needs the internet, a terminal-bench-style
uv/uvx verifier (run offline with ``--provision-verifier``: test_provision.py).
"""

from __future__ import annotations

import asyncio
import json
import shutil
import uuid
from pathlib import Path
from typing import Any

import pytest

from llenvs_async.adapters.harbor import load_local_dataset
from llenvs_async.cli import main
from llenvs_async.docker.engine import DockerEngine
from llenvs_async.docker.images import PYTHON_STANDIN
from tests._support import require_built_images

from ._local_index import DEBS, apt_tree, cached_packages, serve
from .conftest import harbor_containers

TASKS = Path(__file__).resolve().parent / "tasks_real"
SOLVABLE = {
    "arg-from-solution-files",
    "compose-sidecar",
    "digest-pinned-heredoc",
    "hub-python-heredoc",
    "multistage-copy-from",
    "set-e-functions-env",
    "ubuntu-multiline-string",
    "separate-verifier",
    "multi-step",
}
# task -> the oracle's rewards per transition (solve.sh as ONE action, then SUBMIT; a
# multi-step task's step solutions in turn, each step boundary a transition of its own)
ORACLE_REWARDS = {name: [0.0, 1.0] for name in SOLVABLE} | {
    "multi-step": [0.0, 0.0, 0.0, 0.0, 0.0, 1.0],
    "multi-step-gated": [0.0, 0.0, 0.0, 0.5],  # step 2 scores 0 < min_reward: mean(1, 0)
}
# task -> (error type, words its message must hold)
REFUSED: dict[str, tuple[str, tuple[str, ...]]] = {
    "apt-install-build": ("ImageError", ("apt-get install", "build log", "--build-network")),
    "pip-install-build": ("ImageError", ("pip install", "build log", "--build-network")),
    "copy-from-external-image": (
        "ImageError",
        ("ghcr.io/astral-sh/uv:0.5.11", "COPY --from on line 2", "--base-image"),
    ),
    "uv-verifier": (
        "VerifierError",
        ("needs the internet", "no-network", "--build-network --provision-verifier"),
    ),
    "verifier-needs-network": (
        "VerifierError",
        ("needs the internet", "the run grants none", "--allow-network"),
    ),
}


def _fresh_copy(tmp_path: Path) -> Path:
    """The task set with the apt/pip build steps made unique to this run: a layer cached by
    an earlier build with a network would otherwise let the offline build succeed."""
    copy = tmp_path / "tasks_real"
    shutil.copytree(TASKS, copy)
    for name in ("apt-install-build", "pip-install-build"):
        dockerfile = copy / name / "environment" / "Dockerfile"
        text = dockerfile.read_text().replace("RUN ", f"RUN : {uuid.uuid4().hex} && ", 1)
        dockerfile.write_text(text)
    return copy


def _records(path: Path) -> dict[str, dict[str, Any]]:
    records = [json.loads(line) for line in path.read_text().splitlines()]
    return {str(r["key"]["task"]).rsplit("/", 1)[-1]: r["trajectory"] for r in records}


def test_the_task_set_covers_every_shape() -> None:
    dataset = load_local_dataset(TASKS)
    loaded = {t.short_name for t in dataset.tasks}
    assert len(loaded) + len(dataset.unloadable) >= 10
    unloadable = {name.rsplit("/", 1)[-1] for name in dataset.unloadable}
    assert unloadable == set()
    assert loaded == (set(ORACLE_REWARDS) | set(REFUSED)) - unloadable
    hub = dataset.resolve("hub-python-heredoc")[1]
    assert hub.declared_workdir == "/workspace"
    command = dataset.resolve("set-e-functions-env")[1].oracle_command()
    assert "GREETING=hello" in command and command.endswith("bash /solution/solve.sh")


@pytest.mark.docker
@pytest.mark.slow
async def test_oracle_run_scores_solvable_tasks_and_names_each_refusal(
    tmp_path: Path,
    docker_engine: DockerEngine,
    capsys: pytest.CaptureFixture[str],
    caplog: pytest.LogCaptureFixture,
) -> None:
    await require_built_images(docker_engine, PYTHON_STANDIN)  # the python:3* stand-in
    out = tmp_path / "real.jsonl"
    args = ["run", str(_fresh_copy(tmp_path)), "-o", str(out), "--quiet", "--n-concurrent", "4"]
    code = await asyncio.to_thread(main, args)  # the CLI runs its own event loop
    assert code == 0, capsys.readouterr().err
    trajectories = _records(out)
    assert set(trajectories) == set(ORACLE_REWARDS) | set(REFUSED)
    for name, expected in ORACLE_REWARDS.items():
        traj = trajectories[name]
        assert traj["error"] is None, (name, traj["error"])
        assert [t["reward"] for t in traj["transitions"]] == expected, name
    gated = trajectories["multi-step-gated"]["transitions"][-1]["info"]
    assert gated["multi_step_end"] == "min_reward"
    assert [r["name"] for r in gated["step_results"]] == ["create", "extend"]  # never 'report'
    separate = trajectories["separate-verifier"]["transitions"][-1]["info"]
    assert separate["collect_hooks"][0]["exit_code"] == 0
    assert {a["source"]: a["files"] for a in separate["artifacts"]} == {
        "/logs/artifacts": 1,
        "/app/numbers.txt": 1,
        "/app/out": 1,  # total.txt; scratch.tmp is excluded
    }
    for name, (kind, words) in REFUSED.items():
        error = trajectories[name]["error"]
        assert error is not None, name
        assert error["type"] == kind, (name, error)
        for word in words:
            assert word in error["message"], (name, word, error["message"])
    assert await harbor_containers(docker_engine) == []
    substituted = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert (
        "task llenvs-real/ubuntu-multiline-string: using local image llenvs/base:bookworm "
        "for ubuntu:24.04" in substituted
    )


@pytest.mark.docker
@pytest.mark.slow
async def test_build_network_lets_apt_install_at_build_time(
    tmp_path: Path, docker_engine: DockerEngine
) -> None:
    """The build's apt reaches only an apt repository this test serves on 127.0.0.1 (the
    task's sources replaced by it; .debs from ``scripts/ensure-test-packages.sh``)."""
    served = apt_tree(cached_packages(DEBS), tmp_path / "apt")
    assert "jq" in served
    tasks = _fresh_copy(tmp_path)
    out = tmp_path / "apt.jsonl"
    args = ["run", str(tasks), "-t", "apt-install-build", "-o", str(out), "-q", "--build-network"]
    with serve(tmp_path / "apt") as (url, requests):
        dockerfile = tasks / "apt-install-build" / "environment" / "Dockerfile"
        only_ours = (
            f"RUN rm -rf /etc/apt/sources.list.d && echo 'deb [trusted=yes] {url} ./' "
            "> /etc/apt/sources.list\nRUN "
        )
        dockerfile.write_text(dockerfile.read_text().replace("RUN ", only_ours, 1))
        assert await asyncio.to_thread(main, args) == 0
    paths = [p.removeprefix("/.") for p in requests]  # apt asks for /./Packages.xz
    assert "/Packages" in paths and any(p.startswith("/jq_") for p in paths)
    trajectory = _records(out)["apt-install-build"]
    assert trajectory["error"] is None
    assert [t["reward"] for t in trajectory["transitions"]] == [0.0, 1.0]
    assert await harbor_containers(docker_engine) == []


@pytest.mark.docker
@pytest.mark.slow
async def test_allow_network_without_a_bridge_says_why_the_verifier_failed(
    tmp_path: Path, docker_engine: DockerEngine
) -> None:
    """Only on a daemon without a bridge (``scripts/ensure-docker.sh``: ``--bridge=none``),
    where a granted network is loopback only: a daemon with one would let this verifier
    reach the internet, which no test may do."""
    query = {"filters": json.dumps({"name": ["bridge"]})}
    networks = await docker_engine.request_json("GET", "networks", params=query)
    if any(n.get("Name") == "bridge" for n in networks or []):
        pytest.skip(
            "the Docker daemon has a bridge network: this verifier would leave loopback "
            "(start it with scripts/ensure-docker.sh)"
        )
    await require_built_images(docker_engine, PYTHON_STANDIN)
    out = tmp_path / "net.jsonl"
    args = ["run", str(TASKS), "-t", "verifier-needs-network", "-o", str(out), "-q"]
    await asyncio.to_thread(main, [*args, "--allow-network"])
    error = _records(out)["verifier-needs-network"]["error"]
    assert error is not None and error["type"] == "VerifierError", error
    assert "was given a network, yet the Docker daemon has no bridge network" in error["message"]
    assert "--bridge=none" in error["message"]
    assert await harbor_containers(docker_engine) == []


@pytest.mark.docker
@pytest.mark.slow
async def test_q_values_restore_across_a_step_boundary(
    tmp_path: Path, docker_engine: DockerEngine
) -> None:
    """``q-values`` restores the three-step task mid-step 2 (replaying the step-1 boundary):
    the oracle then finishes every step (V = 1), a wrong action fails step 2's min_reward."""
    out, estimates = tmp_path / "steps.jsonl", tmp_path / "q.json"
    run = ["run", str(TASKS), "-t", "multi-step", "-o", str(out), "-q"]
    assert await asyncio.to_thread(main, run) == 0
    wrong = "echo wrong >> /app/f"
    args = ["q-values", str(out), "--step", "3", "-n", "2", "--no-file-actions", "-a", wrong]
    assert await asyncio.to_thread(main, [*args, "--json", str(estimates)]) == 0
    rows = {(r["kind"], r["action"]): r for r in json.loads(estimates.read_text())}
    assert rows["V", None]["returns"] == [1.0, 1.0]
    assert rows["Q", wrong]["returns"] == [0.5, 0.5]  # mean(create 1.0, extend 0.0)
    assert await harbor_containers(docker_engine) == []
