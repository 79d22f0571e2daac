"""DockerEnvironment: episodes, rewards, truncation, container lifecycle."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest

from llenvs_async import Action, Completion
from llenvs_async.docker import DockerEngine, DockerEnvironment
from llenvs_async.errors import EnvError, StaleStateError
from llenvs_async.testing import check_env

EnvMaker = Callable[..., Awaitable[DockerEnvironment]]


@pytest.fixture
async def make_env(engine: DockerEngine, busybox_image: str) -> AsyncIterator[EnvMaker]:
    """``await make_env(**kwargs)``: a DockerEnvironment on busybox; all closed at teardown."""
    made: list[DockerEnvironment] = []

    async def make(**kwargs: Any) -> DockerEnvironment:
        env = DockerEnvironment(**{"image": busybox_image, "engine": engine, **kwargs})
        made.append(env)
        return env

    try:
        yield make
    finally:
        for env in made:
            await env.aclose()


async def test_episode_with_submit_is_verified(make_env: EnvMaker, engine: DockerEngine) -> None:
    env = await make_env(instruction="Create /tmp/done.", verify_command="test -f /tmp/done")
    state = await env.reset(3)
    assert (state.observation.text, state.task, state.step) == ("Create /tmp/done.", 3, 0)
    assert env.container is not None
    container_id = env.container.id

    reply = "I will do it.\n```bash\ncd /tmp\ntouch done\n```"  # as a model writes it
    step = await env.step(state, Action(text=reply, completion=Completion(text=reply)))
    assert (step.reward, step.terminated, step.next_state.observation.text) == (
        0.0,
        False,
        "(no output)",
    )
    assert set(step.info) == {
        "parse_error",
        "finish_reason",
        "command",
        "exit_code",
        "timed_out",
        "continuation_prompt",
        "duration_sec",
    }  # the keys HarborEnvironment uses too
    assert env.reward_range == (0.0, 1.0)
    listing = await env.step(step.next_state, Action(text="ls"))
    assert listing.next_state.observation.text == "done"  # cwd persisted from the last step
    final = await env.step(listing.next_state, Action(text="SUBMIT"))
    assert final.terminated and final.reward == 1.0 and final.next_state.done
    assert [a.text for a in final.next_state.actions][-1] == "SUBMIT"
    assert final.info["verify"]["exit_code"] == 0

    await env.aclose()
    assert env.container is None
    assert await engine.remove_container(container_id) is False  # already removed


async def test_failed_verification_and_exit_codes(make_env: EnvMaker) -> None:
    env = await make_env(verify_command="test -f /tmp/never")
    state = await env.reset()
    step = await env.step(state, Action(text="ls /missing"))
    text = step.next_state.observation.text
    assert "/missing" in text and text.endswith("[exit code: 1]")
    assert step.next_state.observation.data["exit_code"] == 1
    final = await env.step(step.next_state, Action(text="SUBMIT"))
    assert final.reward == 0.0 and final.terminated


async def test_max_steps_truncates_and_verifies(make_env: EnvMaker) -> None:
    env = await make_env(max_steps=2, verify_command="test -f /ok")
    state = await env.reset()
    first = await env.step(state, Action(text="touch /ok"))
    assert not first.truncated and first.reward == 0.0
    second = await env.step(first.next_state, Action(text="echo two"))
    assert second.truncated and not second.terminated and second.reward == 1.0


async def test_timeouts_and_continuation_prompts_are_observed(make_env: EnvMaker) -> None:
    env = await make_env(command_timeout=1)
    state = await env.reset()
    slow = await env.step(state, Action(text="sleep 100"))
    assert "timed out after 1s" in slow.next_state.observation.text
    stuck = await env.step(slow.next_state, Action(text='echo "open'))
    assert "waiting for more input" in stuck.next_state.observation.text
    assert stuck.info["continuation_prompt"] is True


async def test_reset_replaces_the_container(make_env: EnvMaker, engine: DockerEngine) -> None:
    env = await make_env()
    state = await env.reset()
    assert env.container is not None
    first_id = env.container.id
    await env.step(state, Action(text="touch /marker"))
    again = await env.reset()
    assert env.container is not None and env.container.id != first_id
    assert await engine.remove_container(first_id) is False
    check = await env.step(again, Action(text="test -e /marker"))
    assert check.next_state.observation.data["exit_code"] == 1
    with pytest.raises(StaleStateError):
        await env.step(state, Action(text="true"))


async def test_failing_setup_raises_and_removes(make_env: EnvMaker, engine: DockerEngine) -> None:
    env = await make_env(setup_commands=["mkdir /work", "false"])
    with pytest.raises(EnvError, match="setup command 'false' failed"):
        await env.reset()
    assert env.container is None
    assert await engine.own_containers() == []


async def test_factory_builds_instances_that_own_their_engine(busybox_image: str) -> None:
    factory = DockerEnvironment.factory(image=busybox_image, instruction="hi")
    env = await factory()
    try:
        state = await env.reset()
        assert state.observation.text == "hi"
    finally:
        await env.aclose()
    assert env.closed and env.container is None


async def test_passes_the_environment_conformance_check(busybox_image: str) -> None:
    factory = DockerEnvironment.factory(image=busybox_image, verify_command="test -f /x")
    await check_env(factory, task=0, actions=("echo hi", "touch /x", "cat /x; echo $?"))
