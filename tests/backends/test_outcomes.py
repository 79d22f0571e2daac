"""Which engine messages make a per-request failure a ContextLengthError."""

from __future__ import annotations

import pytest

from llenvs_async.backends._outcomes import request_error
from llenvs_async.errors import BackendError, ContextLengthError


@pytest.mark.parametrize(
    ("message", "body"),
    [
        # vLLM's HTTP server (renderers/params.py) and its in-process validation
        (
            "HTTP 400",
            '{"error": {"message": "This model\'s maximum context length is 1024 tokens."}}',
        ),
        ("The decoder prompt (length 1100) is longer than the maximum model length of 1024.", None),
        # OpenAI's error code
        ("HTTP 400", '{"error": {"code": "context_length_exceeded"}}'),
    ],
)
def test_context_window_messages_are_context_length_errors(message: str, body: str | None) -> None:
    error = request_error(message, status_code=400, url="http://x/v1", body=body)
    assert isinstance(error, ContextLengthError)
    assert (error.status_code, error.url, error.body) == (400, "http://x/v1", body)


@pytest.mark.parametrize(
    "message", ["Token id 999999 is out of vocabulary", "temperature must be >= 0", "HTTP 422"]
)
def test_other_rejections_are_plain_backend_errors(message: str) -> None:
    error = request_error(message, status_code=400)
    assert type(error) is BackendError
    assert str(error) == message
