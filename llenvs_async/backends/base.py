"""The Backend protocol: one batched ``generate`` call per lockstep round."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, runtime_checkable

from ..types import Completion, GenerationError, GenerationRequest, SamplingParams

__all__ = ["Backend"]


@runtime_checkable
class Backend(Protocol):
    """Generates one completion per request, returned in request order.

    A request that fails on its own may get a ``GenerationError`` at its position
    (only that rollout fails); raising fails every rollout of the round.
    """

    async def generate(
        self, requests: Sequence[GenerationRequest], params: SamplingParams
    ) -> Sequence[Completion | GenerationError]: ...

    async def aclose(self) -> None: ...
