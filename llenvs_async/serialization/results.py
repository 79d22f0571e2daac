"""What ``run`` records per trajectory (its (task, rollout) key, its source as JSON), outside
the CLI so every reader of results files (the CLI, the viewer) parses them the same way. What a
source is (a built-in environment, a Harbor dataset and its ``HarborSettings``) is the CLI's:
it reads a record's ``source`` with its own reader."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, Generic, TypeVar

from ..errors import LlenvsError
from ..types import Trajectory
from ._decode import from_dict

__all__ = [
    "ResultRecord",
    "ResultsError",
    "parse_result",
    "raw_source",
    "unique_by_key",
]

S = TypeVar("S")


class ResultsError(LlenvsError, ValueError):
    """A results record, or the source spec it records (a flag's value too), is not valid."""


Key = tuple[int | str, int]


@dataclass(frozen=True, slots=True, kw_only=True)
class ResultRecord(Generic[S]):
    """One trajectory of a results file, with the key and source ``run`` stored beside it
    (``source`` as its reader gave it: the JSON object by default)."""

    task: int | str
    rollout: int
    source: S
    trajectory: Trajectory

    @property
    def key(self) -> Key:
        return (self.task, self.rollout)


def raw_source(data: Any, where: str) -> Mapping[str, Any]:
    """A record's ``source`` as the JSON object it is (``ResultsError`` when it is none)."""
    if not isinstance(data, dict):
        raise ResultsError(f"{where}: no 'source' object (not written by `llenvs-async run`?)")
    return MappingProxyType(data)


def parse_result(
    record: Mapping[str, Any],
    where: str,
    read_source: Callable[[Any, str], S] = raw_source,  # type: ignore[assignment]
) -> ResultRecord[S]:
    """One results-file record, its source read by ``read_source``; ``where`` (file and
    record) starts every error message."""
    key = record.get("key")
    if not isinstance(key, dict) or not isinstance(key.get("rollout"), int):
        raise ResultsError(f"{where}: no 'key' with task and rollout (not a results file?)")
    task = key.get("task")
    if not isinstance(task, int | str):
        raise ResultsError(f"{where}: key.task must be an int or a string, got {task!r}")
    return ResultRecord(
        task=task,
        rollout=key["rollout"],
        source=read_source(record.get("source"), where),
        trajectory=from_dict(Trajectory, record.get("trajectory") or {}),
    )


def unique_by_key(records: Iterable[ResultRecord[S]]) -> list[ResultRecord[S]]:
    """One record per (task, rollout): the last one written wins (retries append)."""
    latest: dict[Key, ResultRecord[S]] = {}
    for record in records:
        latest.pop(record.key, None)
        latest[record.key] = record
    return list(latest.values())
