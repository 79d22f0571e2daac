"""validate_replay_consistency: deterministic tasks replay identically, random ones do not."""

from __future__ import annotations

import pytest

from llenvs_async.adapters.harbor import (
    HarborAdapter,
    HarborEnvironment,
    collect_probes,
    default_probes,
    validate_replay_consistency,
)
from llenvs_async.docker.engine import DockerEngine
from llenvs_async.types import Action

from .conftest import EXAMPLES, harbor_containers

pytestmark = pytest.mark.docker


async def test_deterministic_prefix_is_consistent_and_matches_the_live_instance(
    adapter: HarborAdapter, docker_engine: DockerEngine
) -> None:
    opened: list[HarborEnvironment] = []

    async def env_factory() -> HarborEnvironment:
        env = await adapter.get_environment(EXAMPLES, max_steps=30)
        opened.append(env)
        return env

    async with await env_factory() as live:
        state = await live.reset("build-release")
        task_index = live.task_index
        commands = live.dataset.tasks[task_index].solution_commands()
        for command in commands:
            state = (await live.step(state, Action(text=command))).next_state
        reference = await collect_probes(live)
        assert reference == await collect_probes(live)  # probes are read-only
        assert live.current_state == state  # ... and take no step

    report = await validate_replay_consistency(
        env_factory=env_factory,
        task_index=task_index,
        trajectory=(*commands, "SUBMIT"),
        num_trials=3,
        reference_probes=reference,
    )
    assert report["consistent"] is True
    assert report["matches_reference"] is True
    assert report["divergence_details"] == []
    assert report["task_name"] == "llenvs-examples/build-release"
    assert len(report["probe_outputs"]) == 3
    assert set(report["probe_outputs"][0]) == set(default_probes("/app"))
    assert "./release.tar" in report["probe_outputs"][0][default_probes("/app")[0]]
    assert len(opened) == 4 and all(env.closed for env in opened)
    assert await harbor_containers(docker_engine) == []


async def test_non_deterministic_commands_are_caught(adapter: HarborAdapter) -> None:
    async def env_factory() -> HarborEnvironment:
        return await adapter.get_environment(EXAMPLES)

    dataset = await adapter.get_dataset(EXAMPLES)
    index = dataset.index_of("random-session")
    report = await validate_replay_consistency(
        env_factory, index, dataset.tasks[index].solution_commands(), num_trials=2
    )
    assert report["consistent"] is False
    assert report["matches_reference"] is None
    details = {d["probe"]: d for d in report["divergence_details"]}
    tree, digests, _packages = default_probes("/app")
    assert set(details) == {tree, digests}  # packages did not change
    assert details[digests]["kind"] == "between_trials"
    assert details[digests]["groups"] == [["trial0"], ["trial1"]]
    assert "session/token.txt" in details[digests]["diff"]
    assert "session/scratch." in details[tree]["diff"]


async def test_probes_never_step_or_verify(adapter: HarborAdapter) -> None:
    async def env_factory() -> HarborEnvironment:
        return await adapter.get_environment(EXAMPLES, max_steps=1)

    dataset = await adapter.get_dataset(EXAMPLES)
    index = dataset.index_of("csv-totals")
    probe = "ls /logs/verifier /tests 2>&1; cat /app/x; echo probed"
    report = await validate_replay_consistency(
        env_factory, index, ["echo hi > /app/x", "SUBMIT"], probe_commands=[probe], num_trials=2
    )
    # max_steps=1 is reached by the replay, then a SUBMIT: still no verifier ran.
    (output,) = {o[probe] for o in report["probe_outputs"]}
    assert "No such file" in output and output.endswith("hi\nprobed")
    assert report["consistent"] is True


async def test_reference_mismatch_is_reported(adapter: HarborAdapter) -> None:
    async def env_factory() -> HarborEnvironment:
        return await adapter.get_environment(EXAMPLES)

    dataset = await adapter.get_dataset(EXAMPLES)
    report = await validate_replay_consistency(
        env_factory,
        dataset.index_of("csv-totals"),
        ["echo region,total > /app/totals.csv"],
        num_trials=2,
        reference_probes={"cat /app/totals.csv": "region,total\neast,314.75"},
    )
    assert report["consistent"] is True
    assert report["matches_reference"] is False
    (detail,) = report["divergence_details"]
    assert detail["kind"] == "vs_reference"
    assert detail["groups"] == [["reference"], ["trial0", "trial1"]]
    assert "-east,314.75" in detail["diff"]
