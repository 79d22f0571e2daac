"""The rollout path's values: actions, observations, and the persistent history a state
carries (``ActionPath``: a linked list shared by a state and its successors; ``History``:
its step view). Re-exported by ``llenvs_async.types``, the public home of every value.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, overload

if TYPE_CHECKING:
    from ._generation import Completion

__all__ = [
    "Action",
    "ActionPath",
    "History",
    "HistoryStep",
    "Observation",
    "TokenStep",
    "ToolReply",
]

_EMPTY: Mapping[str, Any] = MappingProxyType({})


def _empty() -> Mapping[str, Any]:
    return _EMPTY


@dataclass(frozen=True, slots=True, kw_only=True)
class Action:
    """What the agent does: the completion text (environments parse it).

    ``completion`` is the generation that produced it (set by the runner; None for a
    forced or replayed action); it is not part of an action's identity (``==``).
    """

    text: str
    tool_calls: tuple[Any, ...] = ()
    completion: Completion | None = field(default=None, compare=False, repr=False)


@dataclass(frozen=True, slots=True, kw_only=True)
class ToolReply:
    """The answer to one tool call (``tool_call_id``), as the model reads it."""

    tool_call_id: str
    content: str


@dataclass(frozen=True, slots=True, kw_only=True)
class Observation:
    """What the agent sees after a reset or a step: ``text`` for people (and a user turn),
    or, when it answers tool calls, one ``tool_replies`` entry per call, in call order."""

    text: str
    data: Mapping[str, Any] = field(default_factory=_empty)
    tool_replies: tuple[ToolReply, ...] = ()


@dataclass(frozen=True, slots=True, kw_only=True)
class HistoryStep:
    """One step of a state's path: the action (with its ``completion``) and what followed.

    ``observation`` is None when it was never recorded (a state built from a bare
    action tuple).
    """

    action: Action
    observation: Observation | None = None
    # Token mode (not part of a step's identity): the ids the step added to the prompt, and
    # the whole prompt at this step when it was templated here instead (see ActionPath).
    tokens: TokenStep | None = field(default=None, compare=False, repr=False)
    prefix: tuple[int, ...] | None = field(default=None, compare=False, repr=False)

    @property
    def completion(self) -> Completion | None:
        return self.action.completion


@dataclass(frozen=True, slots=True, kw_only=True)
class TokenStep:
    """The prompt ids one step adds in token mode: the action's ids, then the observation turn's.

    ``action_ids`` are the sampled completion ids exactly as the engine returned them
    (``sampled=True``, loss mask 1) or a forced action templated as an assistant turn
    (``sampled=False``, mask 0); ``observation_ids`` close the turn and template the next
    user turn up to the generation prompt (mask 0). Only this step's delta is held.
    """

    action_ids: tuple[int, ...]
    observation_ids: tuple[int, ...]
    sampled: bool = True


class ActionPath(Sequence[Action]):
    """The path from ``reset`` to a state, as ``State.actions``: a persistent list (each
    node links to its parent) that compares and concatenates like the tuple of actions it
    replaces, and also keeps each step's observation and the initial observation.

    ``append`` is O(1) and shares the parent's nodes, so a state and its successors hold
    one chain, never copies of the prefix. ``State.history`` is the step view of it.
    """

    __slots__ = ("_action", "_initial", "_len", "_observation", "_parent", "_prefix", "_tokens")

    def __init__(
        self, initial: Observation | None = None, *, prefix: tuple[int, ...] | None = None
    ) -> None:
        self._initial = initial
        self._parent: ActionPath | None = None
        self._action: Action | None = None
        self._observation: Observation | None = None
        self._len = 0
        self._tokens: TokenStep | None = None
        self._prefix = prefix

    def append(
        self, action: Action, observation: Observation | None, *, tokens: TokenStep | None = None
    ) -> ActionPath:
        node = ActionPath.__new__(ActionPath)
        node._initial, node._parent, node._len = self._initial, self, self._len + 1
        node._action, node._observation = action, observation
        node._tokens, node._prefix = tokens, None
        return node

    def __reduce__(self) -> tuple[Any, ...]:
        """Pickled (and deep-copied) flat: a chain of parent links would recurse once per
        step and fail on long episodes (states travel to Ray actors on every step)."""
        nodes = self._nodes()
        root = nodes[0]._parent if nodes else self
        assert root is not None
        steps = [(n._action, n._observation, n._tokens, n._prefix) for n in nodes]
        return (_rebuild_path, (root._initial, root._prefix, steps))

    def with_prefix(self, prefix: tuple[int, ...]) -> ActionPath:
        """This node again (same parent, action, observation), carrying the whole prompt
        ``prefix`` at this point: how a root, or a state whose steps lack token ids, gets
        its token prefix (token mode)."""
        if self._parent is None:
            return ActionPath(self._initial, prefix=prefix)
        assert self._action is not None
        node = self._parent.append(self._action, self._observation, tokens=self._tokens)
        node._prefix = prefix
        return node

    def with_tokens(self, tokens: TokenStep) -> ActionPath:
        """This step node again (same parent, action, observation) carrying ``tokens``."""
        assert self._parent is not None and self._action is not None
        node = self._parent.append(self._action, self._observation, tokens=tokens)
        node._prefix = self._prefix
        return node

    @property
    def tokens(self) -> TokenStep | None:
        """The token ids this step added to the prompt (token mode; None at the root)."""
        return self._tokens

    def token_prefix(self) -> tuple[int, ...] | None:
        """The prompt ids the policy was sent at this point (token mode): the nearest stored
        ``prefix`` plus every later step's delta; None when a step lacks its ids."""
        deltas: list[TokenStep] = []
        node: ActionPath | None = self
        while node is not None and node._prefix is None:
            if node._tokens is None:
                return None
            deltas.append(node._tokens)
            node = node._parent
        if node is None or node._prefix is None:
            return None
        ids = list(node._prefix)
        for step in reversed(deltas):
            ids += step.action_ids
            ids += step.observation_ids
        return tuple(ids)

    def _nodes(self) -> list[ActionPath]:
        """The non-root nodes, oldest first."""
        out: list[ActionPath] = []
        node: ActionPath | None = self
        while node is not None and node._len:
            out.append(node)
            node = node._parent
        out.reverse()
        return out

    def _node(self, index: int) -> ActionPath:
        n = self._len
        i = index + n if index < 0 else index
        if not 0 <= i < n:
            raise IndexError("index out of range")
        node = self
        for _ in range(n - 1 - i):
            assert node._parent is not None
            node = node._parent
        return node

    def __len__(self) -> int:
        return self._len

    def __iter__(self) -> Iterator[Action]:
        return (node._action for node in self._nodes())  # type: ignore[misc]

    @overload
    def __getitem__(self, index: int) -> Action: ...
    @overload
    def __getitem__(self, index: slice) -> tuple[Action, ...]: ...
    def __getitem__(self, index: int | slice) -> Action | tuple[Action, ...]:
        if isinstance(index, slice):
            return tuple(self)[index]
        action = self._node(index)._action
        assert action is not None
        return action

    def __eq__(self, other: object) -> bool:
        if self is other:
            return True
        if isinstance(other, ActionPath | tuple | list):
            return len(self) == len(other) and tuple(self) == tuple(other)
        return NotImplemented

    def __hash__(self) -> int:
        return hash(tuple(self))

    def __add__(self, other: Sequence[Action]) -> tuple[Action, ...]:
        return (*self, *other)

    def __radd__(self, other: Sequence[Action]) -> tuple[Action, ...]:
        return (*other, *self)

    def __repr__(self) -> str:
        return repr(tuple(self))


def _rebuild_path(
    initial: Observation | None,
    prefix: tuple[int, ...] | None,
    steps: list[tuple[Action, Observation | None, TokenStep | None, tuple[int, ...] | None]],
) -> ActionPath:
    path = ActionPath(initial, prefix=prefix)
    for action, observation, tokens, step_prefix in steps:
        path = path.append(action, observation, tokens=tokens)
        path._prefix = step_prefix
    return path


class History(Sequence[HistoryStep]):
    """``State.history``: the steps of a state's path (a view; nothing is copied).

    ``initial`` is the observation after ``reset`` (None when unknown, as for a state
    built from a bare action tuple); each step is the action (with its ``completion``)
    and the observation that followed it.
    """

    __slots__ = ("_path",)

    def __init__(self, path: ActionPath) -> None:
        self._path = path

    @classmethod
    def of(
        cls,
        steps: Iterable[HistoryStep],
        initial: Observation | None,
        *,
        prefix: tuple[int, ...] | None = None,
    ) -> History:
        """A history of ``steps`` after ``initial`` (``prefix``: the root's start prompt)."""
        path = ActionPath(initial, prefix=prefix)
        for step in steps:
            path = path.append(step.action, step.observation, tokens=step.tokens)
            if step.prefix is not None:
                path = path.with_prefix(step.prefix)
        return cls(path)

    @property
    def prefix(self) -> tuple[int, ...] | None:
        """The root's token prefix (token mode: the start prompt after reset)."""
        node = self._path
        while node._parent is not None:
            node = node._parent
        return node._prefix

    @property
    def path(self) -> ActionPath:
        return self._path

    @property
    def initial(self) -> Observation | None:
        return self._path._initial

    @property
    def parent(self) -> History | None:
        """The history one step shorter (None at the root)."""
        parent = self._path._parent
        return None if parent is None else History(parent)

    @property
    def last(self) -> HistoryStep | None:
        return self[-1] if self._path._len else None

    @property
    def complete(self) -> bool:
        """True when the initial observation and every step's observation are known."""
        return self.initial is not None and all(
            node._observation is not None for node in self._path._nodes()
        )

    def extends(self, parent: History) -> bool:
        """Whether this history is ``parent`` plus one step (sharing its nodes)."""
        return self._path._parent is parent._path

    def __len__(self) -> int:
        return self._path._len

    def __iter__(self) -> Iterator[HistoryStep]:
        return (_step(node) for node in self._path._nodes())

    @overload
    def __getitem__(self, index: int) -> HistoryStep: ...
    @overload
    def __getitem__(self, index: slice) -> tuple[HistoryStep, ...]: ...
    def __getitem__(self, index: int | slice) -> HistoryStep | tuple[HistoryStep, ...]:
        if isinstance(index, slice):
            return tuple(self)[index]
        return _step(self._path._node(index))

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, History):
            return NotImplemented
        return self._path is other._path or (
            len(self) == len(other) and self.initial == other.initial and list(self) == list(other)
        )

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"History(initial={self.initial!r}, steps={len(self)})"


def _step(node: ActionPath) -> HistoryStep:
    assert node._action is not None
    return HistoryStep(
        action=node._action, observation=node._observation, tokens=node._tokens, prefix=node._prefix
    )
