"""``ShellTaskEnvironment``: the step rules every shell task shares (``DockerEnvironment``,
``HarborEnvironment``), so they cannot drift.

The environment's agent protocol (``action_format``: ``"text"``, ``"tools"`` or an
``AgentProtocol``) turns an action into calls: shell commands run in the episode's shell in
order, each reply capped to ``max_observation_chars`` (head and tail kept); a submit ends the
episode (terminated) and verifies it. A reply the protocol cannot parse (a format error,
a cut-off reply) runs nothing and tells the model what was expected; ``max_format_errors``
consecutive ones end the episode. Truncation (``max_steps``, format errors, what a subclass
adds such as a time budget, and the stops the runner makes through ``verify_stop``) is
verified too unless ``verify_on_truncation=False``. Rewards are 0.0 except on the terminal
step, which carries the verifier's reward in ``reward_range``.

Info keys of a step (``parse_error`` and the command's keys are also the observation's
``data``): ``parse_error`` (None when the reply parsed), ``finish_reason`` (the completion's,
None for an action written by hand), ``command``, ``exit_code``, ``timed_out``,
``continuation_prompt``, ``duration_sec`` of the last command run (``calls``: one such dict
per call when a reply made several); a truncated step adds ``truncation_reason``
(``"max_steps"``, ``"format_errors"``, ...) and ``truncation_message``; verification adds what
the subclass's ``_verify_episode`` returns.
"""

from __future__ import annotations

import math
import signal
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from .env import BaseEnvironment
from .errors import StaleStateError
from .host import CommandResult
from .protocols import AgentProtocol, CallResult, Parsed, get_protocol
from .types import Action, ChatMessage, History, Observation, State, StepResult

__all__ = [
    "DEFAULT_MAX_OBSERVATION_CHARS",
    "ShellTaskEnvironment",
    "StepReply",
    "cap_text",
    "format_observation",
    "observation_text",
]

SUBMITTED_TEXT = "Submitted; the task was verified."
NOT_RUN_TEXT = "(not run: the episode ended at an earlier submit)"
DEFAULT_MAX_OBSERVATION_CHARS = 10_000
"""What one command's reply shows the model: the first and last halves, the middle counted."""


def format_observation(result: CommandResult, timeout: float | None = None) -> str:
    """The command output, with a note when it failed, timed out, was stopped or left the
    shell waiting."""
    parts = [result.output.rstrip("\n")] if result.output.strip() else []
    if result.continuation_prompt:
        parts.append(
            "[the shell was waiting for more input (unterminated quote, heredoc or block); "
            "the command was discarded]"
        )
    elif result.stopped is not None:
        parts.append(f"[command stopped: {result.stopped}]")
    elif result.timed_out:
        after = f" after {timeout:g}s" if timeout is not None else ""
        parts.append(f"[command timed out{after} and was interrupted]")
    elif result.exit_code not in (0, None):
        parts.append(f"[exit code: {result.exit_code}{_killed_by(result.exit_code)}]")
    if result.shell_restarted:
        parts.append("[the shell was restarted: working directory and variables were reset]")
    return "\n".join(parts)


def _killed_by(code: int) -> str:
    """``": killed by SIGXFSZ (File size limit exceeded)"`` for a shell's 128 + N status."""
    try:
        number = signal.Signals(code - 128)
    except ValueError:
        return ""
    return f": killed by {number.name} ({signal.strsignal(number)})"


def observation_text(result: CommandResult, timeout: float | None = None) -> str:
    """``format_observation``, never empty (the model must see a reply)."""
    return format_observation(result, timeout) or "(no output)"


def cap_text(text: str, limit: int | None) -> str:
    """``text`` within ``limit`` characters: head and tail kept, the middle counted."""
    if limit is None or len(text) <= limit:
        return text
    head = limit // 2
    tail = limit - head
    omitted = len(text) - head - tail
    return f"{text[:head]}\n[... {omitted} characters omitted ...]\n{text[len(text) - tail :]}"


@dataclass(frozen=True, slots=True)
class StepReply:
    """A step's answer as the protocol shapes it: the observation (with how the action is
    shown, see ``shown``) and the step info's ``parse_error`` / ``finish_reason``."""

    observation: Observation
    info: Mapping[str, Any]


def shown(observation: Observation, action: Action, rendered: Action) -> Observation:
    """``observation`` saying how the conversation shows ``action`` when the action format
    renders it differently (a command written by hand): ``data["shown_action"]`` =
    ``{"content", "tool_calls"}``, which the runner sends as the assistant turn."""
    if rendered is action:
        return observation
    turn = {"content": rendered.text, "tool_calls": [dict(c) for c in rendered.tool_calls]}
    return replace(observation, data={**observation.data, "shown_action": turn})


class ShellTaskEnvironment(BaseEnvironment):
    """Base of container shell tasks: subclasses start the container in ``_reset`` and give
    ``_run_command`` (run one command in the episode's shell) and ``_verify_episode``
    (``(reward, info)``); ``_truncation`` and ``_before_submit``/``_after_command`` are hooks.
    ``tools`` and ``system_prompt`` are what the runner offers the model for this format.
    """

    pure_step = False
    reward_range: tuple[float, float] = (0.0, 1.0)

    def __init__(
        self,
        *,
        max_steps: int | None = None,
        submit_keyword: str = "SUBMIT",
        verify_on_truncation: bool = True,
        action_format: str | AgentProtocol = "text",
        max_format_errors: int | None = 3,
        max_observation_chars: int | None = DEFAULT_MAX_OBSERVATION_CHARS,
        system_prompt: str | None = None,
    ) -> None:
        super().__init__(max_steps=max_steps)
        if not submit_keyword.strip():
            raise ValueError("submit_keyword must be a non-empty word")
        if max_format_errors is not None and max_format_errors < 1:
            raise ValueError(f"max_format_errors must be >= 1 or None, got {max_format_errors!r}")
        if max_observation_chars is not None and max_observation_chars < 64:
            raise ValueError(
                f"max_observation_chars must be >= 64 or None, got {max_observation_chars!r}"
            )
        self.submit_keyword = submit_keyword.strip()
        self.verify_on_truncation = verify_on_truncation
        self.protocol = get_protocol(action_format, submit_word=self.submit_keyword)
        self.max_format_errors = max_format_errors
        self.max_observation_chars = max_observation_chars
        self._system_prompt = system_prompt

    @property
    def tools(self) -> tuple[Mapping[str, Any], ...]:
        """The tool schemas of the environment's action format (none for ``text``)."""
        return self.protocol.tools()

    @property
    def example_turns(self) -> tuple[ChatMessage, ...]:
        """The action format's example turns, each example task worded as this environment
        words its own (the runner sends them after the system prompt)."""
        return self.protocol.examples(self.frame_task)

    def frame_task(self, instruction: str) -> str:
        """A task's first message around its ``instruction`` (subclasses add their wording)."""
        return instruction

    @property
    def stop_sequences(self) -> tuple[str, ...]:
        """Where the action format ends a reply (the runner adds them to every request)."""
        return self.protocol.stop_sequences()

    @property
    def system_prompt(self) -> str:
        """The one given, else the action format's instructions."""
        return self._system_prompt or self.protocol.instructions()

    def commands(self, action: Action) -> tuple[str, ...]:
        """The shell commands ``action`` runs (what a saved state's container depends on)."""
        return self.protocol.commands(action)

    def is_submit(self, action: Action) -> bool:
        """The action's first call is a submit."""
        calls = self.protocol.parse(action).calls
        return bool(calls) and calls[0].kind == "submit"

    async def verify_stop(
        self, state: State, reason: str
    ) -> tuple[float, Mapping[str, Any]] | None:
        """Verify an episode the runner stopped at ``state`` (``reason``: the context window,
        its ``max_steps``): ``(reward, info)``, or None when it is not verified."""
        self._ensure_open()
        if state.done or not self.verify_on_truncation:
            return None
        cur = self.current_state
        if cur is None or (cur.episode_id, cur.step) != (state.episode_id, state.step):
            raise StaleStateError(
                f"{type(self).__name__}.verify_stop: the environment is not in the state "
                f"(episode {state.episode_id!r}, step {state.step})",
                expected=None if cur is None else (cur.episode_id, cur.step),
                got=(state.episode_id, state.step),
            )
        reward, verdict = await self._verify_episode()
        return reward, {**verdict, "truncation_reason": reason}

    # -- hooks ------------------------------------------------------------------------------

    async def _run_command(
        self, command: str, timeout_sec: float | None = None
    ) -> tuple[CommandResult, float | None]:
        """Run ``command`` in the episode's shell within the environment's per-command limit
        (``timeout_sec``, when the model asked for one, can only shorten it); returns the
        result and the timeout used."""
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

    def _submit_reply(self, state: State, action: Action, text: str) -> StepReply:
        """The reply to a submit answered with ``text`` outside ``_step`` (a multi-step
        task's boundary); calls after the submit are answered as not run."""
        rendered = self.protocol.render(action, state.step + 1)
        parsed = self.protocol.parse(rendered)
        results = [
            CallResult(call, text if i == 0 else NOT_RUN_TEXT)
            for i, call in enumerate(parsed.calls)
        ]
        observation = shown(self.protocol.observe(parsed, results), action, rendered)
        return StepReply(observation, _reply_info(action, parsed))

    async def _step(self, state: State, action: Action) -> StepResult:
        step = state.step + 1
        # Parsed as shown: a command written by hand gets the ids its rendering carries.
        rendered = self.protocol.render(action, step)
        parsed = self.protocol.parse(rendered)
        info = _reply_info(action, parsed)
        if parsed.error is not None:
            return await self._format_error(state, action, rendered, parsed, info)
        results: list[CallResult] = []
        calls: list[dict[str, Any]] = []
        reward, submitted = 0.0, False
        for call in parsed.calls:
            if submitted:
                results.append(CallResult(call, NOT_RUN_TEXT))
            elif call.kind == "invalid":
                results.append(CallResult(call, f"[error: {call.error}]"))
            elif call.kind == "submit":
                self._before_submit(step)
                reward, verdict = await self._verify_episode()
                info.update(verdict, submitted=True)
                submitted = True
                results.append(CallResult(call, SUBMITTED_TEXT))
            else:
                result, timeout = await self._run_command(call.command, call.timeout_sec)
                self._after_command(call.command, result, step)
                text = cap_text(observation_text(result, timeout), self.max_observation_chars)
                results.append(CallResult(call, text))
                calls.append(_command_info(call.command, result))
        if calls:
            info.update(calls[-1])
            if len(parsed.calls) > 1:
                info["calls"] = calls
        observation = shown(self.protocol.observe(parsed, results), action, rendered)
        if submitted:
            return self._result(state, action, observation, reward, info, terminated=True)
        return await self._end_or_go_on(state, action, observation, info, self._truncation(step))

    async def _format_error(
        self,
        state: State,
        action: Action,
        rendered: Action,
        parsed: Parsed,
        info: dict[str, Any],
    ) -> StepResult:
        """A reply that runs nothing; the ``max_format_errors``-th in a row ends the episode."""
        errors = _trailing_format_errors(state) + 1
        info["format_errors"] = errors
        observation = shown(self.protocol.observe(parsed, ()), action, rendered)
        truncation = self._truncation(state.step + 1)
        limit = self.max_format_errors
        if truncation is None and limit is not None and errors >= limit:
            truncation = (
                "format_errors",
                f"{errors} consecutive replies could not be parsed "
                f"(max_format_errors={self.max_format_errors})",
            )
        return await self._end_or_go_on(state, action, observation, info, truncation)

    async def _end_or_go_on(
        self,
        state: State,
        action: Action,
        observation: Observation,
        info: dict[str, Any],
        truncation: tuple[str, str] | None,
    ) -> StepResult:
        if truncation is None:
            return self._result(state, action, observation, 0.0, info)
        info["truncation_reason"], info["truncation_message"] = truncation
        if truncation[0] != "max_steps":
            observation = replace(observation, text=f"{observation.text}\n[{truncation[1]}]")
        reward = 0.0
        if self.verify_on_truncation:
            reward, verdict = await self._verify_episode()
            info.update(verdict)
        return self._result(state, action, observation, reward, info, truncated=True)

    def _result(
        self,
        state: State,
        action: Action,
        observation: Observation | str,
        reward: float,
        info: Mapping[str, Any],
        *,
        terminated: bool = False,
        truncated: bool = False,
    ) -> StepResult:
        if isinstance(observation, str):
            observation = Observation(text=observation)
        hidden = self._hidden()
        data = {k: info[k] for k in _DATA_KEYS if info.get(k) is not None}
        next_state = state.advance(
            action,
            replace(observation, data={**observation.data, **data}),
            terminated=terminated,
            truncated=truncated,
            info=dict(info),
            **({} if hidden is None else {"hidden": hidden}),
        )
        return StepResult.of(next_state, reward, info)


_DATA_KEYS = ("parse_error", "exit_code", "timed_out", "duration_sec")


def _reply_info(action: Action, parsed: Parsed) -> dict[str, Any]:
    completion = action.completion
    return {
        "parse_error": parsed.error,
        "finish_reason": None if completion is None else completion.finish_reason,
    }


def _command_info(command: str, result: CommandResult) -> dict[str, Any]:
    info: dict[str, Any] = {
        "command": command,
        "exit_code": result.exit_code,
        "timed_out": result.timed_out,
        "continuation_prompt": result.continuation_prompt,
        "duration_sec": round(result.duration_s, 6),
    }
    if result.stopped is not None:
        info["stopped"] = result.stopped
    return info


def _trailing_format_errors(state: State) -> int:
    """How many of the steps that led to ``state``, counted back from the last, were
    format errors (a state without a recorded history counts none)."""
    count = 0
    history: History | None = state.history
    while history is not None and (step := history.last) is not None:
        if step.observation is None or step.observation.data.get("parse_error") is None:
            break
        count += 1
        history = history.parent
    return count


def capped_timeout(limit: float | None, asked: float | None) -> float | None:
    """The per-command limit, shortened to what the model asked for (never lengthened)."""
    if asked is None or not math.isfinite(asked) or asked <= 0:
        return limit
    return asked if limit is None else min(limit, asked)
