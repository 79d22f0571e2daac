from __future__ import annotations

import asyncio
import shutil
import subprocess
from pathlib import Path

import pytest

from llenvs_async.serialization.results import ResultsError

from .conftest import CLI, EXAMPLE_TASKS, Invoke


def _one_line_error(err: str) -> str:
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1, err
    assert lines[0].startswith("error: ")
    assert "Traceback" not in err
    return lines[0]


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (["run"], "exactly one of"),
        (["run", "--env", "chain", str(EXAMPLE_TASKS)], "exactly one of"),
        (["run", "--env", "chian"], "unknown --env 'chian'"),
        (["run", "/no/such/tasks"], "no such directory"),
        (["run", "--env", "chain", "--bogus"], "--bogus"),
        (["run", "--env", "chain", "-n", "x"], "--rollouts"),
        (["run", "--env", "chain", "-n", "0"], "--rollouts"),
        (["run", "--env", "chain", "--epsilon", "2"], "--epsilon"),
        (["run", "--env", "chain", "--max-steps", "0"], "--max-steps"),
        (["run", "--env", "chain", "--backend", "gpt"], "--backend"),
        (["run", "--env", "chain", "--backend", "openai"], "--model and --base-url"),
        (["run", "--env", "chain", "--backend", "vllm"], "needs --model"),
        (
            ["run", "--env", "chain", "--backend", "openai", "--model", "M", "--base-url", "x"],
            "--base-url must be an http(s) URL",
        ),
        (["run", "--env", "chain", "-o", "/no/such/dir/r.jsonl"], "does not exist"),
        (["run", "--env", "chain", "-t", "99"], "unknown task '99'"),
        (["run", "--env", "chain", "--retry-failed"], "--retry-failed"),
        (["run", str(EXAMPLE_TASKS), "--base-image", "python"], "--base-image: a base-image"),
        (["run", str(EXAMPLE_TASKS), "--build-ca-bundle", "/no/ca.pem"], "no such file"),
        (["run", str(EXAMPLE_TASKS), "--command-timeout", "0"], "--command-timeout"),
        (["run", "--env", "chain", "--allow-network"], "need a Harbor DATASET"),
        (["run", "--env", "chain", "--schedule", "lockstep"], "'lockstep' is not one of"),
        (["q-values", "x.jsonl", "--schedule", "x"], "--schedule"),
        (["q-values", "/no/such.jsonl"], "does not exist"),
        (["q-values", "x.jsonl", "-n", "1"], "--rollouts"),
        (["q-values", "x.jsonl", "--step", "-1"], "--step"),
        (["q-values", "x.jsonl", "--plot", "/no/dir/q.png"], "--plot '/no/dir/q.png'"),
        (["q-values", "x.jsonl", "--json", "/no/dir/q.json"], "--json '/no/dir/q.json'"),
        (["q-values", "x.jsonl", "--trajectories", "/no/d/t.jsonl"], "--trajectories '/no/d/"),
        (["tasks", "list", "/no/such/tasks"], "no such directory"),
        (["validate-replay", str(EXAMPLE_TASKS), "--task", "nope"], "unknown task 'nope'"),
        (
            ["validate-replay", str(EXAMPLE_TASKS), "--task", "csv-totals", "--trials", "1"],
            "trials",
        ),
        (["nosuchcommand"], "nosuchcommand"),
    ],
)
def test_bad_input_is_one_line_and_exits_2(cli: Invoke, args: list[str], fragment: str) -> None:
    res = cli(*args)
    assert res.code == 2  # bad input: the usage-error code, whichever layer found it
    assert fragment in _one_line_error(res.err)


def test_existing_output_needs_resume_or_force(cli: Invoke, tmp_path: Path) -> None:
    out = tmp_path / "r.jsonl"
    assert cli("run", "--env", "chain", "--limit", "1", "-o", str(out), "-q").code == 0
    res = cli("run", "--env", "chain", "--limit", "1", "-o", str(out), "-q")
    assert res.code == 2
    assert "--resume" in _one_line_error(res.err)
    res = cli("run", "--env", "arithmetic", "--limit", "1", "-o", str(out), "--resume", "-q")
    assert "written for env chain, not env arithmetic" in _one_line_error(res.err)
    res = cli("run", "--env", "chain", "--max-steps", "4", "-o", str(out), "--resume", "-q")
    assert "not env chain (--max-steps 4)" in _one_line_error(res.err)
    res = cli("run", "--env", "arithmetic", "--limit", "1", "-o", str(out), "--force", "-q")
    assert res.code == 0


def test_force_keeps_the_old_file_when_the_run_cannot_start(cli: Invoke, tmp_path: Path) -> None:
    out = tmp_path / "r.jsonl"
    assert cli("run", "--env", "chain", "--limit", "1", "-o", str(out), "-q").code == 0
    before = out.read_bytes()
    res = cli("run", "--env", "chain", "-t", "99", "-o", str(out), "--force", "-q")  # a typo
    assert "unknown task '99'" in _one_line_error(res.err)
    assert out.read_bytes() == before
    res = cli("run", "--env", "chain", "-t", "1", "-o", str(out), "--force", "-q")
    assert res.code == 0, res.err
    assert out.read_bytes() != before
    assert out.read_text().count("\n") == 1


def test_malformed_results_file_names_the_line(cli: Invoke, tmp_path: Path) -> None:
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"key": 1}\nnot json\n{}\n')
    res = cli("q-values", str(bad))
    assert res.code == 1
    assert "bad.jsonl:2: malformed JSON" in _one_line_error(res.err)
    bad.write_text('{"key": {"task": 0, "rollout": 0}}\n')
    res = cli("q-values", str(bad))
    assert "no 'source'" in _one_line_error(res.err)


def test_console_script_process_gives_one_line(tmp_path: Path) -> None:
    proc = subprocess.run(
        [*CLI, "q-values", str(tmp_path / "missing.jsonl")], capture_output=True, text=True
    )
    assert proc.returncode == 2
    assert "missing.jsonl" in _one_line_error(proc.stderr)
    assert proc.stdout == ""


def test_tasks_list_of_a_harbor_directory_needs_no_docker(cli: Invoke) -> None:
    res = cli("tasks", "list", str(EXAMPLE_TASKS))
    assert res.code == 0
    for name in ("build-release", "csv-totals", "random-session"):
        assert name in res.out


def test_no_docker_engine_is_one_line_and_creates_no_output(
    cli: Invoke, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DOCKER_HOST", f"unix://{tmp_path}/no-docker.sock")
    out = tmp_path / "r.jsonl"
    res = cli("run", str(EXAMPLE_TASKS), "-o", str(out), "-q")
    assert res.code == 1
    assert "Docker engine" in _one_line_error(res.err)
    assert not out.exists()
    assert "Docker engine" in _one_line_error(cli("cleanup").err)


async def test_a_run_where_every_rollout_failed_exits_non_zero(tmp_path: Path, cli: Invoke) -> None:
    from llenvs_async.testing.openai_server import Fault, serve_openai_compatible

    out = tmp_path / "r.jsonl"
    async with serve_openai_compatible(faults=[Fault.http_error(400, times=10**6)]) as server:
        res = await asyncio.to_thread(
            cli, "run", "--env", "chain", "-o", str(out), "-q", "--backend", "openai",
            "--model", "fake-model", "--base-url", server.base_url,
        )  # fmt: skip
    assert res.code == 1
    assert "every rollout failed; first error: BackendError" in res.err
    assert out.read_text().count("\n") == 5  # the failed rollouts are still recorded


@pytest.mark.docker
def test_run_where_every_task_fails_to_start_is_one_line(
    cli: Invoke, tmp_path: Path, docker_ready: None
) -> None:
    import shutil

    tasks = tmp_path / "tasks"
    shutil.copytree(EXAMPLE_TASKS / "csv-totals", tasks / "csv-totals")
    dockerfile = tasks / "csv-totals" / "environment" / "Dockerfile"
    dockerfile.write_text("FROM ghcr.io/nowhere/missing:1\n")
    out = tmp_path / "r.jsonl"
    res = cli("run", str(tasks), "-o", str(out), "-q")
    assert res.code == 1
    line = _one_line_error(res.err)
    assert "every rollout failed" in line and "ghcr.io/nowhere/missing:1" in line
    assert "--base-image" in line
    assert len(out.read_text().splitlines()) == 1  # the failure is recorded, not dropped


def test_harbor_options_are_recorded_with_the_source() -> None:
    from llenvs_async.adapters.harbor import HarborSettings
    from llenvs_async.cli._sources import SourceSpec

    options = HarborSettings(
        base_image_aliases=(("python:3.*", "llenvs/python:3-bookworm"),), build_network=True,
        allow_network=True, command_timeout_sec=30.0,
    )  # fmt: skip
    spec = SourceSpec.from_flags(str(EXAMPLE_TASKS), None, None, options)
    data = spec.to_json()
    assert data["harbor"]["base_image_aliases"] == [["python:3.*", "llenvs/python:3-bookworm"]]
    assert SourceSpec.from_json(data, "x") == spec
    # A file written before HarborSettings (its names, None for the default timeout) reads.
    old = {**data, "harbor": {"base_images": [["python:3.*", "llenvs/python:3-bookworm"]],
                              "build_network": True, "allow_network": True,
                              "command_timeout": 30.0, "observation_chars": 10_000}}  # fmt: skip
    assert SourceSpec.from_json(old, "x") == spec
    older = {**data, "harbor": {"command_timeout": None}}
    assert SourceSpec.from_json(older, "x").harbor == HarborSettings()
    with pytest.raises(ResultsError, match=r"f: harbor: provision_verifier fetches.*build_network"):
        SourceSpec.from_json({**data, "harbor": {"provision_verifier": True}}, "f")
    plain = SourceSpec.from_flags(str(EXAMPLE_TASKS), None, None)
    assert "harbor" not in plain.to_json()  # files written before these flags still match
    assert SourceSpec.from_json(plain.to_json(), "x") == plain


def test_tasks_list_shows_unloadable_tasks_with_their_error(cli: Invoke, tmp_path: Path) -> None:
    real = Path(__file__).resolve().parents[1] / "adapters" / "harbor" / "tasks_real"
    shutil.copytree(real / "multi-step", tmp_path / "multi-step")
    toml = tmp_path / "multi-step" / "task.toml"
    toml.write_text(toml.read_text().replace('name = "create"', 'title = "create"'))
    res = cli("tasks", "list", str(tmp_path))
    assert res.code == 0, res.err
    flat = " ".join(res.out.replace("│", " ").split())
    assert "multi-step" in flat and "(cannot load:" in flat
    assert "steps[0].name" in flat  # shown as written, not eaten as markup
