"""What ``VLLMBackend`` needs of an engine: ``EngineLike`` to generate, and ``AsyncLLM``'s
pause / reload API (checked up front) to swap weights."""

from __future__ import annotations

from collections.abc import AsyncGenerator
from typing import Any, Protocol

from ..errors import BackendError
from ._weights import UpdateMode

__all__ = ["EngineLike", "EngineSwap", "check_updatable"]


class EngineLike(Protocol):
    """The part of ``AsyncLLM`` this backend uses (``testing.fake_vllm`` implements it too)."""

    def generate(
        self, prompt: Any, sampling_params: Any, request_id: str
    ) -> AsyncGenerator[Any, None]: ...

    async def abort(self, request_id: str) -> None: ...

    def get_tokenizer(self) -> Any: ...

    def shutdown(self) -> None: ...


class EngineSwap:
    """``SwapTarget`` over an in-process ``AsyncLLM``'s pause / reload API."""

    def __init__(self, engine: Any) -> None:
        self._engine = engine

    async def pause(self, mode: UpdateMode) -> None:
        await self._engine.pause_generation(mode=mode, clear_cache=False)

    async def reload(self, directory: str) -> None:
        await self._engine.collective_rpc("reload_weights", kwargs={"weights_path": directory})

    async def reset_cache(self) -> None:
        await self._engine.reset_prefix_cache(reset_running_requests=True)

    async def label(self, version: str) -> None:
        await self._engine.update_weight_version(version)

    async def resume(self) -> None:
        await self._engine.resume_generation()


def check_updatable(engine: Any) -> None:
    """Refuse an engine without the pause / reload API of vLLM's ``AsyncLLM``."""
    needed = (
        "pause_generation",
        "resume_generation",
        "collective_rpc",
        "reset_prefix_cache",
        "update_weight_version",
    )
    missing = [name for name in needed if not callable(getattr(engine, name, None))]
    if missing:
        raise BackendError(
            f"VLLMBackend.update_weights needs an AsyncLLM with {', '.join(needed)}; "
            f"{type(engine).__name__} lacks {', '.join(missing)}"
        )
