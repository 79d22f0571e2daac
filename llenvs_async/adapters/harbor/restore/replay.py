"""``harbor_restore``: bring a fresh ``HarborEnvironment`` to a saved state by replay.

Unlike the generic ``replay_restore`` it (1) refuses, before any container command
runs, a state whose task index now names another task (index drift between
dataset versions), (2) replays with the live time budget disabled and aborts when
a replayed command leaves the shell at a continuation prompt, and (3) re-anchors
the budget so the continuation has exactly the budget the saved state had.
Errors: ``RestoreError`` (index drift, finished or foreign state, replay landing on
another step) and ``ContinuationPromptError`` (names the command and step).
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

from ....env import Environment, check_replayed, replay
from ....errors import RestoreError
from ....types import State
from ..episode.environment import HarborEnvironment
from ..tasks.task import short_name

__all__ = ["check_restorable", "harbor_restore", "reanchor", "replay_prefix", "saved_hidden"]


def saved_hidden(state: State) -> Mapping[str, Any]:
    """The Harbor bookkeeping a state carries in ``state.hidden`` (validated)."""
    hidden = state.hidden
    if (
        not isinstance(hidden, Mapping)
        or not isinstance(hidden.get("task_name"), str)
        or not isinstance(hidden.get("task_index"), int)
    ):
        raise RestoreError(
            "state.hidden lacks the Harbor task name and index: this state was not produced "
            f"by a HarborEnvironment (hidden={hidden!r})"
        )
    return hidden


def check_task_identity(env: HarborEnvironment, state: State) -> None:
    """Refuse a state whose recorded task is not what ``state.task`` resolves to now."""
    hidden = saved_hidden(state)
    name, index = hidden["task_name"], hidden["task_index"]
    dataset = env.dataset
    if isinstance(state.task, str):
        try:
            dataset.index_of(state.task)
        except KeyError as exc:
            raise RestoreError(
                f"task {state.task!r} is not in {dataset.spec} any more: the dataset may have "
                "changed since the state was saved",
                task=state.task,
            ) from exc
        return
    found = dataset.tasks[index].name if 0 <= index < len(dataset) else None
    if found is None or short_name(found) != short_name(name):
        now = f"holds {found!r}" if found is not None else f"is out of range ({len(dataset)} tasks)"
        raise RestoreError(
            f"task index {index} of {dataset.spec} {now}, but the state was saved on task "
            f"{name!r}: the dataset may have changed (index drift); restore by task name or "
            "use the dataset version the state was saved with",
            task_index=index,
            saved_name=name,
            found_name=found,
        )


def check_restorable(env: Environment, state: State, caller: str) -> HarborEnvironment:
    """The checks every Harbor restore makes before any command runs: a ``HarborEnvironment``,
    an unfinished state, and the task identity (no index drift)."""
    if not isinstance(env, HarborEnvironment):
        raise TypeError(f"{caller} needs a HarborEnvironment, got {type(env).__name__}")
    if state.done:
        raise RestoreError(
            f"state at step {state.step} of episode {state.episode_id!r} is finished: "
            "there is nothing to continue",
            step=state.step,
        )
    check_task_identity(env, state)
    return env


async def replay_prefix(env: HarborEnvironment, state: State) -> State:
    """Reset to ``state.task`` and replay ``state.actions`` with the budget disabled; the
    state reached (budget not re-anchored yet)."""
    with env.replaying():
        current = await replay(env, state.task, state.actions, seed=state.seed)
    check_replayed(current, state)
    return current


def reanchor(
    env: HarborEnvironment,
    state: State,
    *,
    started: float,
    info: Mapping[str, Any] | None = None,
) -> State:
    """Give ``env`` exactly the budget ``state`` had; ``started``: when the restore began
    (``time.monotonic``), reported as ``info["replay_sec"]``."""
    hidden = saved_hidden(state)
    return env.reanchor_budget(
        used_sec=float(hidden.get("budget_used_sec", 0.0)),
        budget_sec=hidden.get("budget_sec"),
        replay_sec=time.monotonic() - started,
        info=info,
    )


async def harbor_restore(env: Environment, state: State) -> State:
    """A ``RestoreFn``: check the task identity, reset, replay ``state.actions`` without the
    budget, and re-anchor the budget (see the module docstring for the errors)."""
    harbor_env = check_restorable(env, state, "harbor_restore")
    started = time.monotonic()
    await replay_prefix(harbor_env, state)
    return reanchor(harbor_env, state, started=started)
