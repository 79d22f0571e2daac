"""A pure multi-step text game: walk a corridor to the goal with "left"/"right"."""

from __future__ import annotations

from ..env import BaseEnvironment, new_episode_id
from ..types import Action, Observation, State, StepResult
from .arithmetic import _task_index

__all__ = ["ChainEnv"]


class ChainEnv(BaseEnvironment):
    """Positions ``0..length``; start at 0, goal at ``length``. The action text's first
    word ``left``/``right`` moves (anything else stays). Reaching the goal gives 1.0.
    Task ``i`` sets the corridor length to ``min_length + i``. Pure.
    """

    pure_step = True
    # Range of one episode's return (Gymnasium's attribute): one terminal reward of 0 or 1.
    reward_range = (0.0, 1.0)

    def __init__(self, *, min_length: int = 3, num_tasks: int = 5, max_steps: int = 10) -> None:
        super().__init__(max_steps=max_steps)
        self.min_length = min_length
        self.num_tasks = num_tasks

    async def _reset(self, task: int | str | None, *, seed: int | None) -> State:
        index = _task_index(task, self.num_tasks, seed)
        length = self.min_length + index
        return State(
            observation=Observation(text=self._describe(0, length), data={"position": 0}),
            task=index,
            episode_id=new_episode_id(),
            hidden=(0, length),
            seed=seed,
        )

    async def _step(self, state: State, action: Action) -> StepResult:
        position, length = state.hidden
        word = action.text.strip().split(maxsplit=1)[0].lower() if action.text.strip() else ""
        if word == "right":
            position = min(position + 1, length)
        elif word == "left":
            position = max(position - 1, 0)
        step = state.step + 1
        terminated = position == length
        truncated = not terminated and self.max_steps is not None and step >= self.max_steps
        next_state = state.advance(
            action,
            Observation(text=self._describe(position, length), data={"position": position}),
            terminated=terminated,
            truncated=truncated,
            hidden=(position, length),
        )
        return StepResult.of(next_state, 1.0 if terminated else 0.0)

    @staticmethod
    def _describe(position: int, length: int) -> str:
        return f"You are at {position} of {length}. Say 'left' or 'right'."
