"""harbor_restore: identity checks before any command, replay without the budget, re-anchoring."""

from __future__ import annotations

import time

import pytest

from llenvs_async.adapters.harbor import (
    HarborAdapter,
    HarborEnvironment,
    collect_probes,
    harbor_restore,
)
from llenvs_async.docker.engine import DockerEngine
from llenvs_async.errors import ContinuationPromptError, RestoreError
from llenvs_async.types import Action, State

from .conftest import EXAMPLES, MakeRegistry, harbor_containers

pytestmark = pytest.mark.docker


async def play(env: HarborEnvironment, state: State, *commands: str) -> State:
    for command in commands:
        state = (await env.step(state, Action(text=command))).next_state
    return state


async def test_restored_instance_answers_probes_like_the_live_one(adapter: HarborAdapter) -> None:
    async with (
        await adapter.get_environment(EXAMPLES) as live,
        await adapter.get_environment(EXAMPLES) as fresh,
    ):
        state = await live.reset("build-release")
        commands = live.dataset.tasks[live.task_index].solution_commands()[:4]
        saved = await play(live, state, *commands)  # cd, mkdir, VERSION, compile
        probes = (*(await collect_probes(live)), "pwd", "cat build/app.txt")
        reference = await collect_probes(live, probes)

        restored = await harbor_restore(fresh, saved)
        assert (restored.step, restored.actions, restored.task) == (4, saved.actions, saved.task)
        assert restored.hidden["task_name"] == saved.hidden["task_name"]
        assert restored.info["restored"] is True
        assert await collect_probes(fresh, probes) == reference
        assert reference["pwd"] == "/app/project"  # the shell's cwd was replayed too

        # The restored instance continues like the live one would: finish and get reward 1.
        rest = fresh.dataset.tasks[fresh.task_index].solution_commands()[4:]
        done = await fresh.step(await play(fresh, restored, *rest), Action(text="SUBMIT"))
        assert done.reward == 1.0


async def test_index_drift_is_refused_before_any_command(
    docker_engine: DockerEngine, make_registry: MakeRegistry
) -> None:
    registry = make_registry(
        {
            "1.0": [("csv-totals", "csv-totals"), ("log-errors", "log-errors")],
            "2.0": [("log-errors", "log-errors"), ("csv-totals", "csv-totals")],
        }
    )
    adapter = HarborAdapter(cache_dir=registry.parent / "cache", registry=registry)
    async with await adapter.get_environment("examples@1.0") as old:
        saved = await play(old, await old.reset(0), "echo step-one > /app/note.txt")
    assert saved.hidden["task_name"] == "llenvs-examples/csv-totals"

    async with await adapter.get_environment("examples@2.0") as new:
        with pytest.raises(RestoreError, match="index drift") as info:
            await harbor_restore(new, saved)
        assert "llenvs-examples/csv-totals" in str(info.value) and "log-errors" in str(info.value)
        assert new.container is None  # nothing was started, so no command ran
        assert await harbor_containers(docker_engine) == []

        # The same state saved by name restores fine in the new version.
        async with await adapter.get_environment("examples@1.0") as old:
            by_name = await play(old, await old.reset("csv-totals"), "echo step-one")
        restored = await harbor_restore(new, by_name)
        assert restored.hidden["task_index"] == 1 and restored.step == 1


async def test_replayed_continuation_prompt_aborts_the_restore(adapter: HarborAdapter) -> None:
    async with (
        await adapter.get_environment(EXAMPLES) as live,
        await adapter.get_environment(EXAMPLES) as fresh,
    ):
        saved = await play(live, await live.reset("csv-totals"), "ls", 'echo "oops', "pwd")
        with pytest.raises(ContinuationPromptError) as info:
            await harbor_restore(fresh, saved)
        assert (info.value.step, info.value.command) == (2, 'echo "oops')


async def test_finished_or_foreign_states_are_refused(adapter: HarborAdapter) -> None:
    async with await adapter.get_environment(EXAMPLES) as env:
        state = await env.reset("csv-totals")
        done = (await env.step(state, Action(text="SUBMIT"))).next_state
        with pytest.raises(RestoreError, match="finished"):
            await harbor_restore(env, done)
        with pytest.raises(RestoreError, match="not produced by a HarborEnvironment"):
            await harbor_restore(env, State(observation=state.observation, task=0, hidden=None))


async def test_budget_is_reanchored_after_a_slow_replay_and_running_out_truncates(
    adapter: HarborAdapter,
) -> None:
    budget, spent = 6.0, 2.0
    async with (
        await adapter.get_environment(EXAMPLES, budget_sec=budget) as live,
        await adapter.get_environment(EXAMPLES, budget_sec=budget) as fresh,
    ):
        saved = await live.reset("csv-totals")
        assert saved.hidden["budget_used_sec"] == 0.0  # the reset is not charged
        walls, durations = [], []
        for command in ("sleep 1", "sleep 1"):
            before, started = saved.hidden["budget_used_sec"], time.monotonic()
            result = await live.step(saved, Action(text=command))
            walls.append(time.monotonic() - started)
            saved = result.next_state
            durations.append(result.info["duration_sec"])
            # Each step charges its command's time: at least the shell's own measure of
            # it, at most the whole step as the caller saw it (nothing outside it).
            charged = saved.hidden["budget_used_sec"] - before
            assert durations[-1] - 1e-5 <= charged <= walls[-1] + 1e-5
        used = saved.hidden["budget_used_sec"]
        assert spent <= sum(durations) and sum(durations) - 1e-5 <= used <= sum(walls) + 1e-5
        assert saved.hidden["budget_left_sec"] == pytest.approx(budget - used)

        started = time.monotonic()
        restored = await harbor_restore(fresh, saved)
        assert time.monotonic() - started >= spent  # the replay itself took the 2 s again
        assert restored.info["replay_sec"] >= spent
        assert restored.hidden["budget_used_sec"] == used  # ... but did not spend the budget
        assert fresh.budget_left_sec == pytest.approx(budget - used)

        # The continuation has exactly budget - used seconds of command time left: that is
        # the timeout its command ran under (the observation names it), and all of it is
        # charged.
        result = await fresh.step(restored, Action(text="sleep 30"))
        assert result.truncated and not result.terminated
        assert result.info["truncation_reason"] == "agent_timeout"
        assert result.info["truncation_message"] == "the trajectory time budget of 6s is used up"
        text = result.next_state.observation.text
        assert f"[command timed out after {budget - used:g}s and was interrupted]" in text
        assert "time budget of 6s is used up" in text
        assert result.info["timed_out"] is True
        # Interrupted at the timeout, not after the 30 s sleep (a hang guard, not a window).
        assert budget - used - 0.1 <= result.info["duration_sec"] < 30
        assert result.reward == 0.0  # verified: csv-totals is not solved
        assert result.next_state.hidden["budget_left_sec"] == 0.0
