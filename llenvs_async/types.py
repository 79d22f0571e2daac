"""Frozen value types shared by environments, backends and the runner.

Every type is a frozen, slotted, keyword-only dataclass holding tuples (not
lists), so values can be shared between rollouts without defensive copies.
New fields always get a default so user code constructing these keeps working.
The backend-facing values (request, sampling settings, completion) live in
``_generation`` and are re-exported here.
"""

from __future__ import annotations

import traceback as _traceback
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Literal

from ._generation import (
    ChatMessage,
    Completion,
    GenerationError,
    GenerationRequest,
    SamplingParams,
)
from ._history import (
    _EMPTY,
    Action,
    ActionPath,
    History,
    HistoryStep,
    Observation,
    TokenStep,
    ToolReply,
    _empty,
)

__all__ = [
    "Action",
    "ChatMessage",
    "Completion",
    "ActionPath",
    "ErrorInfo",
    "GenerationError",
    "GenerationRequest",
    "History",
    "HistoryStep",
    "Observation",
    "SamplingParams",
    "State",
    "StepResult",
    "TokenRecord",
    "TokenStep",
    "ToolReply",
    "Trajectory",
    "Transition",
]

_KEEP: Any = object()  # State.advance: "carry this field over"


@dataclass(frozen=True, slots=True, kw_only=True)
class State:
    """A point in an episode, carrying its own provenance.

    ``task`` is what ``reset`` was called with and ``actions`` the prefix applied
    since: together they are what replay-based restore needs. ``history`` is the whole
    path (initial observation; every action, its completion, the observation after),
    shared with the parent state: it is what the policy saw, so a rollout from a saved
    state continues with the same context. ``actions`` is that history's action view
    (a tuple given here is accepted; the history then lacks the observations).
    ``hidden`` is environment-private data; ``info`` is free-form metadata.
    """

    observation: Observation
    task: int | str | None = None
    step: int = 0
    episode_id: str = ""
    actions: Sequence[Action] = ()
    terminated: bool = False
    truncated: bool = False
    hidden: Any = None
    info: Mapping[str, Any] = field(default_factory=_empty)
    seed: int | None = None

    def __post_init__(self) -> None:
        if type(self.actions) is not ActionPath:  # a tuple: no observations to record
            path = ActionPath(None if self.actions else self.observation)
            for action in self.actions:
                path = path.append(action, None)
            object.__setattr__(self, "actions", path)

    @property
    def history(self) -> History:
        """The path that led here: the initial observation and every step (shared)."""
        assert type(self.actions) is ActionPath
        return History(self.actions)

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
        """The state after ``action``: step + 1 with the provenance (task, episode, history
        extended by ``action`` and ``observation`` in O(1), seed) carried over; ``hidden``
        and ``info`` are kept unless given."""
        assert type(self.actions) is ActionPath
        return State(
            observation=observation,
            task=self.task,
            step=self.step + 1,
            episode_id=self.episode_id,
            actions=self.actions.append(action, observation),
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
class Transition:
    """One step of a trajectory: ``state --action--> next_state`` with its reward."""

    state: State
    action: Action
    next_state: State
    reward: float = 0.0
    completion: Completion | None = None
    info: Mapping[str, Any] = field(default_factory=_empty)
    tokens: TokenStep | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class ErrorInfo:
    """Why a rollout failed; recorded on its trajectory instead of raising."""

    type: str
    message: str
    phase: str = "step"
    traceback: str = ""
    details: Mapping[str, Any] = field(default_factory=_empty)

    @classmethod
    def from_exception(cls, exc: BaseException, *, phase: str) -> ErrorInfo:
        """Record ``exc``; an ``LlenvsError``'s structured fields (status, body, container
        id, ...) are kept in ``details`` as JSON values (others as their ``repr``)."""
        raw = getattr(exc, "details", None)
        details = (
            MappingProxyType({str(k): _json_safe(v) for k, v in raw.items()})
            if isinstance(raw, Mapping) and raw
            else _EMPTY
        )
        return cls(
            type=type(exc).__name__,
            message=str(exc),
            phase=phase,
            traceback="".join(_traceback.format_exception(exc)),
            details=details,
        )


def _json_safe(value: Any) -> Any:
    if value is None or isinstance(value, bool | int | float | str):
        return value
    if isinstance(value, tuple | list):
        return [_json_safe(v) for v in value]
    return repr(value)


StopReason = Literal[
    "terminated", "truncated", "max_steps", "context_length", "error", "unfinished"
]


@dataclass(frozen=True, slots=True, kw_only=True)
class Trajectory:
    """A finished rollout: its start, its transitions, and its error if it failed.

    ``index`` is the position of the rollout's input in the batch that produced it.
    ``end_reward`` is the verifier's reward for a stop the runner made before any step
    (a start prompt over the context window); a verified stop after a step is folded
    into that step's reward.
    """

    episode_id: str
    initial_state: State
    transitions: tuple[Transition, ...] = ()
    error: ErrorInfo | None = None
    index: int | None = None
    stop_reason: StopReason = "unfinished"
    info: Mapping[str, Any] = field(default_factory=_empty)
    end_reward: float = 0.0

    @property
    def total_reward(self) -> float:
        return sum(t.reward for t in self.transitions) + self.end_reward

    def discounted_return(self, gamma: float = 1.0) -> float:
        total = self.end_reward
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
        if self.error is not None:
            return False
        return (self.transitions[-1].reward if self.transitions else self.end_reward) >= 1.0

    @property
    def actions(self) -> tuple[Action, ...]:
        return tuple(t.action for t in self.transitions)

    @property
    def policy_versions(self) -> tuple[int, ...]:
        """The weight versions this rollout's generated actions came from, oldest first
        (empty when the backend reports none, or every action was forced)."""
        versions = {
            v
            for t in self.transitions
            if t.completion is not None
            for v in t.completion.policy_versions
        }
        return tuple(sorted(versions))

    @property
    def states(self) -> tuple[State, ...]:
        """Every state visited, the initial one first."""
        return (self.initial_state, *(t.next_state for t in self.transitions))

    def __len__(self) -> int:
        return len(self.transitions)

    def token_record(self) -> TokenRecord | None:
        """The trainer's view of a token-mode rollout (None when it was not run in token
        mode): see ``TokenRecord``."""
        return TokenRecord.of(self)


@dataclass(frozen=True, slots=True, kw_only=True)
class TokenRecord:
    """One token-mode trajectory as a trainer reads it.

    ``input_ids`` is the start prompt (the start state's token prefix, mask 0) followed,
    per step, by the action's ids and, except after the last step, the observation turn's
    ids: every prompt the engine was sent is a prefix of it. ``loss_mask`` is 1 exactly
    on the ids sampled in this trajectory; ``logprobs`` has one entry per 1 in the mask,
    in order (None when a sampled step has none); ``turns`` are the ``(start, end)``
    spans of each step's action ids; turn t's prompt is ``input_ids[:turns[t][0]]``.
    """

    input_ids: tuple[int, ...]
    loss_mask: tuple[int, ...]
    logprobs: tuple[float, ...] | None
    turns: tuple[tuple[int, int], ...]
    prompt_length: int

    @classmethod
    def of(cls, trajectory: Trajectory) -> TokenRecord | None:
        actions = trajectory.initial_state.actions
        assert type(actions) is ActionPath
        prefix = actions.token_prefix()
        steps = [t.tokens for t in trajectory.transitions]
        if prefix is None or any(step is None for step in steps):
            return None
        ids, mask = list(prefix), [0] * len(prefix)
        logprobs: list[float] | None = []
        turns: list[tuple[int, int]] = []
        last = len(steps) - 1
        for i, (t, step) in enumerate(zip(trajectory.transitions, steps, strict=True)):
            assert step is not None
            start = len(ids)
            ids += step.action_ids
            mask += [int(step.sampled)] * len(step.action_ids)
            turns.append((start, len(ids)))
            if step.sampled and logprobs is not None:
                lp = None if t.completion is None else t.completion.logprobs
                if lp is None or len(lp) != len(step.action_ids):
                    logprobs = None
                else:
                    logprobs += lp
            if i != last:
                ids += step.observation_ids
                mask += [0] * len(step.observation_ids)
        return cls(
            input_ids=tuple(ids),
            loss_mask=tuple(mask),
            logprobs=None if logprobs is None else tuple(logprobs),
            turns=tuple(turns),
            prompt_length=len(prefix),
        )

    def dense_logprobs(self, fill: float = 0.0) -> tuple[float, ...] | None:
        """``logprobs`` spread over ``input_ids`` (``fill`` where the mask is 0)."""
        if self.logprobs is None:
            return None
        values = iter(self.logprobs)
        return tuple(next(values) if m else fill for m in self.loss_mask)
