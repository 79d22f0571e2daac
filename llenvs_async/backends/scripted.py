"""A deterministic backend driven by a policy function (tests, demos, benchmarks)."""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Awaitable, Callable, Iterable, Sequence
from typing import Any

from .._resource import AsyncResource
from ..errors import BackendError, ClosedError
from ..types import Completion, GenerationRequest, SamplingParams
from ._weights import UpdateMode, check_update, check_version, tag

__all__ = ["Policy", "ScriptedBackend"]

Policy = Callable[[GenerationRequest], "str | Completion | Awaitable[str | Completion]"]


class ScriptedBackend(AsyncResource):
    """Answers each request with ``policy(request)``; the policy may be sync or async
    and may return a string or a full ``Completion``.

    Async policies for one batch run concurrently, as a real engine would batch them.
    With a ``tokenizer`` it serves token mode (the policy then reads
    ``request.prompt_token_ids`` and returns a ``Completion`` with ``token_ids``).
    Each completion is tagged with ``policy_version`` as it was when it finished
    (``update_weights`` only records the new version: there are no weights). It starts at
    version 0 like the engine backends (``None``: untagged, no staleness control).
    """

    def __init__(
        self, policy: Policy, *, tokenizer: Any = None, policy_version: int | None = 0
    ) -> None:
        if not callable(policy):
            raise TypeError(
                f"ScriptedBackend(policy) needs a callable, got {type(policy).__name__}"
            )
        check_version(policy_version, owner="ScriptedBackend")
        self._policy = policy
        self._tokenizer = tokenizer
        self._closed = False
        self._version = policy_version
        self._in_flight = 0
        self._idle = asyncio.Event()
        self._idle.set()
        self._open = asyncio.Event()  # cleared while a mode="wait" update drains
        self._open.set()
        self.calls = 0
        self.weight_updates: list[tuple[int, UpdateMode]] = []

    @property
    def policy_version(self) -> int | None:
        """The version completions finishing now are tagged with."""
        return self._version

    async def update_weights(
        self, named_tensors: Iterable[tuple[str, Any]], *, version: int, mode: UpdateMode = "keep"
    ) -> None:
        """Switch to ``version`` (recorded in ``weight_updates``; the tensors are ignored).

        ``keep`` and ``abort`` switch at once, so calls still in flight finish under the new
        version (an aborted request would be regenerated under it); ``wait`` holds new
        ``generate`` calls, lets the calls in flight finish under the old version, then
        switches.
        """
        check_update(mode, version, owner="ScriptedBackend")
        if self._closed:
            raise ClosedError("ScriptedBackend")
        if mode == "wait":
            self._open.clear()
            try:
                await self._idle.wait()
                self._version = version
            finally:
                self._open.set()
        else:
            self._version = version
        self.weight_updates.append((version, mode))

    async def generate(
        self, requests: Sequence[GenerationRequest], params: SamplingParams
    ) -> list[Completion]:
        if self._closed:
            raise ClosedError("ScriptedBackend")
        self.calls += 1
        await self._open.wait()  # returns at once unless a mode="wait" update is draining
        self._in_flight += 1
        self._idle.clear()
        try:
            results: list[object] = [self._policy(r) for r in requests]
            if not any(inspect.isawaitable(r) for r in results):
                return [self._finish(r) for r in results]
            try:
                async with asyncio.TaskGroup() as tg:
                    tasks = [tg.create_task(self._resolve(r)) for r in results]
            except BaseExceptionGroup as group:
                # An async policy's error surfaces as itself, exactly like a sync policy's:
                # the runner records its type (or propagates a TypeError), not a group.
                raise group.exceptions[0] from None
            return [t.result() for t in tasks]
        finally:
            self._in_flight -= 1
            if not self._in_flight:
                self._idle.set()

    async def _resolve(self, result: object) -> Completion:
        return self._finish(await result if inspect.isawaitable(result) else result)

    def _finish(self, result: object) -> Completion:
        """The policy's answer as a ``Completion`` tagged with the version it finished under."""
        return tag(_to_completion(result), self._version)

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


def _to_completion(result: object) -> Completion:
    if isinstance(result, Completion):
        return result
    if isinstance(result, str):
        return Completion(text=result, finish_reason="stop")
    raise BackendError(
        f"ScriptedBackend policy must return str or Completion, got {type(result).__name__}"
    )
