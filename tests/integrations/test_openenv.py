"""OpenEnv both ways, against the real ``openenv-core`` package on 127.0.0.1.

Serve: OpenEnv's own ``GenericEnvClient`` drives our environments through OpenEnv's own
``HTTPEnvServer`` (concurrent sessions, capacity, bad requests, bearer tokens, a Harbor task
in a real container torn down when its client is killed mid-episode). Consume: our
``OpenEnvEnvironment`` and the runner drive a server built from OpenEnv's own example
environment (the echo environment its ``openenv init`` template generates).

Marked ``standards``: skipped locally without OpenEnv, FAILED in CI.
"""

from __future__ import annotations

import asyncio
import importlib
import json
import os
import signal
import subprocess
import sys
import textwrap
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from llenvs_async import (
    EnvError,
    LlenvsError,
    SamplingParams,
    ScriptedBackend,
    TrajectoryRunner,
)
from llenvs_async.envs import CounterEnv
from llenvs_async.envs._tracker import InstanceTracker
from tests.cli._docker import containers_of, docker_ready

pytestmark = pytest.mark.standards
_ = docker_ready  # a fixture
ROOT = Path(__file__).resolve().parents[2]
TASKS = ROOT / "examples" / "tasks"
TOKEN = "s3cret-token-for-tests"


@pytest.fixture
def openenv() -> Any:
    return pytest.importorskip("openenv.core.generic_client")


def counter_factory(tracker: InstanceTracker) -> Any:
    async def factory() -> CounterEnv:
        return CounterEnv(max_steps=5, tracker=tracker)

    return factory


async def until(predicate: Any, what: str, timeout: float = 60.0) -> None:
    """Wait for a condition the server reaches on its own (a session's teardown)."""
    async with asyncio.timeout(timeout):
        while not await predicate():
            await asyncio.sleep(0.05)


@pytest.fixture
async def counter_server(openenv: Any) -> AsyncIterator[tuple[str, InstanceTracker]]:
    from llenvs_async.integrations.openenv import create_app, serving

    tracker = InstanceTracker()
    app = create_app(counter_factory(tracker), max_concurrent=3)
    async with serving(app) as url:
        yield url, tracker
    assert tracker.live == 0  # shutdown closed every instance


# -- serve: OpenEnv's client drives our environments ------------------------------------


async def test_openenv_client_drives_concurrent_sessions(
    openenv: Any, counter_server: tuple[str, InstanceTracker]
) -> None:
    url, tracker = counter_server

    async def episode(target: int) -> tuple[Any, list[Any]]:
        async with openenv.GenericEnvClient(base_url=url) as client:
            first = await client.reset(task=target, seed=7)
            results = [await client.step({"text": "inc"}) for _ in range(target)]
            results.append(await client.step({"text": "submit"}))
            return first, results

    outcomes = await asyncio.gather(episode(1), episode(2), episode(3))
    for target, (first, results) in zip((1, 2, 3), outcomes, strict=True):
        assert first.observation["text"] == f"Counter is 0. Reach {target}, then submit."
        assert first.done is False
        assert [r.observation["data"]["value"] for r in results[:-1]] == list(range(1, target + 1))
        last = results[-1]
        assert (last.reward, last.done, last.observation["terminated"]) == (1.0, True, True)
        assert last.observation["step"] == target + 1
    assert tracker.created == 3 and tracker.peak_live == 3  # one instance per session
    await until(lambda: _zero(tracker), "sessions closed")
    assert tracker.closed == 3


async def _zero(tracker: InstanceTracker) -> bool:
    return tracker.live == 0


async def test_capacity_and_bad_requests_stay_in_their_session(
    openenv: Any, counter_server: tuple[str, InstanceTracker]
) -> None:
    from websockets.asyncio.client import connect

    url, tracker = counter_server
    clients = [openenv.GenericEnvClient(base_url=url) for _ in range(3)]
    try:
        for client in clients:
            await client.reset(task=2)
        # a fourth session is refused at once (OpenEnv's client may see the close first)
        async with connect(url.replace("http://", "ws://") + "/ws") as extra:
            refusal = json.loads(await extra.recv())
        assert refusal["data"]["code"] == "CAPACITY_REACHED"
        assert refusal["data"]["max_sessions"] == 3
        good, bad, _ = clients
        with pytest.raises(RuntimeError, match="VALIDATION_ERROR"):
            await bad.step({"txt": "inc"})  # no 'text' field
        with pytest.raises(RuntimeError, match=r"unknown fields \['colour'\]"):
            await bad.reset(colour="red")
        with pytest.raises(RuntimeError, match="unknown task 'x'"):
            await bad.reset(task="x")
        assert (await good.step({"text": "inc"})).observation["data"]["value"] == 1
        for _ in range(4):  # max_steps=5: the fifth step truncates
            result = await good.step({"text": "inc"})
        assert result.done and result.observation["truncated"]
        with pytest.raises(RuntimeError, match="the episode is over"):
            await good.step({"text": "inc"})
        assert (await good.reset(task=1)).observation["step"] == 0  # same session, new episode
        assert tracker.created == 3  # the refused client never got an instance
    finally:
        for client in clients:
            await client.close()


async def test_bearer_token_is_checked_on_requests_and_sessions(openenv: Any) -> None:
    import httpx

    from llenvs_async.integrations.openenv import OpenEnvEnvironment, create_app, serving

    tracker = InstanceTracker()
    app = create_app(counter_factory(tracker), token=TOKEN)
    async with serving(app) as url:
        async with httpx.AsyncClient() as http:
            assert (await http.get(f"{url}/health")).status_code == 401
            wrong = {"Authorization": "Bearer nope"}
            assert (await http.get(f"{url}/health", headers=wrong)).status_code == 401
            right = {"Authorization": f"Bearer {TOKEN}"}
            assert (await http.get(f"{url}/health", headers=right)).status_code == 200
        with pytest.raises(ConnectionError, match="403"):
            await openenv.GenericEnvClient(base_url=url).connect()
        async with OpenEnvEnvironment(url, token=TOKEN, observation_field="text") as env:
            state = await env.reset(3)
            assert state.observation.text == "Counter is 0. Reach 3, then submit."
        with pytest.raises(EnvError, match="403"):
            await OpenEnvEnvironment(url, token="x" * 16).reset(3)
    assert tracker.created == 1 and tracker.live == 0


async def test_remote_hosts_need_a_flag_and_a_token(openenv: Any) -> None:
    from llenvs_async.integrations.openenv import create_app, is_loopback, serving

    assert is_loopback("127.0.0.1") and is_loopback("::1") and is_loopback("localhost")
    assert not is_loopback("0.0.0.0")
    app = create_app(counter_factory(InstanceTracker()))
    with pytest.raises(LlenvsError, match=r"'0\.0\.0\.0' is not a loopback address"):
        async with serving(app, host="0.0.0.0"):
            pass
    with pytest.raises(LlenvsError, match="needs a bearer token"):
        async with serving(app, host="0.0.0.0", allow_remote=True):
            pass
    with pytest.raises(ValueError, match="at least 16"):
        create_app(counter_factory(InstanceTracker()), token="short")
    with pytest.raises(ValueError, match="max_concurrent must be >= 1, got 0"):
        create_app(counter_factory(InstanceTracker()), max_concurrent=0)


# -- serve: a Harbor task in a real container ---------------------------------------------

_VANISHING_CLIENT = textwrap.dedent(
    """
    import asyncio, sys
    from openenv.core.generic_client import GenericEnvClient

    async def main():
        client = GenericEnvClient(base_url=sys.argv[1], message_timeout_s=300)
        first = await client.reset(task="fix-shell-script")
        step = await client.step({"text": "echo hello > /tmp/mark && cat /tmp/mark"})
        print(repr(first.observation["text"][:40]), step.observation["text"], flush=True)
        await asyncio.sleep(3600)  # killed mid-episode

    asyncio.run(main())
    """
)


@pytest.mark.docker
@pytest.mark.slow
@pytest.mark.timeout(600)
async def test_harbor_container_removed_when_client_vanishes(
    openenv: Any, docker_ready: None
) -> None:
    from llenvs_async.adapters.harbor import HarborAdapter
    from llenvs_async.integrations.openenv import create_app, serving

    adapter = HarborAdapter()

    async def factory() -> Any:
        return await adapter.get_environment(TASKS, max_steps=5)

    async def no_containers() -> bool:
        return await containers_of(os.getpid()) == []

    try:
        async with serving(create_app(factory, max_concurrent=2)) as url:
            child = subprocess.Popen(
                [sys.executable, "-c", _VANISHING_CLIENT, url],
                stdout=subprocess.PIPE,
                text=True,
            )
            try:
                assert child.stdout is not None
                line = await asyncio.to_thread(child.stdout.readline)
                assert "hello" in line  # the command ran in the task's container
                assert len(await containers_of(os.getpid())) >= 1
            finally:
                child.send_signal(signal.SIGKILL)
                child.wait()
                child.stdout.close()  # type: ignore[union-attr]
            await until(no_containers, "the vanished client's container removed", 120)
    finally:
        await adapter.aclose()
    assert await containers_of(os.getpid()) == []


# -- consume: our environment over OpenEnv's own example server ---------------------------


@pytest.fixture
async def echo_server(openenv: Any, tmp_path: Path) -> AsyncIterator[str]:
    """OpenEnv's example (echo) environment, generated by OpenEnv's own template code and
    served by its own ``create_app``, as the template's ``server/app.py`` does but with 4
    concurrent sessions instead of 1 (the change its comment invites)."""
    init = importlib.import_module("openenv.cli.commands.init")
    target = tmp_path / "echo_env"
    target.mkdir()
    init._copy_template_directory(
        "openenv.cli.templates.openenv_env",
        "",
        target,
        init._create_template_replacements("echo_env"),
        "echo_env",
    )
    sys.path.insert(0, str(tmp_path))
    try:
        environment = importlib.import_module("echo_env.server.echo_env_environment")
        models = importlib.import_module("echo_env.models")
        http_server = importlib.import_module("openenv.core.env_server.http_server")
        app = http_server.create_app(
            environment.EchoEnvironment,
            models.EchoAction,
            models.EchoObservation,
            env_name="echo_env",
            max_concurrent_envs=4,
        )
        from llenvs_async.integrations.openenv import serving

        async with serving(app) as url:
            yield url
    finally:
        sys.path.remove(str(tmp_path))
        for name in [m for m in sys.modules if m == "echo_env" or m.startswith("echo_env.")]:
            del sys.modules[name]


async def test_openenv_environment_drives_openenv_example_server(echo_server: str) -> None:
    from llenvs_async.integrations.openenv import OpenEnvEnvironment, openenv_factory

    async with OpenEnvEnvironment(echo_server, observation_field="echoed_message") as env:
        state = await env.reset()
        assert state.observation.text == "Echo Env environment ready!"
        result = await env.step(state, _action("hello"))
        assert result.next_state.observation.text == "hello"
        assert result.next_state.observation.data["message_length"] == 5
        assert result.reward == pytest.approx(0.5)  # the example's reward: 0.1 per character
    async with OpenEnvEnvironment(echo_server, action_field="msg") as wrong:
        start = await wrong.reset()
        with pytest.raises(EnvError, match="step failed: RuntimeError: Server error") as info:
            await wrong.step(start, _action("x"))  # the example's action needs 'message'
        assert info.value.details["connection_lost"] is False

    factory = openenv_factory(echo_server, observation_field="echoed_message", max_steps=2)
    runner = TrajectoryRunner(
        await factory(),
        ScriptedBackend(lambda request: f"say {request.rollout_index}"),
        SamplingParams(max_tokens=8),
        env_factory=factory,
    )
    trajectories = await runner.run_batch([None, None])
    for index, trajectory in enumerate(trajectories):
        assert trajectory.error is None
        assert [t.next_state.observation.text for t in trajectory.transitions] == [
            f"say {index}"
        ] * 2
        assert trajectory.final_state.truncated and trajectory.total_reward == pytest.approx(1.0)
    await runner.environment.aclose()


async def test_openenv_environment_maps_a_dead_server_to_env_error(openenv: Any) -> None:
    from llenvs_async.integrations.openenv import OpenEnvEnvironment

    with pytest.raises(ValueError, match="url must be"):
        OpenEnvEnvironment("localhost:1")
    async with OpenEnvEnvironment("http://127.0.0.1:9", connect_timeout_s=2) as env:
        with pytest.raises(EnvError, match="reset failed: ConnectionError") as info:
            await env.reset()
        assert info.value.details["connection_lost"] is True


def _action(text: str) -> Any:
    from llenvs_async import Action

    return Action(text=text)


def test_cli_refuses_remote_hosts_without_flag_and_token(
    openenv: Any, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from llenvs_async.cli import main

    monkeypatch.delenv("LLENVS_OPENENV_TOKEN", raising=False)
    assert main(["serve-openenv", str(TASKS), "--host", "0.0.0.0"]) == 2
    assert "add --allow-remote" in capsys.readouterr().err
    assert main(["serve-openenv", str(TASKS), "--host", "0.0.0.0", "--allow-remote"]) == 2
    assert "needs a bearer token in $LLENVS_OPENENV_TOKEN" in capsys.readouterr().err
