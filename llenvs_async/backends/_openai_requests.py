"""Completions mode's requests planned before sending, and one request's failure as its own
outcome: pure functions, so ``OpenAIBackend`` keeps to sending and receiving."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ..errors import BackendError, ContextLengthError
from ..types import Completion, GenerationError, GenerationRequest, SamplingParams
from ._openai_http import is_rejection
from ._openai_wire import Prompt
from ._parsing import OutputParsers, ParsePlan, forces_tool_call

__all__ = ["group_prompts", "parsed", "rejected"]

GroupKey = tuple[bool, int | None, int, tuple[tuple[str, Any], ...]]
"""Token ids or text, the seed, ``max_tokens`` and the extra sampling fields of one POST."""
Planned = tuple[
    dict[int, Completion | GenerationError], dict[int, ParsePlan], dict[GroupKey, list[int]]
]


def group_prompts(
    prompts: Sequence[Prompt],
    requests: Sequence[GenerationRequest],
    params: SamplingParams,
    window: int | None,
    parsers: OutputParsers | None,
    *,
    vllm_extras: bool,
) -> Planned:
    """The prompts grouped by what one POST shares (``GroupKey``), each request's parse plan,
    and the outcomes of the requests that fail before sending (never grouped)."""
    results: dict[int, Completion | GenerationError] = {}
    plans: dict[int, ParsePlan] = {}
    groups: dict[GroupKey, list[int]] = {}
    for i, (prompt, request) in enumerate(zip(prompts, requests, strict=True)):
        try:
            max_tokens = params.max_tokens
            if isinstance(prompt, list) and window is not None:
                max_tokens = _room(len(prompt), window, max_tokens)
            extra: tuple[tuple[str, Any], ...] = ()
            if forces_tool_call(request.tool_choice):
                raise BackendError(
                    f"tool_choice={request.tool_choice!r}: the completions route takes no "
                    "tool_choice (use mode='chat', or VLLMBackend)"
                )
            if parsers is not None:
                ids = prompt if isinstance(prompt, list) else []
                plan = parsers.plan(request, ids)
                plans[i] = plan
                if vllm_extras and "skip_special_tokens" in plan.sampling:
                    extra = (("skip_special_tokens", plan.sampling["skip_special_tokens"]),)
        except BackendError as exc:
            results[i] = _own_error(exc, i, request)
            continue
        key = (isinstance(prompt, list), request.seed, max_tokens, extra)
        groups.setdefault(key, []).append(i)
    return results, plans, groups


def _room(prompt_length: int, window: int, max_tokens: int) -> int:
    """``max_tokens`` clamped to what a prompt of ``prompt_length`` tokens leaves of the
    window; a ``ContextLengthError`` when it leaves nothing."""
    if prompt_length >= window:
        raise ContextLengthError(
            f"the prompt is {prompt_length} tokens and the model's maximum context length is "
            f"{window} tokens: no room for a completion (not sent)"
        )
    return min(max_tokens, window - prompt_length)


def _own_error(exc: BackendError, index: int, request: GenerationRequest) -> GenerationError:
    """A failure of one request (found before sending, or a rejection), as the request's
    own outcome naming it."""
    error = type(exc)(
        f"request {index} of the round (rollout {request.rollout_index}, step {request.step}): "
        f"{exc.message}",
        status_code=exc.status_code,
        url=exc.url,
        body=exc.body,
    )
    error.__cause__ = exc.__cause__ or exc
    return GenerationError(error=error, request_index=index)


def rejected(exc: BackendError, index: int, request: GenerationRequest) -> GenerationError:
    """A rejection as the request's own outcome (naming it); anything else fails the round."""
    if not is_rejection(exc):
        raise exc
    return _own_error(exc, index, request)


def parsed(
    index: int,
    outcome: Completion | GenerationError,
    plan: ParsePlan | None,
    request: GenerationRequest,
) -> Completion | GenerationError:
    """``outcome`` split by the local parsers (completions mode)."""
    if plan is None or not isinstance(outcome, Completion):
        return outcome
    try:
        return plan.apply(outcome)
    except Exception as exc:
        error = BackendError(f"vLLM's parsers failed on the output: {type(exc).__name__}: {exc}")
        error.__cause__ = exc
        return _own_error(error, index, request)
