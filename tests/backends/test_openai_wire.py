"""The OpenAI wire mapping (pure functions): reasoning both ways, tool_choice, and what a
server's context-length rejection says."""

from __future__ import annotations

from typing import Any

import pytest

from llenvs_async._chat import message_dict
from llenvs_async.backends._openai_wire import MalformedResponse, chat_payload, parse_chat_response
from llenvs_async.backends._outcomes import ContextOverflow, context_overflow, request_error
from llenvs_async.errors import BackendError, ContextLengthError
from llenvs_async.types import ChatMessage, GenerationRequest, SamplingParams

CALL = {"id": "c1", "type": "function", "function": {"name": "bash", "arguments": "{}"}}
BASH = {"type": "function", "function": {"name": "bash", "parameters": {"type": "object"}}}
NAMED = {"type": "function", "function": {"name": "bash"}}


def response(message: dict[str, Any]) -> dict[str, Any]:
    return {"choices": [{"index": 0, "message": message, "finish_reason": "stop"}]}


def test_an_assistant_reasoning_is_sent_as_reasoning_content_only_when_set() -> None:
    with_reasoning = ChatMessage(
        role="assistant", content="done", tool_calls=(CALL,), reasoning="think first"
    )
    assert message_dict(with_reasoning) == {
        "role": "assistant",
        "content": "done",
        "tool_calls": [CALL],
        "reasoning_content": "think first",
    }
    # "set" is "not None": an empty reasoning is still the turn's reasoning.
    assert (
        message_dict(ChatMessage(role="assistant", content="x", reasoning=""))["reasoning_content"]
        == ""
    )
    for plain in (
        ChatMessage(role="assistant", content="x"),
        ChatMessage(role="user", content="x"),
        ChatMessage(role="tool", content="5", tool_call_id="c1"),
    ):
        assert "reasoning_content" not in message_dict(plain)
        assert "reasoning" not in message_dict(plain)


@pytest.mark.parametrize(
    ("choice", "sent"),
    [
        ("required", "required"),
        ("none", "none"),
        (NAMED, NAMED),
    ],
)
def test_tool_choice_is_sent_when_set(choice: Any, sent: Any) -> None:
    request = GenerationRequest(
        messages=(ChatMessage(role="user", content="go"),), tools=(BASH,), tool_choice=choice
    )
    payload = chat_payload("m", request, SamplingParams(), vllm_extras=True, extra_body={})
    assert payload["tool_choice"] == sent
    assert payload["tools"] == [BASH]


def test_tool_choice_is_absent_when_none_and_extra_body_wins() -> None:
    request = GenerationRequest(messages=(ChatMessage(role="user", content="go"),), tools=(BASH,))
    payload = chat_payload("m", request, SamplingParams(), vllm_extras=True, extra_body={})
    assert "tool_choice" not in payload
    forced = GenerationRequest(messages=request.messages, tools=(BASH,), tool_choice="auto")
    override = chat_payload(
        "m", forced, SamplingParams(), vllm_extras=True, extra_body={"tool_choice": "none"}
    )
    assert override["tool_choice"] == "none"


@pytest.mark.parametrize(
    ("message", "reasoning"),
    [
        ({"content": "a", "reasoning": "r1"}, "r1"),  # vLLM >= 0.10
        ({"content": "a", "reasoning_content": "r2"}, "r2"),  # older vLLM, DeepSeek
        ({"content": "a", "reasoning": "r1", "reasoning_content": "r2"}, "r1"),
        ({"content": "a", "reasoning": None, "reasoning_content": "r2"}, "r2"),
        ({"content": "a", "reasoning": "", "reasoning_content": None}, None),
        ({"content": "a"}, None),
    ],
)
def test_reasoning_is_read_from_either_field(message: dict[str, Any], reasoning: Any) -> None:
    completion = parse_chat_response(response({"role": "assistant", **message}))
    assert completion.reasoning == reasoning
    assert completion.text == "a"


def test_a_reasoning_that_is_not_a_string_is_malformed() -> None:
    with pytest.raises(MalformedResponse, match="reasoning is not a string"):
        parse_chat_response(response({"content": "a", "reasoning": 3}))


@pytest.mark.parametrize(
    ("message", "window", "prompt"),
    [
        (
            "This model's maximum context length is 1024 tokens. However, you requested "
            "1100 tokens (1000 in the messages, 100 in the completion). Please reduce the "
            "length of the messages or completion.",
            1024,
            1000,
        ),
        (
            "This model's maximum context length is 60 tokens. However, your prompt contains "
            "80 input tokens, which exceeds this limit even without any output tokens.",
            60,
            80,
        ),
        (
            "This model's maximum context length is 60 tokens. However, your prompt contains "
            "at least 61 input tokens, which exceeds this limit",
            60,
            61,
        ),
        (
            "Requested token count exceeds the model's maximum context length of 4096 tokens. "
            "You requested a total of 5000 tokens: 4000 tokens from the input messages and "
            "1000 tokens for the completion.",
            4096,
            4000,
        ),
        ("Input length (1100) exceeds model's maximum context length (1024).", 1024, 1100),
        (
            "The decoder prompt (length 1100) is longer than the maximum model length of 1024.",
            1024,
            1100,
        ),
        ("max_tokens must be at least 1, got 0.", None, None),
    ],
)
def test_context_overflow_reads_the_window_and_the_prompt_length(
    message: str, window: int | None, prompt: int | None
) -> None:
    overflow = context_overflow(message)
    assert overflow == ContextOverflow(window=window, prompt=prompt)
    assert isinstance(request_error(message, status_code=400), ContextLengthError)


def test_other_messages_are_no_context_overflow() -> None:
    for message in ("temperature must be >= 0", "max_tokens must be at least 1, got -3."):
        assert context_overflow(message) is None
        assert type(request_error(message, status_code=400)) is BackendError
    assert ContextOverflow(window=100, prompt=60).room() == 40
    assert ContextOverflow(window=None, prompt=60).room() is None
