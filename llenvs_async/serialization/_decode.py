"""Dicts of JSON values decoded back into value types (``from_dict``), every bad field
named by where it sits."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import replace
from types import MappingProxyType
from typing import Any, TypeVar, cast

from ..types import (
    Action,
    ActionPath,
    Completion,
    ErrorInfo,
    History,
    HistoryStep,
    Observation,
    State,
    StopReason,
    TokenStep,
    ToolReply,
    Trajectory,
    Transition,
)
from ._values import (
    _EXTENDS,
    _PREFIX,
    _READABLE_FORMATS,
    _STOP_REASONS,
    FORMAT_VERSION,
    SerializationError,
    _decode_mapping,
    _decode_value,
    _prompts_before,
)

T = TypeVar("T")


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
    extra = _decode_mapping(data, "data", where)
    holder = data
    if "tool_replies" not in data and "tool_replies" in extra:  # files before 2026-12-07
        holder, where_replies = data["data"], f"{where}.data"
        extra = MappingProxyType({k: v for k, v in extra.items() if k != "tool_replies"})
    else:
        where_replies = where
    replies = tuple(
        ToolReply(
            tool_call_id=_field(r, "tool_call_id", str, f"{where_replies}.tool_replies[{i}]"),
            content=_field(r, "content", str, f"{where_replies}.tool_replies[{i}]"),
        )
        for i, r in enumerate(_objects(holder, "tool_replies", where_replies))
    )
    return Observation(text=_field(data, "text", str, where), data=extra, tool_replies=replies)


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
        reasoning=_opt(data, "reasoning", str, where),
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
        end_reward=_number(data, "end_reward", where) if "end_reward" in data else 0.0,
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
