"""A stand-in for ``vllm.v1.engine.async_llm.AsyncLLM`` (no GPU, no vLLM needed).

It exposes the interface ``VLLMBackend`` uses — ``generate`` (an async generator of
RequestOutput-like objects, cumulative like vLLM's default), ``abort``,
``get_tokenizer`` and ``shutdown`` — and records what a test needs to check:
requests received, the high-water mark of requests in flight, aborted request ids.
Sampling params may be real ``vllm.SamplingParams`` or the kwargs dict the backend
passes when vLLM is not importable (see ``backends._vllm_compat``).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncGenerator, Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

__all__ = [
    "EngineDeadError",
    "FakeAsyncLLM",
    "FakeCompletionOutput",
    "FakeEngineError",
    "FakeLogprob",
    "FakeRequestOutput",
    "FakeTokenizer",
    "fake_logprob",
]

_TOKEN_BASE = 1000
BOS_ID = 1


def fake_logprob(token_id: int) -> float:
    """The fake model's logprob for a sampled token (deterministic, always < 0)."""
    return -((token_id % 13) + 1) / 4


class FakeEngineError(RuntimeError):
    """What ``FakeAsyncLLM.generate`` raises for prompts matched by ``fail_when``."""


class EngineDeadError(FakeEngineError):
    """Named like vLLM's: the whole engine is gone (raised for prompts matched by ``die_when``)."""


@dataclass(frozen=True, slots=True)
class FakeLogprob:
    logprob: float
    rank: int | None = None
    decoded_token: str | None = None


@dataclass(frozen=True, slots=True)
class FakeCompletionOutput:
    index: int
    text: str
    token_ids: list[int]
    cumulative_logprob: float | None
    logprobs: list[dict[int, FakeLogprob]] | None
    finish_reason: str | None
    stop_reason: int | str | None = None


@dataclass(frozen=True, slots=True)
class FakeRequestOutput:
    request_id: str
    prompt: str | None
    prompt_token_ids: list[int] | None
    outputs: list[FakeCompletionOutput]
    finished: bool


class FakeTokenizer:
    """Renders chats as ``<|role|>content`` blocks; one token per character (``1000 + ord``)."""

    def __init__(self) -> None:
        self.template_calls: list[list[dict[str, str]]] = []

    def apply_chat_template(
        self,
        conversation: Sequence[Mapping[str, str]],
        *,
        tokenize: bool = True,
        add_generation_prompt: bool = False,
        **kwargs: Any,
    ) -> str | list[int]:
        self.template_calls.append([dict(m) for m in conversation])
        text = "".join(f"<|{m['role']}|>{m['content']}" for m in conversation)
        if add_generation_prompt:
            text += "<|assistant|>"
        return self.encode(text) if tokenize else text

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        ids = [_TOKEN_BASE + ord(c) for c in text]
        return [BOS_ID, *ids] if add_special_tokens else ids

    def decode(self, token_ids: Iterable[int]) -> str:
        return "".join(chr(t - _TOKEN_BASE) for t in token_ids if t >= _TOKEN_BASE)


class FakeAsyncLLM:
    """The fake engine. ``policy(prompt_text) -> completion text`` (default: an echo).

    ``hold_until_in_flight=N``: each request waits until N are in flight at once (or
    ``hold_timeout`` passes). ``hang``: requests never finish (until cancelled).
    ``fail_when(prompt_text)``: those requests raise ``FakeEngineError`` (after the hold);
    ``die_when(prompt_text)``: they raise ``EngineDeadError``, as a crashed engine does.
    ``chunks``: how many cumulative outputs each request streams.
    """

    def __init__(
        self,
        *,
        policy: Callable[[str], str] | None = None,
        tokenizer: FakeTokenizer | None = None,
        async_tokenizer: bool = False,
        chunks: int = 3,
        hold_until_in_flight: int | None = None,
        hold_timeout: float = 10.0,
        hang: bool = False,
        fail_when: Callable[[str], bool] | None = None,
        die_when: Callable[[str], bool] | None = None,
    ) -> None:
        self.tokenizer = tokenizer or FakeTokenizer()
        self.policy = policy or (lambda prompt: f"echo: {prompt[-24:]}")
        self.async_tokenizer = async_tokenizer
        self.chunks = max(1, chunks)
        self.hang = hang
        self.fail_when = fail_when
        self.die_when = die_when
        self.requests: list[tuple[str, Any, Any]] = []
        self.aborted: list[str] = []
        self.in_flight: set[str] = set()
        self.max_in_flight = 0
        self.shutdown_calls = 0
        self._hold_until = hold_until_in_flight
        self._hold_timeout = hold_timeout
        self._changed = asyncio.Condition()

    async def generate(
        self, prompt: Any, sampling_params: Any, request_id: str, **kwargs: Any
    ) -> AsyncGenerator[FakeRequestOutput, None]:
        """Like ``AsyncLLM.generate``: cumulative outputs, the last one ``finished``."""
        if request_id in self.in_flight:
            raise ValueError(f"request id {request_id!r} is already running")
        prompt_ids = self._prompt_ids(prompt)
        prompt_text = self.tokenizer.decode(prompt_ids)
        self.requests.append((request_id, prompt, sampling_params))
        await self._enter(request_id)
        try:
            await self._hold()
            if self.die_when is not None and self.die_when(prompt_text):
                raise EngineDeadError("EngineCore encountered an issue (fake)")
            if self.fail_when is not None and self.fail_when(prompt_text):
                raise FakeEngineError(f"fake engine failure for request {request_id}")
            ids = self.tokenizer.encode(self.policy(prompt_text), add_special_tokens=False)
            max_tokens = int(_param(sampling_params, "max_tokens", 16))
            finish = "length" if len(ids) > max_tokens else "stop"
            ids = ids[:max_tokens]
            want_logprobs = _param(sampling_params, "logprobs", None) is not None
            for step in range(1, self.chunks + 1):
                await asyncio.sleep(0)
                cut = len(ids) * step // self.chunks
                last = step == self.chunks
                yield self._output(request_id, prompt_ids, ids[:cut], want_logprobs, finish, last)
                if self.hang:
                    await asyncio.Event().wait()
        finally:
            self.in_flight.discard(request_id)

    def _prompt_ids(self, prompt: Any) -> list[int]:
        if isinstance(prompt, Mapping) and "prompt_token_ids" in prompt:
            return [int(t) for t in prompt["prompt_token_ids"]]
        if isinstance(prompt, str):
            return self.tokenizer.encode(prompt)
        raise TypeError(f"FakeAsyncLLM cannot read prompt {prompt!r}")

    def _output(
        self,
        request_id: str,
        prompt_ids: list[int],
        ids: list[int],
        want_logprobs: bool,
        finish: str,
        last: bool,
    ) -> FakeRequestOutput:
        logprobs = None
        if want_logprobs:
            # A decoy entry first (the top-ranked token), so callers must index by the sampled id.
            logprobs = [
                {t + 1: FakeLogprob(-0.01, rank=1), t: FakeLogprob(fake_logprob(t), rank=2)}
                for t in ids
            ]
        output = FakeCompletionOutput(
            index=0,
            text=self.tokenizer.decode(ids),
            token_ids=list(ids),
            cumulative_logprob=sum(fake_logprob(t) for t in ids),
            logprobs=logprobs,
            finish_reason=finish if last else None,
        )
        return FakeRequestOutput(request_id, None, list(prompt_ids), [output], finished=last)

    async def _enter(self, request_id: str) -> None:
        async with self._changed:
            self.in_flight.add(request_id)
            self.max_in_flight = max(self.max_in_flight, len(self.in_flight))
            self._changed.notify_all()

    async def _hold(self) -> None:
        if self._hold_until is None:
            return
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(self._hold_timeout), self._changed:
                await self._changed.wait_for(lambda: self.max_in_flight >= (self._hold_until or 0))

    async def wait_in_flight(self, count: int) -> None:
        """Wait until ``count`` requests are in flight at once (bound it with a timeout)."""
        async with self._changed:
            await self._changed.wait_for(lambda: len(self.in_flight) >= count)

    async def abort(self, request_id: str | Iterable[str]) -> None:
        """Record the abort (as ``AsyncLLM.abort``, unknown ids are ignored)."""
        ids = [request_id] if isinstance(request_id, str) else list(request_id)
        self.aborted.extend(ids)

    def get_tokenizer(self) -> FakeTokenizer | Awaitable[FakeTokenizer]:
        """Sync like recent vLLM, or a coroutine like vLLM 0.11 (``async_tokenizer=True``)."""
        if self.async_tokenizer:
            return self._tokenizer_async()
        return self.tokenizer

    async def _tokenizer_async(self) -> FakeTokenizer:
        return self.tokenizer

    def shutdown(self) -> None:
        self.shutdown_calls += 1


def _param(sampling_params: Any, name: str, default: Any) -> Any:
    if isinstance(sampling_params, Mapping):
        return sampling_params.get(name, default)
    return getattr(sampling_params, name, default)
