"""A backend wrapper that records every generate call (batch sizes, requests, concurrency)."""

from __future__ import annotations

from collections.abc import Sequence
from types import TracebackType

from ..backends.base import Backend
from ..types import Completion, GenerationRequest, SamplingParams

__all__ = ["RecordingBackend"]


class RecordingBackend:
    """Wraps a backend and records each call, so tests can assert "one call per round"."""

    def __init__(self, inner: Backend) -> None:
        self.inner = inner
        self.calls: list[tuple[GenerationRequest, ...]] = []
        self.params: list[SamplingParams] = []
        self.in_flight = 0
        self.peak_in_flight = 0

    @property
    def batch_sizes(self) -> list[int]:
        return [len(call) for call in self.calls]

    async def generate(
        self, requests: Sequence[GenerationRequest], params: SamplingParams
    ) -> list[Completion]:
        self.calls.append(tuple(requests))
        self.params.append(params)
        self.in_flight += 1
        self.peak_in_flight = max(self.peak_in_flight, self.in_flight)
        try:
            return await self.inner.generate(requests, params)
        finally:
            self.in_flight -= 1

    async def aclose(self) -> None:
        await self.inner.aclose()

    async def __aenter__(self) -> RecordingBackend:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()
