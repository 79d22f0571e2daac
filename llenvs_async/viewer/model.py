"""Results and estimate files read, checked and turned into the JSON document the page shows.

A file is a results JSONL (``llenvs-async run``: one record per line, a truncated last line
ignored as everywhere), a ``q-values --json`` list, or the ``q-values --trajectories`` JSONL
(results records that name their estimate's ``id``: the rollouts behind it, opened from the
value tree, not listed as runs), or ATIF trajectories (``export --format atif``, or any Harbor
agent's ``agent/trajectory.json``): a file, or a directory searched for them. Anything else
fails with ONE ``ViewerInputError`` naming the file, the line (JSONL) or item (estimates), and
the field.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import MappingProxyType
from typing import Any

from ..errors import LlenvsError
from ..serialization import SerializationError, iter_jsonl
from ..serialization.results import (
    ResultRecord,
    ResultsError,
    parse_result,
    unique_by_key,
)
from ..types import Trajectory

__all__ = ["ViewerInputError", "load_files", "trajectory_detail"]

Record = ResultRecord[Mapping[str, Any]]  # the viewer shows no source: it keeps its JSON
_NO_SOURCE: Mapping[str, Any] = MappingProxyType({})

Json = dict[str, Any]
_HINT = (
    "(expected a results JSONL of `llenvs-async run`, the JSON of `q-values --json` "
    "or ATIF trajectories)"
)
# Timing keys: seconds are ``*_sec`` (the project's convention: Docker/Harbor steps record
# ``duration_sec``, a restored state ``replay_sec``); a start time is ``started_at``.
_TIME_SUFFIX = "_sec"
_TIME_KEYS = ("started_at",)


class ViewerInputError(LlenvsError, ValueError):
    """A file given to the viewer is missing, truncated or not one it can show."""


def load_files(paths: Sequence[Path]) -> tuple[Json, list[Json]]:
    """The page's document (files, run rows, value-tree nodes) and every trajectory's
    detail, indexed by the run rows' ``id``."""
    files: list[Json] = []
    runs: list[Json] = []
    details: list[Json] = []
    estimates: list[tuple[int, list[Json]]] = []
    behind: dict[str, list[Json]] = {}  # estimate id -> its rollouts' rows, in file order
    for index, path in enumerate(paths):
        kind, items = _read(path)
        files.append({"path": str(path), "kind": kind, "records": len(items)})
        if kind == "values":
            estimates.append((index, items))
            continue
        estimate_of = {r.key: e for r, e in items}  # the last written wins, as for records
        for record in unique_by_key(r for r, _ in items):
            estimate = estimate_of[record.key]
            row = {**_run_row(len(details), index, record), "estimate": estimate}
            if estimate is None:
                runs.append(row)
            else:  # the rollout's position among its estimate's, as q-values wrote them
                row["sample"] = len(behind.setdefault(estimate, []))
                behind[estimate].append(row)
            details.append(trajectory_detail(row, record.trajectory))
    ran = [details[row["id"]] for row in runs]
    values = [node for index, rows in estimates for node in _value_nodes(index, rows, ran)]
    matched = _attach_rollouts(values, behind)
    for f in files:
        if f["kind"] == "rollouts":
            f["unmatched"] = 0
    for estimate, rows in behind.items():
        for row in rows if estimate not in matched else ():
            files[row["file"]]["unmatched"] += 1
    return {"files": files, "runs": runs, "values": values}, details


# -- reading -----------------------------------------------------------------------------


def _read(path: Path) -> tuple[str, list[Any]]:
    if not path.exists():
        raise ViewerInputError(f"{path}: no such file", path=str(path))
    if path.is_dir():
        return "atif", _read_atif(path)
    if not path.is_file():
        raise ViewerInputError(f"{path}: not a file", path=str(path))
    head = _first_char(path)
    if head == "":
        raise ViewerInputError(f"{path}: the file is empty {_HINT}", path=str(path))
    if head == "[":
        return "values", _read_estimates(path)
    if head == "{" and _is_atif(path):
        return "atif", _read_atif(path)
    if head == "{":
        records = _read_results(path)
        return ("run" if records[0][1] is None else "rollouts"), records
    raise ViewerInputError(f"{path}: starts with {head!r} {_HINT}", path=str(path))


def _is_atif(path: Path) -> bool:
    """One JSON object (not a JSONL) naming an ATIF ``schema_version``."""
    with path.open("rb") as f:
        head = f.read(4096)
    if b'"schema_version"' not in head or b"ATIF-" not in head:
        return False
    try:
        data = json.loads(path.read_bytes())
    except ValueError:
        return False
    return isinstance(data, dict) and str(data.get("schema_version", "")).startswith("ATIF-")


def _read_atif(path: Path) -> list[tuple[Record, str | None]]:
    """ATIF trajectories as run records: the task they name, else their trial's directory
    (``<trial>/agent/trajectory.json``) or file name; rollouts numbered per task."""
    from ..serialization.atif import AtifError, find_atif_files, from_atif, read_atif

    out: list[tuple[Record, str | None]] = []
    counts: dict[int | str, int] = {}
    try:
        for file in find_atif_files(path):
            trajectory = from_atif(read_atif(file), skip_unknown_tools=True)
            trial = file.parent.parent.name if file.parent.name == "agent" else file.stem
            task = trajectory.initial_state.task
            key: int | str = trial if task is None else task
            counts[key] = counts.get(key, -1) + 1
            # The unparametrised class: an alias's call would set __orig_class__ on a slotted,
            # frozen instance (TypeError).
            record: Record = ResultRecord(
                task=key, rollout=counts[key], source=_NO_SOURCE, trajectory=trajectory
            )
            out.append((record, None))
    except AtifError as exc:
        raise ViewerInputError(str(exc), path=str(path)) from None
    if not out:
        raise ViewerInputError(f"{path}: no ATIF trajectory found {_HINT}", path=str(path))
    return out


def _first_char(path: Path) -> str:
    with path.open("rb") as f:
        chunk = f.read(4096).lstrip()
    return chunk[:1].decode("latin-1")


def _read_results(path: Path) -> list[tuple[Record, str | None]]:
    """Each record with the id of the estimate it is a rollout of (None: a run's record)."""
    out: list[tuple[Record, str | None]] = []
    number = 0
    try:
        for number, record in iter_jsonl(path):
            where = f"{path}:{number}"
            estimate = record.get("estimate")
            if (estimate is not None and not isinstance(estimate, str)) or (
                out and (estimate is None) != (out[0][1] is None)
            ):
                message = f"{where}.estimate: unexpected value {estimate!r:.60} (every record of "
                message += "a `q-values --trajectories` file names its estimate, no run's does)"
                raise ViewerInputError(message, path=str(path), line=number, field="estimate")
            try:
                out.append((parse_result(record, where), estimate))
            except SerializationError as exc:
                raise ViewerInputError(f"{where}: {exc}", path=str(path), line=number) from None
    except ResultsError as exc:
        raise ViewerInputError(str(exc), path=str(path), line=number) from None
    except SerializationError as exc:
        if _is_one_json_object(path):
            message = f"{path}: one JSON object over several lines, not a results JSONL {_HINT}"
            raise ViewerInputError(message, path=str(path)) from None
        raise ViewerInputError(str(exc), path=str(path)) from None
    if not out:
        raise ViewerInputError(f"{path}: no complete record {_HINT}", path=str(path))
    return out


def _is_one_json_object(path: Path) -> bool:
    try:
        return isinstance(json.loads(path.read_bytes()), dict)
    except ValueError:
        return False


def _read_estimates(path: Path) -> list[Any]:
    try:
        data = json.loads(path.read_bytes())
    except ValueError as exc:
        where = f"line {exc.lineno}" if isinstance(exc, json.JSONDecodeError) else "decoding"
        message = f"{path}: invalid JSON at {where} (truncated?): {exc}"
        raise ViewerInputError(message, path=str(path)) from None
    assert isinstance(data, list)
    if not data:
        raise ViewerInputError(f"{path}: an empty list, no estimates {_HINT}", path=str(path))
    return [_estimate(item, f"{path}: item {i}") for i, item in enumerate(data)]


_NUMBER = (int, float)


def _estimate(item: Any, where: str) -> Json:
    """One row of ``q-values --json`` checked field by field."""
    if not isinstance(item, dict):
        raise ViewerInputError(f"{where}: expected an object, got {type(item).__name__} {_HINT}")

    def get(key: str, kinds: tuple[type, ...], optional: bool = False) -> Any:
        if key not in item:
            raise ViewerInputError(f"{where}: missing field {key!r} {_HINT}", field=key)
        value = item[key]
        if (value is None and optional) or (
            isinstance(value, kinds) and not isinstance(value, bool)
        ):
            return value
        raise ViewerInputError(f"{where}.{key}: unexpected value {value!r:.60} {_HINT}", field=key)

    kind = get("kind", (str,))
    if kind not in ("V", "Q"):
        raise ViewerInputError(f"{where}.kind: expected 'V' or 'Q', got {kind!r}", field="kind")
    prefix, returns = get("prefix", (list,)), get("returns", (list,))
    if not all(isinstance(a, str) for a in prefix):
        raise ViewerInputError(f"{where}.prefix: expected a list of action texts", field="prefix")
    if not all(isinstance(r, _NUMBER) and not isinstance(r, bool) for r in returns):
        raise ViewerInputError(f"{where}.returns: expected a list of numbers", field="returns")
    bounds = get("reward_range", (list,), optional=True)
    for key in ("id", "trajectories"):  # added with `q-values --trajectories`: optional
        if not isinstance(item.get(key), str | None):
            raise ViewerInputError(f"{where}.{key}: expected a string, got {item[key]!r:.60}")
    if bounds is not None and not (
        len(bounds) == 2 and all(b is None or isinstance(b, _NUMBER) for b in bounds)
    ):
        raise ViewerInputError(f"{where}.reward_range: expected [lo, hi]", field="reward_range")
    return {
        "task": get("task", (int, str)),
        "step": get("step", (int,)),
        "prefix": prefix,
        "kind": kind,
        "action": get("action", (str,), optional=kind == "V"),
        "mean": get("mean", _NUMBER, optional=True),
        "ci_low": get("ci_low", _NUMBER, optional=True),
        "ci_high": get("ci_high", _NUMBER, optional=True),
        "stderr": get("stderr", _NUMBER, optional=True),
        "n": get("n", (int,)),
        "failed": get("failed", (int,)),
        "returns": returns,
        "method": get("method", (str,)),
        "reward_range": bounds,
        "id": item.get("id"),
        "trajectories": item.get("trajectories"),
    }


# -- the document ------------------------------------------------------------------------


def _run_row(ident: int, file: int, record: Record) -> Json:
    t = record.trajectory
    error = t.error
    return {
        "id": ident,
        "file": file,
        "task": record.task,
        "rollout": record.rollout,
        "steps": len(t),
        "return": _finite(t.total_reward),
        "success": t.success,
        "stop": t.stop_reason,
        "error": None if error is None else {"type": error.type, "phase": error.phase},
    }


def trajectory_detail(row: Mapping[str, Any], t: Trajectory) -> Json:
    """Everything the trajectory page shows, as JSON values."""
    record = t.token_record()
    steps = []
    start = t.initial_state
    for i, tr in enumerate(t.transitions):
        c = tr.completion
        # token mode: turn i's prompt is input_ids[:turns[i][0]] even when c kept no prompt ids
        prompt = record.turns[i][0] if record is not None else 0
        steps.append(
            {
                "step": tr.state.step,
                "action": tr.action.text,
                "tool_calls": _jsonable(tr.action.tool_calls),
                "observation": tr.next_state.observation.text,
                "reward": _finite(tr.reward),
                "terminated": tr.next_state.terminated,
                "truncated": tr.next_state.truncated,
                "parse_error": tr.info.get("parse_error"),
                "completion": None
                if c is None
                else {
                    "finish_reason": c.finish_reason,
                    "reasoning": c.reasoning,
                    "tokens": len(c.token_ids),
                    "prompt_tokens": len(c.prompt_token_ids) or prompt,
                    "policy_versions": list(c.policy_versions),
                },
                "info": _jsonable(tr.info),
                "timing": _timing(tr.info),
            }
        )
    info = _jsonable(t.info)
    return {
        **row,
        "episode_id": t.episode_id,
        "start_step": start.step,
        "prefix": [a.text for a in start.actions],
        "timing": {**_timing(t.info), **_timing(start.info)},
        "system_prompt": info.get("system_prompt") if isinstance(info, dict) else None,
        "initial": t.initial_state.observation.text,
        "steps": steps,
        "error": None
        if t.error is None
        else {
            "type": t.error.type,
            "phase": t.error.phase,
            "message": t.error.message,
            "traceback": t.error.traceback,
            "details": _jsonable(t.error.details),
        },
        "info": info,
        "tokens": None
        if record is None
        else {
            "input_ids": list(record.input_ids),
            "loss_mask": list(record.loss_mask),
            "turns": [list(span) for span in record.turns],
            "prompt_length": record.prompt_length,
            "sampled": sum(record.loss_mask),
        },
    }


def _value_nodes(file: int, rows: list[Json], details: list[Json]) -> list[Json]:
    """One node per estimated state (task, step, action prefix): V(s) and each Q(s, a), with
    the loaded runs' trajectories that pass through the state (and which action each took)."""
    nodes: dict[tuple[str, int, str], Json] = {}
    for row in rows:
        key = (json.dumps(row["task"]), row["step"], json.dumps(row["prefix"]))
        node = nodes.setdefault(
            key,
            {"file": file, "task": row["task"], "step": row["step"], "prefix": row["prefix"],
             "v": None, "q": [], "through": []},
        )  # fmt: skip
        estimate = {k: row[k] for k in row if k not in ("task", "step", "prefix", "kind")}
        if row["kind"] == "V":
            node["v"] = estimate
        else:
            node["q"].append(estimate)
    for node in nodes.values():
        step, prefix = node["step"], node["prefix"]
        for d in details:
            actions = d["prefix"] + [s["action"] for s in d["steps"]]  # from reset on
            if d["task"] == node["task"] and len(actions) > step and actions[:step] == prefix:
                node["through"].append({"id": d["id"], "action": actions[step]})
    return list(nodes.values())


def _attach_rollouts(values: list[Json], behind: Mapping[str, list[Json]]) -> set[str]:
    """Each estimate's ``rollouts`` (None: none loaded) from the rollouts files' rows; the
    ids that found their estimate."""
    matched: set[str] = set()
    for node in values:
        for estimate in filter(None, (node["v"], *node["q"])):
            rows = behind.get(estimate["id"]) if estimate["id"] is not None else None
            estimate["rollouts"] = None if rows is None else [_rollout(r) for r in rows]
            if rows is not None:
                matched.add(estimate["id"])
    return matched


def _rollout(row: Json) -> Json:
    return {k: row[k] for k in ("id", "sample", "steps", "return", "success", "stop", "error")}


def _timing(info: Mapping[str, Any]) -> Json:
    """The time-like entries of an ``info``: ``*_sec`` numbers and ``started_at``."""
    return {
        k: _jsonable(v)
        for k, v in info.items()
        if (k.endswith(_TIME_SUFFIX) and isinstance(v, int | float) and not isinstance(v, bool))
        or (k in _TIME_KEYS and isinstance(v, str | int | float))
    }


def _finite(x: float) -> float | None:
    return x if math.isfinite(x) else None


def _jsonable(value: Any) -> Any:
    """Free-form fields (info, tool calls) as plain JSON (tuples as lists, odd values as text)."""
    if value is None or isinstance(value, bool | int | str):
        return value
    if isinstance(value, float):
        return _finite(value)
    if isinstance(value, Mapping):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_jsonable(v) for v in value]
    return repr(value)
