"""A deterministic backend driven by a policy function (tests, demos, benchmarks)."""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from .._resource import AsyncResource
from ..errors import BackendError, ClosedError
from ..types import Completion, GenerationRequest, SamplingParams

__all__ = ["Policy", "ScriptedBackend"]

Policy = Callable[[GenerationRequest], "str | Completion | Awaitable[str | Completion]"]


class ScriptedBackend(AsyncResource):
    """Answers each request with ``policy(request)``; the policy may be sync or async
    and may return a string or a full ``Completion``.

    Async policies for one batch run concurrently, as a real engine would batch them.
    With a ``tokenizer`` it serves token mode (the policy then reads
    ``request.prompt_token_ids`` and returns a ``Completion`` with ``token_ids``).
    """

    def __init__(self, policy: Policy, *, tokenizer: Any = None) -> None:
        if not callable(policy):
            raise TypeError(
                f"ScriptedBackend(policy) needs a callable, got {type(policy).__name__}"
            )
        self._policy = policy
        self._tokenizer = tokenizer
        self._closed = False
        self.calls = 0

    async def generate(
        self, requests: Sequence[GenerationRequest], params: SamplingParams
    ) -> list[Completion]:
        if self._closed:
            raise ClosedError("ScriptedBackend")
        self.calls += 1
        results: list[object] = [self._policy(r) for r in requests]
        if any(inspect.isawaitable(r) for r in results):
            try:
                async with asyncio.TaskGroup() as tg:
                    tasks = [tg.create_task(_resolve(r)) for r in results]
            except BaseExceptionGroup as group:
                # An async policy's error surfaces as itself, exactly like a sync policy's:
                # the runner records its type (or propagates a TypeError), not a group.
                raise group.exceptions[0] from None
            results = [t.result() for t in tasks]
        return [_to_completion(r) for r in results]

    def token_mode_error(self) -> str | None:
        if self._tokenizer is None:
            return "ScriptedBackend has no tokenizer: pass ScriptedBackend(policy, tokenizer=...)"
        return None

    async def get_tokenizer(self) -> Any:
        problem = self.token_mode_error()
        if problem is not None:
            raise BackendError(problem)
        return self._tokenizer

    @property
    def closed(self) -> bool:
        return self._closed

    async def aclose(self) -> None:
        self._closed = True


async def _resolve(result: object) -> object:
    return await result if inspect.isawaitable(result) else result


def _to_completion(result: object) -> Completion:
    if isinstance(result, Completion):
        return result
    if isinstance(result, str):
        return Completion(text=result, finish_reason="stop")
    raise BackendError(
        f"ScriptedBackend policy must return str or Completion, got {type(result).__name__}"
    )
