"""The ``tools`` format: the model calls the ``bash`` and ``submit`` functions (OpenAI tool
calls); each call is answered by a ``tool`` message carrying its id."""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from typing import Any

from ..types import Action, Observation, ToolReply
from ._base import AgentProtocol, Call, CallResult, Parsed

__all__ = ["ToolsProtocol"]

_EXPECTED = "Call the bash tool with a command, or the submit tool when the task is done."
_BASH_ARGS = frozenset({"command", "timeout_sec"})


def _field(obj: Any, name: str) -> Any:
    """``obj[name]`` for a mapping (the norm), else the attribute (SDK objects)."""
    return obj.get(name) if isinstance(obj, Mapping) else getattr(obj, name, None)


def _call_id(raw: Any, index: int) -> str:
    """The call's id, or ``call_{index}`` when the server gave none."""
    call_id = _field(raw, "id")
    return call_id if isinstance(call_id, str) and call_id else f"call_{index}"


def _arguments(raw: Any) -> Mapping[str, Any] | str:
    """A call's arguments as an object (``""`` and null read as ``{}``), or what is wrong."""
    if raw is None or (isinstance(raw, str) and not raw.strip()):
        return {}
    if isinstance(raw, str):
        try:
            raw = json.loads(raw)
        except ValueError as exc:
            return f"the arguments are not valid JSON ({exc})"
    if not isinstance(raw, Mapping):
        return f"the arguments must be a JSON object, got {type(raw).__name__}"
    return raw


def _bash(args: Mapping[str, Any], call_id: str) -> Call:
    unexpected = sorted(set(args) - _BASH_ARGS)
    command, timeout = args.get("command"), args.get("timeout_sec")
    if unexpected:
        error = f"unexpected arguments {unexpected}; it takes command and timeout_sec"
    elif command is None:
        error = "the command argument is missing"
    elif not isinstance(command, str):
        error = f"command must be a string, got {type(command).__name__}"
    elif not command.strip():
        error = "command is empty"
    elif timeout is not None and (
        isinstance(timeout, bool)
        or not isinstance(timeout, int | float)
        or not math.isfinite(timeout)
        or timeout <= 0
    ):
        error = f"timeout_sec must be a positive number of seconds, got {timeout!r}"
    else:
        seconds = None if timeout is None else float(timeout)
        return Call("bash", command.strip(), seconds, call_id)
    return Call("invalid", call_id=call_id, error=f"bash: {error}")


def _call(raw: Any, index: int) -> Call:
    """One tool call of a reply as a ``Call`` (``invalid``, saying why, when malformed)."""
    call_id = _call_id(raw, index)
    function = _field(raw, "function")
    name = None if function is None else _field(function, "name")
    if name not in ("bash", "submit"):
        error = (
            f"unknown tool {name!r}; the tools are bash and submit"
            if isinstance(name, str) and name
            else "the tool call names no function; the tools are bash and submit"
        )
        return Call("invalid", call_id=call_id, error=error)
    args = _arguments(_field(function, "arguments"))
    if isinstance(args, str):
        return Call("invalid", call_id=call_id, error=f"{name}: {args}")
    if name == "bash":
        return _bash(args, call_id)
    if args:
        error = f"submit: takes no arguments, got {sorted(args)}"
        return Call("invalid", call_id=call_id, error=error)
    return Call("submit", call_id=call_id)


def _tool_call(name: str, arguments: dict[str, str], call_id: str) -> dict[str, Any]:
    return {
        "id": call_id,
        "type": "function",
        "function": {"name": name, "arguments": json.dumps(arguments)},
    }


class ToolsProtocol(AgentProtocol):
    """The ``bash`` and ``submit`` tools; several calls in a reply run in order."""

    name = "tools"

    def tools(self) -> tuple[Mapping[str, Any], ...]:
        """Fresh ``bash`` and ``submit`` function schemas (callers may mutate them)."""
        bash = {
            "type": "object",
            "properties": {
                "command": {"type": "string", "description": "The shell command to run."},
                "timeout_sec": {
                    "type": "number",
                    "description": "Seconds before the command is interrupted (optional; "
                    "capped by the task).",
                },
            },
            "required": ["command"],
            "additionalProperties": False,
        }
        submit = {"type": "object", "properties": {}, "additionalProperties": False}
        return (
            _function("bash", "Run one command in the task's persistent bash shell.", bash),
            _function("submit", "Submit the task for verification; ends the episode.", submit),
        )

    def instructions(self) -> str:
        return (
            "You are working in a Linux shell to complete a task, through two tools. "
            "bash runs a command in a persistent shell (the working directory and variables "
            "carry over) and returns its output; timeout_sec can shorten its time limit. "
            "submit has your work verified and ends the episode: call it only when the task "
            "is complete.\n"
            "Every reply must call at least one tool; a reply without a tool call runs "
            "nothing. Several calls in one reply run in order, and calls after submit do "
            "not run."
        )

    def parse(self, action: Action) -> Parsed:
        """As ``AgentProtocol.parse``; a cut-off reply that carries tool calls also lists
        them, invalid, so that each can be answered with the error."""
        parsed = super().parse(action)
        if parsed.error is None or not action.tool_calls:
            return parsed
        calls = tuple(
            Call("invalid", call_id=_call_id(raw, i), error=parsed.error)
            for i, raw in enumerate(action.tool_calls)
        )
        return Parsed(calls=calls, error=parsed.error)

    def _parse_reply(self, action: Action) -> Parsed:
        if not action.tool_calls:
            return Parsed(error="the reply called no tool; call bash or submit")
        return Parsed(calls=tuple(_call(raw, i) for i, raw in enumerate(action.tool_calls)))

    def _shown(self, call: Call, step: int) -> Action:
        call_id = f"call_{step}_0"
        if call.kind == "submit":
            shown = _tool_call("submit", {}, call_id)
        else:
            shown = _tool_call("bash", {"command": call.command}, call_id)
        return Action(text="", tool_calls=(shown,))

    def observe(self, parsed: Parsed, results: Sequence[CallResult]) -> Observation:
        """Each result as a ``tool_replies`` entry (in call order) and, for people, one
        block per call; a format error sets ``parse_error`` (the key is absent otherwise)
        and answers any calls it carries with the error."""
        if parsed.error is not None:
            text = f"Format error: {parsed.error}.\n{_EXPECTED}"
            errors = tuple(_reply(c, text) for c in parsed.calls)
            return Observation(text=text, data={"parse_error": parsed.error}, tool_replies=errors)
        replies = tuple(_reply(r.call, r.text) for r in results)
        blocks = [f"[{_label(r.call)}]\n{r.text}" for r in results]
        return Observation(text="\n\n".join(blocks), tool_replies=replies)


def _reply(call: Call, content: str) -> ToolReply:
    """The reply to ``call`` (every call this format parses has an id)."""
    assert call.call_id is not None, call
    return ToolReply(tool_call_id=call.call_id, content=content)


def _function(name: str, description: str, parameters: Mapping[str, Any]) -> dict[str, Any]:
    return {
        "type": "function",
        "function": {"name": name, "description": description, "parameters": parameters},
    }


def _label(call: Call) -> str:
    """The heading of a call's reply: the tool and what it ran."""
    if call.kind == "bash":
        return f"bash: {call.command.splitlines()[0]}"
    return call.kind
