"""``llenvs-async export``: token-mode trajectories as a trainer's table (Parquet or HF dataset).

One row per trajectory: its token record (``input_ids``, ``loss_mask``, ``logprobs`` with
one entry per 1 in the mask, ``turns`` as ``[start, end]`` action spans,
``prompt_length``), the weight versions that sampled it (``policy_versions``; and
``token_versions``, aligned with ``logprobs``, null when the backend reported none),
per-step ``rewards``, ``reasoning`` (the text the reasoning parser split off each step's
completion, null where none; its tokens are in ``input_ids``) and ``parse_error`` (the
action format's verdict, null when the reply parsed), ``total_reward``, ``task``,
``stop_reason`` and ``error``
(``"Type: message"`` or null: a failed rollout is a row, never dropped).
``--format parquet`` writes ``DIR/trajectories.parquet`` (``datasets.load_dataset(
"parquet", data_dir=DIR)`` reads it); ``--format hf`` writes ``Dataset.save_to_disk(DIR)``.
Needs the ``export`` extra (pyarrow, datasets).

``--format atif`` writes every trajectory (token mode or not, failed ones too) as an ATIF
document in Harbor's trial layout, ``DIR/<task>__<rollout>/agent/trajectory.json``, which
Harbor's viewer and trace tools read; ``llenvs-async import-atif`` reads it back.
"""

from __future__ import annotations

from collections.abc import Sequence
from enum import StrEnum
from pathlib import Path
from typing import Annotated, Any

import typer

from .._extras import import_extra
from ..errors import MissingExtraError
from ..serialization import SerializationError, from_dict, read_jsonl
from ..types import Trajectory
from ._common import CliError, console

__all__ = ["ExportFormat", "export", "export_rows", "row", "token_versions", "write_rows"]

PARQUET_FILE = "trajectories.parquet"


class ExportFormat(StrEnum):
    parquet = "parquet"
    hf = "hf"
    atif = "atif"


def row(trajectory: Trajectory, *, rollout: int | None = None) -> dict[str, Any] | None:
    """A trajectory as one export row (None when it was not run in token mode)."""
    record = trajectory.token_record()
    if record is None:
        return None
    task = trajectory.initial_state.task
    error = trajectory.error
    return {
        "episode_id": trajectory.episode_id,
        "index": trajectory.index,
        "rollout": rollout,
        "task": None if task is None else str(task),
        "input_ids": list(record.input_ids),
        "loss_mask": list(record.loss_mask),
        "logprobs": None if record.logprobs is None else list(record.logprobs),
        "policy_versions": list(trajectory.policy_versions),
        "token_versions": token_versions(trajectory),
        "turns": [list(span) for span in record.turns],
        "prompt_length": record.prompt_length,
        "rewards": [float(t.reward) for t in trajectory.transitions],
        "reasoning": [
            None if t.completion is None else t.completion.reasoning for t in trajectory.transitions
        ],
        "parse_error": [_text_or_none(t.info.get("parse_error")) for t in trajectory.transitions],
        "total_reward": float(trajectory.total_reward),
        "num_steps": len(trajectory),
        "stop_reason": trajectory.stop_reason,
        "success": trajectory.success,
        "error": None if error is None else f"{error.type}: {error.message}",
    }


def _text_or_none(value: Any) -> str | None:
    return None if value is None else str(value)


def token_versions(trajectory: Trajectory) -> list[int] | None:
    """The weight version of each sampled token, in ``logprobs`` order (a request that ran
    across an update has several); None when a sampled step's completion has no version."""
    out: list[int] = []
    for t in trajectory.transitions:
        step = t.tokens
        if step is None or not step.sampled:
            continue
        c = t.completion
        if c is not None and c.version_spans:
            for version, start, end in c.version_spans:
                out += [version] * (end - start)
        elif c is not None and c.policy_version is not None:
            out += [c.policy_version] * len(step.action_ids)
        else:
            return None
    return out


def export_rows(path: Path, *, skip_missing: bool = False) -> tuple[list[dict[str, Any]], int]:
    """The rows of a JSONL file of trajectories (``run`` results or ``write_trajectory``
    records) and how many were skipped for lacking token ids."""
    if not path.is_file():
        raise CliError(f"results file {str(path)!r} does not exist")
    rows: list[dict[str, Any]] = []
    skipped = 0
    try:
        records = read_jsonl(path)
        for number, record in enumerate(records, start=1):
            data = record.get("trajectory")
            if not isinstance(data, dict):
                raise CliError(f"{path}: record {number} has no 'trajectory' object", code=1)
            trajectory = from_dict(Trajectory, data)
            key = record.get("key")
            rollout = key.get("rollout") if isinstance(key, dict) else None
            out = row(trajectory, rollout=rollout if isinstance(rollout, int) else None)
            if out is None:
                if not skip_missing:
                    raise CliError(
                        f"{path}: record {number} (episode {trajectory.episode_id!r}) has no "
                        "token ids: run it with token_mode=True, or pass --skip-missing",
                        code=1,
                    )
                skipped += 1
                continue
            rows.append(out)
    except SerializationError as exc:
        raise CliError(f"{path}: {exc}", code=1) from None
    return rows, skipped


def _schema() -> Any:
    import pyarrow as pa

    ids = pa.list_(pa.int64())
    return pa.schema(
        [
            ("episode_id", pa.string()),
            ("index", pa.int64()),
            ("rollout", pa.int64()),
            ("task", pa.string()),
            ("input_ids", ids),
            ("loss_mask", pa.list_(pa.int8())),
            ("logprobs", pa.list_(pa.float64())),
            ("policy_versions", ids),
            ("token_versions", ids),
            ("turns", pa.list_(ids)),
            ("prompt_length", pa.int64()),
            ("rewards", pa.list_(pa.float64())),
            ("reasoning", pa.list_(pa.string())),
            ("parse_error", pa.list_(pa.string())),
            ("total_reward", pa.float64()),
            ("num_steps", pa.int64()),
            ("stop_reason", pa.string()),
            ("success", pa.bool_()),
            ("error", pa.string()),
        ]
    )


def write_rows(rows: Sequence[dict[str, Any]], out: Path, fmt: ExportFormat) -> Path:
    """Write ``rows`` under ``out`` (created); returns the file or directory written."""
    try:
        pa = import_extra("pyarrow", extra="export", what="export", package="pyarrow")
        pq = import_extra("pyarrow.parquet", extra="export", what="export", package="pyarrow")
        datasets = None
        if fmt is not ExportFormat.parquet:
            datasets = import_extra("datasets", extra="export", what="--format hf",
                                    package="datasets")  # fmt: skip
    except MissingExtraError as exc:
        raise CliError(str(exc)) from exc
    table = pa.Table.from_pylist(list(rows), schema=_schema())
    out.mkdir(parents=True, exist_ok=True)
    if fmt is ExportFormat.parquet:
        target = out / PARQUET_FILE
        pq.write_table(table, target)
        return target
    assert datasets is not None
    datasets.Dataset(table).save_to_disk(str(out))
    return out


def export(
    results: Annotated[Path, typer.Argument(help="JSONL of trajectories (e.g. run's results).")],
    out: Annotated[Path, typer.Option("--output", "-o", help="Directory to write.")],
    fmt: Annotated[
        ExportFormat,
        typer.Option("--format", "-f", help="parquet, hf (save_to_disk) or atif (Harbor's)."),
    ] = ExportFormat.parquet,
    skip_missing: Annotated[
        bool, typer.Option("--skip-missing", help="Skip trajectories without token ids.")
    ] = False,
) -> None:
    """Export token-mode trajectories (input_ids, loss_mask, logprobs, rewards) for training,
    or every trajectory as ATIF (--format atif)."""
    if fmt is ExportFormat.atif:
        written = export_atif(results, out)
        console.print(f"exported {written} ATIF trajectories to {out}", markup=False)
        return
    rows, skipped = export_rows(results, skip_missing=skip_missing)
    if not rows:
        raise CliError(f"{results}: no token-mode trajectories to export", code=1)
    target = write_rows(rows, out, fmt)
    note = f" ({skipped} without token ids skipped)" if skipped else ""
    console.print(f"exported {len(rows)} trajectories to {target}{note}", markup=False)


def export_atif(path: Path, out: Path) -> int:
    """Every trajectory of a results JSONL as ``out/<task>__<rollout>/agent/trajectory.json``
    (ATIF; the record's source kept for the import); returns how many were written."""
    from ..serialization.atif import to_atif, write_atif

    if not path.is_file():
        raise CliError(f"results file {str(path)!r} does not exist")
    out.mkdir(parents=True, exist_ok=True)
    names: set[str] = {p.name for p in out.iterdir()}
    written = 0
    try:
        for number, record in enumerate(read_jsonl(path), start=1):
            data = record.get("trajectory")
            if not isinstance(data, dict):
                raise CliError(f"{path}: record {number} has no 'trajectory' object", code=1)
            trajectory = from_dict(Trajectory, data)
            raw_key = record.get("key")
            key: dict[str, Any] = raw_key if isinstance(raw_key, dict) else {}
            rollout = key.get("rollout")
            task = key.get("task", trajectory.initial_state.task)
            prompt = trajectory.info.get("system_prompt")
            document = to_atif(
                trajectory,
                system_prompt=prompt if isinstance(prompt, str) else None,
                source=record.get("source") if isinstance(record.get("source"), dict) else None,
                rollout=rollout if isinstance(rollout, int) else None,
            )
            name = _trial_name(task, rollout if isinstance(rollout, int) else number - 1, names)
            write_atif(document, out / name)
            written += 1
    except SerializationError as exc:
        raise CliError(f"{path}: {exc}", code=1) from None
    if not written:
        raise CliError(f"{path}: no trajectories to export", code=1)
    return written


def _trial_name(task: Any, rollout: int, taken: set[str]) -> str:
    """``<task short name>__<rollout>`` (as Harbor names trials), unique in ``taken``."""
    short = str(task).rsplit("/", 1)[-1] if task is not None else "trajectory"
    base = "".join(c if c.isalnum() or c in "-_." else "-" for c in short) + f"__{rollout}"
    name, n = base, 1
    while name in taken:
        n += 1
        name = f"{base}-{n}"
    taken.add(name)
    return name
