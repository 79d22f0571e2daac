"""A request as the engine takes it: its chat templated to token ids, ``max_tokens`` kept
inside the context window, and its place in the round named for error messages."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from .._chat import message_dict
from ..errors import BackendError, ContextLengthError
from ..types import GenerationRequest

__all__ = ["describe", "room", "templated_ids"]


def templated_ids(
    tokenizer: Any, index: int, request: GenerationRequest, template_kwargs: Mapping[str, Any]
) -> list[int]:
    """The request's chat templated with ``tokenizer`` (plus its tools), as token ids."""
    conversation = [message_dict(m) for m in request.messages]
    kwargs = dict(template_kwargs)
    if request.tools:
        kwargs["tools"] = [dict(t) for t in request.tools]
    try:
        text = tokenizer.apply_chat_template(
            conversation, tokenize=False, add_generation_prompt=True, **kwargs
        )
        # The template already holds the special tokens (BOS...): do not add them twice.
        return [int(t) for t in tokenizer.encode(text, add_special_tokens=False)]
    except Exception as exc:
        raise BackendError(
            f"chat templating failed for {describe(index, request)}: {type(exc).__name__}: {exc}"
        ) from exc


def room(
    window: int | None,
    index: int,
    request: GenerationRequest,
    prompt_ids: Sequence[int],
    max_tokens: int,
) -> int | None:
    """``max_tokens`` clamped to what the prompt leaves of the window (None: unchanged);
    a ``ContextLengthError`` when the prompt leaves no room."""
    if window is None:
        return None
    if len(prompt_ids) >= window:
        raise ContextLengthError(
            f"{describe(index, request)}: the prompt ({len(prompt_ids)} tokens) leaves no "
            f"room for a completion in the maximum model length of {window} tokens "
            "(not sent to the engine)"
        )
    room = window - len(prompt_ids)
    return room if room < max_tokens else None


def describe(index: int, request: GenerationRequest) -> str:
    return f"request {index} of the round, rollout {request.rollout_index}, step {request.step}"
