"""The ``text`` format: each reply holds one fenced code block, the command it runs, or the
submit word alone. Reasoning (``<think>`` blocks, or everything before a lone ``</think>``)
is removed first, so a block inside it never runs."""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence

from ..types import Action, ChatMessage, Observation
from ._base import AgentProtocol, Call, CallResult, Parsed, is_model_output

__all__ = ["TextProtocol"]

_THINK_BLOCK = re.compile(r"<think>.*?</think>", re.S)
_OPEN_FENCE = re.compile(r"[ \t]*(`{3,})[^`]*")
_RENDERED = re.compile(r"```bash\n(.*)\n```", re.S)
_NO_ANSWER = "the reply has no answer after the reasoning"
# Where a reply's first ```bash block closes (a closing fence alone on its line, followed by
# a newline): generation stops there instead of running on into notes and more blocks.
BLOCK_END = "\n```\n"
# Shown before every task (``TextProtocol.examples``): everyday commands on paths no task uses,
# and one submit after a command that printed nothing. (is a task, user turn, command or submit)
EXAMPLE_TURNS: tuple[tuple[bool, str, str | None], ...] = (
    (True, "Show the first line of the file /etc/passwd", "head -n 1 /etc/passwd"),
    (True, "Make the directory /srv/cache", "mkdir -p /srv/cache"),
    (True, "Save the word ready in the file /tmp/status", "echo ready > /tmp/status"),
    (False, "(no output)", None),
    (True, "Find the lines of /var/log/syslog that contain error", "grep error /var/log/syslog"),
)


def _answer(text: str) -> tuple[str, str | None]:
    """``text`` with its reasoning removed, or an error when it ends inside ``<think>``."""
    text = _THINK_BLOCK.sub("", text)
    close = text.rfind("</think>")
    if close >= 0:  # the template opened <think> in the prompt: all before it is reasoning
        text = text[close + len("</think>") :]
    if "<think>" in text:
        return "", "the reply ended inside <think>: no answer after the reasoning"
    return text, None


def _blocks(text: str) -> tuple[list[str], bool]:
    """The fenced code blocks of ``text`` (contents stripped), and whether one is unclosed."""
    blocks: list[str] = []
    body: list[str] | None = None
    fence = ""
    for line in text.split("\n"):
        if body is None:
            if opening := _OPEN_FENCE.fullmatch(line):
                body, fence = [], opening[1]
        elif line.strip().startswith(fence) and not line.strip().strip("`"):
            blocks.append("\n".join(body).strip())
            body = None
        else:
            body.append(line)
    return blocks, body is not None


class TextProtocol(AgentProtocol):
    """One ```` ```bash ```` block per reply, or the submit word alone; prose is never run.

    ``stop_after_block`` (default) ends generation at the first closing fence (``BLOCK_END``):
    a small model otherwise writes on after its command until ``max_tokens`` cuts it off,
    and a cut-off reply runs nothing. The stop string stays in the reply, so what was
    sampled is what is parsed; a reply that opens a bare ```` ``` ```` fence after prose
    stops there, unclosed, and is a format error as before. ``few_shot`` (default) shows
    ``EXAMPLE_TURNS`` before the task."""

    name = "text"

    def __init__(
        self, *, submit_word: str = "SUBMIT", stop_after_block: bool = True, few_shot: bool = True
    ) -> None:
        super().__init__(submit_word=submit_word)
        self.stop_after_block = stop_after_block
        self.few_shot = few_shot

    def stop_sequences(self) -> tuple[str, ...]:
        return (BLOCK_END,) if self.stop_after_block else ()

    def examples(self, frame: Callable[[str], str] = str) -> tuple[ChatMessage, ...]:
        if not self.few_shot:
            return ()
        turns: list[ChatMessage] = []
        for is_task, said, command in EXAMPLE_TURNS:
            reply = self.submit_word if command is None else f"```bash\n{command}\n```"
            turns.append(ChatMessage(role="user", content=frame(said) if is_task else said))
            turns.append(ChatMessage(role="assistant", content=reply))
        return tuple(turns)

    def _expected(self) -> str:
        """The line an observation adds after a format error."""
        return (
            f"Reply with exactly one ```bash code block holding one command, "
            f"or {self.submit_word} alone to submit."
        )

    def instructions(self) -> str:
        """Short on purpose: with the example turns, it measured best for a small model
        (a longer prompt describing reasoning and notes did no better)."""
        return (
            "You are a Linux shell agent. Reply with exactly one shell command in a ```bash "
            f"code block. When the task is done, reply {self.submit_word} alone."
        )

    def parse(self, action: Action) -> Parsed:
        """As ``AgentProtocol.parse``; a command as written in its rendered shape (one
        ```` ```bash ```` block, as a replayed history holds it) is that block's command."""
        if not is_model_output(action) and (shown := _RENDERED.fullmatch(action.text.strip())):
            action = Action(text=shown[1])
        return super().parse(action)

    def _parse_reply(self, action: Action) -> Parsed:
        raw = action.text.replace("\r\n", "\n")
        text, error = _answer(raw)
        if error is not None:
            return Parsed(error=error)
        if not text.strip():
            reasoned = raw.strip() or (action.completion and action.completion.reasoning)
            return Parsed(error=_NO_ANSWER if reasoned else "the reply is empty")
        blocks, unclosed = _blocks(text)
        if unclosed:
            return Parsed(error="the reply has a ``` code block that is never closed")
        if len(blocks) > 1:
            return Parsed(error=f"the reply has {len(blocks)} code blocks; only one runs per reply")
        if not blocks:
            if text.strip() == self.submit_word:
                return Parsed(calls=(Call("submit"),))
            return Parsed(error="the reply has no fenced code block, and prose is never run")
        if not blocks[0]:
            return Parsed(error="the reply's code block is empty")
        if blocks[0] == self.submit_word:
            return Parsed(calls=(Call("submit"),))
        return Parsed(calls=(Call("bash", command=blocks[0]),))

    def _shown(self, call: Call, step: int) -> Action:
        if call.kind == "submit":
            return Action(text=self.submit_word)
        return Action(text=f"```bash\n{call.command}\n```")

    def observe(self, parsed: Parsed, results: Sequence[CallResult]) -> Observation:
        """A format error and the expected format, else the call's reply (empty without
        results: the environment supplies a submit's text)."""
        if parsed.error is not None:
            return Observation(
                text=f"Format error: {parsed.error}.\n{self._expected()}",
                data={"parse_error": parsed.error},
            )
        return Observation(text="\n".join(result.text for result in results))
