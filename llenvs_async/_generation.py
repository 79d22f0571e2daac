"""Frozen values exchanged with a backend: the request, the sampling settings and
the completion (or per-request error) that comes back. Re-exported by ``types``."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

__all__ = [
    "ChatMessage",
    "Completion",
    "GenerationError",
    "GenerationRequest",
    "SamplingParams",
]


@dataclass(frozen=True, slots=True, kw_only=True)
class Completion:
    """One generated completion; token ids and logprobs are kept for RL.

    ``tool_calls`` are the model's tool calls as the server returned them (OpenAI's
    ``{"id", "type": "function", "function": {"name", "arguments"}}`` objects); the
    runner copies them to ``Action.tool_calls`` for the environment. ``reasoning`` is the
    text the server's reasoning parser split off ``text`` (None when it has none).

    ``policy_version`` is the backend's weight version when the completion finished;
    ``version_spans`` (where the engine reports them) say which weights sampled which
    tokens: ``(version, start, end)`` over ``token_ids``, for a request that ran across
    an in-flight weight update.
    """

    text: str
    token_ids: tuple[int, ...] = ()
    logprobs: tuple[float, ...] | None = None
    finish_reason: str | None = None
    prompt_token_ids: tuple[int, ...] = ()
    tool_calls: tuple[Any, ...] = ()
    reasoning: str | None = None
    policy_version: int | None = None
    version_spans: tuple[tuple[int, int, int], ...] = ()

    @property
    def policy_versions(self) -> tuple[int, ...]:
        """Every weight version that sampled part of this completion, oldest first."""
        if self.version_spans:
            return tuple(sorted({v for v, _, _ in self.version_spans}))
        return () if self.policy_version is None else (self.policy_version,)


@dataclass(frozen=True, slots=True, kw_only=True)
class SamplingParams:
    """Sampling settings passed to the backend once per round.

    ``logprobs`` is the number of top logprobs to request (0 = only the sampled token's).
    """

    max_tokens: int = 256
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    stop: tuple[str, ...] = ()
    seed: int | None = None
    logprobs: int | None = 0
    n: int = 1

    def __post_init__(self) -> None:
        if self.max_tokens < 1:
            raise ValueError(f"SamplingParams.max_tokens must be >= 1, got {self.max_tokens!r}")
        if self.temperature < 0:
            raise ValueError(f"SamplingParams.temperature must be >= 0, got {self.temperature!r}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"SamplingParams.top_p must be in (0, 1], got {self.top_p!r}")
        if self.n != 1:
            raise ValueError(
                f"SamplingParams.n must be 1 (one completion per rollout), got {self.n!r}"
            )
        if isinstance(self.stop, str | list):
            object.__setattr__(
                self, "stop", (self.stop,) if isinstance(self.stop, str) else tuple(self.stop)
            )


@dataclass(frozen=True, slots=True, kw_only=True)
class ChatMessage:
    """One chat message; an assistant's ``tool_calls`` and a ``tool`` reply's
    ``tool_call_id`` follow OpenAI's chat format. ``reasoning`` is an assistant turn's
    reasoning, sent (as ``reasoning_content``) only when the run keeps it."""

    role: Literal["system", "user", "assistant", "tool"]
    content: str
    tool_calls: tuple[Any, ...] = ()
    tool_call_id: str | None = None
    reasoning: str | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class GenerationRequest:
    """One rollout's prompt for this round.

    ``prompt_token_ids``, when given, lets a backend skip chat templating.
    ``rollout_index`` is the rollout's id: its input position unless the run was given
    ``rollout_ids`` (for scripted policies and logs). ``seed`` is this request's own
    sampling seed, derived by the runner from the run's base seed, the task, the rollout's
    id and the step (None: the engine's randomness).
    ``tools`` are OpenAI-format tool definitions offered to the model; ``tool_choice``
    is OpenAI's (``"auto"``, ``"required"``, ``"none"`` or a named function; None: the
    server's default).
    """

    messages: tuple[ChatMessage, ...]
    prompt_token_ids: tuple[int, ...] | None = None
    rollout_index: int = 0
    step: int = 0
    task: int | str | None = None
    seed: int | None = None
    tools: tuple[Mapping[str, Any], ...] = ()
    tool_choice: str | Mapping[str, Any] | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class GenerationError:
    """A backend's per-request failure, returned at a request's position instead of a
    ``Completion``: only that rollout fails (or, for a ``ContextLengthError``, stops with
    ``stop_reason="context_length"``); its siblings in the round go on.
    """

    error: BaseException
    request_index: int | None = None
