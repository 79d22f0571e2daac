"""``VerlServerBackend``: a token-in/token-out llenvs-async backend over verl's
``server_manager.generate``, so our runner drives the environment while verl's servers generate."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Mapping, Sequence
from typing import Any

from llenvs_async import (
    BackendError,
    Completion,
    ContextLengthError,
    GenerationError,
    GenerationRequest,
    SamplingParams,
)

from ..errors import MissingExtraError

__all__ = ["VerlServerBackend", "VerlUnavailableError"]

_PROGRAMMING_ERRORS = (TypeError, AttributeError, NameError)  # bugs: never mapped to ours


# The name this module's error had before every extra shared one (kept for ``except`` clauses).
VerlUnavailableError = MissingExtraError


class VerlServerBackend:
    """A token-mode ``Backend`` whose every request is one ``server_manager.generate`` call.

    ``server_manager`` is verl's ``LLMServerClient`` (what an agent loop is given);
    ``tokenizer`` is the agent loop's. ``response_length`` caps the ids a rollout adds after
    its first prompt (``max_tokens`` clamped; nothing left: a ``ContextLengthError`` for that
    rollout alone). ``extra_sampling_params`` (verl's dict) are sent with every request under
    the ones derived from our ``SamplingParams``. Requests of a round run concurrently; the
    server batches them. Closing does not close the server (it is verl's).
    """

    def __init__(
        self,
        server_manager: Any,
        tokenizer: Any,
        *,
        response_length: int | None = None,
        extra_sampling_params: Mapping[str, Any] | None = None,
        request_id: str | None = None,
    ) -> None:
        if not callable(getattr(server_manager, "generate", None)):
            raise TypeError(
                "server_manager must have verl's async generate(request_id, *, prompt_ids, "
                f"sampling_params), got {type(server_manager).__name__}"
            )
        if response_length is not None and (
            isinstance(response_length, bool) or response_length < 1
        ):
            raise ValueError(f"response_length must be a positive integer, got {response_length!r}")
        self.server_manager = server_manager
        self.tokenizer = tokenizer
        self.response_length = response_length
        self.extra_sampling_params = dict(extra_sampling_params or {})
        self.request_id = request_id or uuid.uuid4().hex
        self._starts: dict[int, int] = {}  # rollout index -> length of its first prompt

    def token_mode_error(self) -> str | None:
        return None if self.tokenizer is not None else "VerlServerBackend has no tokenizer"

    async def get_tokenizer(self) -> Any:
        return self.tokenizer

    async def aclose(self) -> None:
        """Nothing to release: the server belongs to verl."""

    async def generate(
        self, requests: Sequence[GenerationRequest], params: SamplingParams
    ) -> list[Completion | GenerationError]:
        return list(
            await asyncio.gather(*(self._one(i, r, params) for i, r in enumerate(requests)))
        )

    async def _one(
        self, index: int, request: GenerationRequest, params: SamplingParams
    ) -> Completion | GenerationError:
        if request.prompt_token_ids is None:
            raise BackendError(
                "VerlServerBackend sends token ids: use TrajectoryRunner(..., token_mode=True)"
            )
        prompt = request.prompt_token_ids
        max_tokens = params.max_tokens
        if self.response_length is not None:
            start = self._starts.setdefault(request.rollout_index, len(prompt))
            room = self.response_length - (len(prompt) - start)
            if room <= 0:
                return GenerationError(
                    error=ContextLengthError(
                        f"rollout {request.rollout_index}: its response already holds "
                        f"{len(prompt) - start} ids of rollout.response_length="
                        f"{self.response_length}; no room for another turn"
                    ),
                    request_index=index,
                )
            max_tokens = min(max_tokens, room)
        sampling = {**self.extra_sampling_params, **_verl_params(params, max_tokens, request)}
        try:
            out = await self.server_manager.generate(
                request_id=f"{self.request_id}-{request.rollout_index}",
                prompt_ids=list(prompt),
                sampling_params=sampling,
            )
        except _PROGRAMMING_ERRORS:
            raise
        except Exception as exc:
            error = BackendError(
                f"rollout {request.rollout_index}: verl's server_manager.generate failed: "
                f"{type(exc).__name__}: {exc}"
            )
            error.__cause__ = exc
            return GenerationError(error=error, request_index=index)
        ids = tuple(int(t) for t in out.token_ids)
        if out.stop_reason == "aborted" or not ids:
            return GenerationError(
                error=BackendError(
                    f"rollout {request.rollout_index}: verl's server returned no tokens "
                    f"(stop_reason={out.stop_reason!r})"
                ),
                request_index=index,
            )
        logprobs = out.log_probs
        version = out.extra_fields.get("global_steps") if out.extra_fields else None
        return Completion(
            text=self.tokenizer.decode(list(ids), skip_special_tokens=True),
            token_ids=ids,
            logprobs=tuple(logprobs) if logprobs and len(logprobs) == len(ids) else None,
            finish_reason="length" if len(ids) >= max_tokens else "stop",
            prompt_token_ids=prompt,
            policy_version=version if isinstance(version, int) else None,
        )


def _verl_params(
    params: SamplingParams, max_tokens: int, request: GenerationRequest
) -> dict[str, Any]:
    """Our sampling settings in the keys verl's servers read (vLLM's names)."""
    out: dict[str, Any] = {
        "temperature": params.temperature,
        "top_p": params.top_p,
        "top_k": params.top_k,
        "max_tokens": max_tokens,
        "logprobs": params.logprobs is not None,
    }
    if params.stop:
        out["stop"] = list(params.stop)
    if request.seed is not None:
        out["seed"] = request.seed
    return out
