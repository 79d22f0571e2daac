"""LLM backends: the protocol, scripted policies, OpenAI-compatible HTTP, in-process vLLM."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ._vllm_orphans import ReapedProcess, reap_orphan_engines
from .base import Backend, TokenizerBackend, TrainableBackend
from .scripted import ScriptedBackend

if TYPE_CHECKING:
    from .openai import OpenAIBackend
    from .vllm import VLLMBackend

__all__ = [
    "Backend",
    "OpenAIBackend",
    "ReapedProcess",
    "ScriptedBackend",
    "TokenizerBackend",
    "TrainableBackend",
    "VLLMBackend",
    "reap_orphan_engines",
]


def __getattr__(name: str) -> Any:
    # OpenAIBackend / VLLMBackend are imported lazily: vLLM is an optional, heavy extra.
    if name == "OpenAIBackend":
        from .openai import OpenAIBackend

        return OpenAIBackend
    if name == "VLLMBackend":
        from .vllm import VLLMBackend

        return VLLMBackend
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
