"""Frozen value types shared by environments, backends and the runner.

Every type is a frozen, slotted, keyword-only dataclass holding tuples (not
lists), so values can be shared between rollouts without defensive copies.
New fields always get a default so user code constructing these keeps working.
"""

from __future__ import annotations

import traceback as _traceback
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Literal

__all__ = [
    "Action",
    "ChatMessage",
    "Completion",
    "ErrorInfo",
    "GenerationError",
    "GenerationRequest",
    "Observation",
    "SamplingParams",
    "State",
    "StepResult",
    "Trajectory",
    "Transition",
]

_EMPTY: Mapping[str, Any] = MappingProxyType({})


def _empty() -> Mapping[str, Any]:
    return _EMPTY


_KEEP: Any = object()  # State.advance: "carry this field over"


@dataclass(frozen=True, slots=True, kw_only=True)
class Action:
    """What the agent does: the completion text (environments parse it)."""

    text: str
    tool_calls: tuple[Any, ...] = ()


@dataclass(frozen=True, slots=True, kw_only=True)
class Observation:
    """What the agent sees after a reset or a step."""

    text: str
    data: Mapping[str, Any] = field(default_factory=_empty)


@dataclass(frozen=True, slots=True, kw_only=True)
class State:
    """A point in an episode, carrying its own provenance.

    ``task`` is what ``reset`` was called with and ``actions`` the prefix applied
    since: together they are what replay-based restore needs. ``hidden`` is
    environment-private data; ``info`` is free-form metadata.
    """

    observation: Observation
    task: int | str | None = None
    step: int = 0
    episode_id: str = ""
    actions: tuple[Action, ...] = ()
    terminated: bool = False
    truncated: bool = False
    hidden: Any = None
    info: Mapping[str, Any] = field(default_factory=_empty)
    seed: int | None = None

    @property
    def done(self) -> bool:
        return self.terminated or self.truncated

    def advance(
        self,
        action: Action,
        observation: Observation,
        *,
        terminated: bool = False,
        truncated: bool = False,
        hidden: Any = _KEEP,
        info: Mapping[str, Any] | object = _KEEP,
    ) -> State:
        """The state after ``action``: step + 1 with the provenance (task, episode, action
        prefix, seed) carried over; ``hidden`` and ``info`` are kept unless given."""
        return State(
            observation=observation,
            task=self.task,
            step=self.step + 1,
            episode_id=self.episode_id,
            actions=(*self.actions, action),
            terminated=terminated,
            truncated=truncated,
            hidden=self.hidden if hidden is _KEEP else hidden,
            info=self.info if info is _KEEP else info,  # type: ignore[arg-type]
            seed=self.seed,
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class StepResult:
    """The outcome of ``Environment.step``."""

    next_state: State
    reward: float = 0.0
    terminated: bool = False
    truncated: bool = False
    info: Mapping[str, Any] = field(default_factory=_empty)

    @classmethod
    def of(
        cls, next_state: State, reward: float = 0.0, info: Mapping[str, Any] | None = None
    ) -> StepResult:
        """A result whose terminated/truncated flags are ``next_state``'s (they must agree)."""
        return cls(
            next_state=next_state,
            reward=reward,
            terminated=next_state.terminated,
            truncated=next_state.truncated,
            info=_EMPTY if info is None else info,
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class Completion:
    """One generated completion; token ids and logprobs are kept for RL."""

    text: str
    token_ids: tuple[int, ...] = ()
    logprobs: tuple[float, ...] | None = None
    finish_reason: str | None = None
    prompt_token_ids: tuple[int, ...] = ()


@dataclass(frozen=True, slots=True, kw_only=True)
class Transition:
    """One step of a trajectory: ``state --action--> next_state`` with its reward."""

    state: State
    action: Action
    next_state: State
    reward: float = 0.0
    completion: Completion | None = None
    info: Mapping[str, Any] = field(default_factory=_empty)


@dataclass(frozen=True, slots=True, kw_only=True)
class ErrorInfo:
    """Why a rollout failed; recorded on its trajectory instead of raising."""

    type: str
    message: str
    phase: str = "step"
    traceback: str = ""

    @classmethod
    def from_exception(cls, exc: BaseException, *, phase: str) -> ErrorInfo:
        return cls(
            type=type(exc).__name__,
            message=str(exc),
            phase=phase,
            traceback="".join(_traceback.format_exception(exc)),
        )


StopReason = Literal[
    "terminated", "truncated", "max_steps", "context_length", "error", "unfinished"
]


@dataclass(frozen=True, slots=True, kw_only=True)
class Trajectory:
    """A finished rollout: its start, its transitions, and its error if it failed.

    ``index`` is the position of the rollout's input in the batch that produced it.
    """

    episode_id: str
    initial_state: State
    transitions: tuple[Transition, ...] = ()
    error: ErrorInfo | None = None
    index: int | None = None
    stop_reason: StopReason = "unfinished"
    info: Mapping[str, Any] = field(default_factory=_empty)

    @property
    def total_reward(self) -> float:
        return sum(t.reward for t in self.transitions)

    def discounted_return(self, gamma: float = 1.0) -> float:
        total = 0.0
        for t in reversed(self.transitions):
            total = t.reward + gamma * total
        return total

    @property
    def final_state(self) -> State:
        return self.transitions[-1].next_state if self.transitions else self.initial_state

    @property
    def done(self) -> bool:
        return self.final_state.done

    @property
    def success(self) -> bool:
        """True when the rollout did not fail and its final reward is >= 1.0."""
        return self.error is None and bool(self.transitions) and self.transitions[-1].reward >= 1.0

    @property
    def actions(self) -> tuple[Action, ...]:
        return tuple(t.action for t in self.transitions)

    @property
    def states(self) -> tuple[State, ...]:
        """Every state visited, the initial one first."""
        return (self.initial_state, *(t.next_state for t in self.transitions))

    def __len__(self) -> int:
        return len(self.transitions)


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
    role: Literal["system", "user", "assistant", "tool"]
    content: str


@dataclass(frozen=True, slots=True, kw_only=True)
class GenerationRequest:
    """One rollout's prompt for this round.

    ``prompt_token_ids``, when given, lets a backend skip chat templating.
    ``rollout_index`` is the rollout's input position (for scripted policies and logs).
    ``seed`` is this request's own sampling seed, derived by the runner from the run's
    base seed, the rollout's input index and the step (None: the engine's randomness).
    """

    messages: tuple[ChatMessage, ...]
    prompt_token_ids: tuple[int, ...] | None = None
    rollout_index: int = 0
    step: int = 0
    task: int | str | None = None
    seed: int | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class GenerationError:
    """A backend's per-request failure, returned at a request's position instead of a
    ``Completion``: only that rollout fails (or, for a ``ContextLengthError``, stops with
    ``stop_reason="context_length"``); its siblings in the round go on.
    """

    error: BaseException
    request_index: int | None = None
