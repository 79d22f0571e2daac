"""``llenvs-async q-values``: V(s) and Q(s, a) at mid-trajectory states of a results file."""

from __future__ import annotations

import dataclasses
import json
import math
import uuid
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.table import Table

from ..docker.runtime import get_runtime
from ..errors import MissingExtraError
from ..estimation import Failures, ValueEstimate, estimate_q_values, estimate_values
from ..serialization import JsonlWriter
from ..types import State
from . import _options as opt
from ._backend import BackendKind, BackendOptions, open_runner
from ._common import CliError, console, err_console, run_async
from ._results import RunRecord, load_results, record_fields, unique_by_key
from ._sources import SourceSpec, open_source
from .plot import EstimatePanel, matplotlib_available, plot_estimates

__all__ = ["FailureMode", "StatePick", "pick_states", "q_values"]


class FailureMode(StrEnum):
    """``--failures``: how a failed rollout counts in an estimate (see ``estimation.Failures``)."""

    exclude = "exclude"
    zero = "zero"
    raise_ = "raise"


@dataclass(frozen=True, slots=True, kw_only=True)
class StatePick:
    """A saved state to estimate at, and the candidate first actions for Q."""

    task: int | str
    state: State
    actions: tuple[str, ...]

    @property
    def title(self) -> str:
        return f"task {self.task}, step {self.state.step}"


def q_values(
    results: Annotated[Path, typer.Argument(help="Results JSONL written by `llenvs-async run`.")],
    action: Annotated[
        list[str] | None, typer.Option("--action", "-a", help="Candidate action (repeatable).")
    ] = None,
    file_actions: Annotated[
        bool,
        typer.Option(
            "--file-actions/--no-file-actions",
            help="Also use the actions the file's trajectories took at the state.",
        ),
    ] = True,
    step: Annotated[
        int | None, typer.Option("--step", help="The state's step (default: mid-trajectory).")
    ] = None,
    tasks: Annotated[
        list[str] | None, typer.Option("--task", "-t", help="Only these tasks.")
    ] = None,
    max_states: Annotated[int, typer.Option("--max-states", help="States to estimate at.")] = 3,
    rollouts: Annotated[int, typer.Option("--rollouts", "-n", help="Rollouts per estimate.")] = 8,
    n_concurrent: opt.NConcurrentOpt = 4,
    schedule: opt.ScheduleOpt = opt.ScheduleKind.refill,
    backend: opt.BackendOpt = BackendKind.scripted,
    model: opt.ModelOpt = None,
    base_url: opt.BaseUrlOpt = None,
    epsilon: opt.EpsilonOpt = 0.0,
    seed: opt.SeedOpt = 0,
    temperature: opt.TemperatureOpt = None,
    max_tokens: opt.MaxTokensOpt = None,
    plot: Annotated[
        Path | None, typer.Option("--plot", help="PNG path (default: RESULTS with .q.png).")
    ] = None,
    json_out: Annotated[
        Path | None, typer.Option("--json", help="Write estimates as JSON.")
    ] = None,
    trajectories_out: Annotated[
        Path | None,
        typer.Option(
            "--trajectories",
            help="Write the rollouts behind each estimate as a results JSONL, each record "
            "naming its estimate's id (the JSON's 'id'); `view` opens them from the tree.",
        ),
    ] = None,
    snapshot: Annotated[
        bool,
        typer.Option(
            "--snapshot", help="Containers: replay each state once, fork the rest from a commit."
        ),
    ] = False,
    runtime: Annotated[
        str | None,
        typer.Option(
            "--runtime",
            help="Override the results file's runtime: runc or gvisor (with --snapshot, "
            "gvisor forks keep processes and shell state).",
        ),
    ] = None,
    failures: Annotated[
        FailureMode,
        typer.Option(
            "--failures",
            help="Failed rollouts: leave out of the mean (exclude), count as return 0 (zero), "
            "or stop with an error (raise). The table's 'failed' column counts them either way.",
        ),
    ] = FailureMode.exclude,
) -> None:
    """Estimate V(s) and Q(s, a) by Monte Carlo rollouts from saved mid-trajectory states."""
    options = opt.backend_options(backend, model, base_url, epsilon, seed, temperature, max_tokens)
    if rollouts < 2 or n_concurrent < 1 or max_states < 1:
        raise CliError("--rollouts must be >= 2, --n-concurrent and --max-states >= 1")
    if step is not None and step < 0:
        raise CliError(f"--step must be >= 0, got {step}")
    targets = (("--plot", plot), ("--json", json_out), ("--trajectories", trajectories_out))
    for flag, target in targets:
        if target is not None and not target.parent.is_dir():  # fail before the rollouts
            raise CliError(
                f"{flag} {str(target)!r}: directory {str(target.parent)!r} does not exist"
            )
    records = unique_by_key(load_results(results))
    if not records:
        raise CliError(f"{results} holds no trajectories")
    sources = {r.source for r in records}
    if len(sources) > 1:
        raise CliError(f"{results} mixes sources: {sorted(s.label for s in sources)}")
    picks = pick_states(records, step=step, tasks=tasks or [], max_states=max_states,
                        extra_actions=tuple(action or ()), file_actions=file_actions)  # fmt: skip
    source = sources.pop()
    if runtime is not None:
        harbor = opt.harbor_settings(source.harbor, runtime=runtime)
        source = dataclasses.replace(source, harbor=harbor)
    mode: Failures = failures.value
    rows = run_async(
        lambda: _estimate(
            source, options, picks, rollouts, n_concurrent, snapshot, mode, schedule.value
        )
    )
    console.print(_table(rows, mode))
    ids = _estimate_ids(len(rows))
    if trajectories_out is not None:
        _write_trajectories(trajectories_out, rows, ids, source)
        console.print(f"trajectories: {trajectories_out}")
    if json_out is not None:
        written = None if trajectories_out is None else str(trajectories_out)
        json_rows = [
            {"id": ident, **_json_row(p, label, e), "trajectories": written}
            for ident, (p, label, e) in zip(ids, rows, strict=True)
        ]
        json_out.write_text(json.dumps(json_rows, indent=1))
    path = plot if plot is not None else results.with_suffix(".q.png")
    if matplotlib_available():
        panels = [
            EstimatePanel(title=p.title, rows=[(lbl, e) for q, lbl, e in rows if q is p])
            for p in picks
        ]
        plot_estimates(panels, path)
        console.print(f"plot: {path}")
    elif plot is not None:
        raise CliError(str(MissingExtraError("--plot", extra="plot", package="matplotlib")), code=1)


def pick_states(
    records: list[RunRecord],
    *,
    step: int | None,
    tasks: list[str],
    max_states: int,
    extra_actions: tuple[str, ...],
    file_actions: bool,
) -> list[StatePick]:
    """Up to ``max_states`` states, at most one per task, each at ``step`` (default: the
    middle) of a trajectory that did not fail, with its candidate actions.
    """
    usable = [r for r in records if r.trajectory.error is None and r.trajectory.transitions]
    if tasks:
        usable = [r for r in usable if _matches(r.task, tasks)]
    picks: list[StatePick] = []
    for record in sorted(usable, key=lambda r: r.rollout):
        k = len(record.trajectory) // 2 if step is None else step
        if len(picks) == max_states or k >= len(record.trajectory):
            continue
        if any(p.task == record.task for p in picks):
            continue
        state = record.trajectory.transitions[k].state
        found = _taken_at(state, record.task, usable) if file_actions else ()
        actions = tuple(dict.fromkeys((*extra_actions, *found)))
        if not actions:
            raise CliError("no candidate actions: pass --action or keep --file-actions")
        picks.append(StatePick(task=record.task, state=state, actions=actions))
    if not picks:
        where = "mid-trajectory" if step is None else f"step-{step}"
        raise CliError(f"no trajectory without error has a {where} state to estimate at")
    return picks


def _matches(task: int | str, selectors: list[str]) -> bool:
    return str(task) in selectors or str(task).rsplit("/", 1)[-1] in selectors


def _taken_at(state: State, task: int | str, records: list[RunRecord]) -> tuple[str, ...]:
    """The actions the file's trajectories of ``task`` took from ``state``'s action prefix:
    the command a shell step ran (a candidate is a command as written), else the text."""
    prefix = [a.text for a in state.actions]
    out = []
    for record in records:
        transitions = record.trajectory.transitions
        if record.task != task or state.step >= len(transitions):
            continue
        here = transitions[state.step]
        if [a.text for a in here.state.actions] == prefix:
            command = here.info.get("command")
            out.append(command if isinstance(command, str) else here.action.text)
    return tuple(out)


async def _estimate(
    spec: SourceSpec,
    options: BackendOptions,
    picks: list[StatePick],
    rollouts: int,
    n_concurrent: int,
    snapshot: bool,
    failures: Failures,
    schedule: str,
) -> list[tuple[StatePick, str, ValueEstimate]]:
    rows: list[tuple[StatePick, str, ValueEstimate]] = []
    async with open_source(spec) as source:
        await source.check()
        processes = "checkpoint" in get_runtime(spec.harbor.runtime).capabilities
        async with open_runner(
            source, options, snapshot=snapshot, processes=processes, schedule=schedule
        ) as runner:
            for pick in picks:
                err_console.print(f"estimating at {pick.title} ({len(pick.actions)} actions)")
                (value,) = await estimate_values(
                    runner, [pick.state], rollouts, n_concurrent, failures=failures
                )
                rows.append((pick, "V(s)", value))
                qs = await estimate_q_values(
                    runner, pick.state, pick.actions, rollouts, n_concurrent, failures=failures
                )
                rows.extend((pick, f"Q: {a}", q) for a, q in zip(pick.actions, qs, strict=True))
    return rows


def _estimate_ids(count: int) -> list[str]:
    """One id per estimate, unique across runs (files from several runs load together)."""
    run = uuid.uuid4().hex[:12]
    return [f"{run}-{k}" for k in range(count)]


def _write_trajectories(
    path: Path,
    rows: list[tuple[StatePick, str, ValueEstimate]],
    ids: list[str],
    source: SourceSpec,
) -> None:
    """Every estimate's rollouts, in order, as results records (``key.rollout`` numbers
    them through the file) with ``estimate``: the id of the estimate they belong to."""
    path.unlink(missing_ok=True)  # a fresh file, as --json is
    number = 0
    with JsonlWriter(path) as writer:
        for ident, (pick, _, e) in zip(ids, rows, strict=True):
            for trajectory in e.trajectories:
                fields = record_fields(pick.task, number, source)
                writer.write_trajectory(trajectory, **fields, estimate=ident)
                number += 1


def _fmt(x: float) -> str:
    return f"{x:.3f}" if math.isfinite(x) else "-"


_FAILED_ROLLOUTS = {"exclude": "excluded", "zero": "counted as 0", "raise": "none allowed"}


def _table(rows: list[tuple[StatePick, str, ValueEstimate]], failures: Failures) -> Table:
    title = f"Monte Carlo estimates (95% CI; failed rollouts {_FAILED_ROLLOUTS[failures]})"
    table = Table(title=title)
    for column in ("task", "step", "estimate of", "mean", "95% CI", "method", "n", "failed"):
        table.add_column(column, justify="right" if column in ("mean", "n", "failed") else "left")
    for pick, label, e in rows:
        table.add_row(
            str(pick.task), str(pick.state.step), label, _fmt(e.mean),
            f"[{_fmt(e.ci_low)}, {_fmt(e.ci_high)}]", e.method, str(e.n), str(e.failed),
        )  # fmt: skip
    return table


def _json_row(pick: StatePick, label: str, e: ValueEstimate) -> dict[str, Any]:
    def num(x: float) -> float | None:
        return x if math.isfinite(x) else None

    return {
        "task": pick.task, "step": pick.state.step,
        "prefix": [a.text for a in pick.state.actions],
        "kind": "V" if label == "V(s)" else "Q", "action": None if label == "V(s)" else label[3:],
        "mean": num(e.mean), "ci_low": num(e.ci_low), "ci_high": num(e.ci_high),
        "stderr": num(e.stderr), "n": e.n, "failed": e.failed, "returns": list(e.returns),
        "method": e.method, "reward_range": None if e.reward_range is None else [
            num(x) for x in e.reward_range
        ],
    }  # fmt: skip
