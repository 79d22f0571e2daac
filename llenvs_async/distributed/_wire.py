"""What one call to an instance's actor carries, kept small and cheap to pickle.

Every step used to ship the whole ``State`` to the actor and the whole next state back:
its history (every action, completion and observation since ``reset``) pickled twice
per step, O(steps) each time, through cloudpickle. Here:

- Each side keeps the last states it exchanged, under a key the driver picks: a state
  the actor already holds travels as its key (``KNOWN``), one that differs from it only
  near the end of its history (token mode re-tags the last step) as a short ``PATCHED``.
- A step's reply (``DELTA``) carries the result's fields, the next state's fields that
  are not the stepped state's own, and the steps its history adds (normally one); the
  driver applies them to *its* state, so the next state shares that history's nodes
  exactly as after a local step (``History.extends`` holds, as token mode needs) and
  holds the driver's own action object.
- Payloads are pickled once, with the C pickler (a ``mappingproxy`` reduced to a dict),
  and handed to Ray as ``bytes``; anything that pickle cannot ship faithfully (a
  ``__main__`` class, a Ray object or handle, a module registered to pickle by value, a
  lambda) goes to Ray's own serializer as before.

Replies are ``(status, value)``: ``FAILED`` (value: the failure), ``OK`` (the value),
``DELTA`` (a step's result as above) or ``MISS`` (the actor does not hold the state a
call referred to: the driver sends it again in full).
"""

from __future__ import annotations

import copyreg
import dataclasses
import io
import pickle
import re
from collections.abc import Callable, Hashable
from types import MappingProxyType
from typing import Any

from ..types import Action, ActionPath, State

__all__ = [
    "DELTA",
    "FAILED",
    "MISS",
    "OK",
    "StateCache",
    "apply_delta",
    "decode_result",
    "dumps",
    "encode_result",
    "encode_state",
    "loads",
    "path_delta",
]

# Reply statuses (FAILED and OK are also what ``open``/``close`` reply: False and True).
FAILED, OK, DELTA, MISS = 0, 1, 2, 3
# A state as sent: the ``State`` itself, or one of these tuples.
KNOWN, PATCHED = 0, 1
# A history step's action or observation in a delta: the one the call sent / the node
# it replaces at the same depth (a step re-tagged with token ids).
SENT, SAME = 0, 1

# How far back (history steps) a delta looks for the state the other side holds.
DELTA_DEPTH = 8
# How many recent states an actor keeps per instance (a call the driver abandoned may
# have replaced the one the driver refers to; a miss costs one resend in full).
CACHE_SIZE = 4

Delta = tuple[int, tuple[tuple[Any, Any, Any, Any], ...]]  # (pop, steps)


def _mappingproxy(items: dict[str, Any]) -> MappingProxyType[str, Any]:
    return MappingProxyType(items)


def _reduce_mappingproxy(proxy: MappingProxyType[Any, Any]) -> tuple[Any, ...]:
    return _mappingproxy, (dict(proxy),)


_DISPATCH: dict[type, Callable[[Any], Any]] = dict(copyreg.dispatch_table)
_DISPATCH[MappingProxyType] = _reduce_mappingproxy


class _Pickler(pickle.Pickler):
    dispatch_table = _DISPATCH


# A global from __main__ (cloudpickle ships it by value), or any global from Ray (an
# ObjectRef or actor handle must go through Ray's serializer to be tracked): module names
# are pickled as short strings right before the global they name.
_UNSAFE = re.compile(rb"\x8c(?:\x08__main__|\x03ray\x94|[\x05-\xff]ray\.)")


def _by_value_modules() -> bool:
    from ray.cloudpickle import cloudpickle

    return bool(getattr(cloudpickle, "_PICKLE_BY_VALUE_MODULES", ()))


def dumps(obj: Any) -> Any:
    """``obj`` pickled to ``bytes`` when the C pickler ships it faithfully; else ``obj``
    itself, for Ray's serializer."""
    buffer = io.BytesIO()
    try:
        _Pickler(buffer, protocol=5).dump(obj)
    except Exception:
        return obj
    blob = buffer.getvalue()
    if _UNSAFE.search(blob) or _by_value_modules():
        return obj
    return blob


def loads(payload: Any) -> Any:
    """What ``dumps`` made, on the other side."""
    return pickle.loads(payload) if type(payload) is bytes else payload


_FIELDS: dict[tuple[type, str], tuple[str, ...]] = {}


def _fields(kind: type, skip: str) -> tuple[str, ...]:
    """The ``__init__`` fields of dataclass ``kind`` but ``skip`` (cached)."""
    names = _FIELDS.get((kind, skip))
    if names is None:
        names = _FIELDS[kind, skip] = tuple(
            f.name for f in dataclasses.fields(kind) if f.init and f.name != skip
        )
    return names


def _changed(state: State, base: State) -> tuple[tuple[str, Any], ...]:
    """``state``'s fields (``actions`` excepted) that are not ``base``'s very objects."""
    return tuple(
        (name, value)
        for name in _fields(type(state), "actions")
        if (value := getattr(state, name)) is not getattr(base, name)
    )


def path_delta(path: ActionPath, base: ActionPath, action: Action | None) -> Delta | None:
    """``path`` as ``(pop, steps)``: ``base`` ``pop`` steps shorter, then ``steps``
    appended; None when their common node is more than ``DELTA_DEPTH`` steps back or they
    share none. ``action``: the call's action, sent as ``SENT`` where the path holds it."""
    # id() is safe here: every node compared is alive (reachable from base or path).
    levels: dict[int, tuple[int, ActionPath]] = {}
    node: ActionPath | None = base
    for level in range(DELTA_DEPTH):
        if node is None:
            break
        levels[id(node)] = (level, node)
        node = node._parent
    added: list[ActionPath] = []
    node = path
    while node is not None and len(added) <= DELTA_DEPTH:
        hit = levels.get(id(node))
        if hit is not None and hit[1] is node:
            pop = hit[0]
            popped = _last(base, pop)
            added.reverse()
            steps = []
            for depth, new in enumerate(added):
                old = popped[depth] if depth < pop else None
                act: Any = new._action
                obs: Any = new._observation
                if old is not None and act is old._action:
                    act = SAME
                elif action is not None and act is action:
                    act = SENT
                if old is not None and obs is not None and obs is old._observation:
                    obs = SAME
                steps.append((act, obs, new._tokens, new._prefix))
            return pop, tuple(steps)
        if node._parent is None:  # a root of its own (reset, or a root re-tagged)
            return None
        added.append(node)
        node = node._parent
    return None


def _last(base: ActionPath, count: int) -> list[ActionPath]:
    """The ``count`` last nodes of ``base``, oldest first."""
    out = []
    node = base
    for _ in range(count):
        out.append(node)
        assert node._parent is not None
        node = node._parent
    out.reverse()
    return out


def apply_delta(base: ActionPath, delta: Delta, action: Action | None) -> ActionPath:
    """The history ``delta`` describes on ``base`` (sharing ``base``'s remaining nodes)."""
    pop, steps = delta
    popped = _last(base, pop)
    path = base
    for _ in range(pop):
        assert path._parent is not None
        path = path._parent
    for depth, (act, obs, tokens, prefix) in enumerate(steps):
        if type(act) is int:
            act = popped[depth]._action if act == SAME else action
        if type(obs) is int:
            obs = popped[depth]._observation
        path = path.append(act, obs, tokens=tokens)
        path._prefix = prefix
    return path


def encode_state(state: State, held: tuple[int, State] | None) -> Any:
    """``state`` as sent to an actor that holds ``held`` (key, state): ``(KNOWN, key)``,
    ``(PATCHED, key, changed fields, delta)`` or the state itself."""
    if held is None:
        return state
    key, base = held
    if state is base:
        return KNOWN, key
    if (
        type(state) is not type(base)
        or type(state.actions) is not ActionPath
        or type(base.actions) is not ActionPath
    ):
        return state
    delta = path_delta(state.actions, base.actions, None)
    if delta is None:
        return state
    return PATCHED, key, _changed(state, base), delta


class StateCache:
    """The actor's side: the last ``CACHE_SIZE`` states it exchanged with the driver."""

    def __init__(self) -> None:
        self._states: dict[int, State] = {}

    def remember(self, key: Hashable, value: Any) -> None:
        if isinstance(value, State) and isinstance(key, int):
            self._states[key] = value
            while len(self._states) > CACHE_SIZE:
                del self._states[next(iter(self._states))]

    def decode(self, wire: Any) -> State | None:
        """The state ``wire`` stands for; None when its key is not held (a miss)."""
        if type(wire) is not tuple:
            state: State = wire
            return state
        base = self._states.get(wire[1])
        if base is None or wire[0] == KNOWN:
            return base
        _, _, changed, delta = wire
        assert type(base.actions) is ActionPath
        path = apply_delta(base.actions, delta, None)
        return dataclasses.replace(base, **dict(changed), actions=path)


def encode_result(result: Any, state: State, action: Action) -> tuple[int, Any]:
    """A step's result as its reply: ``DELTA`` when it is a dataclass whose next state
    (of ``state``'s type) continues ``state``'s history, as ``State.advance`` makes it;
    else ``OK`` with the result itself."""
    after = getattr(result, "next_state", None)
    if (
        type(after) is not type(state)
        or not dataclasses.is_dataclass(result)
        or type(after.actions) is not ActionPath
        or type(state.actions) is not ActionPath
    ):
        return OK, result
    assert isinstance(after, State)
    delta = path_delta(after.actions, state.actions, action)
    if delta is None:
        return OK, result
    kind = type(result)
    fields = tuple((name, getattr(result, name)) for name in _fields(kind, "next_state"))
    return DELTA, (kind, fields, _changed(after, state), delta)


def decode_result(status: int, value: Any, state: State, action: Action) -> Any:
    """The step's result in the driver: a ``DELTA`` reply's next state is ``state`` with
    the changed fields and its own history extended (nodes shared, as after a local
    step)."""
    if status != DELTA:
        return value
    kind, fields, changed, delta = value
    assert type(state.actions) is ActionPath
    after = dataclasses.replace(
        state, **dict(changed), actions=apply_delta(state.actions, delta, action)
    )
    return kind(next_state=after, **dict(fields))
