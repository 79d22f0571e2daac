"""SnapshotRestore: replay once, commit, fork; same state as replay; fallbacks; no leftovers."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Sequence

import pytest

from llenvs_async import ScriptedBackend, TrajectoryRunner
from llenvs_async._ownership import current_owner
from llenvs_async.adapters.harbor import (
    HarborAdapter,
    HarborEnvironment,
    SnapshotRestore,
    collect_probes,
    default_probes,
    harbor_restore,
)
from llenvs_async.docker.engine import DockerEngine
from llenvs_async.docker.snapshots import list_snapshot_images
from llenvs_async.errors import ContinuationPromptError, RestoreError
from llenvs_async.policies import fenced
from llenvs_async.types import (
    Action,
    Completion,
    GenerationRequest,
    SamplingParams,
    State,
    StepResult,
    Trajectory,
)

from .conftest import EXAMPLES, harbor_containers

pytestmark = pytest.mark.docker

DETERMINISTIC = (
    "build-release",
    "csv-totals",
    "fix-shell-script",
    "json-config",
    "log-errors",
    "organize-files",
)
# Shell state a commit does not keep, appended to each task's solution.
SHELL_STATE = (
    "export LLENVS_SNAP='two words $x'",
    "unset HOME",
    "umask 027",
    "mkdir -p /app/deep/dir && cd /app/deep/dir",
)
# The first command after the restore depends on that shell state.
CONTINUE = 'touch after && echo "$LLENVS_SNAP|${HOME-unset}|$(pwd)" > /app/seen.txt && ls -l after'
PROBES = ("pwd", "umask", "(unset HOSTNAME; export -p)")


async def own_snapshot_images(engine: DockerEngine) -> list[str]:
    images = await list_snapshot_images(engine, owner=current_owner().label)
    return [str(image["Id"]) for image in images]


@pytest.fixture(autouse=True)
async def no_snapshot_images(docker_engine: DockerEngine) -> AsyncIterator[None]:
    yield
    assert await own_snapshot_images(docker_engine) == [], "the test left snapshot images"


async def play(env: HarborEnvironment, state: State, commands: Sequence[str]) -> State:
    for command in commands:
        state = (await env.step(state, Action(text=command))).next_state
    return state


@pytest.mark.parametrize("task", DETERMINISTIC)
async def test_forked_instances_match_the_live_one_and_replay_restore(
    adapter: HarborAdapter, task: str
) -> None:
    async with contextlib.AsyncExitStack() as stack:
        restore = await stack.enter_async_context(SnapshotRestore())  # closed after the envs
        envs = [
            await stack.enter_async_context(await adapter.get_environment(EXAMPLES))
            for _ in range(4)
        ]
        live, first, second, replayed = envs
        state = await live.reset(task)
        solution = live.dataset.tasks[live.task_index].solution_commands()
        saved = await play(live, state, (*solution, *SHELL_STATE))

        forked = await asyncio.gather(restore(first, saved), restore(second, saved))
        restored = [*forked, await harbor_restore(replayed, saved)]
        (image,) = restore.images
        assert sorted(list(s.info["restore"].items()) for s in forked) == [
            [("method", "replay"), ("snapshot", image)],  # the one that replayed and committed
            [("method", "snapshot"), ("image", image)],
        ]
        assert restore.stats.replays == 1 and restore.stats.forks == 1
        for state_now in restored:
            assert (state_now.step, state_now.actions) == (saved.step, saved.actions)
            assert state_now.hidden["budget_used_sec"] == saved.hidden["budget_used_sec"]
        for env in (first, second):
            assert env.budget_left_sec == pytest.approx(saved.hidden["budget_left_sec"])

        steps = [
            await env.step(state_now, Action(text=CONTINUE))
            for env, state_now in zip(envs, [saved, *restored], strict=True)
        ]
        probes = (*default_probes("/app"), *PROBES, "cat /app/seen.txt")
        outputs = [await collect_probes(env, probes) for env in envs]

    texts = [s.next_state.observation.text for s in steps]
    assert texts[0].startswith("-rw-r----- 1 root root 0 ")  # umask 027 carried over
    assert [t.split(" 0 ")[0] for t in texts] == [texts[0].split(" 0 ")[0]] * 4
    assert outputs[0]["cat /app/seen.txt"] == "two words $x|unset|/app/deep/dir"
    assert "./deep/dir/after" in outputs[0][default_probes("/app")[0]]
    for name, output in zip(("fork", "fork", "replay"), outputs[1:], strict=True):
        assert output == outputs[0], f"{task}: a {name} differs from the live instance"


@pytest.mark.parametrize(
    "background",
    ["sleep 300 >/dev/null 2>&1 &", "(sleep 300 >/dev/null 2>&1 &)"],
    ids=["shell-job", "orphan-daemon"],
)
async def test_a_prefix_that_leaves_a_process_running_falls_back_to_replay(
    adapter: HarborAdapter, background: str
) -> None:
    envs = [await adapter.get_environment(EXAMPLES) for _ in range(3)]
    live, *fresh = envs
    try:
        started = "until pgrep -x sleep >/dev/null; do :; done"  # the fork has exec'd sleep
        prefix = ("echo a > /app/a", background, started)
        saved = await play(live, await live.reset("csv-totals"), prefix)
        async with SnapshotRestore() as restore:
            restored = await asyncio.gather(*(restore(env, saved) for env in fresh))
            assert restore.stats.snapshots == 0 and restore.images == ()
            assert restore.stats.replays == 2 and restore.stats.fallbacks == 2
            running = [await env.probe("cat /proc/[0-9]*/cmdline | tr '\\0' ' '") for env in fresh]
    finally:
        for env in envs:
            await env.aclose()
    for state in restored:
        record = state.info["restore"]
        assert record["method"] == "replay"
        assert "left processes running" in record["fallback_reason"]
        assert "sleep (pid " in record["fallback_reason"]
    assert all("sleep 300" in text for text in running)  # replayed, so the process runs


async def test_with_b_rollouts_from_one_state_the_prefix_is_replayed_once(
    adapter: HarborAdapter, docker_engine: DockerEngine
) -> None:
    prefix = tuple(f"echo prefix-{i} >> /app/log" for i in range(3))
    replayed: list[str] = []

    class CountingEnv(HarborEnvironment):
        async def _step(self, state: State, action: Action) -> StepResult:
            if action.text.startswith("echo prefix-"):
                replayed.append(action.text)
            return await super()._step(state, action)

    async def env_factory() -> HarborEnvironment:
        return CountingEnv(adapter.runtime, await adapter.get_dataset(EXAMPLES))

    async with await env_factory() as live:
        saved = await play(live, await live.reset("csv-totals"), prefix)
    replayed.clear()
    restore = SnapshotRestore()
    async with TrajectoryRunner(
        environment=live,
        backend=ScriptedBackend(lambda request: fenced("cat /app/log")),
        env_factory=env_factory,
        restore_fn=restore,
    ) as runner:
        first = await runner.run_batch_from_states([saved] * 4, max_steps=1)
        assert replayed == list(prefix)  # B = 4 rollouts, one replay of the prefix
        again = await runner.run_batch_from_states([saved] * 4, max_steps=1)
        assert replayed == list(prefix)  # the snapshot is cached for the runner's life
        assert len(restore.images) == 1
    assert restore.stats.replays == 1 and restore.stats.forks == 7
    assert sorted(method(t) for t in first) == ["replay"] + ["snapshot"] * 3
    assert [method(t) for t in again] == ["snapshot"] * 4
    for trajectory in (*first, *again):
        assert trajectory.error is None
        log = trajectory.transitions[0].next_state.observation.text
        assert log == "prefix-0\nprefix-1\nprefix-2"  # every fork sees the prefix once
    assert await harbor_containers(docker_engine) == []


def method(trajectory: Trajectory) -> str:
    return str(trajectory.initial_state.info["restore"]["method"])


class ProbingBackend:
    """Notes how many snapshot images exist when asked to generate, then ends as told."""

    def __init__(self, engine: DockerEngine, ending: str) -> None:
        self.engine, self.ending = engine, ending
        self.images_seen: list[int] = []
        self.generating = asyncio.Event()

    async def generate(
        self, requests: Sequence[GenerationRequest], params: SamplingParams
    ) -> list[Completion]:
        self.images_seen.append(len(await own_snapshot_images(self.engine)))
        self.generating.set()
        if self.ending == "error":
            raise TypeError("a bug in the backend")
        if self.ending == "cancel":
            await asyncio.Event().wait()
        return [Completion(text=fenced("ls")) for _ in requests]

    async def aclose(self) -> None:
        return None


@pytest.mark.parametrize("ending", ["finish", "error", "cancel"])
async def test_no_snapshot_image_or_container_remains_after_the_runner(
    adapter: HarborAdapter, docker_engine: DockerEngine, ending: str
) -> None:
    backend = ProbingBackend(docker_engine, ending)

    async def env_factory() -> HarborEnvironment:
        return await adapter.get_environment(EXAMPLES)

    async with await env_factory() as live:
        saved = await play(live, await live.reset("csv-totals"), ("echo a > /app/a", "cd /tmp"))

        async def run() -> list[Trajectory]:
            async with TrajectoryRunner(
                environment=live,
                backend=backend,
                env_factory=env_factory,
                restore_fn=SnapshotRestore(),
            ) as runner:
                return await runner.run_batch_from_states([saved] * 3, max_steps=1)

        task = asyncio.create_task(run())
        if ending == "cancel":
            await backend.generating.wait()
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
        elif ending == "error":
            with pytest.raises(TypeError, match="a bug in the backend"):
                await task
        else:
            assert all(t.error is None for t in await task)
    assert backend.images_seen == [1]  # the snapshot existed while the rollouts ran
    assert await own_snapshot_images(docker_engine) == []
    assert await harbor_containers(docker_engine) == []


async def test_harbor_checks_apply_before_any_container_starts(adapter: HarborAdapter) -> None:
    async with (
        await adapter.get_environment(EXAMPLES) as live,
        await adapter.get_environment(EXAMPLES) as fresh,
        SnapshotRestore() as restore,
    ):
        saved = await play(live, await live.reset("csv-totals"), ("ls",))
        drifted = State(
            observation=saved.observation,
            task=saved.hidden["task_index"],
            step=saved.step,
            actions=saved.actions,
            hidden={**saved.hidden, "task_name": "llenvs-examples/log-errors"},
        )
        with pytest.raises(RestoreError, match="index drift"):
            await restore(fresh, drifted)
        done = (await live.step(saved, Action(text="SUBMIT"))).next_state
        with pytest.raises(RestoreError, match="finished"):
            await restore(fresh, done)
        assert fresh.container is None and restore.stats.replays == 0


async def test_a_failing_replay_fails_every_instance_and_caches_nothing(
    adapter: HarborAdapter,
) -> None:
    envs = [await adapter.get_environment(EXAMPLES) for _ in range(3)]
    live, *fresh = envs
    try:
        saved = await play(live, await live.reset("csv-totals"), ("ls", 'echo "oops', "pwd"))
        async with SnapshotRestore() as restore:
            results = await asyncio.gather(
                *(restore(env, saved) for env in fresh), return_exceptions=True
            )
            assert all(isinstance(r, ContinuationPromptError) for r in results), results
            assert restore.stats.replays == 2 and restore.images == ()
    finally:
        for env in envs:
            await env.aclose()
