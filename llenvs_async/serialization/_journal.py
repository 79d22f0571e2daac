"""A run's step journal: each in-flight rollout's settled steps, appended as they happen, so
that a run killed at any point resumes every unfinished rollout from its last step.

One JSONL line per step: ``{"key": [...], "step": n, "transition": {...}}``, the
transition encoded as a trajectory's are (its state only where it is not step n-1's next
state; its next state's history ``"+1"``); step 0 adds ``"initial_state"``. A line for
step n replaces what the journal held for that rollout from step n on (a step handed again
after a stop's verdict; a rollout started afresh). Lines are flushed as written and a torn
last line is dropped on reading (``JsonlWriter``), so a kill loses at most the step it cut.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path
from types import TracebackType
from typing import Any

from ..types import State, Trajectory, Transition
from ._decode import _read_state, _read_transition
from ._encode import _state, _transition
from ._jsonl import JsonlWriter, iter_jsonl
from ._values import SerializationError

__all__ = ["JournalKey", "StepJournal", "read_journal"]

JournalKey = tuple[int | str, ...]
"""What names a rollout in a journal (the CLI's: its task's key and its rollout number)."""


class StepJournal:
    """Appends rollouts' steps to ``path`` (see the module doc). ``known`` (items of what
    ``read_journal`` gave) lets a resumed rollout's next step be written against the state
    its last journaled one led to."""

    def __init__(
        self, path: str | os.PathLike[str], known: Iterable[tuple[JournalKey, Trajectory]] = ()
    ) -> None:
        self._writer = JsonlWriter(path)
        self._last: dict[JournalKey, State] = {k: t.final_state for k, t in known}

    @property
    def path(self) -> Path:
        return self._writer.path

    def write(self, key: JournalKey, step: int, transition: Transition) -> None:
        """Journal step ``step`` of rollout ``key`` (flushed before this returns)."""
        record: dict[str, Any] = {"key": list(key), "step": step}
        state = transition.state
        previous = self._last.get(key)
        if step == 0:  # the rollout's start: its first state is the initial one
            record["initial_state"] = _state(state)
            record["transition"] = _transition(transition, None)
        elif previous is not None and (state is previous or state == previous):
            record["transition"] = _transition(transition, None)
        else:  # a resumed rollout's restored state, say
            record["transition"] = _transition(transition, _state(state, base=previous))
        self._writer.write(record)
        self._last[key] = transition.next_state

    def finished(self, key: JournalKey) -> None:
        """Forget rollout ``key``'s last state (it is written elsewhere now): the journal
        holds a state only per rollout in flight, not per rollout ever run."""
        self._last.pop(key, None)

    def close(self) -> None:
        self._writer.close()

    def __enter__(self) -> StepJournal:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


def read_journal(path: str | os.PathLike[str]) -> dict[JournalKey, Trajectory]:
    """Each journaled rollout's steps as an unfinished ``Trajectory`` (``stop_reason``
    ``"unfinished"``), by key; a missing file is an empty journal. A line whose step does
    not follow what came before for its rollout is a ``SerializationError`` naming it."""
    source = Path(path)
    if not source.exists():
        return {}
    rollouts: dict[JournalKey, tuple[State, list[Transition]]] = {}
    for number, record in iter_jsonl(source):
        where = f"{source}:{number}"
        key, step, data = record.get("key"), record.get("step"), record.get("transition")
        if not isinstance(key, list) or not all(isinstance(k, int | str) for k in key):
            raise SerializationError(f"{where}: 'key' must be a list of ints and strings")
        if type(step) is not int or step < 0 or not isinstance(data, dict):
            raise SerializationError(f"{where}: expected a 'step' >= 0 and a 'transition'")
        name = tuple(key)
        if step == 0:
            initial = record.get("initial_state")
            if not isinstance(initial, dict):
                raise SerializationError(f"{where}: step 0 without an 'initial_state'")
            rollouts[name] = (_read_state(initial, f"{where}.initial_state"), [])
        elif name not in rollouts or step > len(rollouts[name][1]):
            held = len(rollouts[name][1]) if name in rollouts else 0
            raise SerializationError(
                f"{where}: step {step} of rollout {key} follows {held} journaled step(s)"
            )
        first, steps = rollouts[name]
        del steps[step:]
        previous = steps[-1].next_state if steps else first
        steps.append(_read_transition(data, f"{where}.transition", previous))
    return {
        name: Trajectory(
            episode_id=first.episode_id or "",
            initial_state=first,
            transitions=tuple(steps),
            stop_reason="unfinished",
        )
        for name, (first, steps) in rollouts.items()
    }
