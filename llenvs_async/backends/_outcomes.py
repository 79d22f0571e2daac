"""Per-request failures: which engine messages mean "this prompt does not fit the context"."""

from __future__ import annotations

import re

from ..errors import BackendError, ContextLengthError

__all__ = ["request_error"]

# vLLM (in-process and HTTP), OpenAI and SGLang phrasings of a prompt over the context window.
_CONTEXT_LENGTH = re.compile(
    r"maximum context length|longer than the maximum model length|context_length_exceeded"
    r"|exceeds? the (model's )?(maximum )?context",
    re.IGNORECASE,
)


def request_error(
    message: str, *, status_code: int | None = None, url: str | None = None, body: str | None = None
) -> BackendError:
    """The error for one failed request: a ``ContextLengthError`` when the engine's own
    message (in ``message`` or ``body``) says the prompt is over the context window."""
    text = f"{message}\n{body or ''}"
    cls = ContextLengthError if _CONTEXT_LENGTH.search(text) else BackendError
    return cls(message, status_code=status_code, url=url, body=body)
