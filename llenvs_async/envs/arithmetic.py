"""A pure text puzzle with a verifiable answer: solve a small arithmetic problem."""

from __future__ import annotations

import random
import re

from ..env import BaseEnvironment, new_episode_id
from ..errors import EnvError
from ..types import Action, Observation, State, StepResult

__all__ = ["ArithmeticEnv"]

_INT = re.compile(r"-?\d+")


class ArithmeticEnv(BaseEnvironment):
    """Task ``i`` is a deterministic ``a op b`` problem; the last integer in the action
    is the answer. Right: reward 1.0 and the episode ends; wrong: feedback and retry
    until ``max_steps``. Pure: the answer travels in ``state.hidden``.
    """

    pure_step = True
    # Range of one episode's return (Gymnasium's attribute): one terminal reward of 0 or 1.
    reward_range = (0.0, 1.0)

    def __init__(self, *, num_tasks: int = 100, max_steps: int = 3) -> None:
        super().__init__(max_steps=max_steps)
        if num_tasks < 1:
            raise ValueError(f"num_tasks must be >= 1, got {num_tasks!r}")
        self.num_tasks = num_tasks

    def problem(self, task: int) -> tuple[str, int]:
        rng = random.Random(task)
        a, b = rng.randint(2, 99), rng.randint(2, 99)
        op = rng.choice("+-*")
        answer = a + b if op == "+" else a - b if op == "-" else a * b
        return f"{a} {op} {b}", answer

    async def _reset(self, task: int | str | None, *, seed: int | None) -> State:
        index = _task_index(task, self.num_tasks, seed)
        question, answer = self.problem(index)
        return State(
            observation=Observation(text=f"Compute {question}. Answer with a single integer."),
            task=index,
            episode_id=new_episode_id(),
            hidden=answer,
            seed=seed,
        )

    async def _step(self, state: State, action: Action) -> StepResult:
        found = _INT.findall(action.text)
        correct = bool(found) and int(found[-1]) == state.hidden
        step = state.step + 1
        truncated = not correct and self.max_steps is not None and step >= self.max_steps
        text = "Correct." if correct else ("Wrong." if found else "No integer found.")
        next_state = state.advance(
            action, Observation(text=text), terminated=correct, truncated=truncated
        )
        return StepResult.of(next_state, 1.0 if correct else 0.0)


def _task_index(task: int | str | None, num_tasks: int, seed: int | None) -> int:
    """Resolve ``reset``'s task argument: an index, a numeric string, or None (seeded pick)."""
    if task is None:
        return random.Random(seed).randrange(num_tasks)
    if isinstance(task, str) and task.lstrip("-").isdigit():
        task = int(task)
    if not isinstance(task, int) or isinstance(task, bool) or not 0 <= task < num_tasks:
        raise EnvError(f"unknown task {task!r}: expected an index in [0, {num_tasks})", task=task)
    return task
