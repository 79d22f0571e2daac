"""The OpenEnv server's idle timeout, against the real ``openenv-core`` package on 127.0.0.1.

``create_app(..., idle_timeout_s=...)`` runs our own idle reaper (OpenEnv's is off: it
would end a session in the middle of a long step). The tests never guess how long reaping
takes: they wait (with a bound) on an event set by the reaped environment's ``aclose``, and
use that reaping as the witness that the reaper ran while other sessions were acting,
blocked in a step, or served with no timeout at all.

Marked ``standards``: skipped locally without OpenEnv, FAILED in CI.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

import pytest

from llenvs_async import Action, State, StepResult
from llenvs_async.envs import ChainEnv

pytestmark = [pytest.mark.standards, pytest.mark.timeout(120)]
IDLE_S = 0.5  # the idle timeout under test
PACE_S = 0.1  # an active client's pause between steps: well under IDLE_S
BOUND_S = 30.0  # the most a test waits for the reaper (it wakes at each idle deadline)


@pytest.fixture
def openenv() -> Any:
    return pytest.importorskip("openenv.core.generic_client")


class WatchedChain(ChainEnv):
    """A ``ChainEnv`` that counts ``aclose`` calls and signals the first."""

    def __init__(self) -> None:
        super().__init__(max_steps=100_000)
        self.aclose_calls = 0
        self.closed_event = asyncio.Event()

    async def aclose(self) -> None:
        self.aclose_calls += 1
        await super().aclose()
        self.closed_event.set()


class GatedChain(WatchedChain):
    """A ``WatchedChain`` whose steps signal ``stepping`` and then wait for ``gate``."""

    def __init__(self) -> None:
        super().__init__()
        self.stepping = asyncio.Event()
        self.gate = asyncio.Event()

    async def _step(self, state: State, action: Action) -> StepResult:
        self.stepping.set()
        await self.gate.wait()
        return await super()._step(state, action)


class Made:
    """An env factory that keeps every instance it made, in order."""

    def __init__(self, kind: type[WatchedChain] = WatchedChain) -> None:
        self.kind = kind
        self.instances: list[WatchedChain] = []

    async def __call__(self) -> WatchedChain:
        env = self.kind()
        self.instances.append(env)
        return env


@contextlib.asynccontextmanager
async def served(made: Made, idle_timeout_s: float | None, **kw: Any) -> AsyncIterator[str]:
    from llenvs_async.integrations.openenv import create_app, serving

    async with serving(create_app(made, idle_timeout_s=idle_timeout_s, **kw)) as url:
        yield url
    assert all(env.aclose_calls == 1 for env in made.instances)  # shutdown closed the rest


async def closed(env: WatchedChain) -> None:
    """Wait, bounded, until the server closes ``env`` on its own."""
    async with asyncio.timeout(BOUND_S):
        await env.closed_event.wait()


async def test_idle_session_is_ended_but_an_active_one_is_not(openenv: Any) -> None:
    made = Made()
    async with (
        served(made, IDLE_S, max_concurrent=2) as url,
        openenv.GenericEnvClient(base_url=url) as idle,
        openenv.GenericEnvClient(base_url=url) as active,
    ):
        await idle.reset(task=0)
        await active.reset(task=0)
        idle_env, active_env = made.instances
        steps = await step_until(active, idle_env, steps=0)
        assert idle_env.aclose_calls == 1 and idle_env.closed
        # the ended session keeps its slot until its client leaves; then a third client
        # gets a fresh instance, and the leaving did not close the old one again
        await idle.close()
        assert idle_env.aclose_calls == 1
        async with openenv.GenericEnvClient(base_url=url) as third:
            first = await third.reset(task=1)
            assert first.observation["text"] == "You are at 0 of 4. Say 'left' or 'right'."
            third_env = made.instances[2]
            # the third session, reset after the active one, idles out while it acts: the
            # active one was never idle IDLE_S, though it has lived longer than that
            await step_until(active, third_env, steps=steps)
        assert active_env.aclose_calls == 0 and not active_env.closed
        result = await active.step({"text": "right"})
        assert result.observation["data"]["position"] == 1
        assert len(made.instances) == 3


async def step_until(client: Any, reaped: WatchedChain, *, steps: int) -> int:
    """Step ``client`` every ``PACE_S`` until the server closes ``reaped``; the step count."""
    while not reaped.closed_event.is_set():  # the reaper has not ended it yet
        assert steps * PACE_S < BOUND_S, "the idle session was never reaped"
        result = await client.step({"text": "left"})  # stays at 0: never done
        assert result.observation["step"] == steps + 1
        steps += 1
        await asyncio.sleep(PACE_S)
    return steps


async def test_client_of_an_ended_session_gets_a_clear_error(openenv: Any) -> None:
    made = Made()
    async with served(made, IDLE_S) as url:
        async with openenv.GenericEnvClient(base_url=url, message_timeout_s=BOUND_S) as client:
            await client.reset(task=0)
            (env,) = made.instances
            await closed(env)
            async with asyncio.timeout(BOUND_S):  # answered, not left hanging
                with pytest.raises(RuntimeError, match=r"this OpenEnv session \(it was closed"):
                    await client.step({"text": "right"})
                with pytest.raises(RuntimeError, match=r"this OpenEnv session \(it was closed"):
                    await client.reset(task=0)
        assert len(made.instances) == 1 and env.aclose_calls == 1


async def test_no_idle_timeout_never_reaps(openenv: Any) -> None:
    kept, witness = Made(), Made()
    async with served(kept, None) as kept_url, served(witness, IDLE_S) as witness_url:
        async with (
            openenv.GenericEnvClient(base_url=kept_url) as client,
            openenv.GenericEnvClient(base_url=witness_url) as witness_client,
        ):
            await client.reset(task=0)
            await witness_client.reset(task=0)
            # both idle from here; the witness server's reaper ends its session ...
            await closed(witness.instances[0])
            # ... while the session served without a timeout, idle as long, lives on
            (env,) = kept.instances
            assert env.aclose_calls == 0 and not env.closed
            result = await client.step({"text": "right"})
            assert result.observation["data"]["position"] == 1
        await closed(env)  # the server ends it once it sees the client leave (async)
        assert env.aclose_calls == 1  # closed when its client left, not before


async def test_a_step_in_flight_outlives_the_idle_timeout(openenv: Any) -> None:
    made = Made(GatedChain)  # the witnesses are instances too, but never step
    async with (
        served(made, IDLE_S, max_concurrent=2) as url,
        openenv.GenericEnvClient(base_url=url, message_timeout_s=BOUND_S) as client,
    ):
        await client.reset(task=0)
        (env,) = made.instances
        assert isinstance(env, GatedChain)
        step = asyncio.create_task(client.step({"text": "right"}))
        try:
            async with asyncio.timeout(BOUND_S):
                await env.stepping.wait()
            # three sessions, each started after the step began, idle out one after
            # another: the step has been in flight for over 3 * IDLE_S, reaper running
            for _ in range(3):
                async with openenv.GenericEnvClient(base_url=url) as witness:
                    await witness.reset(task=0)
                    await closed(made.instances[-1])
            assert len(made.instances) == 4 and not step.done()
            assert env.aclose_calls == 0 and not env.closed
        finally:
            env.gate.set()
        async with asyncio.timeout(BOUND_S):
            result = await step
        assert result.observation["data"]["position"] == 1
        # idle from here on: now the reaper ends it, and says so to its client
        await closed(env)
        assert env.aclose_calls == 1
        async with asyncio.timeout(BOUND_S):
            with pytest.raises(RuntimeError, match=r"it was closed: idle for over 0.5 s"):
                await client.step({"text": "right"})
