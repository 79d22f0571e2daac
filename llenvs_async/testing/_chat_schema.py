"""What OpenAI's (and vLLM's) chat schema rejects, so the test server answers a bad
request with the 400 a real server gives."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

__all__ = ["chat_schema_error"]

_ROLES = frozenset({"system", "user", "assistant", "tool", "developer"})


def chat_schema_error(messages: list[Any], tools: Any, tool_choice: Any = None) -> str | None:
    """What OpenAI's (and vLLM's) chat schema rejects in messages, tool definitions and
    ``tool_choice``."""
    if tool_choice is not None and tool_choice != "none":
        if not tools:
            return "When using `tool_choice`, `tools` must be set."
        if isinstance(tool_choice, Mapping):
            name = (tool_choice.get("function") or {}).get("name")
            names = [(t.get("function") or {}).get("name") for t in tools if isinstance(t, Mapping)]
            if name not in names:
                return f"Tool {name!r} has not been passed in `tools`."
        elif tool_choice not in ("auto", "required"):
            return f"Invalid value for `tool_choice`: {tool_choice!r}"
    if tools is not None:
        if not isinstance(tools, list):
            return "'tools' must be a list"
        for i, tool in enumerate(tools):
            function = tool.get("function") if isinstance(tool, Mapping) else None
            if tool.get("type") != "function" or not isinstance(function, Mapping):
                return f"tools[{i}] must be {{'type': 'function', 'function': {{...}}}}"
            if not isinstance(function.get("name"), str):
                return f"tools[{i}].function.name is required"
    for i, message in enumerate(messages):
        if not isinstance(message, Mapping) or message.get("role") not in _ROLES:
            return f"messages[{i}] needs a role among {sorted(_ROLES)}"
        if message["role"] == "tool" and not isinstance(message.get("tool_call_id"), str):
            return f"messages[{i}]: a tool message needs a tool_call_id"
        calls = message.get("tool_calls")
        if calls is not None:
            if message["role"] != "assistant" or not isinstance(calls, list):
                return f"messages[{i}].tool_calls: only an assistant has a list of tool calls"
            for j, call in enumerate(calls):
                function = call.get("function") if isinstance(call, Mapping) else None
                if (
                    not isinstance(call.get("id"), str)
                    or call.get("type") != "function"
                    or not isinstance(function, Mapping)
                    or not isinstance(function.get("name"), str)
                    or not isinstance(function.get("arguments"), str)
                ):
                    return (
                        f"messages[{i}].tool_calls[{j}] needs id, type 'function' and "
                        "function.name / function.arguments (a JSON string)"
                    )
    return None
