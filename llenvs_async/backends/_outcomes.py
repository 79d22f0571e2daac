"""Per-request failures: which engine messages mean "this prompt does not fit the context",
and what such a message says about the prompt's length and the window."""

from __future__ import annotations

import re
from dataclasses import dataclass

import httpx

from ..errors import BackendError, BackendTimeoutError, ContextLengthError

__all__ = [
    "ContextOverflow",
    "check_context_length",
    "context_overflow",
    "http_failure",
    "request_error",
]

# vLLM (in-process and HTTP), OpenAI and SGLang phrasings of a prompt over the context window.
_CONTEXT_LENGTH = re.compile(
    r"maximum context length|longer than the maximum model length|context_length_exceeded"
    r"|exceeds? the (model's )?(maximum )?context",
    re.IGNORECASE,
)


def http_failure(method: str, url: str, exc: Exception, *, attempts: int = 1) -> BackendError:
    """An HTTP client's failure to get any reply (httpx's errors, mapped at this one edge):
    a timeout is ``BackendTimeoutError``; ``attempts`` > 1 says it was retried."""
    tries = f" after {attempts} attempt(s)" if attempts > 1 else ""
    kind = type(exc).__name__
    if isinstance(exc, TimeoutError | httpx.TimeoutException):
        return BackendTimeoutError(f"{method} {url} timed out{tries} ({kind}: {exc})", url=url)
    return BackendError(f"{method} {url} failed{tries}: {kind}: {exc}", url=url)


def request_error(
    message: str, *, status_code: int | None = None, url: str | None = None, body: str | None = None
) -> BackendError:
    """The error for one failed request: a ``ContextLengthError`` when the engine's own
    message (in ``message`` or ``body``) says the prompt is over the context window
    (see ``context_overflow``)."""
    text = f"{message}\n{body or ''}"
    cls = ContextLengthError if context_overflow(text) is not None else BackendError
    return cls(message, status_code=status_code, url=url, body=body)


# The window, and the prompt's token count, as servers state them on a 400:
# OpenAI and vLLM < 0.10 ("... is 1024 tokens. However, you requested 1100 tokens (1000 in
# the messages, 100 in the completion)"), vLLM >= 0.10 ("... your prompt contains [at least]
# 1100 input tokens"), SGLang ("... of 1024 tokens. You requested a total of 1100 tokens:
# 1000 tokens from the input messages and 100 tokens for the completion"), vLLM's engine
# ("Input length (1100) exceeds model's maximum context length (1024)", "The decoder prompt
# (length 1100) is longer than the maximum model length of 1024").
_WINDOW = re.compile(r"maximum (?:context|model) length (?:is |of )?\(?(\d+)", re.IGNORECASE)
_PROMPT = re.compile(
    r"\((\d+) in the messages|prompt contains (?:at least )?(\d+) input tokens"
    r"|(\d+) tokens from the input|input length \((\d+)\)|prompt \(length (\d+)\)",
    re.IGNORECASE,
)
# vLLM >= 0.10 clamps max_tokens to the window itself: a prompt exactly filling it leaves 0.
_NO_ROOM = re.compile(r"max_tokens must be at least 1, got 0", re.IGNORECASE)


@dataclass(frozen=True, slots=True)
class ContextOverflow:
    """What a server's context-length rejection says: the window and the prompt's length
    (either None when the message does not say)."""

    window: int | None
    prompt: int | None

    def room(self) -> int | None:
        """Tokens the prompt leaves for a completion (None: unknown; <= 0: none)."""
        if self.window is None or self.prompt is None:
            return None
        return self.window - self.prompt


def context_overflow(text: str) -> ContextOverflow | None:
    """The window and prompt length a context-length message states; None when ``text``
    is not one. vLLM's "max_tokens must be at least 1, got 0" (we never send 0) is its
    clamp leaving no room: a prompt filling the window."""
    if _NO_ROOM.search(text):
        return ContextOverflow(window=None, prompt=None)
    if not _CONTEXT_LENGTH.search(text):
        return None
    window = _WINDOW.search(text)
    prompt = _PROMPT.search(text)
    return ContextOverflow(
        window=int(window.group(1)) if window else None,
        prompt=int(next(g for g in prompt.groups() if g)) if prompt else None,
    )


def check_context_length(value: int | None, *, owner: str) -> None:
    """A ``ValueError`` unless ``value`` is None or a positive int."""
    if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
        raise ValueError(f"{owner} context_length must be an int >= 1, got {value!r}")
