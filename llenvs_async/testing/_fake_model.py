"""The test server's fake model: one token per character, deterministic logprobs, an
echoing default policy, and ``stop`` / ``max_tokens`` applied like a real server."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

__all__ = [
    "default_policy",
    "detokenize",
    "fake_logprob",
    "fake_token_ids",
    "is_token_list",
    "render_chat",
    "requested_max_tokens",
    "sample",
]

_TOKEN_BASE = 1000


def fake_token_ids(text: str) -> list[int]:
    """The fake tokenizer: one token per character, ``1000 + ord(c)``."""
    return [_TOKEN_BASE + ord(c) for c in text]


def fake_logprob(token_id: int) -> float:
    """The fake model's logprob for a sampled token (deterministic, always < 0)."""
    return -((token_id % 17) + 1) / 8


def detokenize(token_ids: Iterable[int]) -> str:
    """The fake tokenizer's inverse (``<id>`` for an id below the base)."""
    return "".join(chr(t - _TOKEN_BASE) if t >= _TOKEN_BASE else f"<{t}>" for t in token_ids)


def default_policy(prompt: Any) -> str:
    """``echo: <last message content>`` for chats, ``echo: <prompt>`` for completions."""
    if isinstance(prompt, list) and prompt and isinstance(prompt[-1], Mapping):
        return f"echo: {prompt[-1].get('content', '')}"
    if isinstance(prompt, list):
        return f"echo: {detokenize(prompt)}"
    return f"echo: {prompt}"


def requested_max_tokens(body: Mapping[str, Any]) -> int:
    """The request's ``max_tokens`` (or ``max_completion_tokens``), 16 when unset."""
    return int(body.get("max_tokens") or body.get("max_completion_tokens") or 16)


def sample(text: str, body: Mapping[str, Any], max_tokens: int) -> tuple[str, list[int], str]:
    """Apply ``stop`` then ``max_tokens`` (one token per character) like a real server."""
    finish = "stop"
    stops = body.get("stop") or []
    for stop in [stops] if isinstance(stops, str) else stops:
        if stop and stop in text:
            text = text[: text.index(stop)]
    if len(text) > max_tokens:
        text, finish = text[:max_tokens], "length"
    return text, fake_token_ids(text), finish


def render_chat(messages: list[Any]) -> str:
    """The fake chat template: ``<role>content`` per message."""
    return "".join(f"<{m.get('role')}>{m.get('content')}" for m in messages)


def is_token_list(value: Any) -> bool:
    """Whether a completions ``prompt`` is token ids."""
    return isinstance(value, list) and all(isinstance(v, int) for v in value)
