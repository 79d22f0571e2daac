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
writer killed mid-line) and rejects any other malformed line by number. A run's step
journal (``StepJournal``, ``read_journal``) holds its in-flight rollouts' steps the same way.
"""

from __future__ import annotations

from ._decode import from_dict
from ._encode import to_dict
from ._journal import JournalKey, StepJournal, read_journal
from ._jsonl import JsonlWriter, iter_jsonl, read_jsonl, read_trajectories
from ._values import FORMAT_VERSION, SerializationError

__all__ = [
    "FORMAT_VERSION",
    "JournalKey",
    "JsonlWriter",
    "SerializationError",
    "StepJournal",
    "from_dict",
    "iter_jsonl",
    "read_journal",
    "read_jsonl",
    "read_trajectories",
    "to_dict",
]
