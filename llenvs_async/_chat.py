"""Messages in the chat format that OpenAI-compatible servers and chat templates read."""

from __future__ import annotations

from typing import Any

from .types import ChatMessage

__all__ = ["message_dict"]


def message_dict(message: ChatMessage) -> dict[str, Any]:
    """A message in OpenAI's chat format (an assistant's ``tool_calls``, a tool reply's
    ``tool_call_id``); also what a chat template receives (in-process and token mode).

    An assistant's ``reasoning``, when set, goes as ``reasoning_content``: the field
    Qwen3-style chat templates render (``<think>...</think>``) and that vLLM accepts in
    requests (>= 0.10 reads it as ``reasoning``, and hands both names to the template).
    """
    out: dict[str, Any] = {"role": message.role, "content": message.content}
    if message.tool_calls:
        out["tool_calls"] = [dict(call) for call in message.tool_calls]
    if message.tool_call_id is not None:
        out["tool_call_id"] = message.tool_call_id
    if message.reasoning is not None:
        out["reasoning_content"] = message.reasoning
    return out
