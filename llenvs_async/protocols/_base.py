"""The agent protocol: how a model's reply becomes shell commands or a submit, and how the
results go back to the model. Shell-task environments take one; the shell, the runner and
the backends stay unaware of it.

A protocol parses what a model generated: an action carrying its ``Completion``, or tool
calls. An action without either (a forced action, a hand-written prefix, the seed's
``Action(text="apt-get update")``) is one command as written (the submit word alone is a
submit), and ``render`` shows it in the conversation the way the format would.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, Literal

from ..types import Action, ChatMessage, Observation

__all__ = ["AgentProtocol", "Call", "CallResult", "Parsed", "is_model_output"]

CallKind = Literal["bash", "submit", "invalid"]


@dataclass(frozen=True, slots=True)
class Call:
    """One thing a reply asks for, in reply order. ``invalid``: answered with ``error``,
    nothing runs. ``call_id`` is the tool call's id (its reply carries it); ``timeout_sec``
    is what the model asked for (the environment caps it)."""

    kind: CallKind
    command: str = ""
    timeout_sec: float | None = None
    call_id: str | None = None
    error: str | None = None


@dataclass(frozen=True, slots=True)
class Parsed:
    """A parsed reply: its calls in order, or a format ``error`` (the whole reply runs
    nothing and the model is told what was expected). A cut-off reply that carried tool
    calls has both: the error, and each call as ``invalid`` so that every call is answered."""

    calls: tuple[Call, ...] = ()
    error: str | None = None

    @property
    def commands(self) -> tuple[str, ...]:
        """The shell commands the reply runs, in order (calls after a submit never run)."""
        out: list[str] = []
        for call in self.calls:
            if call.kind == "submit":
                break
            if call.kind == "bash":
                out.append(call.command)
        return tuple(out)

    @property
    def submits(self) -> bool:
        return any(call.kind == "submit" for call in self.calls)


@dataclass(frozen=True, slots=True)
class CallResult:
    """What one call got back: ``text`` is the model-facing reply (output and notes, never
    empty), formatted by the environment."""

    call: Call
    text: str


def is_model_output(action: Action) -> bool:
    """A reply a model generated (it carries a completion or tool calls): parsed strictly.
    Anything else is a command as written."""
    return action.completion is not None or bool(action.tool_calls)


class AgentProtocol(ABC):
    """One action format. Subclasses set ``name`` and implement ``instructions``,
    ``_parse_reply``, ``_shown`` and ``observe``; ``tools`` defaults to none."""

    name: ClassVar[str]

    def __init__(self, *, submit_word: str = "SUBMIT") -> None:
        if not submit_word.strip() or len(submit_word.split()) != 1:
            raise ValueError(f"submit_word must be one non-empty word, got {submit_word!r}")
        self.submit_word = submit_word.strip()

    def tools(self) -> tuple[Mapping[str, Any], ...]:
        """The OpenAI-format tool schemas every request offers (none by default)."""
        return ()

    def examples(self, frame: Callable[[str], str] = str) -> tuple[ChatMessage, ...]:
        """Example turns (user task, assistant reply, ...) sent after the system prompt and
        before the task: small models follow shown replies far better than described ones.
        ``frame`` is how the environment words a task's first message (its boilerplate
        around the instruction), so that an example task reads like a real one. None by
        default."""
        return ()

    def stop_sequences(self) -> tuple[str, ...]:
        """Strings that end a reply where the format says it is complete (sent as
        ``SamplingParams.stop``, kept in the reply's text and ids); none by default. They
        only save the tokens a model would ramble after its answer: the parser still
        decides what runs."""
        return ()

    @abstractmethod
    def instructions(self) -> str:
        """The system prompt that explains the format to the model."""

    def parse(self, action: Action) -> Parsed:
        """What ``action`` asks for. A reply cut off at ``max_tokens`` runs nothing; an
        action that is not model output is one command as written."""
        if not is_model_output(action):
            text = action.text.strip()
            if text == self.submit_word:
                return Parsed(calls=(Call("submit"),))
            if not text:
                return Parsed(error="empty command")
            return Parsed(calls=(Call("bash", command=text),))
        completion = action.completion
        if completion is not None and completion.finish_reason == "length":
            return Parsed(
                error="the reply was cut off at the max_tokens limit (finish_reason=length); "
                "nothing was run"
            )
        return self._parse_reply(action)

    @abstractmethod
    def _parse_reply(self, action: Action) -> Parsed:
        """Parse a complete model reply strictly."""

    def commands(self, action: Action) -> tuple[str, ...]:
        """The shell commands ``action`` runs (snapshot cache keys, fork replay)."""
        return self.parse(action).commands

    def render(self, action: Action, step: int) -> Action:
        """``action`` as the conversation shows it: model output unchanged; a command as
        written in this format's shape (``_shown``, deterministic in the call and ``step``)."""
        if is_model_output(action):
            return action
        calls = self.parse(action).calls
        return self._shown(calls[0], step) if calls else action

    @abstractmethod
    def _shown(self, call: Call, step: int) -> Action:
        """A command written by hand (``call``: one ``bash`` or ``submit``) as this format's
        reply; parsing it must give the same call."""

    @abstractmethod
    def observe(self, parsed: Parsed, results: Sequence[CallResult]) -> Observation:
        """The observation after a step: for a format error, what was wrong and what is
        expected; else every call's reply (``Observation.tool_replies`` where the format
        answers calls by id, in call order)."""
