"""``llenvs-async import-atif``: ATIF trajectories (ours, or any Harbor agent's) as a results
JSONL, so ``q-values`` (and ``view``, ``export``) run from their states.

A document ``export --format atif`` wrote comes back exactly, with the source it recorded.
Another agent's needs the Harbor dataset its task is in (``--dataset``, a local directory)
and the task (``--task``, else the trial's ``result.json``/``config.json`` next to
``agent/trajectory.json``): every state then carries that task's identity, so a restore
replays its commands in a fresh container of the task.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any

import typer

from ..serialization import JsonlWriter
from ..types import Trajectory
from ._common import CliError, console
from ._options import harbor_settings
from ._results import record_fields
from ._source_types import SourceSpec

__all__ = ["import_atif", "task_identity"]


def import_atif(
    paths: Annotated[
        list[Path],
        typer.Argument(help="ATIF files, or directories searched for them (Harbor trial dirs)."),
    ],
    out: Annotated[Path, typer.Option("--output", "-o", help="Results JSONL to write.")],
    dataset: Annotated[
        str | None,
        typer.Option("--dataset", help="The Harbor dataset directory the tasks are in."),
    ] = None,
    task: Annotated[
        str | None, typer.Option("--task", "-t", help="The task every trajectory ran.")
    ] = None,
    max_steps: Annotated[
        int | None, typer.Option("--max-steps", help="Steps per episode for later rollouts.")
    ] = None,
    action_format: Annotated[
        str, typer.Option("--action-format", help="text or tools, for later rollouts.")
    ] = "text",
    skip_unknown_tools: Annotated[
        bool,
        typer.Option(
            "--skip-unknown-tools",
            help="Import calls that are not shell commands (file editors, ...) as nothing; "
            "restored states may then differ from the original.",
        ),
    ] = False,
) -> None:
    """Import ATIF trajectories as a results file that q-values, view and export read."""
    from ..serialization.atif import EXTRA_KEY, AtifError, from_atif, iter_atif

    if not out.parent.is_dir():
        raise CliError(f"--output {str(out)!r}: directory {str(out.parent)!r} does not exist")
    harbor = harbor_settings(action_format=action_format)
    given = None if dataset is None else SourceSpec.from_flags(dataset, None, max_steps, harbor)
    rollouts: dict[int | str | None, int] = {}
    records: list[tuple[Trajectory, int | str, int, SourceSpec]] = []
    try:
        for path, document in iter_atif(paths):
            extra = document.get("extra")
            ours = extra.get(EXTRA_KEY) if isinstance(extra, Mapping) else None
            if isinstance(ours, Mapping) and ours.get("format") == 1:
                trajectory = from_atif(document)
                spec = given or _recorded_source(ours, path)
            else:
                if given is None:
                    raise CliError(
                        f"{path}: another agent's trajectory: pass --dataset DIR (the Harbor "
                        "dataset its task is in)"
                    )
                name = task or _trial_task(path)
                if name is None:
                    raise CliError(f"{path}: which task? pass --task NAME (no trial result.json)")
                full, hidden = task_identity(given, name)
                trajectory = from_atif(
                    document, task=full, hidden=hidden, skip_unknown_tools=skip_unknown_tools
                )
                spec = given
            key = trajectory.initial_state.task
            if key is None:
                raise CliError(f"{path}: the trajectory names no task; pass --task NAME")
            rollout = rollouts.get(key, 0)
            rollouts[key] = rollout + 1
            records.append((trajectory, key, rollout, spec))
    except AtifError as exc:
        raise CliError(str(exc), code=1) from None
    if not records:
        raise CliError(f"no ATIF trajectory found in {', '.join(map(str, paths))}", code=1)
    out.unlink(missing_ok=True)
    with JsonlWriter(out) as writer:
        for trajectory, key, rollout, spec in records:
            writer.write_trajectory(trajectory, **record_fields(key, rollout, spec))
    console.print(f"imported {len(records)} trajectories to {out}", markup=False)


def _recorded_source(ours: Mapping[str, Any], path: Path) -> SourceSpec:
    source = ours.get("source")
    if source is None:
        raise CliError(f"{path}: no source recorded (exported without one): pass --dataset DIR")
    return SourceSpec.from_json(source, str(path))


def _trial_task(path: Path) -> str | None:
    """The task of a Harbor trial's ``agent/trajectory.json``: ``result.json``'s
    ``task_name``, else the directory of ``config.json``'s ``task.path``."""
    trial = path.parent.parent
    for name, pick in (("result.json", ("task_name",)), ("config.json", ("task", "path"))):
        try:
            value: Any = json.loads((trial / name).read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        for key in pick:
            value = value.get(key) if isinstance(value, dict) else None
        if isinstance(value, str) and value:
            return value.rstrip("/").rsplit("/", 1)[-1] if name == "config.json" else value
    return None


def task_identity(spec: SourceSpec, name: str) -> tuple[str, dict[str, Any]]:
    """A task's full name in ``spec``'s local dataset and the ``hidden`` of its states as
    ``HarborEnvironment`` keeps it (the whole time budget left: ATIF records none used)."""
    from ..adapters.harbor import load_local_dataset
    from ..errors import TaskLoadError

    assert spec.dataset is not None
    try:
        harbor_dataset = load_local_dataset(spec.dataset)
        index = harbor_dataset.index_of(name)
    except (KeyError, TaskLoadError) as exc:
        raise CliError(f"--task {name!r}: not a task of {spec.dataset} ({exc})") from None
    found = harbor_dataset.tasks[index]
    if found.steps:
        raise CliError(
            f"task {found.name!r} is multi-step: importing it from ATIF is not supported"
        )
    budget = found.config.agent.timeout_sec
    hidden = {
        "task_name": found.name,
        "task_index": index,
        "dataset": harbor_dataset.spec,
        "budget_sec": budget,
        "budget_used_sec": 0.0,
        "budget_left_sec": budget,
    }
    return found.name, hidden
