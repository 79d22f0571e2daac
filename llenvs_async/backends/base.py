"""The Backend protocol: one batched ``generate`` call per lockstep round."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any, Literal, Protocol, runtime_checkable

from ..types import Completion, GenerationError, GenerationRequest, SamplingParams

__all__ = ["Backend", "TokenizerBackend", "TrainableBackend"]


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


@runtime_checkable
class TokenizerBackend(Protocol):
    """A backend that can serve token mode: it sends ``GenerationRequest.prompt_token_ids``
    verbatim and tells the runner which tokenizer (and chat template) made them.

    ``token_mode_error()`` is None when token mode works, else why not (checked by the
    runner at construction); ``get_tokenizer()`` returns a Hugging Face-style tokenizer
    (``apply_chat_template`` and ``encode``).
    """

    def token_mode_error(self) -> str | None: ...

    async def get_tokenizer(self) -> Any: ...


@runtime_checkable
class TrainableBackend(Protocol):
    """A backend whose weights a trainer updates in flight (``ScriptedBackend``,
    ``VLLMBackend``, ``OpenAIBackend`` against a vLLM server).

    ``policy_version`` is the version completions finishing now are tagged with (None:
    unversioned). ``update_weights`` loads ``named_tensors`` (e.g. ``model.named_parameters()``)
    and makes ``version`` current; ``mode`` says what happens to requests in flight:
    ``keep`` continues them under the new weights, ``wait`` lets them finish first,
    ``abort`` stops them and regenerates them under the new weights. None is lost.
    """

    @property
    def policy_version(self) -> int | None: ...

    async def update_weights(
        self,
        named_tensors: Iterable[tuple[str, Any]],
        *,
        version: int,
        mode: Literal["keep", "wait", "abort"] = "keep",
    ) -> None: ...
