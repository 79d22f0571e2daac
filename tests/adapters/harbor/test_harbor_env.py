"""HarborEnvironment on a real Docker engine: the episode rules, rewards, limits and teardown."""

from __future__ import annotations

import asyncio
import json
import shutil
import time
from pathlib import Path

import pytest

from llenvs_async.adapters.harbor import HarborAdapter, HarborEnvironment, load_local_dataset
from llenvs_async.docker.engine import DockerEngine
from llenvs_async.errors import ClosedError, ImageError, StaleStateError, VerifierError
from llenvs_async.types import Action, Completion, State

from .conftest import EXAMPLES, harbor_containers

pytestmark = pytest.mark.docker

EXAMPLE_TASKS = load_local_dataset(EXAMPLES).list_tasks()


async def play(env: HarborEnvironment, state: State, *commands: str) -> State:
    for command in commands:
        state = (await env.step(state, Action(text=command))).next_state
    return state


@pytest.mark.parametrize(("index", "name"), EXAMPLE_TASKS, ids=[n for _, n in EXAMPLE_TASKS])
async def test_solution_scores_one_and_immediate_submit_scores_zero(
    adapter: HarborAdapter, index: int, name: str
) -> None:
    async with await adapter.get_environment(EXAMPLES) as env:
        task = env.dataset.tasks[index]
        state = await env.reset(index)
        state = await play(env, state, *task.solution_commands())
        assert not state.done
        solved = await env.step(state, Action(text="SUBMIT"))
        assert (solved.reward, solved.terminated, solved.truncated) == (1.0, True, False)
        assert "PASS" in solved.info["verifier_output"]

        fresh = await env.reset(name)  # by name this time: a new container
        assert fresh.hidden["task_index"] == index
        failed = await env.step(fresh, Action(text="SUBMIT"))
        assert (failed.reward, failed.terminated) == (0.0, True)
        assert "FAIL" in failed.info["verifier_output"]


async def test_episode_rules(adapter: HarborAdapter) -> None:
    async with await adapter.get_environment(EXAMPLES, max_steps=10) as env:
        state = await env.reset("organize-files")
        task = env.dataset.tasks[env.task_index]
        assert task.instruction in state.observation.text
        assert "SUBMIT" in state.observation.text
        assert state.task == "organize-files"
        assert state.hidden["task_name"] == "llenvs-examples/organize-files"
        assert json.loads(json.dumps(state.hidden)) == state.hidden

        # A model's reply: two blocks run nothing; one block runs, prose around it ignored.
        text = "I will look first.\n```bash\nls inbox | sort\n```\nthen\n```\nrm -rf /app\n```"
        step = await env.step(state, Action(text=text, completion=Completion(text=text)))
        assert "2 code blocks" in step.info["parse_error"] and "exit_code" not in step.info
        text = text[: text.index("then")] + "then I will decide."
        step = await env.step(step.next_state, Action(text=text, completion=Completion(text=text)))
        assert step.next_state.observation.text.splitlines()[:2] == ["README.md", "cache1.tmp"]
        assert step.reward == 0.0 and not step.next_state.done

        # Shell state persists; a failing command shows its exit code.
        state = await play(env, step.next_state, "cd inbox", "export GREETING=hi")
        failing = await env.step(state, Action(text="  cat missing.txt; echo $GREETING  "))
        out = failing.next_state.observation.text
        assert "No such file" in out and "hi" in out and "[exit code: " not in out
        failing = await env.step(failing.next_state, Action(text="cat missing.txt"))
        assert failing.next_state.observation.text.endswith("[exit code: 1]")
        assert failing.info["exit_code"] == 1

        # A stale state is refused; the step count and actions are the state's provenance.
        with pytest.raises(StaleStateError):
            await env.step(state, Action(text="pwd"))
        assert failing.next_state.step == 6
        assert [a.text for a in failing.next_state.actions][-1] == "cat missing.txt"


async def test_continuation_prompt_in_a_live_episode_is_reported_and_recovered(
    adapter: HarborAdapter,
) -> None:
    async with await adapter.get_environment(EXAMPLES) as env:
        state = await env.reset("csv-totals")
        broken = await env.step(state, Action(text='echo "unterminated'))
        assert "waiting for more input" in broken.next_state.observation.text
        after = await env.step(broken.next_state, Action(text="echo still-alive"))
        assert after.next_state.observation.text == "still-alive"


@pytest.mark.parametrize(("verify", "reward"), [(True, 1.0), (False, 0.0)])
async def test_max_steps_truncates_and_verifies_unless_disabled(
    adapter: HarborAdapter, verify: bool, reward: float
) -> None:
    async with await adapter.get_environment(
        EXAMPLES, max_steps=1, verify_on_truncation=verify
    ) as env:
        state = await env.reset("json-config")
        first = env.dataset.tasks[env.task_index].solution_commands()[0]  # alone solves it
        result = await env.step(state, Action(text=first))
        assert (result.truncated, result.terminated) == (True, False)
        assert result.info["truncation_reason"] == "max_steps"
        assert result.info["truncation_message"] == "max_steps=1 reached"
        assert result.reward == reward
        assert ("rewards" in result.info) is verify
        if verify:
            assert result.info["rewards"] == {"reward": 1.0, "keys_ok": 1.0}


async def test_container_limits_network_and_teardown(
    adapter: HarborAdapter, docker_engine: DockerEngine
) -> None:
    env = await adapter.get_environment(EXAMPLES)
    assert env.container is None and await harbor_containers(docker_engine) == []  # cheap
    async with env:
        await env.reset("build-release")
        assert env.container is not None
        info = await env.container.inspect()
        host = info["HostConfig"]
        assert host["NetworkMode"] == "none"
        assert host["Memory"] == 512 * 2**20
        assert host["NanoCpus"] == 10**9
        assert info["Config"]["Labels"]["llenvs.harbor.task"] == "llenvs-examples/build-release"
        first_id = env.container.id
        await env.reset("csv-totals")  # a re-reset replaces the container
        assert await harbor_containers(docker_engine) == [env.container.id]
        assert env.container.id != first_id
    assert await harbor_containers(docker_engine) == []
    await env.aclose()  # idempotent
    with pytest.raises(ClosedError):
        await env.reset(0)


async def test_processes_that_fill_the_pids_limit_score_zero_with_the_reason(
    adapter: HarborAdapter, docker_engine: DockerEngine
) -> None:
    """The agent's processes fill the container's pids limit (sleepers that stay, a fork
    bomb whose churn does not leave a slot), so the verifier cannot even start: that is the
    episode's outcome, a verified 0 that says why, not an error; the next episode's
    container is unaffected."""
    async with await adapter.get_environment(EXAMPLES) as env:
        state = await env.reset("csv-totals")
        # Sleepers left to PID 1 until a fork finds no free pid (bash retries it ~15 s).
        fill = "for i in $(seq 2000); do (sleep 1000 &) || break; done"
        flood = await env.step(state, Action(text=f"```bash\n{fill}\n```"))
        assert "fork" in flood.next_state.observation.text
        assert env.container is not None
        current, limit = await env.container.pids()
        assert limit is not None and current >= limit - 2, (current, limit)
        ended = await env.step(flood.next_state, Action(text="SUBMIT"))
        assert (ended.reward, ended.terminated) == (0.0, True)
        assert ended.info["reward_source"] == "process-limit"
        assert f"process limit ({current} of {limit})" in ended.info["verifier_output"]
        task = env.dataset.tasks[env.dataset.index_of("csv-totals")]
        fresh = await play(env, await env.reset("csv-totals"), *task.solution_commands())
        solved = await env.step(fresh, Action(text="SUBMIT"))
        assert solved.reward == 1.0 and solved.info["reward_source"] != "process-limit"
    assert await harbor_containers(docker_engine) == []


async def test_image_is_built_once_for_concurrent_resets(
    tmp_path: Path, docker_engine: DockerEngine
) -> None:
    task = tmp_path / "tasks" / "unique"
    shutil.copytree(EXAMPLES / "log-errors", task)
    (task / "environment" / "marker.txt").write_text(str(tmp_path))  # content never seen before
    adapter = HarborAdapter(cache_dir=tmp_path / "cache")
    envs = [await adapter.get_environment(tmp_path / "tasks") for _ in range(3)]
    tags: set[str] = set()
    try:
        async with asyncio.TaskGroup() as tg:
            for env in envs:
                tg.create_task(env.reset(0))
        tags = {env.container.spec.image for env in envs if env.container is not None}
        assert len(tags) == 1
        assert adapter.images.builds == 1
        (tag,) = tags
        assert tag.startswith("llenvs-harbor/unique:")  # legacy task: the directory name
        again = HarborAdapter(cache_dir=tmp_path / "cache")  # a new process would do this
        async with await again.get_environment(tmp_path / "tasks") as env:
            await env.reset(0)
            assert env.container is not None and env.container.spec.image == tag
        assert again.images.builds == 0  # same content, same tag: reused
    finally:
        for env in envs:
            await env.aclose()
        for tag in tags:
            await docker_engine.client.images.delete(tag, force=True)


@pytest.mark.parametrize(
    ("script", "kind"),
    [
        ("true", "missing"),
        (": > /logs/verifier/reward.txt", "empty"),
        ("echo great > /logs/verifier/reward.txt", "non-numeric"),
        ("echo inf > /logs/verifier/reward.txt", "non-finite"),
        ("echo '{\"reward\": NaN}' > /logs/verifier/reward.json", "non-finite"),
    ],
)
async def test_bad_reward_files_raise_distinct_verifier_errors(
    tmp_path: Path, docker_engine: DockerEngine, script: str, kind: str
) -> None:
    task = tmp_path / "tasks" / "bad-verifier"
    shutil.copytree(EXAMPLES / "csv-totals", task)
    (task / "tests" / "test.sh").write_text(f"#!/bin/bash\n{script}\n")
    adapter = HarborAdapter(cache_dir=tmp_path / "cache")
    async with await adapter.get_environment(tmp_path / "tasks") as env:
        state = await env.reset(0)
        with pytest.raises(VerifierError) as info:
            await env.step(state, Action(text="SUBMIT"))
        assert info.value.kind == kind


async def test_verifier_timeout_is_a_verifier_error(
    tmp_path: Path, docker_engine: DockerEngine
) -> None:
    task = tmp_path / "tasks" / "slow-verifier"
    shutil.copytree(EXAMPLES / "csv-totals", task)
    (task / "tests" / "test.sh").write_text("#!/bin/bash\nsleep 30\n")
    toml = (task / "task.toml").read_text().replace("timeout_sec = 60.0", "timeout_sec = 1.0")
    (task / "task.toml").write_text(toml)
    adapter = HarborAdapter(cache_dir=tmp_path / "cache")
    async with await adapter.get_environment(tmp_path / "tasks") as env:
        state = await env.reset(0)
        with pytest.raises(VerifierError) as info:
            await env.step(state, Action(text="SUBMIT"))
        assert info.value.kind == "timeout"


TB_STYLE_TOML = """
version = "1.0"

[metadata]
difficulty = "easy"
category = "system-administration"

[verifier]
timeout_sec = 900.0

[agent]
timeout_sec = 900.0

[environment]
build_timeout_sec = 600.0
docker_image = "ghcr.io/example/terminal-bench/hello-world:2.0"
cpus = 1
memory_mb = 2048
storage_mb = 10240
allow_internet = true
"""


async def test_prebuilt_image_task_runs_through_an_alias_without_network(
    tmp_path: Path, docker_engine: DockerEngine
) -> None:
    task = tmp_path / "tb" / "hello-world"
    (task / "tests").mkdir(parents=True)
    (task / "task.toml").write_text(TB_STYLE_TOML)
    (task / "instruction.md").write_text("Create /hello.txt containing 'Hello, world!'.\n")
    (task / "tests" / "test.sh").write_text(
        "#!/bin/bash\n"
        'if [ "$(cat /hello.txt)" = "Hello, world!" ]; then echo 1; else echo 0; fi'
        " > /logs/verifier/reward.txt\n"
    )
    image = "ghcr.io/example/terminal-bench/hello-world:2.0"
    plain = HarborAdapter(cache_dir=tmp_path / "cache")
    async with await plain.get_environment(tmp_path / "tb") as env:
        with pytest.raises(ImageError, match="not present locally"):
            await env.reset(0)
        assert env.container is None

    aliased = HarborAdapter(
        cache_dir=tmp_path / "cache", base_image_aliases={image: "llenvs/base:bookworm"}
    )
    async with await aliased.get_environment(tmp_path / "tb") as env:
        state = await env.reset("hello-world")
        assert env.container is not None
        host = (await env.container.inspect())["HostConfig"]
        assert host["NetworkMode"] == "none"  # the task asks for internet; the adapter says no
        assert env.workdir == "/"
        state = (await env.step(state, Action(text="echo 'Hello, world!' > /hello.txt"))).next_state
        assert (await env.step(state, Action(text="SUBMIT"))).reward == 1.0


async def test_dockerfile_base_images_are_rewritten_through_aliases(
    tmp_path: Path, docker_engine: DockerEngine
) -> None:
    task = tmp_path / "tasks" / "py-base"
    shutil.copytree(EXAMPLES / "csv-totals", task)
    dockerfile = task / "environment" / "Dockerfile"
    dockerfile.write_text(
        dockerfile.read_text().replace("debian:bookworm-slim", "python:3.12-slim")
    )
    adapter = HarborAdapter(
        cache_dir=tmp_path / "cache",
        base_image_aliases={"python:3.12-slim": "debian:bookworm-slim"},
    )
    async with await adapter.get_environment(tmp_path / "tasks") as env:
        state = await env.reset(0)
        result = await env.step(state, Action(text="head -1 sales.csv"))
        assert result.next_state.observation.text == "region,product,amount"


async def test_build_timeout_is_an_image_error(tmp_path: Path, docker_engine: DockerEngine) -> None:
    task = tmp_path / "tasks" / "slow-build"
    shutil.copytree(EXAMPLES / "csv-totals", task)
    (task / "environment" / "Dockerfile").write_text(
        f"FROM debian:bookworm-slim\nRUN sleep 600 # {tmp_path}\n"  # unique: never cached
    )
    toml = (task / "task.toml").read_text()
    (task / "task.toml").write_text(
        toml.replace("build_timeout_sec = 120.0", "build_timeout_sec = 1")
    )
    adapter = HarborAdapter(cache_dir=tmp_path / "cache")
    async with await adapter.get_environment(tmp_path / "tasks") as env:
        started = time.monotonic()
        with pytest.raises(ImageError, match="build_timeout_sec=1s") as info:
            await env.reset(0)
        assert isinstance(info.value.__cause__, TimeoutError)  # the build's own timeout fired
        # Cut off at the timeout, not after the build's 600 s: a hang guard, not a window.
        assert time.monotonic() - started < 120
        assert env.container is None

    async def build_containers() -> list[str]:  # the RUN step's, named by the unique line
        found = await docker_engine.request_json("GET", "containers/json", params={"all": "1"})
        return [c["Id"] for c in found if str(tmp_path) in c.get("Command", "")]

    # The daemon dropped the cut-off build too: nothing is left sleeping (bounded wait).
    async with asyncio.timeout(60):
        while await build_containers():
            await asyncio.sleep(0.2)


STORAGE_TOML = """
version = "1.0"

[verifier]
timeout_sec = 60.0

[environment]
docker_image = "llenvs/base:bookworm"
storage_mb = 64
"""


async def test_writes_past_storage_mb_are_stopped_and_score_zero_with_the_reason(
    tmp_path: Path, docker_engine: DockerEngine
) -> None:
    """``storage_mb`` holds without disk quotas: one file stops at the limit (the kernel's
    file-size limit), files written past it in total (a background writer) stop the command
    running and end the episode with a verified 0 that says why; the next episode's
    container is unaffected."""
    task = tmp_path / "tasks" / "fill"
    (task / "tests").mkdir(parents=True)
    (task / "task.toml").write_text(STORAGE_TOML)
    (task / "instruction.md").write_text("Write /done.\n")
    (task / "tests" / "test.sh").write_text(
        "#!/bin/bash\nif [ -e /done ]; then echo 1; else echo 0; fi > /logs/verifier/reward.txt\n"
    )
    adapter = HarborAdapter(cache_dir=tmp_path / "cache")
    async with adapter, await adapter.get_environment(tmp_path / "tasks") as env:
        state = await env.reset(0)
        big = await env.step(state, Action(text="dd if=/dev/zero of=/big bs=1M count=300"))
        assert "killed by SIGXFSZ (File size limit exceeded)" in big.next_state.observation.text
        assert await env.probe("stat -c %s /big") == str(64 * 2**20)  # not a byte more
        assert not big.truncated  # at the limit, not over it
        full = await env.step(big.next_state, Action(text="sleep 1.5"))  # measured meanwhile
        assert "[the container's files are at the task's storage_mb = 64: writes past it fail]" in (
            full.next_state.observation.text
        )
        state = await play(env, full.next_state, "rm /big")
        writer = "(i=0; while :; do head -c 4M /dev/zero > /tmp/f$i; i=$((i+1)); done) &"
        state = await play(env, state, writer)
        ended = await env.step(state, Action(text="sleep 30; touch /done"))
        assert ended.truncated and ended.reward == 0.0
        assert ended.info["truncation_reason"] == "storage_limit"
        assert ended.info["reward_source"] == "storage-limit"
        assert "over the task's storage_mb = 64" in ended.info["stopped"]
        text = ended.next_state.observation.text
        assert "[command stopped: the container's files reached" in text
        assert ended.info["duration_sec"] < 30  # stopped, not run to its end
        fresh = await env.reset(0)
        assert env.container is not None and await env.container.storage_used() < 2**20
        done = await play(env, fresh, "touch /done")
        assert (await env.step(done, Action(text="SUBMIT"))).reward == 1.0
