"""Parsing the rest of Harbor's format: separate verifiers, artifacts, collect hooks and
``[[steps]]``; every bad value names its file, field and value. No Docker needed."""

from __future__ import annotations

import base64
import shutil
from pathlib import Path
from types import MappingProxyType

import pytest

from llenvs_async.adapters.harbor import (
    load_local_dataset,
    load_task,
    oracle_actions,
    parse_task_config,
)
from llenvs_async.adapters.harbor.episode.steps import aggregate, passes
from llenvs_async.adapters.harbor.verify.verifier import VerifierResult
from llenvs_async.errors import TaskLoadError

TASKS = Path(__file__).resolve().parent / "tasks_real"


def _verdict(reward: float, **rewards: float) -> VerifierResult:
    return VerifierResult(
        reward=reward, rewards=MappingProxyType({"reward": reward, **rewards}), source="x"
    )


def test_verifier_environment_table_implies_separate_and_keeps_its_resources() -> None:
    cfg = parse_task_config('[verifier.environment]\nmemory_mb = 256\nnetwork_mode = "no-network"')
    assert cfg.verifier.separate
    assert cfg.verifier.environment is not None
    assert cfg.verifier.environment.memory_mb == 256
    assert not parse_task_config("[verifier]\ntimeout_sec = 5").verifier.separate
    with pytest.raises(TaskLoadError) as info:
        parse_task_config(
            '[verifier]\nenvironment_mode = "shared"\n[verifier.environment]\ncpus = 1'
        )
    assert info.value.field == "verifier.environment_mode"


def test_collect_hooks_and_artifacts_are_typed() -> None:
    cfg = parse_task_config(
        'artifacts = ["/a", {source = "/b/c", destination = "d", exclude = ["x"]}]\n'
        '[[verifier.collect]]\ncommand = "echo hi"\n'
        '[[verifier.collect]]\ncommand = "dump"\nservice = "db"\ntimeout_sec = 5\n'
    )
    assert [(h.command, h.service, h.timeout_sec) for h in cfg.verifier.collect] == [
        ("echo hi", "main", 60.0),
        ("dump", "db", 5.0),
    ]
    assert [(a.source, a.target) for a in cfg.artifacts] == [("/a", "a"), ("/b/c", "d")]


@pytest.mark.parametrize(
    ("toml", "field", "value"),
    [
        ('artifacts = ["relative/path"]', "artifacts[0].source", "relative/path"),
        ('artifacts = ["/a/../etc"]', "artifacts[0].source", "/a/../etc"),
        ('artifacts = [{source = "/a", destination = "../x"}]', "artifacts[0].destination", "../x"),
        ("[[verifier.collect]]\ntimeout_sec = 3", "verifier.collect[0].command", None),
        ('multi_step_reward_strategy = "max"', "multi_step_reward_strategy", "max"),
        ("[[steps]]\nmin_reward = 1", "steps[0].name", None),
        ('[[steps]]\nname = "a"\n[[steps]]\nname = "a"', "steps[1].name", "a"),
        ('[[steps]]\nname = "a"\nmin_reward = "high"', "steps[0].min_reward", "high"),
        ('[[steps]]\nname = "a"\n[steps.agent]\nuser = "bob"', "steps[0].agent.user", "bob"),
        (
            '[[steps]]\nname = "a"\n[steps.verifier]\nenvironment_mode = "separate"',
            "steps[0].verifier.environment_mode",
            "separate",
        ),
    ],
)
def test_bad_values_name_their_field(toml: str, field: str, value: object) -> None:
    with pytest.raises(TaskLoadError) as info:
        parse_task_config(toml, path="t/task.toml")
    assert (info.value.path, info.value.field, info.value.value) == ("t/task.toml", field, value)


def test_step_configs_fall_back_to_the_task_tables() -> None:
    cfg = parse_task_config(
        '[agent]\ntimeout_sec = 100\n[verifier]\ntimeout_sec = 50\nenv = {A = "1"}\n'
        '[[steps]]\nname = "one"\nmin_reward = 1\n'
        '[[steps]]\nname = "two"\nmin_reward = {correct = 0.5}\n'
        '[steps.agent]\ntimeout_sec = 10\n[steps.verifier]\ntimeout_sec = 5\nenv = {B = "2"}\n'
    )
    one, two = cfg.step_configs
    assert (one.agent.timeout_sec, one.verifier.timeout_sec, one.min_reward) == (100, 50, 1.0)
    assert (two.agent.timeout_sec, two.verifier.timeout_sec) == (10, 5)
    assert dict(two.verifier.env) == {"A": "1", "B": "2"}
    assert two.min_reward == {"correct": 0.5}
    assert cfg.multi_step_reward_strategy == "mean"
    assert cfg.ignored == ()
    healthcheck = parse_task_config('[[steps]]\nname = "a"\n[steps.healthcheck]\ncommand = "true"')
    assert healthcheck.ignored == ("steps[0].healthcheck",)  # logged as ignored on load


def test_min_reward_gates_and_strategies() -> None:
    assert passes(None, _verdict(0.0))
    assert passes(1.0, _verdict(1.0)) and not passes(1.0, _verdict(0.9))
    assert passes({"correct": 1.0}, _verdict(0.0, correct=1.0))
    assert not passes({"missing": 0.0}, _verdict(1.0))  # a missing key fails the gate
    results = [{"reward": 1.0}, {"reward": 0.0}]
    assert aggregate("mean", results) == 0.5
    assert aggregate("final", results) == 0.0
    assert aggregate("mean", []) == 0.0


def test_three_step_task_loads_with_its_step_directories() -> None:
    task = load_local_dataset(TASKS).resolve("multi-step")[1]
    assert [s.name for s in task.steps] == ["create", "extend", "report"]
    create, extend, _ = task.steps
    assert create.tests_dir is None  # falls back to the task's tests/test.sh
    assert extend.workdir_dir is not None and (extend.workdir_dir / "setup.sh").is_file()
    actions = oracle_actions(task)
    assert len(actions) == 5 and actions[1] == actions[3] == "SUBMIT"
    assert actions[0] != actions[2]  # each step's own solution


def test_multi_step_task_without_its_files_is_refused(tmp_path: Path) -> None:
    shutil.copytree(TASKS / "multi-step", tmp_path / "t")
    (tmp_path / "t" / "steps" / "report" / "instruction.md").unlink()
    with pytest.raises(TaskLoadError, match="instruction of step 2 'report'") as info:
        load_task(tmp_path / "t")
    assert info.value.field == "steps[2].name"
    shutil.rmtree(tmp_path / "t")
    shutil.copytree(TASKS / "multi-step", tmp_path / "t")
    (tmp_path / "t" / "tests" / "test.sh").unlink()  # step 'create' has no tests/ of its own
    with pytest.raises(TaskLoadError, match="verifier of step 'create'"):
        load_task(tmp_path / "t")


def test_separate_verifier_needs_an_image_source(tmp_path: Path) -> None:
    shutil.copytree(TASKS / "separate-verifier", tmp_path / "t")
    (tmp_path / "t" / "tests" / "Dockerfile").unlink()
    with pytest.raises(TaskLoadError, match="tests/Dockerfile") as info:
        load_task(tmp_path / "t")
    assert info.value.field == "verifier.environment_mode"


def test_oracle_command_is_the_same_in_every_process() -> None:
    """No timestamp in the payload (gzip header included): a later process's oracle
    recognises the solution actions of a saved trajectory."""
    task = load_local_dataset(TASKS).resolve("multi-step")[1]
    payload = oracle_actions(task)[0].split("'")[3]
    assert base64.b64decode(payload)[4:8] == b"\0\0\0\0"  # gzip MTIME
