"""OpenAI-compatible wire format: request payloads and response parsing (pure functions).

Kept apart from the HTTP client so the mapping can be read and tested on its own.
Parsers raise ``MalformedResponse``; the backend wraps it into a ``BackendError``
that names the URL and shows the body.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from .._chat import message_dict
from ..types import ChatMessage, Completion, GenerationRequest, SamplingParams

__all__ = [
    "MalformedResponse",
    "chat_payload",
    "completions_payload",
    "parse_chat_response",
    "parse_completions_response",
    "render_plain_prompt",
]

Prompt = str | list[int]


class MalformedResponse(ValueError):
    """A 2xx reply whose JSON does not have the shape of an OpenAI completion response."""


def render_plain_prompt(messages: Sequence[ChatMessage]) -> str:
    """Completions-mode rendering of a chat: ``role: content`` blocks, then ``assistant:``.

    Used only when a request has no ``prompt_token_ids``; pass ``prompt_renderer`` to
    ``OpenAIBackend`` to use the model's own format instead.
    """
    return "".join(f"{m.role}: {m.content}\n\n" for m in messages) + "assistant:"


# vLLM's extra fields: token ids, and a stop string kept in the text as it is in the ids.
_VLLM_IDS = {"return_token_ids": True}
_VLLM_EXTRAS = {**_VLLM_IDS, "include_stop_str_in_output": True}


def _sampling_fields(params: SamplingParams, seed: int | None) -> dict[str, Any]:
    """Sampling fields of a request; ``seed`` is the request's own (not ``params.seed``)."""
    fields: dict[str, Any] = {
        "max_tokens": params.max_tokens,
        "temperature": params.temperature,
        "top_p": params.top_p,
        "n": params.n,
    }
    if params.top_k > 0:  # vLLM / SGLang extra; <= 0 means "disabled"
        fields["top_k"] = params.top_k
    if params.stop:
        fields["stop"] = list(params.stop)
    if seed is not None:
        fields["seed"] = seed
    return fields


def chat_payload(
    model: str,
    request: GenerationRequest,
    params: SamplingParams,
    *,
    vllm_extras: bool,
    extra_body: Mapping[str, Any],
) -> dict[str, Any]:
    """Body of one ``POST /chat/completions`` (one conversation); ``extra_body`` wins.
    ``tool_choice`` is sent when the request sets it (None: the server's default)."""
    payload: dict[str, Any] = {
        "model": model,
        "messages": [message_dict(m) for m in request.messages],
        **_sampling_fields(params, request.seed),
    }
    if request.tools:
        payload["tools"] = [dict(tool) for tool in request.tools]
    if request.tool_choice is not None:
        choice = request.tool_choice
        payload["tool_choice"] = choice if isinstance(choice, str) else dict(choice)
    if params.logprobs is not None:
        payload["logprobs"] = True
        if params.logprobs > 0:
            payload["top_logprobs"] = params.logprobs
    if vllm_extras:
        payload.update(_VLLM_EXTRAS if params.stop else _VLLM_IDS)
    payload.update(extra_body)
    return payload


def completions_payload(
    model: str,
    prompts: Sequence[Prompt],
    params: SamplingParams,
    *,
    seed: int | None = None,
    vllm_extras: bool,
    extra_body: Mapping[str, Any],
) -> dict[str, Any]:
    """Body of one ``POST /completions`` carrying a list of prompts that share ``seed``."""
    payload: dict[str, Any] = {
        "model": model,
        "prompt": list(prompts),
        **_sampling_fields(params, seed),
    }
    if params.logprobs is not None:
        payload["logprobs"] = params.logprobs
    if vllm_extras:
        payload.update(_VLLM_EXTRAS if params.stop else _VLLM_IDS)
    payload.update(extra_body)
    return payload


def parse_chat_response(data: Any) -> Completion:
    """One chat response (n=1) -> ``Completion``; vLLM's token ids are read when present.

    ``Completion.reasoning`` is the message's ``reasoning`` (vLLM >= 0.10) or else its
    ``reasoning_content`` (older vLLM, DeepSeek-style servers); None when both are absent
    or empty.
    """
    choice = _choices(data, expected=1)[0]
    message = choice.get("message")
    if not isinstance(message, Mapping):
        raise MalformedResponse("choices[0].message is missing or not an object")
    content = message.get("content")
    if content is not None and not isinstance(content, str):
        raise MalformedResponse("choices[0].message.content is not a string")
    logprobs: tuple[float, ...] | None = None
    raw_lp = choice.get("logprobs")
    if isinstance(raw_lp, Mapping) and raw_lp.get("content") is not None:
        entries = raw_lp["content"]
        if not isinstance(entries, list) or not all(isinstance(e, Mapping) for e in entries):
            raise MalformedResponse("choices[0].logprobs.content is not a list of objects")
        logprobs = tuple(_float(e.get("logprob"), "logprobs.content[].logprob") for e in entries)
    return Completion(
        text=content or "",
        token_ids=_int_tuple(choice.get("token_ids"), "choices[0].token_ids"),
        logprobs=logprobs,
        finish_reason=_finish_reason(choice),
        prompt_token_ids=_int_tuple(data.get("prompt_token_ids"), "prompt_token_ids"),
        tool_calls=_tool_calls(message.get("tool_calls")),
        reasoning=_reasoning(message),
    )


def _reasoning(message: Mapping[str, Any]) -> str | None:
    for key in ("reasoning", "reasoning_content"):
        value = message.get(key)
        if value is not None and not isinstance(value, str):
            raise MalformedResponse(f"choices[0].message.{key} is not a string")
        if value:
            return value
    return None


def _tool_calls(value: Any) -> tuple[dict[str, Any], ...]:
    """``message.tool_calls``: objects with a ``function`` holding a ``name`` (and arguments)."""
    if value is None:
        return ()
    if not isinstance(value, list):
        raise MalformedResponse("choices[0].message.tool_calls is not a list")
    for i, call in enumerate(value):
        function = call.get("function") if isinstance(call, Mapping) else None
        if not isinstance(function, Mapping) or not isinstance(function.get("name"), str):
            raise MalformedResponse(
                f"choices[0].message.tool_calls[{i}] has no function with a name"
            )
    return tuple(dict(call) for call in value)


def parse_completions_response(data: Any, n_prompts: int) -> list[Completion]:
    """A completions response for ``n_prompts`` prompts (n=1), mapped back by choice ``index``."""
    by_index: dict[int, Mapping[str, Any]] = {}
    for choice in _choices(data, expected=n_prompts):
        index = choice.get("index")
        if not isinstance(index, int) or not 0 <= index < n_prompts or index in by_index:
            raise MalformedResponse(
                f"choice index {index!r} is missing, duplicated or out of range"
            )
        by_index[index] = choice
    return [_completion_choice(by_index[i]) for i in range(n_prompts)]


def _completion_choice(choice: Mapping[str, Any]) -> Completion:
    text = choice.get("text")
    if not isinstance(text, str):
        raise MalformedResponse(f"choices[{choice.get('index')}].text is missing or not a string")
    logprobs: tuple[float, ...] | None = None
    raw_lp = choice.get("logprobs")
    if isinstance(raw_lp, Mapping) and raw_lp.get("token_logprobs") is not None:
        values = raw_lp["token_logprobs"]
        if not isinstance(values, list):
            raise MalformedResponse("choices[].logprobs.token_logprobs is not a list")
        logprobs = tuple(_float(v, "token_logprobs[]") for v in values)
    return Completion(
        text=text,
        token_ids=_int_tuple(choice.get("token_ids"), "choices[].token_ids"),
        logprobs=logprobs,
        finish_reason=_finish_reason(choice),
        prompt_token_ids=_int_tuple(choice.get("prompt_token_ids"), "choices[].prompt_token_ids"),
    )


def _choices(data: Any, *, expected: int) -> list[Mapping[str, Any]]:
    if not isinstance(data, Mapping):
        raise MalformedResponse("the body is not a JSON object")
    choices = data.get("choices")
    if not isinstance(choices, list) or not all(isinstance(c, Mapping) for c in choices):
        raise MalformedResponse("'choices' is missing or not a list of objects")
    if len(choices) != expected:
        raise MalformedResponse(f"expected {expected} choice(s), got {len(choices)}")
    return choices


def _finish_reason(choice: Mapping[str, Any]) -> str | None:
    reason = choice.get("finish_reason")
    return reason if isinstance(reason, str) else None


def _int_tuple(value: Any, where: str) -> tuple[int, ...]:
    if value is None:
        return ()
    if not isinstance(value, list) or not all(
        isinstance(v, int) and not isinstance(v, bool) for v in value
    ):
        raise MalformedResponse(f"{where} is not a list of integers")
    return tuple(value)


def _float(value: Any, where: str) -> float:
    """A logprob; JSON ``null`` (no logprob for that position) becomes NaN."""
    if value is None:
        return math.nan
    if not isinstance(value, int | float) or isinstance(value, bool):
        raise MalformedResponse(f"{where} is not a number: {value!r}")
    return float(value)
