"""Multi-step tasks against the real engine: step boundaries as observations, restore across a
boundary (the replay re-runs it), Harbor's mid-task start, and a failing ``setup.sh``."""

from __future__ import annotations

import contextlib
import shutil
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import pytest

from llenvs_async.adapters.harbor import (
    HarborAdapter,
    HarborEnvironment,
    SnapshotRestore,
    harbor_restore,
    oracle_actions,
    start_at_step,
)
from llenvs_async.docker import Container, ContainerSpec, DockerEngine
from llenvs_async.docker.runtime import RuntimeHost
from llenvs_async.errors import EnvError
from llenvs_async.host import ShellSession
from llenvs_async.types import Action, State, StepResult

pytestmark = pytest.mark.docker

TASKS = Path(__file__).resolve().parent / "tasks_real"


async def play(env: HarborEnvironment, state: State, *commands: str) -> StepResult:
    result = None
    for command in commands:
        result = await env.step(state, Action(text=command))
        state = result.next_state
    assert result is not None
    return result


async def test_restore_across_a_step_boundary_reruns_it(adapter: HarborAdapter) -> None:
    async with await adapter.get_environment(TASKS) as live:
        first = await live.reset("multi-step")
        assert first.observation.text.startswith("Step 1 of 3 (create):")
        assert first.hidden["step_name"] == "create"
        actions = oracle_actions(live.dataset.resolve("multi-step")[1])
        boundary = await play(live, first, *actions[:2])  # step 1's solution, SUBMIT
        assert not boundary.next_state.done and boundary.reward == 0.0
        assert boundary.info["step_boundary"] is True and boundary.info["step_reward"] == 1.0
        assert "Step 2 of 3 (extend):" in boundary.next_state.observation.text
        saved = (await play(live, boundary.next_state, actions[2])).next_state  # mid step 2
        assert saved.hidden["step_index"] == 1
        assert saved.hidden["budget_sec"] == 60.0  # [steps.agent].timeout_sec of 'extend'

    async with await adapter.get_environment(TASKS) as fresh:
        restored = await harbor_restore(fresh, saved)
        assert (restored.step, restored.hidden["step_name"]) == (3, "extend")
        assert restored.hidden["step_results"] == saved.hidden["step_results"]
        # the replayed SUBMIT re-ran the boundary: step 2's setup.sh staged its word again
        assert (await fresh.probe("cat /app/next-word.txt /app/f")).split() == ["two", "one", "two"]
        done = await play(fresh, restored, actions[3], actions[4], "SUBMIT")
        assert done.next_state.terminated and done.reward == 1.0
        assert done.info["multi_step_end"] == "completed"
        assert [r["name"] for r in done.info["step_results"]] == ["create", "extend", "report"]


async def test_start_at_step_replays_earlier_oracle_solutions(adapter: HarborAdapter) -> None:
    async with await adapter.get_environment(TASKS) as env:
        state = await start_at_step(env, "multi-step", "report")
        assert (state.step, state.hidden["step_index"]) == (4, 2)
        assert state.info["started_at_step"] == "report"
        assert state.observation.text.startswith("Step 2 of 3 is submitted. Step 3 of 3 (report)")
        assert [r["reward"] for r in state.hidden["step_results"]] == [1.0, 1.0]
        solve = oracle_actions(env.dataset.resolve("multi-step")[1])[-1]
        done = await play(env, state, solve, "SUBMIT")
        assert done.reward == 1.0
        with pytest.raises(EnvError, match="no step 'missing'"):
            await start_at_step(env, "multi-step", "missing")


async def test_a_min_reward_miss_ends_the_episode_before_the_next_step(
    adapter: HarborAdapter,
) -> None:
    async with await adapter.get_environment(TASKS) as env:
        state = await env.reset("multi-step")
        done = await play(
            env, state, "echo one > /app/f", "SUBMIT", "echo wrong >> /app/f", "SUBMIT"
        )
        assert done.next_state.terminated
        assert done.info["multi_step_end"] == "min_reward"
        assert done.reward == 0.5  # mean of create (1.0) and extend (0.0); report never ran
        assert "fell short of its min_reward" in done.next_state.observation.text


async def test_a_failing_setup_sh_is_a_clear_error(tmp_path: Path, adapter: HarborAdapter) -> None:
    task = tmp_path / "multi-step"
    shutil.copytree(TASKS / "multi-step", task)
    (task / "steps" / "extend" / "workdir" / "setup.sh").write_text("echo broken >&2; exit 7\n")
    async with await adapter.get_environment(task) as env:
        state = await env.reset()
        with pytest.raises(EnvError, match=r"step 1 'extend'.*setup.sh exited with 7.*broken"):
            await play(env, state, "echo one > /app/f", "SUBMIT")


async def test_snapshot_fork_resumes_in_the_saved_step(adapter: HarborAdapter) -> None:
    async with contextlib.AsyncExitStack() as stack:
        restore = await stack.enter_async_context(SnapshotRestore())  # closed after the envs
        live, first, second = [
            await stack.enter_async_context(await adapter.get_environment(TASKS)) for _ in range(3)
        ]
        actions = oracle_actions(live.dataset.resolve("multi-step")[1])
        saved = (await play(live, await live.reset("multi-step"), *actions[:3])).next_state
        replayed = await restore(first, saved)
        forked = await restore(second, saved)
        assert forked.info["restore"]["method"] == "snapshot"
        for env, state in ((first, replayed), (second, forked)):
            assert (state.hidden["step_name"], state.hidden["step_results"]) == (
                "extend",
                saved.hidden["step_results"],
            )
            done = await play(env, state, actions[3], actions[4], "SUBMIT")
            assert done.reward == 1.0
            assert [r["name"] for r in done.info["step_results"]] == ["create", "extend", "report"]


@dataclass(frozen=True)
class _CommitPoint:
    """A fork point resumed as a gVisor checkpoint is (``ForkPoint.resume``: a started box
    and its shell), here a runc container from a commit of the saved one."""

    engine: DockerEngine
    image: str
    name: str = "multi-step-point"

    async def resume(self, labels: Mapping[str, str]) -> tuple[RuntimeHost, ShellSession]:
        container = await Container.create(self.engine, ContainerSpec(image=self.image))
        shell = await container.shell()
        await shell.run("cd /app")  # a checkpoint keeps the shell's directory: stand in for it
        return container, shell


async def test_a_box_resumed_from_a_fork_point_continues_in_the_saved_step(
    adapter: HarborAdapter, docker_engine: DockerEngine
) -> None:
    """``resume`` with a checkpoint-style point restores the step index and results as a
    commit's resume does (a checkpoint resume used to restart at step 1's bookkeeping)."""
    images: list[str] = []
    try:
        async with contextlib.AsyncExitStack() as stack:
            live, resumed_env = [
                await stack.enter_async_context(await adapter.get_environment(TASKS))
                for _ in range(2)
            ]
            actions = oracle_actions(live.dataset.resolve("multi-step")[1])
            saved = (await play(live, await live.reset("multi-step"), *actions[:3])).next_state
            assert saved.hidden["step_index"] == 1 and live.container is not None
            images.append(await live.container.commit("llenvs-test-fork-point", "multi-step"))
            resumed = await resumed_env.resume(_CommitPoint(docker_engine, images[0]), saved)
            assert resumed.hidden["step_index"] == 1 and resumed.episode_id != saved.episode_id
            assert resumed.hidden["step_results"] == saved.hidden["step_results"]
            done = await play(resumed_env, resumed, actions[3], actions[4], "SUBMIT")
            assert done.reward == 1.0
            names = [r["name"] for r in done.info["step_results"]]
            assert names == ["create", "extend", "report"]
    finally:  # once the containers that use it are gone
        for image in images:
            await docker_engine.remove_image(image)
