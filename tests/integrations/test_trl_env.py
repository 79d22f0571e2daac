"""``environment_factory`` for TRL over Harbor instances, driven the way TRL's tool loop drives
it (``reset(**row)``, tool methods from the trainer's thread, ``get_reward()``), in real
containers; teardown when TRL drops an instance, at ``close`` and at interpreter exit.

Needs TRL (the ``trainers`` tier), a Docker engine and the base image (``make images``).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import gc
import os
import pickle
import sys
import textwrap
import threading
from pathlib import Path

import pytest

from llenvs_async import ClosedError, LlenvsError
from llenvs_async._ownership import OWNER_LABEL
from llenvs_async.adapters.harbor import load_task
from llenvs_async.adapters.harbor.images.image import TASK_IMAGE_LABEL
from llenvs_async.docker.engine import DockerEngine
from llenvs_async.integrations.trl_env import (
    HarborToolEnvironment,
    TRLHarborEnvironments,
    harbor_environment_factory,
)
from tests._support import run_child

pytestmark = [pytest.mark.trainers, pytest.mark.docker]
pytest.importorskip("trl")  # the tier: its adapter is TRL-facing

ROOT = Path(__file__).resolve().parents[2]
TASKS = ROOT / "examples" / "tasks"
TASK = "csv-totals"
LOOP_THREAD = "llenvs-trl-environments"


def task_containers(owner: str | None = None) -> list[str]:
    """Ids of Harbor task containers of ``owner`` (default: this process)."""

    async def ask() -> list[str]:
        async with DockerEngine() as engine:
            label = owner or engine.labels[OWNER_LABEL]
            found = await engine.list_containers({OWNER_LABEL: label, TASK_IMAGE_LABEL: None})
        return [str(c["Id"]) for c in found]

    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        return pool.submit(asyncio.run, ask()).result()


def loop_alive() -> bool:
    return any(t.name == LOOP_THREAD for t in threading.enumerate())


@pytest.fixture
def environments(tmp_path: Path, docker_images: None) -> TRLHarborEnvironments:
    return harbor_environment_factory(TASKS, max_steps=8)


@pytest.mark.timeout(180)
def test_tool_calls_drive_an_episode_and_the_reward_is_the_verifiers(
    environments: TRLHarborEnvironments,
) -> None:
    with environments:
        env = environments()
        instruction = env.reset(task=TASK, prompt=[{"role": "user", "content": ""}])
        assert "/app/totals.csv" in instruction  # the task's instruction, for the prompt
        assert len(task_containers()) == 1
        # one persistent shell: the directory a command left is the next one's
        assert env.bash("cd /tmp && touch here") == "(no output)"
        assert env.bash("pwd; ls here") == "/tmp\nhere"
        assert env.bash("false").endswith("[exit code: 1]")
        # the trainer stopped without a submit: verified now, the task is not done
        assert env.get_reward() == 0.0 and env.reward == 0.0

        env.reset(task=TASK)  # TRL reuses the instance for the next rollout
        assert len(task_containers()) == 1  # the previous episode's container is gone
        for command in load_task(TASKS / TASK).solution_commands():
            env.bash(command)
        assert env.submit() == "Submitted; the task was verified."
        assert env.get_reward() == 1.0
        assert env.state is not None and env.state.terminated and env.state.step == 4
        assert "nothing was run" in env.bash("rm -rf /app")

        budget = environments()
        budget.reset(task=TASK)
        for _ in range(8):
            reply = budget.bash("true")
        assert "truncated: max_steps" in reply
        assert budget.get_reward() == 0.0  # verified at truncation
        assert len(task_containers()) == 2
    assert task_containers() == [] and not loop_alive()
    with pytest.raises(ClosedError):
        environments()


@pytest.mark.timeout(180)
def test_bad_rows_and_failed_episodes(environments: TRLHarborEnvironments) -> None:
    with environments:
        env = environments()
        with pytest.raises(LlenvsError, match="no 'task' column") as info:
            env.reset(prompt="x", task_dir="/somewhere")
        assert info.value.details["field"] == "task"
        with pytest.raises(LlenvsError, match=r"row\['task'\] must be a task index or name"):
            env.reset(task=[1])
        with pytest.raises(LlenvsError, match="reset"):
            env.bash("ls")  # TRL turns a tool's error into {"error": ...} for the model
        # a task that does not exist: the rollout fails, as data, and is left unscored
        assert env.reset(task="no-such-task").startswith("The environment failed: EnvError")
        assert env.error is not None and env.get_reward() is None
        assert env.bash("ls").startswith("The environment failed")

    strict = TRLHarborEnvironments(TASKS, failures="raise")
    with strict, pytest.raises(LlenvsError):
        strict().reset(task="no-such-task")
    zero = TRLHarborEnvironments(TASKS, failures="zero")
    with zero:
        env = zero()
        env.reset(task=99)
        assert env.get_reward() == 0.0
    with pytest.raises(ValueError, match="failures"):
        TRLHarborEnvironments(TASKS, failures="drop")  # type: ignore[arg-type]
    assert task_containers() == []


@pytest.mark.timeout(180)
def test_an_instance_trl_drops_loses_its_container(docker_images: None) -> None:
    environments = harbor_environment_factory(TASKS)  # held here only: a fixture keeps its own
    kept, dropped = environments(), environments()
    kept.reset(task=TASK)
    dropped.reset(task=TASK)
    assert len(task_containers()) == 2
    del dropped  # no close: what happens when TRL's pool lets an instance go
    gc.collect()
    environments.bridge.settle()  # the finalizer's close, started on the loop, is done
    assert len(task_containers()) == 1 and kept.bash("echo on") == "on"
    del kept, environments  # the factory too, never closed
    gc.collect()
    assert task_containers() == [] and not loop_alive()


ATEXIT_CHILD = textwrap.dedent(
    """
    from llenvs_async._ownership import OWNER_LABEL, current_owner
    from llenvs_async.integrations.trl_env import harbor_environment_factory

    environments = harbor_environment_factory({tasks!r})
    envs = [environments(), environments()]
    for env in envs:
        env.reset(task={task!r})
    print(current_owner().labels[OWNER_LABEL], flush=True)
    # no close, nothing dropped: the process ends with the instances still held
    """
)


@pytest.mark.timeout(240)
def test_instances_left_open_are_closed_at_interpreter_exit(docker_images: None) -> None:
    code = ATEXIT_CHILD.format(tasks=str(TASKS), task=TASK)
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "PYTHONPATH": str(ROOT)}
    done = run_child([sys.executable, "-c", code], timeout=120, env=env)
    assert done.returncode == 0, done.stderr
    owner = done.stdout.strip()  # host:pid of the child, whose containers were up
    assert ":" in owner, done.stdout
    assert task_containers(owner) == []


def test_the_factory_pickles_as_its_arguments(tmp_path: Path) -> None:
    pytest.importorskip("trl")
    with TRLHarborEnvironments(TASKS, max_steps=5, task_field="name") as original:
        copy = pickle.loads(pickle.dumps(original))
        with copy:
            assert copy is not original and copy.bridge is not original.bridge
            assert copy.task_field == "name" and copy.dataset == TASKS
            assert copy._arguments == original._arguments


@pytest.mark.timeout(240)
def test_grpo_trainer_takes_our_tools_and_reward(
    environments: TRLHarborEnvironments, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    trl = pytest.importorskip("trl")
    transformers = pytest.importorskip("transformers")
    datasets = pytest.importorskip("datasets")
    from trl.chat_template_utils import qwen3_template

    from llenvs_async.testing.tiny_model import cached_tiny_model

    monkeypatch.setenv("TRL_EXPERIMENTAL_SILENCE", "1")
    model_dir = cached_tiny_model()
    tokenizer = transformers.AutoTokenizer.from_pretrained(model_dir)
    tokenizer.response_template = qwen3_template  # our Qwen3-shaped template's tool calls
    with environments:
        trainer = trl.GRPOTrainer(
            model=transformers.AutoModelForCausalLM.from_pretrained(model_dir),
            args=trl.GRPOConfig(
                output_dir=str(tmp_path),
                per_device_train_batch_size=2,
                num_generations=2,
                max_steps=1,
                max_completion_length=16,
                report_to="none",
                use_cpu=True,
                bf16=False,
                disable_tqdm=True,
            ),
            train_dataset=datasets.Dataset.from_dict(
                {"prompt": [[{"role": "user", "content": ""}]] * 2, "task": [TASK, TASK]}
            ),
            processing_class=tokenizer,
            environment_factory=environments,
        )
        # TRL probed one instance: our tools, and the environment owns the reward
        assert sorted(tool.__name__ for tool in trainer.tools) == ["bash", "submit"]
        assert trainer.reward_func_names == [HarborToolEnvironment.__name__]
        trainer.train()  # the random model calls no tool: reset, then a verified reward
        rollouts = trainer.environments
        assert len(rollouts) == 2 and all(e.state is not None for e in rollouts)
        assert [e.get_reward() for e in rollouts] == [0.0, 0.0]
        assert len(task_containers()) == 2
    assert task_containers() == [] and not loop_alive()
