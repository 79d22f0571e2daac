"""``check_env``: a conformance check any Environment implementation can be run through."""

from __future__ import annotations

import dataclasses
from collections.abc import Awaitable, Callable, Sequence

from ..env import Environment, replay_restore
from ..errors import ClosedError, StaleStateError
from ..types import Action, State, StepResult

__all__ = ["check_env"]


async def check_env(
    make_env: Callable[[], Awaitable[Environment]],
    *,
    task: int | str | None = None,
    actions: Sequence[str] = ("noop",),
    seed: int | None = None,
) -> None:
    """Run the Environment contract against fresh instances from ``make_env``.

    Checks: reset/step types and provenance (task, step, actions prefix, episode id),
    frozen values, reward/flag consistency, ``replay_restore`` reproducing the last
    observation on a fresh instance, the stale-state guard of non-pure environments,
    idempotent ``aclose`` and use-after-close raising ``ClosedError``. Raises
    ``AssertionError`` naming the first broken rule.
    """
    if not actions:
        raise ValueError("check_env needs at least one action")
    env = await make_env()
    try:
        _require(isinstance(env.pure_step, bool), "pure_step must be a bool")
        state = await env.reset(task, seed=seed)
        _check_state(state, step=0, prefix=())
        _require(state.task is not None or task is None, "State.task must record reset's task")
        first = state
        for text in actions:
            if state.done:
                break
            action = Action(text=text)
            result = await env.step(state, action)
            _require(isinstance(result, StepResult), "step must return a StepResult")
            _require(isinstance(result.reward, float | int), "reward must be a number")
            nxt = result.next_state
            _check_state(nxt, step=state.step + 1, prefix=(*state.actions, action))
            _require(nxt.episode_id == state.episode_id, "step must keep the episode_id")
            _require(
                result.terminated == nxt.terminated and result.truncated == nxt.truncated,
                "StepResult flags must match next_state's",
            )
            state = nxt
        try:
            setattr(state, "step", state.step)  # noqa: B010 - probing immutability
        except dataclasses.FrozenInstanceError:
            pass
        else:
            raise AssertionError("State must be frozen")
        if not env.pure_step and not first.done and state.step > 0:
            try:
                await env.step(first, Action(text=actions[0]))
            except StaleStateError:
                pass
            else:
                raise AssertionError("a non-pure env must raise StaleStateError on a stale state")
        await _check_replay(make_env, state)
    finally:
        await env.aclose()
    await env.aclose()  # idempotent
    try:
        await env.reset(task, seed=seed)
    except ClosedError:
        pass
    else:
        raise AssertionError("reset after aclose must raise ClosedError")


async def _check_replay(make_env: Callable[[], Awaitable[Environment]], state: State) -> None:
    fresh = await make_env()
    try:
        restored = await replay_restore(fresh, state)
        _require(restored.step == state.step, "replay_restore must reach the saved step")
        _require(
            restored.observation.text == state.observation.text,
            f"replay must reproduce the observation: {restored.observation.text!r} "
            f"!= {state.observation.text!r}",
        )
    finally:
        await fresh.aclose()


def _check_state(state: State, *, step: int, prefix: tuple[Action, ...]) -> None:
    _require(isinstance(state, State), f"expected a State, got {type(state).__name__}")
    _require(state.step == step, f"state.step must be {step}, got {state.step}")
    _require(state.actions == prefix, f"state.actions must be the prefix {prefix!r}")
    _require(isinstance(state.actions, Sequence), "state.actions must be a sequence")


def _require(ok: bool, message: str) -> None:
    if not ok:
        raise AssertionError(f"check_env: {message}")
