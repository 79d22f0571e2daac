"""``llenvs-async validate-replay``: does replaying a prefix reproduce the container state?"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

import typer

from . import _options as opt
from ._common import CliError, console, run_async
from ._results import load_results, unique_by_key
from ._sources import SourceSpec, TaskRef, select_tasks

__all__ = ["validate_replay"]


def validate_replay(
    dataset: Annotated[str, typer.Argument(help="Harbor dataset: a directory or name@version.")],
    task: Annotated[str, typer.Option("--task", "-t", help="Task name or index.")],
    command: Annotated[
        list[str] | None,
        typer.Option("--command", "-x", help="A replayed command (default: the task's solution)."),
    ] = None,
    results: Annotated[
        Path | None, typer.Option("--from-results", help="Replay a trajectory from this file.")
    ] = None,
    rollout: Annotated[int, typer.Option("--rollout", help="With --from-results.")] = 0,
    probe: Annotated[
        list[str] | None, typer.Option("--probe", "-p", help="Read-only probe command.")
    ] = None,
    trials: Annotated[int, typer.Option("--trials", help="Independent replays.")] = 3,
    max_steps: opt.MaxStepsOpt = None,
    json_out: Annotated[Path | None, typer.Option("--json", help="Write the report.")] = None,
) -> None:
    """Replay a prefix in fresh containers and compare probes; exit 1 when inconsistent."""
    spec = SourceSpec.from_flags(dataset, None, max_steps)
    if trials < 2:
        raise CliError("--trials must be >= 2 to compare replays")
    if command and results is not None:
        raise CliError("give --command or --from-results, not both")
    commands = tuple(command or ())
    if results is not None:
        commands = _from_results(results, task, rollout)
    report = run_async(lambda: _validate(spec, task, commands, tuple(probe or ()), trials))
    if json_out is not None:
        json_out.write_text(json.dumps(report, indent=1))
    verdict = "[green]consistent[/]" if report["consistent"] else "[red]NOT consistent[/]"
    console.print(
        f"task {report['task_name']} (index {report['task_index']}): "
        f"{report['num_trials']} replays are {verdict}"
    )
    for detail in report["divergence_details"]:
        console.print(f"probe {detail['probe']!r} differs ({detail['kind']}):", markup=False)
        console.print(detail["diff"], markup=False, highlight=False)
    if not report["consistent"]:
        raise typer.Exit(1)


def _from_results(path: Path, task: str, rollout: int) -> tuple[str, ...]:
    records = unique_by_key(load_results(path))
    refs = [TaskRef(key=r.task, task=r.task) for r in records if r.rollout == rollout]
    if not refs:
        raise CliError(f"{path} has no trajectory with rollout {rollout}")
    chosen = select_tasks(refs, [task], None)[0]
    record = next(r for r in records if r.rollout == rollout and r.task == chosen.key)
    return tuple(a.text for a in record.trajectory.actions)


async def _validate(
    spec: SourceSpec, task: str, commands: tuple[str, ...], probes: tuple[str, ...], trials: int
) -> dict[str, Any]:
    from ..adapters.harbor import HarborAdapter, validate_replay_consistency
    from ..env import Environment

    assert spec.dataset is not None
    async with HarborAdapter() as adapter:
        dataset = await adapter.get_dataset(spec.dataset)
        refs = [TaskRef(key=t.name, task=i) for i, t in enumerate(dataset.tasks)]
        index = refs.index(select_tasks(refs, [task], None)[0])
        if not commands:
            commands = dataset.tasks[index].solution_commands()

        async def factory() -> Environment:
            return await adapter.get_environment(spec.dataset or "", max_steps=spec.max_steps)

        return await validate_replay_consistency(
            env_factory=factory, task_index=index, trajectory=commands,
            probe_commands=probes or None, num_trials=trials,
        )  # fmt: skip
