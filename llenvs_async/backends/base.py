"""The Backend protocol: one batched ``generate`` call per lockstep round."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, runtime_checkable

from ..types import Completion, GenerationRequest, SamplingParams

__all__ = ["Backend"]


@runtime_checkable
class Backend(Protocol):
    """Generates one completion per request, returned in request order."""

    async def generate(
        self, requests: Sequence[GenerationRequest], params: SamplingParams
    ) -> list[Completion]: ...

    async def aclose(self) -> None: ...
