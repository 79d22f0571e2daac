"""Every bundled environment passes the conformance check, and their rules hold."""

from __future__ import annotations

import pytest

from llenvs_async import Action
from llenvs_async.envs import ArithmeticEnv, ChainEnv, CounterEnv, InstanceTracker
from llenvs_async.testing import check_env


@pytest.mark.parametrize(
    ("make", "task", "actions"),
    [
        (lambda: ArithmeticEnv(), 3, ("12", "13")),
        (lambda: ChainEnv(), 1, ("right", "left", "right")),
        (lambda: CounterEnv(latency=0.001), 2, ("inc", "add 4", "dec")),
    ],
)
async def test_bundled_envs_pass_check_env(make, task, actions) -> None:  # type: ignore[no-untyped-def]
    async def factory():  # type: ignore[no-untyped-def]
        return make()

    await check_env(factory, task=task, actions=actions)


async def test_check_env_catches_a_broken_env() -> None:
    class Broken(ChainEnv):
        async def _step(self, state, action):  # type: ignore[no-untyped-def]
            result = await super()._step(state, action)
            # forgets the provenance: the action prefix is not extended
            from dataclasses import replace

            return replace(result, next_state=replace(result.next_state, actions=()))

    async def factory():  # type: ignore[no-untyped-def]
        return Broken()

    with pytest.raises(AssertionError, match="prefix"):
        await check_env(factory, task=0, actions=("right",))


async def test_arithmetic_rewards_only_the_right_answer() -> None:
    env = ArithmeticEnv(max_steps=2)
    s = await env.reset(7)
    _, answer = env.problem(7)
    wrong = await env.step(s, Action(text=f"I think {answer + 1}"))
    assert wrong.reward == 0.0 and not wrong.next_state.done
    right = await env.step(wrong.next_state, Action(text=f"so {answer}"))
    assert right.reward == 1.0 and right.terminated
    again = await env.step(wrong.next_state, Action(text="0" if answer else "1"))
    assert again.truncated and again.reward == 0.0


async def test_chain_goal_and_truncation() -> None:
    env = ChainEnv(min_length=2, max_steps=3)
    s = await env.reset(0)
    for _ in range(2):
        r = await env.step(s, Action(text="right"))
        s = r.next_state
    assert r.terminated and r.reward == 1.0
    s = await env.reset(0)
    for _ in range(3):
        r = await env.step(s, Action(text="left"))
        s = r.next_state
    assert r.truncated and not r.terminated and s.observation.data["position"] == 0


async def test_counter_submit_and_tracker() -> None:
    tracker = InstanceTracker()
    async with CounterEnv(tracker=tracker) as env:
        s = await env.reset(2)
        for text in ("inc", "inc"):
            s = (await env.step(s, Action(text=text))).next_state
        r = await env.step(s, Action(text="submit"))
        assert r.reward == 1.0 and r.terminated
        assert tracker.live == 1 and tracker.steps == 3 and tracker.resets == 1
    assert tracker.live == 0 and tracker.closed == 1
