"""The async Environment protocol, a base class with the lifecycle rules, and replay restore."""

from __future__ import annotations

import os
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from types import TracebackType
from typing import Any, Protocol, runtime_checkable

from ._resource import AsyncResource
from .errors import ClosedError, EnvError, RestoreError, StaleStateError
from .types import Action, ChatMessage, State, StepResult

__all__ = [
    "AgentEnvironment",
    "AgentSurface",
    "BaseEnvironment",
    "EnvFactory",
    "Environment",
    "Placed",
    "RestoreFn",
    "VerifiesStops",
    "check_replayed",
    "new_episode_id",
    "replay",
    "replay_restore",
]


@runtime_checkable
class Environment(Protocol):
    """What the runner needs from an environment.

    ``pure_step=True`` promises that ``step(state, a)`` depends only on
    ``(state, a)``, so one instance can serve every rollout. Otherwise each rollout
    needs its own instance, restored by a ``RestoreFn``.
    """

    pure_step: bool
    max_steps: int | None

    async def reset(self, task: int | str | None = None, *, seed: int | None = None) -> State: ...

    async def step(self, state: State, action: Action) -> StepResult: ...

    async def aclose(self) -> None: ...

    async def __aenter__(self) -> Environment: ...

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None: ...


@runtime_checkable
class VerifiesStops(Protocol):
    """An environment that verifies the stops the runner makes (``AgentEnvironment``'s part
    checked per stop: a narrow type, so the check reads nothing else)."""

    async def verify_stop(
        self, state: State, reason: str
    ) -> tuple[float, Mapping[str, Any]] | None: ...


@runtime_checkable
class Placed(Protocol):
    """An environment that says where its instance runs (``AgentEnvironment``'s part read
    per rollout)."""

    @property
    def node_id(self) -> str | None: ...


@runtime_checkable
class AgentEnvironment(Environment, VerifiesStops, Placed, Protocol):
    """What an agent environment offers the runner besides stepping: the tools and system
    prompt (with example turns) it sends the model, where a reply stops, how a stop the runner
    makes is verified, the range of a rollout's return, and where the instance runs.

    ``BaseEnvironment`` declares all of it (offering nothing by default), so a subclass sets
    only what it offers. The runner, the forks and the Ray proxy read it through this type.
    """

    @property
    def tools(self) -> Sequence[Mapping[str, Any]]: ...

    @property
    def system_prompt(self) -> str | None: ...

    @property
    def example_turns(self) -> Sequence[ChatMessage]: ...

    @property
    def stop_sequences(self) -> Sequence[str]: ...

    @property
    def reward_range(self) -> tuple[float, float] | None: ...


@dataclass(frozen=True, slots=True, kw_only=True)
class AgentSurface:
    """What an environment offers the runner for every instance alike (its
    ``AgentEnvironment`` members but verification and placement), as one value: what the runner
    reads once and what crosses to a remote proxy."""

    tools: tuple[Mapping[str, Any], ...] = ()
    system_prompt: str | None = None
    example_turns: tuple[ChatMessage, ...] = ()
    stop_sequences: tuple[str, ...] = ()
    reward_range: tuple[float, float] | None = None

    @classmethod
    def of(cls, env: Environment) -> AgentSurface:
        """``env``'s offer; an environment that is not an ``AgentEnvironment`` offers none."""
        if not isinstance(env, AgentEnvironment):
            return cls()
        span = env.reward_range
        return cls(
            tools=tuple(env.tools),
            system_prompt=env.system_prompt,
            example_turns=tuple(env.example_turns),
            stop_sequences=tuple(env.stop_sequences),
            reward_range=None if span is None else (float(span[0]), float(span[1])),
        )


EnvFactory = Callable[[], Awaitable[Environment]]
RestoreFn = Callable[[Environment, State], Awaitable[State]]


def new_episode_id() -> str:
    """16 random hex digits (``uuid4().hex[:16]``'s format, a few times cheaper)."""
    return os.urandom(8).hex()


class BaseEnvironment(AsyncResource):
    """Lifecycle shared by environments: async context manager, idempotent close,
    use-after-close guard and, for non-pure environments, the stale-state guard.

    Subclasses implement ``_reset`` and ``_step`` (and optionally ``_aclose``), and override
    the ``AgentEnvironment`` members they offer (by default none).
    """

    pure_step: bool = True
    max_steps: int | None = None

    def __init__(self, *, max_steps: int | None = None) -> None:
        if max_steps is not None and max_steps < 1:
            raise ValueError(f"max_steps must be >= 1 or None, got {max_steps!r}")
        if max_steps is not None:
            self.max_steps = max_steps
        self._closed = False
        self._current: State | None = None
        self._stepping = False

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def tools(self) -> Sequence[Mapping[str, Any]]:
        """Tool schemas the runner offers the model (none)."""
        return ()

    @property
    def system_prompt(self) -> str | None:
        """The system prompt the runner sends (none)."""
        return None

    @property
    def example_turns(self) -> Sequence[ChatMessage]:
        """Example turns sent after the system prompt (none)."""
        return ()

    @property
    def stop_sequences(self) -> Sequence[str]:
        """Where a reply ends (the runner adds them to every request; none)."""
        return ()

    @property
    def reward_range(self) -> tuple[float, float] | None:
        """The range of one rollout's return, as Gymnasium's (None: undeclared)."""
        return None

    @property
    def node_id(self) -> str | None:
        """Where the instance runs when that is another machine (None: here)."""
        return None

    async def verify_stop(
        self, state: State, reason: str
    ) -> tuple[float, Mapping[str, Any]] | None:
        """``(reward, info)`` for an episode the runner stopped at ``state`` (``reason``: the
        context window, its ``max_steps``); None: such stops are not verified."""
        return None

    @property
    def current_state(self) -> State | None:
        """The state the environment is in (tracked for non-pure environments)."""
        return self._current

    def _ensure_open(self) -> None:
        if self._closed:
            raise ClosedError(type(self).__name__)

    async def reset(self, task: int | str | None = None, *, seed: int | None = None) -> State:
        self._ensure_open()
        state = await self._reset(task, seed=seed)
        self._current = state
        return state

    async def step(self, state: State, action: Action) -> StepResult:
        self._ensure_open()
        if not isinstance(action, Action):
            raise TypeError(f"step() expects an Action, got {type(action).__name__}")
        if state.done:
            raise EnvError(
                f"cannot step from a finished state "
                f"(episode {state.episode_id!r}, step {state.step})"
            )
        if self.pure_step:
            return await self._step(state, action)
        if self._stepping:
            # Two concurrent steps from one state would both pass the check below and
            # both claim the same successor: the second is refused while one is in flight.
            raise StaleStateError(
                f"{type(self).__name__} is not pure and a step is already in flight "
                f"(episode {state.episode_id!r}, step {state.step}); use one instance per rollout",
                expected=None,
                got=(state.episode_id, state.step),
            )
        cur = self._current
        if cur is None or cur.episode_id != state.episode_id or cur.step != state.step:
            expected = None if cur is None else (cur.episode_id, cur.step)
            raise StaleStateError(
                f"{type(self).__name__} is not pure: it can only step from its current "
                f"state {expected}, got (episode {state.episode_id!r}, step {state.step}); "
                "restore a fresh instance instead",
                expected=expected,
                got=(state.episode_id, state.step),
            )
        self._stepping = True
        try:
            result = await self._step(state, action)
        finally:
            self._stepping = False
        self._current = result.next_state
        return result

    async def aclose(self) -> None:
        if self._closed:
            return
        self._closed = True
        await self._aclose()

    async def _reset(self, task: int | str | None, *, seed: int | None) -> State:
        raise NotImplementedError

    async def _step(self, state: State, action: Action) -> StepResult:
        raise NotImplementedError

    async def _aclose(self) -> None:
        return None


async def replay(
    env: Environment,
    task: int | str | None,
    actions: Sequence[Action],
    *,
    seed: int | None = None,
    until: Callable[[Action], bool] | None = None,
) -> State:
    """The one replay loop: reset ``env`` to ``task`` and step ``actions`` in order (stopping
    before the first one ``until`` accepts); the state reached.

    Raises ``RestoreError`` when the episode ends before the actions do.
    """
    current = await env.reset(task, seed=seed)
    for i, action in enumerate(actions):
        if until is not None and until(action):
            break
        if current.done:
            raise RestoreError(
                f"replay of task {task!r} ended after {i} of {len(actions)} actions",
                task=task,
                replayed=i,
            )
        current = (await env.step(current, action)).next_state
    return current


async def replay_restore(env: Environment, state: State) -> State:
    """Bring ``env`` to ``state`` by resetting to ``state.task`` and replaying ``state.actions``.

    Raises ``RestoreError`` when the replay ends early or lands on another step.
    """
    current = await replay(env, state.task, state.actions, seed=state.seed)
    check_replayed(current, state)
    return current


def check_replayed(current: State, state: State) -> None:
    """``RestoreError`` unless a replay of ``state`` landed on its step."""
    if current.step != state.step:
        raise RestoreError(
            f"replay of task {state.task!r} reached step {current.step}, expected {state.step}",
            task=state.task,
            expected_step=state.step,
            got_step=current.step,
        )
