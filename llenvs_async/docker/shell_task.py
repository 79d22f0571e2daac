"""``ShellTaskEnvironment``: the step rules every shell task shares (``DockerEnvironment``,
``HarborEnvironment``), so they cannot drift.

An action's command is the first fenced code block of its text, else the stripped text;
the submit keyword ends the episode (terminated) and verifies it; an empty command gets a
note and runs nothing; any other command runs in the episode's shell and its observation
is ``observation_text`` (never empty). Truncation (``max_steps``, or what a subclass adds
such as a time budget) is verified too unless ``verify_on_truncation=False``. Rewards are
0.0 except on the terminal step, which carries the verifier's reward in ``reward_range``.

Info keys of a command step (also the observation's ``data``): ``command``, ``exit_code``,
``timed_out``, ``continuation_prompt``, ``duration_sec``; a truncated step adds
``truncation_reason`` (``"max_steps"``, ...) and ``truncation_message``; verification adds
what the subclass's ``_verify_episode`` returns.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from ..env import BaseEnvironment
from ..types import Action, Observation, State, StepResult
from .output import CommandResult

__all__ = ["ShellTaskEnvironment", "extract_command", "format_observation", "observation_text"]

_FENCE = re.compile(r"```[^\n`]*\n(.*?)```", re.DOTALL)
SUBMITTED_TEXT = "Submitted; the task was verified."


def extract_command(text: str) -> str:
    """The first fenced code block's content, else the whole stripped text."""
    text = text.replace("\r\n", "\n")
    match = _FENCE.search(text)
    return (match.group(1) if match else text).strip()


def format_observation(result: CommandResult, timeout: float | None = None) -> str:
    """The command output, with a note when it failed, timed out or left the shell waiting."""
    parts = [result.output.rstrip("\n")] if result.output.strip() else []
    if result.continuation_prompt:
        parts.append(
            "[the shell was waiting for more input (unterminated quote, heredoc or block); "
            "the command was discarded]"
        )
    elif result.timed_out:
        after = f" after {timeout:g}s" if timeout is not None else ""
        parts.append(f"[command timed out{after} and was interrupted]")
    elif result.exit_code not in (0, None):
        parts.append(f"[exit code: {result.exit_code}]")
    if result.shell_restarted:
        parts.append("[the shell was restarted: working directory and variables were reset]")
    return "\n".join(parts)


def observation_text(result: CommandResult, timeout: float | None = None) -> str:
    """``format_observation``, never empty (the model must see a reply)."""
    return format_observation(result, timeout) or "(no output)"


class ShellTaskEnvironment(BaseEnvironment):
    """Base of container shell tasks: subclasses start the container in ``_reset`` and give
    ``_run_command`` (run one command in the episode's shell) and ``_verify_episode``
    (``(reward, info)``); ``_truncation`` and ``_before_submit``/``_after_command`` are hooks.
    """

    pure_step = False
    reward_range: tuple[float, float] = (0.0, 1.0)

    def __init__(
        self,
        *,
        max_steps: int | None = None,
        submit_keyword: str = "SUBMIT",
        verify_on_truncation: bool = True,
    ) -> None:
        super().__init__(max_steps=max_steps)
        if not submit_keyword.strip():
            raise ValueError("submit_keyword must be a non-empty word")
        self.submit_keyword = submit_keyword.strip()
        self.verify_on_truncation = verify_on_truncation

    def is_submit(self, action: Action) -> bool:
        return extract_command(action.text) == self.submit_keyword

    # -- hooks ------------------------------------------------------------------------------

    async def _run_command(self, command: str) -> tuple[CommandResult, float | None]:
        """Run ``command`` in the episode's shell; returns the result and the timeout used."""
        raise NotImplementedError

    async def _verify_episode(self) -> tuple[float, Mapping[str, Any]]:
        """Verify the episode: its reward and what to add to the step's info."""
        raise NotImplementedError

    def _truncation(self, step: int) -> tuple[str, str] | None:
        """``(reason, message)`` when the episode must stop after ``step``, else ``None``."""
        if self.max_steps is not None and step >= self.max_steps:
            return "max_steps", f"max_steps={self.max_steps} reached"
        return None

    def _before_submit(self, step: int) -> None:
        """Called before a submit is verified (a subclass may refuse it)."""

    def _after_command(self, command: str, result: CommandResult, step: int) -> None:
        """Called after a command ran (a subclass may raise on what it saw)."""

    def _hidden(self) -> Any:
        """The next state's ``hidden`` (default: unchanged)."""
        return None

    # -- the step ---------------------------------------------------------------------------

    async def _step(self, state: State, action: Action) -> StepResult:
        command = extract_command(action.text)
        step = state.step + 1
        info: dict[str, Any] = {"command": command}
        if command == self.submit_keyword:
            self._before_submit(step)
            reward, verdict = await self._verify_episode()
            info.update(verdict, submitted=True)
            return self._result(state, action, SUBMITTED_TEXT, reward, info, terminated=True)
        if not command:
            text = (
                f"(empty command: reply with a shell command, or {self.submit_keyword} when done)"
            )
        else:
            result, timeout = await self._run_command(command)
            self._after_command(command, result, step)
            text = observation_text(result, timeout)
            info.update(
                exit_code=result.exit_code,
                timed_out=result.timed_out,
                continuation_prompt=result.continuation_prompt,
                duration_sec=round(result.duration_s, 6),
            )
        truncation = self._truncation(step)
        if truncation is None:
            return self._result(state, action, text, 0.0, info)
        info["truncation_reason"], info["truncation_message"] = truncation
        if truncation[0] != "max_steps":
            text += f"\n[{truncation[1]}]"
        reward = 0.0
        if self.verify_on_truncation:
            reward, verdict = await self._verify_episode()
            info.update(verdict)
        return self._result(state, action, text, reward, info, truncated=True)

    def _result(
        self,
        state: State,
        action: Action,
        text: str,
        reward: float,
        info: Mapping[str, Any],
        *,
        terminated: bool = False,
        truncated: bool = False,
    ) -> StepResult:
        hidden = self._hidden()
        data = {k: info[k] for k in ("exit_code", "timed_out", "duration_sec") if k in info}
        next_state = state.advance(
            action,
            Observation(text=text, data=data),
            terminated=terminated,
            truncated=truncated,
            info=dict(info),
            **({} if hidden is None else {"hidden": hidden}),
        )
        return StepResult.of(next_state, reward, info)
