from __future__ import annotations

import ast
import asyncio
from pathlib import Path

import pytest

import llenvs_async
from llenvs_async import Action, ClosedError, RestoreError, StaleStateError, replay_restore
from llenvs_async.env import AgentEnvironment, AgentSurface, Environment
from llenvs_async.envs import ArithmeticEnv, ChainEnv, CounterEnv
from llenvs_async.errors import EnvError
from llenvs_async.types import State, StepResult


async def test_non_pure_env_refuses_stale_state() -> None:
    async with CounterEnv() as env:
        s0 = await env.reset(2)
        s1 = (await env.step(s0, Action(text="inc"))).next_state
        with pytest.raises(StaleStateError) as info:
            await env.step(s0, Action(text="inc"))
        assert info.value.expected == (s1.episode_id, 1)
        assert env.value == 1  # the refused step changed nothing


async def test_pure_env_steps_from_any_state() -> None:
    env = ChainEnv()
    s0 = await env.reset(0)
    right = (await env.step(s0, Action(text="right"))).next_state
    again = (await env.step(s0, Action(text="right"))).next_state
    assert right.observation == again.observation and right.step == again.step == 1


async def test_state_carries_provenance() -> None:
    async with CounterEnv() as env:
        s = await env.reset(5)
        actions = [Action(text=t) for t in ("inc", "add 3", "dec")]
        for a in actions:
            s = (await env.step(s, a)).next_state
        assert s.task == 5 and s.step == 3 and s.actions == tuple(actions)


async def test_replay_restore_reaches_the_same_state() -> None:
    async with CounterEnv() as live, CounterEnv() as fresh:
        s = await live.reset(4)
        for text in ("inc", "add 5", "dec"):
            s = (await live.step(s, Action(text=text))).next_state
        restored = await replay_restore(fresh, s)
        assert fresh.value == live.value == 5
        assert restored.observation == s.observation and restored.step == s.step
        # the restored instance continues from the restored state, not the original
        await fresh.step(restored, Action(text="inc"))


async def test_replay_restore_detects_an_early_end() -> None:
    async with CounterEnv() as live, CounterEnv() as fresh:
        s = await live.reset(1)
        s = (await live.step(s, Action(text="inc"))).next_state
        bogus = type(s)(
            observation=s.observation,
            task=1,
            step=3,
            actions=(Action(text="submit"), Action(text="inc"), Action(text="inc")),
        )
        with pytest.raises(RestoreError, match="ended after 1 of 3"):
            await replay_restore(fresh, bogus)


async def test_close_is_idempotent_and_use_after_close_raises() -> None:
    env = CounterEnv()
    s = await env.reset(1)
    await env.aclose()
    await env.aclose()
    assert env.closed
    with pytest.raises(ClosedError):
        await env.step(s, Action(text="inc"))
    with pytest.raises(ClosedError):
        await env.reset(1)


async def test_stepping_a_finished_state_is_refused() -> None:
    env = ArithmeticEnv()
    s = await env.reset(0)
    done = (await env.step(s, Action(text=str(s.hidden)))).next_state
    assert done.terminated
    with pytest.raises(EnvError, match="finished state"):
        await env.step(done, Action(text="1"))


@pytest.mark.parametrize("task", [-1, 100, "nope", 2.5])
async def test_unknown_task_is_a_clear_error(task: object) -> None:
    env = ArithmeticEnv(num_tasks=100)
    with pytest.raises(EnvError, match="unknown task"):
        await env.reset(task)  # type: ignore[arg-type]


def test_bad_max_steps() -> None:
    with pytest.raises(ValueError, match="max_steps"):
        ChainEnv(max_steps=0)


async def test_concurrent_steps_on_a_non_pure_env_are_refused() -> None:
    """Two steps from one state in flight together: one wins, the other is refused
    (both used to pass the stale check and claim the same successor)."""
    env = CounterEnv(latency=0.01)
    state = await env.reset(3)
    results = await asyncio.gather(
        env.step(state, Action(text="inc")),
        env.step(state, Action(text="inc")),
        return_exceptions=True,
    )
    ok = [r for r in results if not isinstance(r, BaseException)]
    refused = [r for r in results if isinstance(r, StaleStateError)]
    assert len(ok) == 1 and len(refused) == 1
    assert "in flight" in str(refused[0])
    assert ok[0].next_state.observation.text == "Counter is 1."
    # the environment is usable afterwards, from its (one) current state
    nxt = await env.step(ok[0].next_state, Action(text="inc"))
    assert nxt.next_state.observation.text == "Counter is 2."


# -- the agent-environment contract, declared --------------------------------------------

CONTRACT = {"tools", "system_prompt", "example_turns", "stop_sequences", "reward_range",
            "node_id", "verify_stop", "container_runtime"}  # fmt: skip
# Where the contract is read: by type, never probed.
READERS = ("runner", "distributed", "fork.py", "sandbox/fork.py", "estimation.py")


class _DuckEnv:
    """An ``Environment`` by shape only (not a ``BaseEnvironment``)."""

    pure_step, max_steps = True, None
    system_prompt = "ignored: the rest of the contract is missing"

    async def reset(self, task: int | str | None = None, *, seed: int | None = None) -> State:
        raise NotImplementedError

    async def step(self, state: State, action: Action) -> StepResult:
        raise NotImplementedError

    async def aclose(self) -> None: ...

    async def __aenter__(self) -> _DuckEnv:
        return self

    async def __aexit__(self, *exc: object) -> None: ...


def _probes(source: str) -> list[str]:
    """``getattr(x, "<member>")`` calls naming a member of the contract."""
    return [
        node.args[1].value
        for node in ast.walk(ast.parse(source))
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
        and node.func.id in {"getattr", "hasattr"} and len(node.args) >= 2
        and isinstance(node.args[1], ast.Constant) and node.args[1].value in CONTRACT
    ]  # fmt: skip


async def test_a_base_environment_declares_the_contract_and_offers_nothing_by_default() -> None:
    env = ArithmeticEnv()
    assert isinstance(env, AgentEnvironment)
    assert (env.tools, env.system_prompt, env.example_turns, env.stop_sequences) == (
        (),
        None,
        (),
        (),
    )
    assert env.node_id is None and env.reward_range == (0.0, 1.0)
    async with CounterEnv() as counter:
        state = await counter.reset(1)
        assert await counter.verify_stop(state, "max_steps") is None
    assert AgentSurface.of(env) == AgentSurface(reward_range=(0.0, 1.0))


def test_an_environment_by_shape_only_offers_nothing() -> None:
    duck = _DuckEnv()
    assert isinstance(duck, Environment) and not isinstance(duck, AgentEnvironment)
    assert AgentSurface.of(duck) == AgentSurface()


def test_nothing_probes_an_environment_for_the_contract() -> None:
    package = Path(llenvs_async.__file__).parent
    found = {
        f"{path.relative_to(package)}: {name}"
        for reader in READERS
        for path in (
            [package / reader] if reader.endswith(".py") else (package / reader).rglob("*.py")
        )
        for name in _probes(path.read_text())
    }
    assert found == set()
    assert _probes('v = getattr(env, "reward_range", None)\nhasattr(e, "tools")') == [
        "reward_range",
        "tools",
    ]  # the scan itself sees a probe
