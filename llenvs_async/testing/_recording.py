"""A backend wrapper that records every generate call (batch sizes, requests, concurrency)."""

from __future__ import annotations

from collections.abc import Sequence

from .._resource import AsyncResource
from ..backends.base import Backend
from ..types import Completion, GenerationError, GenerationRequest, SamplingParams

__all__ = ["RecordingBackend"]


class RecordingBackend(AsyncResource):
    """Wraps a backend and records each call, so tests can assert "one call per round"."""

    def __init__(self, inner: Backend) -> None:
        self.inner = inner
        self.calls: list[tuple[GenerationRequest, ...]] = []
        self.params: list[SamplingParams] = []
        self.in_flight = 0
        self.peak_in_flight = 0
        self._closed = False

    @property
    def batch_sizes(self) -> list[int]:
        return [len(call) for call in self.calls]

    async def generate(
        self, requests: Sequence[GenerationRequest], params: SamplingParams
    ) -> Sequence[Completion | GenerationError]:
        self.calls.append(tuple(requests))
        self.params.append(params)
        self.in_flight += 1
        self.peak_in_flight = max(self.peak_in_flight, self.in_flight)
        try:
            return await self.inner.generate(requests, params)
        finally:
            self.in_flight -= 1

    @property
    def closed(self) -> bool:
        return self._closed

    async def aclose(self) -> None:
        if self._closed:
            return
        self._closed = True
        await self.inner.aclose()
