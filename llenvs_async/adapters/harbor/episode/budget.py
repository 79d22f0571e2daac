"""The command-time budget of a Harbor episode (or of one step of a multi-step task).

Only command time counts (not the time the agent spends generating); each command's
timeout is ``min(budget left, per-command cap, what the model asked for)``; running out
truncates the episode with ``info["truncation_reason"] = "agent_timeout"``.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from typing import Any, Literal

from ....host import CommandResult, ShellSession
from ..tasks.task import HarborTask

__all__ = ["DEFAULT_COMMAND_TIMEOUT_SEC", "CommandBudget"]

DEFAULT_COMMAND_TIMEOUT_SEC = 180.0
"""A command's time limit when the task gives no ``[agent].timeout_sec``."""


def _positive(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and value > 0


class CommandBudget:
    """One environment's command limits and the budget left (mutable: restarted per
    episode or step, re-anchored on a restore); ``total=None``: no budget."""

    __slots__ = ("_command_timeout", "_override", "total", "used")

    def __init__(
        self,
        command_timeout_sec: float | Literal["task"],
        budget_sec: float | Literal["task"] | None,
    ) -> None:
        if command_timeout_sec != "task" and not _positive(command_timeout_sec):
            raise ValueError(
                f"command_timeout_sec is seconds > 0 or 'task', got {command_timeout_sec!r}"
            )
        if budget_sec != "task" and not (budget_sec is None or _positive(budget_sec)):
            raise ValueError(
                f"budget_sec is seconds > 0, None (unlimited) or 'task', got {budget_sec!r}"
            )
        self._command_timeout = command_timeout_sec
        self._override = budget_sec
        self.total: float | None = None
        self.used = 0.0

    def command_timeout(self, task: HarborTask | None) -> float:
        """One command's limit: the one given, else (``"task"``) ``task``'s
        ``[agent].timeout_sec`` (Harbor bounds its oracle by it), else 180 s."""
        if self._command_timeout != "task":
            return float(self._command_timeout)
        task_limit = task.config.agent.timeout_sec if task is not None else None
        return task_limit or DEFAULT_COMMAND_TIMEOUT_SEC

    @property
    def left(self) -> float | None:
        """Seconds of command time left (``None``: no budget)."""
        if self.total is None:
            return None
        return max(0.0, self.total - self.used)

    def restart(self, task_timeout: float | None) -> None:
        """A fresh budget: ``task_timeout`` (the task's or step's agent timeout) unless the
        environment was given one."""
        self.total = task_timeout if self._override == "task" else self._override
        self.used = 0.0

    def truncation(self) -> tuple[str, str] | None:
        """``("agent_timeout", why)`` once the budget is used up."""
        if self.total is not None and self.used >= self.total:
            return ("agent_timeout", f"the trajectory time budget of {self.total:g}s is used up")
        return None

    async def run(
        self,
        shell: ShellSession,
        command: str,
        cap: float,
        *,
        charged: bool,
        stop: Callable[[], Awaitable[str]] | None = None,
    ) -> tuple[CommandResult, float]:
        """Run ``command`` within ``cap`` seconds; ``charged`` (not a replay): also within the
        budget left, its time charged to it (a command cut off by the budget spends it all).
        ``stop``: the shell's stop watch (``ShellSession.run``)."""
        left = self.left
        timeout = min(cap, left) if charged and left is not None else cap
        started = time.monotonic()
        result = await shell.run(command, timeout=timeout, stop=stop)
        if charged and self.total is not None:
            self.used = min(self.total, self.used + time.monotonic() - started)
            if result.timed_out and left is not None and timeout >= left:
                self.used = self.total
        return result, timeout

    def hidden(self) -> dict[str, Any]:
        """The budget's part of ``state.hidden``."""
        left = self.left
        return {
            "budget_sec": self.total,
            "budget_used_sec": round(self.used, 6),
            "budget_left_sec": None if left is None else round(left, 6),
        }
