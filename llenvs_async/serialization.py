"""JSON-safe round trips of the value types, and append-only JSONL trajectory files.

``to_dict(obj)`` / ``from_dict(cls, data)`` are exact inverses for ``State``,
``Action``, ``Observation``, ``Completion``, ``Transition``, ``Trajectory`` and
``ErrorInfo``. Free-form fields (``hidden``, ``info``, ``Observation.data``,
``tool_calls``) must hold JSON values; tuples inside them are tagged so they come
back as tuples. A state's history (initial observation; per step the action, its
completion and the observation after) is written in full once per trajectory: a
successor state that extends it by its transition is marked ``"history": "+1"``, so a
file grows O(steps), not O(steps^2). Format 1 files (action prefixes only) still read.
Token mode adds, sharing the same structure: the root's start prompt (``"prefix"``), each
step's ``"tokens"`` (action and observation ids), and on a trajectory its derived
``"tokens"`` record (``input_ids``, ``loss_mask``, ``logprobs``, ``turns``) as plain
arrays for other readers; reading rebuilds the record from the steps.

A JSONL file holds one record (a JSON object) per line. ``JsonlWriter`` appends
and flushes one line per record; ``read_jsonl`` skips a truncated last line (a
writer killed mid-line) and rejects any other malformed line by number.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterator, Mapping
from dataclasses import replace
from pathlib import Path
from types import MappingProxyType, TracebackType
from typing import Any, TypeVar, cast, get_args

from .errors import LlenvsError
from .types import (
    Action,
    ActionPath,
    Completion,
    ErrorInfo,
    History,
    HistoryStep,
    Observation,
    State,
    StopReason,
    TokenRecord,
    TokenStep,
    Trajectory,
    Transition,
)

__all__ = [
    "FORMAT_VERSION",
    "JsonlWriter",
    "SerializationError",
    "from_dict",
    "iter_jsonl",
    "read_jsonl",
    "read_trajectories",
    "to_dict",
]

FORMAT_VERSION = 2
_READABLE_FORMATS = frozenset({1, 2})
_PREFIX = "prefix"  # Completion.prompt_token_ids = the token prefix of the state it came from
_EXTENDS = "+1"  # next_state.history = state.history + (transition's action, next observation)
_TUPLE = "__tuple__"
_STOP_REASONS: frozenset[str] = frozenset(get_args(StopReason))

T = TypeVar("T")
Serializable = Action | Observation | State | Completion | Transition | Trajectory | ErrorInfo


class SerializationError(LlenvsError, ValueError):
    """A value cannot be written as JSON, or a JSON document is not a valid encoding."""


# -- free-form JSON values ---------------------------------------------------------------


def _encode_value(value: Any, where: str) -> Any:
    if value is None or isinstance(value, bool | int | float | str):
        return value
    if isinstance(value, tuple):
        return {_TUPLE: [_encode_value(v, f"{where}[{i}]") for i, v in enumerate(value)]}
    if isinstance(value, list):
        return [_encode_value(v, f"{where}[{i}]") for i, v in enumerate(value)]
    if isinstance(value, Mapping):
        out: dict[str, Any] = {}
        for key, item in value.items():
            if not isinstance(key, str):
                raise SerializationError(
                    f"{where}: mapping key {key!r} is a {type(key).__name__}; JSON keys are strings"
                )
            if key == _TUPLE:
                raise SerializationError(f"{where}: the key {_TUPLE!r} is reserved")
            out[key] = _encode_value(item, f"{where}[{key!r}]")
        return out
    raise SerializationError(
        f"{where}: a {type(value).__name__} ({value!r:.60}) is not a JSON value "
        "(use None, bool, int, float, str, list, tuple or a str-keyed dict)"
    )


def _decode_value(value: Any) -> Any:
    if isinstance(value, list):
        return [_decode_value(v) for v in value]
    if isinstance(value, dict):
        if set(value) == {_TUPLE} and isinstance(value[_TUPLE], list):
            return tuple(_decode_value(v) for v in value[_TUPLE])
        return {k: _decode_value(v) for k, v in value.items()}
    return value


def _encode_mapping(value: Mapping[str, Any], where: str) -> dict[str, Any]:
    encoded = _encode_value(value, where)
    assert isinstance(encoded, dict)
    return encoded


def _decode_mapping(data: Mapping[str, Any], key: str, where: str) -> Mapping[str, Any]:
    raw = data.get(key, {})
    if not isinstance(raw, dict):
        raise SerializationError(f"{where}.{key}: expected an object, got {type(raw).__name__}")
    return MappingProxyType(_decode_value(raw)) if raw else MappingProxyType({})


# -- field readers -----------------------------------------------------------------------


def _field(data: Mapping[str, Any], key: str, kind: type | tuple[type, ...], where: str) -> Any:
    if key not in data:
        raise SerializationError(f"{where}: missing field {key!r}")
    value = data[key]
    kinds = kind if isinstance(kind, tuple) else (kind,)
    if not isinstance(value, kinds) or (isinstance(value, bool) and bool not in kinds):
        raise SerializationError(f"{where}.{key}: unexpected {type(value).__name__} {value!r:.60}")
    return value


def _opt(data: Mapping[str, Any], key: str, kind: type | tuple[type, ...], where: str) -> Any:
    return None if data.get(key) is None else _field(data, key, kind, where)


def _number(data: Mapping[str, Any], key: str, where: str) -> float:
    return float(_field(data, key, (int, float), where))


def _numbers(values: Any, kind: type, where: str) -> tuple[Any, ...]:
    """A list of ints (``kind=int``) or of numbers as floats (``kind=float``)."""
    allowed = int if kind is int else int | float
    if not isinstance(values, list) or not all(
        isinstance(v, allowed) and not isinstance(v, bool) for v in values
    ):
        raise SerializationError(f"{where}: expected a list of {kind.__name__}s")
    return tuple(kind(v) for v in values)


def _objects(data: Mapping[str, Any], key: str, where: str) -> list[Mapping[str, Any]]:
    values = data.get(key, [])
    if not isinstance(values, list) or not all(isinstance(v, dict) for v in values):
        raise SerializationError(f"{where}.{key}: expected a list of objects")
    return values


# -- encoders ----------------------------------------------------------------------------


def _action(action: Action) -> dict[str, Any]:
    out: dict[str, Any] = {"text": action.text}
    if action.tool_calls:
        out["tool_calls"] = [_encode_value(c, "Action.tool_calls") for c in action.tool_calls]
    return out


def _observation(obs: Observation) -> dict[str, Any]:
    out: dict[str, Any] = {"text": obs.text}
    if obs.data:
        out["data"] = _encode_mapping(obs.data, "Observation.data")
    return out


def _history(history: History, base: History | None = None) -> dict[str, Any]:
    """The history; with ``base`` (the previous state's, when this one shares its nodes)
    only the steps added to it."""
    steps = list(history)
    shared = base is not None and _shares(steps, history, base)
    start = len(base) if base is not None and shared else 0
    prompts = _prompts_before(steps, history.prefix)
    out: dict[str, Any] = {
        "initial": None if history.initial is None else _observation(history.initial),
        "extend" if shared else "steps": [
            _history_step(step, prompts[i]) for i, step in enumerate(steps) if i >= start
        ],
    }
    if not shared and history.prefix is not None:
        out["prefix"] = list(history.prefix)
    return out


def _shares(steps: list[HistoryStep], history: History, base: History) -> bool:
    """Whether ``history`` starts with ``base``'s steps, token ids included."""
    prefix = list(base)
    return (
        len(prefix) <= len(steps)
        and steps[: len(prefix)] == prefix
        and history.prefix == base.prefix
        and all(
            a.tokens == b.tokens and a.prefix == b.prefix
            for a, b in zip(steps, prefix, strict=False)
        )
    )


def _prompts_before(
    steps: list[HistoryStep], prefix: tuple[int, ...] | None
) -> list[tuple[int, ...] | None]:
    """Token mode: the prompt sent before each step (None where a step lacks its ids)."""
    out: list[tuple[int, ...] | None] = []
    for step in steps:
        out.append(prefix)
        if step.prefix is not None:
            prefix = step.prefix
        elif prefix is not None and step.tokens is not None:
            prefix = prefix + step.tokens.action_ids + step.tokens.observation_ids
        else:
            prefix = None
    return out


def _history_step(step: HistoryStep, prompt: tuple[int, ...] | None = None) -> dict[str, Any]:
    out: dict[str, Any] = {
        "action": _action(step.action),
        "observation": None if step.observation is None else _observation(step.observation),
        "completion": None if step.completion is None else _completion(step.completion, prompt),
    }
    if step.tokens is not None:
        out["tokens"] = _token_step(step.tokens)
    if step.prefix is not None:
        out["prefix"] = list(step.prefix)
    return out


def _token_step(step: TokenStep) -> dict[str, Any]:
    return {
        "action_ids": list(step.action_ids),
        "observation_ids": list(step.observation_ids),
        "sampled": step.sampled,
    }


def _token_record(record: TokenRecord) -> dict[str, Any]:
    return {
        "input_ids": list(record.input_ids),
        "loss_mask": list(record.loss_mask),
        "logprobs": None if record.logprobs is None else list(record.logprobs),
        "turns": [list(span) for span in record.turns],
        "prompt_length": record.prompt_length,
    }


def _extends(t: Transition) -> bool:
    """Whether ``t.next_state``'s history is ``t.state``'s plus exactly this transition."""
    history, last = t.next_state.history, t.next_state.history.last
    return (
        history.extends(t.state.history)
        and last is not None
        and last.action == t.action
        and last.completion == t.completion
        and last.observation == t.next_state.observation
        and last.tokens == t.tokens
        and last.prefix is None
    )


def _state(state: State, *, extends: bool = False, base: State | None = None) -> dict[str, Any]:
    if state.task is not None and not isinstance(state.task, int | str):
        raise SerializationError(f"State.task: expected int, str or None, got {state.task!r:.60}")
    out: dict[str, Any] = {
        "observation": _observation(state.observation),
        "task": state.task,
        "step": state.step,
        "episode_id": state.episode_id,
        "terminated": state.terminated,
        "truncated": state.truncated,
        "hidden": _encode_value(state.hidden, "State.hidden"),
        "seed": state.seed,
        "history": _EXTENDS
        if extends
        else _history(state.history, None if base is None else base.history),
    }
    if state.info:
        out["info"] = _encode_mapping(state.info, "State.info")
    return out


def _completion(c: Completion, prompt: tuple[int, ...] | None = None) -> dict[str, Any]:
    """A completion; its prompt ids are written as ``"prefix"`` when they are the token
    prefix of the state it was sampled from (token mode), so files stay O(tokens)."""
    same = prompt is not None and bool(c.prompt_token_ids) and c.prompt_token_ids == prompt
    return {
        "text": c.text,
        "token_ids": list(c.token_ids),
        "logprobs": None if c.logprobs is None else list(c.logprobs),
        "finish_reason": c.finish_reason,
        "prompt_token_ids": _PREFIX if same else list(c.prompt_token_ids),
        **(
            {"tool_calls": [_encode_value(t, "Completion.tool_calls") for t in c.tool_calls]}
            if c.tool_calls
            else {}
        ),
        **({} if c.policy_version is None else {"policy_version": c.policy_version}),
        **({"version_spans": [list(s) for s in c.version_spans]} if c.version_spans else {}),
    }


def _error(e: ErrorInfo) -> dict[str, Any]:
    out: dict[str, Any] = {
        "type": e.type,
        "message": e.message,
        "phase": e.phase,
        "traceback": e.traceback,
    }
    if e.details:
        out["details"] = _encode_mapping(e.details, "ErrorInfo.details")
    return out


def _reward(value: Any) -> float:
    """A reward as a JSON number: a bool or a numpy scalar is written as the float it means,
    so that every file the writer accepts can be read back.
    """
    if type(value) is float:
        return value
    try:
        return float(value)
    except (TypeError, ValueError):
        raise SerializationError(
            f"Transition.reward: a {type(value).__name__} ({value!r:.60}) is not a number"
        ) from None


def _transition(t: Transition, state: dict[str, Any] | None) -> dict[str, Any]:
    out: dict[str, Any] = {
        "action": _action(t.action),
        "next_state": _state(t.next_state, extends=_extends(t), base=t.state),
        "reward": _reward(t.reward),
        "completion": None if t.completion is None else _completion(t.completion, _prompt(t)),
    }
    if t.tokens is not None:
        out["tokens"] = _token_step(t.tokens)
    if state is not None:
        out["state"] = state
    if t.info:
        out["info"] = _encode_mapping(t.info, "Transition.info")
    return out


def _prompt(t: Transition) -> tuple[int, ...] | None:
    if t.tokens is None or t.completion is None or not t.completion.prompt_token_ids:
        return None
    path = t.state.actions
    return path.token_prefix() if isinstance(path, ActionPath) else None


def _trajectory(traj: Trajectory) -> dict[str, Any]:
    steps: list[dict[str, Any]] = []
    previous = traj.initial_state
    for t in traj.transitions:
        # A transition's state is normally the previous next_state: store it only if not.
        state = (
            None if t.state is previous or t.state == previous else _state(t.state, base=previous)
        )
        steps.append(_transition(t, state))
        previous = t.next_state
    out: dict[str, Any] = {
        "format": FORMAT_VERSION,
        "episode_id": traj.episode_id,
        "initial_state": _state(traj.initial_state),
        "transitions": steps,
        "error": None if traj.error is None else _error(traj.error),
        "index": traj.index,
        "stop_reason": traj.stop_reason,
    }
    if traj.info:
        out["info"] = _encode_mapping(traj.info, "Trajectory.info")
    record = traj.token_record()
    if record is not None:
        out["tokens"] = _token_record(record)
    return out


_ENCODERS: dict[type, Callable[[Any], dict[str, Any]]] = {
    Trajectory: _trajectory,
    Transition: lambda t: _transition(t, _state(t.state)),
    State: _state,
    Action: _action,
    Observation: _observation,
    Completion: _completion,
    ErrorInfo: _error,
}


def to_dict(obj: Serializable) -> dict[str, Any]:
    """Encode a value type as a dict of JSON values (``json.dumps``-ready)."""
    encoder = _ENCODERS.get(type(obj))
    if encoder is None:
        raise TypeError(f"to_dict() cannot encode a {type(obj).__name__}")
    return encoder(obj)


# -- decoders ----------------------------------------------------------------------------


def _read_action(data: Mapping[str, Any], where: str) -> Action:
    calls = data.get("tool_calls", [])
    if not isinstance(calls, list):
        raise SerializationError(f"{where}.tool_calls: expected a list")
    return Action(
        text=_field(data, "text", str, where), tool_calls=tuple(_decode_value(c) for c in calls)
    )


def _read_actions(values: list[Mapping[str, Any]], where: str) -> tuple[Action, ...]:
    return tuple(_read_action(a, f"{where}[{i}]") for i, a in enumerate(values))


def _read_observation(data: Mapping[str, Any], where: str) -> Observation:
    return Observation(
        text=_field(data, "text", str, where), data=_decode_mapping(data, "data", where)
    )


def _read_history(data: Any, where: str, previous: State | None) -> History:
    if not isinstance(data, dict):
        raise SerializationError(f"{where}: expected an object, got {type(data).__name__}")
    initial = data.get("initial")
    steps: list[HistoryStep] = []
    root = data.get("prefix")
    prefix = None if root is None else _numbers(root, int, f"{where}.prefix")
    if "extend" in data:
        if previous is None:
            raise SerializationError(f"{where}.extend: outside a trajectory")
        steps.extend(previous.history)
        prefix = previous.history.prefix
    prompt = _prompts_before([*steps, HistoryStep(action=Action(text=""))], prefix)[-1]
    for i, step in enumerate(_objects(data, "extend" if "extend" in data else "steps", where)):
        at = f"{where}.steps[{i}]"
        completion = step.get("completion")
        obs = step.get("observation")
        action = _read_action(_field(step, "action", dict, at), f"{at}.action")
        if completion is not None:
            read = _read_completion(completion, f"{at}.completion", prompt)
            action = replace(action, completion=read)
        ids = step.get("prefix")
        steps.append(
            HistoryStep(
                action=action,
                observation=None if obs is None else _read_observation(obs, f"{at}.observation"),
                tokens=_read_token_step(step.get("tokens"), f"{at}.tokens"),
                prefix=None if ids is None else _numbers(ids, int, f"{at}.prefix"),
            )
        )
        prompt = _prompts_before([steps[-1], HistoryStep(action=action)], prompt)[-1]
    first = None if initial is None else _read_observation(initial, f"{where}.initial")
    return History.of(steps, initial=first, prefix=prefix)


def _read_token_step(data: Any, where: str) -> TokenStep | None:
    if data is None:
        return None
    if not isinstance(data, dict):
        raise SerializationError(f"{where}: expected an object, got {type(data).__name__}")
    return TokenStep(
        action_ids=_numbers(_field(data, "action_ids", list, where), int, f"{where}.action_ids"),
        observation_ids=_numbers(
            _field(data, "observation_ids", list, where), int, f"{where}.observation_ids"
        ),
        sampled=_field(data, "sampled", bool, where),
    )


def _read_state(
    data: Mapping[str, Any],
    where: str,
    previous: State | None = None,
    via: Action | None = None,
    tokens: TokenStep | None = None,
) -> State:
    """A state; inside a trajectory ``previous`` is the state before it and ``via`` the
    transition's action (what ``"history": "+1"`` and format 1's ``actions_extend`` add to).
    """
    observation = _read_observation(_field(data, "observation", dict, where), where)
    raw = data.get("history")
    actions: Any = ()
    if raw == _EXTENDS:
        if previous is None or via is None:
            raise SerializationError(f"{where}.history: {_EXTENDS!r} outside a trajectory")
        history = History(previous.history.path.append(via, observation, tokens=tokens))
    elif raw is not None:
        history = _read_history(raw, f"{where}.history", previous)
    else:  # format 1: action prefixes only
        if "actions_extend" in data:
            base = () if previous is None else tuple(previous.actions)
            actions = base + _read_actions(_objects(data, "actions_extend", where), where)
        else:
            actions = _read_actions(_objects(data, "actions", where), f"{where}.actions")
        steps = [HistoryStep(action=a) for a in actions]
        history = History.of(steps, initial=None if actions else observation)
    return State(
        observation=observation,
        task=_opt(data, "task", (int, str), where),
        step=_field(data, "step", int, where),
        episode_id=_field(data, "episode_id", str, where),
        actions=history.path,
        terminated=_field(data, "terminated", bool, where),
        truncated=_field(data, "truncated", bool, where),
        hidden=_decode_value(data.get("hidden")),
        info=_decode_mapping(data, "info", where),
        seed=_opt(data, "seed", int, where),
    )


def _read_completion(
    data: Mapping[str, Any], where: str, prompt: tuple[int, ...] | None = None
) -> Completion:
    logprobs = data.get("logprobs")
    raw = data.get("prompt_token_ids", [])
    if raw == _PREFIX:
        if prompt is None:
            raise SerializationError(
                f"{where}.prompt_token_ids: {_PREFIX!r} but the state has no token prefix"
            )
        prompt_ids = prompt
    else:
        prompt_ids = _numbers(raw, int, f"{where}.prompt_token_ids")
    return Completion(
        text=_field(data, "text", str, where),
        token_ids=_numbers(data.get("token_ids", []), int, f"{where}.token_ids"),
        logprobs=None if logprobs is None else _numbers(logprobs, float, f"{where}.logprobs"),
        finish_reason=_opt(data, "finish_reason", str, where),
        prompt_token_ids=prompt_ids,
        tool_calls=tuple(_decode_value(c) for c in _list(data, "tool_calls", where)),
        policy_version=_opt(data, "policy_version", int, where),
        version_spans=_version_spans(data, where),
    )


def _version_spans(data: Mapping[str, Any], where: str) -> tuple[tuple[int, int, int], ...]:
    """``[[version, start, end], ...]``: each a list of three ints."""
    spans = []
    for i, span in enumerate(_list(data, "version_spans", where)):
        values = _numbers(span, int, f"{where}.version_spans[{i}]")
        if len(values) != 3:
            raise SerializationError(
                f"{where}.version_spans[{i}]: expected [version, start, end], got {span!r:.60}"
            )
        spans.append((values[0], values[1], values[2]))
    return tuple(spans)


def _list(data: Mapping[str, Any], key: str, where: str) -> list[Any]:
    values = data.get(key, [])
    if not isinstance(values, list):
        raise SerializationError(f"{where}.{key}: expected a list")
    return values


def _read_error(data: Mapping[str, Any], where: str) -> ErrorInfo:
    return ErrorInfo(
        type=_field(data, "type", str, where),
        message=_field(data, "message", str, where),
        phase=_field(data, "phase", str, where),
        traceback=_field(data, "traceback", str, where),
        details=_decode_mapping(data, "details", where),
    )


def _read_transition(data: Mapping[str, Any], where: str, previous: State | None) -> Transition:
    if "state" in data:
        state = _read_state(_field(data, "state", dict, where), f"{where}.state", previous)
    elif previous is not None:
        state = previous
    else:
        raise SerializationError(f"{where}: missing field 'state'")
    raw = data.get("completion")
    completion = None
    if raw is not None:
        assert isinstance(state.actions, ActionPath)
        completion = _read_completion(
            _field(data, "completion", dict, where), where, state.actions.token_prefix()
        )
    action = _read_action(_field(data, "action", dict, where), f"{where}.action")
    if completion is not None:
        action = replace(action, completion=completion)
    tokens = _read_token_step(data.get("tokens"), f"{where}.tokens")
    return Transition(
        state=state,
        action=action,
        next_state=_read_state(
            _field(data, "next_state", dict, where), f"{where}.next_state", state, action, tokens
        ),
        reward=_number(data, "reward", where),
        completion=completion,
        info=_decode_mapping(data, "info", where),
        tokens=tokens,
    )


def _read_trajectory(data: Mapping[str, Any], where: str) -> Trajectory:
    version = data.get("format", FORMAT_VERSION)
    if version not in _READABLE_FORMATS:
        raise SerializationError(f"{where}: unsupported format version {version!r}")
    initial = _read_state(_field(data, "initial_state", dict, where), f"{where}.initial_state")
    transitions: list[Transition] = []
    previous = initial
    for i, step in enumerate(_objects(data, "transitions", where)):
        transition = _read_transition(step, f"{where}.transitions[{i}]", previous)
        transitions.append(transition)
        previous = transition.next_state
    error = data.get("error")
    stop_reason = _field(data, "stop_reason", str, where)
    if stop_reason not in _STOP_REASONS:
        raise SerializationError(f"{where}.stop_reason: unknown value {stop_reason!r}")
    return Trajectory(
        episode_id=_field(data, "episode_id", str, where),
        initial_state=initial,
        transitions=tuple(transitions),
        error=None if error is None else _read_error(_field(data, "error", dict, where), where),
        index=_opt(data, "index", int, where),
        stop_reason=cast(StopReason, stop_reason),
        info=_decode_mapping(data, "info", where),
    )


_READERS: dict[type, Callable[[Mapping[str, Any], str], Any]] = {
    Trajectory: _read_trajectory,
    Transition: lambda d, w: _read_transition(d, w, None),
    State: _read_state,
    Action: _read_action,
    Observation: _read_observation,
    Completion: _read_completion,
    ErrorInfo: _read_error,
}


def from_dict(cls: type[T], data: Mapping[str, Any]) -> T:
    """Decode what ``to_dict`` produced back into an equal ``cls`` instance."""
    reader = _READERS.get(cls)
    if reader is None:
        raise TypeError(f"from_dict() cannot decode a {getattr(cls, '__name__', cls)!r}")
    if not isinstance(data, Mapping):
        raise SerializationError(f"{cls.__name__}: expected an object, got {type(data).__name__}")
    return cast(T, reader(data, cls.__name__))


# -- JSONL files ---------------------------------------------------------------------------


def _dumps(record: Mapping[str, Any]) -> str:
    return json.dumps(record, ensure_ascii=False, separators=(",", ":"))


class JsonlWriter:
    """Appends one JSON record per line to ``path``, flushing each line as it is written.

    Opening repairs a truncated last line left by a killed writer, so appending is safe.
    """

    def __init__(self, path: str | os.PathLike[str], *, fsync: bool = False) -> None:
        self.path = Path(path)
        self.fsync = fsync
        _repair_tail(self.path)
        self._file = self.path.open("a", encoding="utf-8")
        self.written = 0

    def write(self, record: Mapping[str, Any]) -> None:
        """Write ``record`` as one line and flush it to the OS (and disk with ``fsync``)."""
        line = _dumps(record) + "\n"
        self._file.write(line)
        self._file.flush()
        if self.fsync:
            os.fsync(self._file.fileno())
        self.written += 1

    def write_trajectory(self, trajectory: Trajectory, **fields: Any) -> None:
        """Write ``{"trajectory": to_dict(trajectory), **fields}`` (fields are JSON values)."""
        record = {k: _encode_value(v, k) for k, v in fields.items()}
        record["trajectory"] = to_dict(trajectory)
        self.write(record)

    def close(self) -> None:
        self._file.close()

    def __enter__(self) -> JsonlWriter:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


def _repair_tail(path: Path) -> None:
    """Cut an unterminated last line that is not valid JSON; terminate one that is."""
    if not path.exists():
        return
    with path.open("rb+") as f:
        end = f.seek(0, os.SEEK_END)
        if end == 0:
            return
        f.seek(end - 1)
        if f.read(1) == b"\n":
            return
        start, pos = 0, end
        while pos > 0:  # scan back, chunk by chunk, for the last newline
            size = min(1 << 16, pos)
            pos -= size
            f.seek(pos)
            cut = f.read(size).rfind(b"\n")
            if cut >= 0:
                start = pos + cut + 1
                break
        f.seek(start)
        try:
            json.loads(f.read())
        except ValueError:
            f.truncate(start)
        else:
            f.write(b"\n")


def _iter_lines(path: Path) -> Iterator[tuple[int, dict[str, Any]]]:
    # Bytes, decoded line by line: a writer killed mid-line may have cut a multi-byte
    # UTF-8 character, which must count as a truncated last line, not fail the file.
    data = path.read_bytes()
    lines = data.split(b"\n")
    complete = data.endswith(b"\n")
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line.decode("utf-8"))
        except ValueError as exc:  # UnicodeDecodeError included
            if number == len(lines) and not complete:
                return  # a truncated last line: the writer was killed mid-write
            raise SerializationError(f"{path}:{number}: malformed JSON line ({exc})") from None
        if not isinstance(record, dict):
            raise SerializationError(f"{path}:{number}: expected a JSON object per line")
        yield number, record


def iter_jsonl(path: str | os.PathLike[str]) -> Iterator[tuple[int, dict[str, Any]]]:
    """``(line number, record)`` of every record of a JSONL file, ignoring a truncated last
    line, for readers whose own errors name the line."""
    return _iter_lines(Path(path))


def read_jsonl(path: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """Every record of a JSONL file, ignoring a truncated last line."""
    return [record for _, record in _iter_lines(Path(path))]


def read_trajectories(path: str | os.PathLike[str]) -> list[Trajectory]:
    """The ``trajectory`` of every record written by ``JsonlWriter.write_trajectory``."""
    source = Path(path)
    out: list[Trajectory] = []
    for number, record in _iter_lines(source):
        data = record.get("trajectory")
        if not isinstance(data, dict):
            raise SerializationError(f"{source}:{number}: record has no 'trajectory' object")
        out.append(_read_trajectory(data, f"{source}:{number}"))
    return out
