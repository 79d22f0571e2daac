"""What encoding and decoding share: the format's constants, its error, free-form JSON values
(tuples tagged) and the token-mode prompt before each step."""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Any, get_args

from ..errors import LlenvsError
from ..types import HistoryStep, StopReason

FORMAT_VERSION = 2
_READABLE_FORMATS = frozenset({1, 2})
_PREFIX = "prefix"  # Completion.prompt_token_ids = the token prefix of the state it came from
_EXTENDS = "+1"  # next_state.history = state.history + (transition's action, next observation)
_TUPLE = "__tuple__"
_STOP_REASONS: frozenset[str] = frozenset(get_args(StopReason))


class SerializationError(LlenvsError, ValueError):
    """A value cannot be written as JSON, or a JSON document is not a valid encoding."""


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
