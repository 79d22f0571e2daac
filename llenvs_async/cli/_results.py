"""Results files written by ``run``: loaded for a command, and summarised as a table.

The record itself (``ResultRecord``, keyed by (task, rollout)) is ``serialization.results``'s.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Sequence
from pathlib import Path

from rich.console import Console
from rich.markup import escape
from rich.measure import Measurement
from rich.table import Table

from ..serialization import SerializationError, read_jsonl
from ..serialization.results import ResultRecord, ResultsError, parse_result, unique_by_key
from ..types import Trajectory
from ._common import CliError
from ._source_types import SourceSpec

__all__ = [
    "RunRecord",
    "load_results",
    "print_summary",
    "record_fields",
    "summary_table",
    "unique_by_key",
    "why_error",
    "why_zero",
]


RunRecord = ResultRecord[SourceSpec]


def record_fields(task: int | str, rollout: int, source: SourceSpec) -> dict[str, object]:
    """The fields ``run`` stores next to each trajectory: its key and its source."""
    return {"key": {"task": task, "rollout": rollout}, "source": source.to_json()}


def load_results(path: Path) -> list[RunRecord]:
    """Every record of a results file (a truncated last line is ignored)."""
    if not path.is_file():
        raise CliError(f"results file {str(path)!r} does not exist")
    try:
        return [
            parse_result(record, f"{path}: record {number}", SourceSpec.from_json)
            for number, record in enumerate(read_jsonl(path), start=1)
        ]
    except ResultsError as exc:
        raise CliError(str(exc)) from None
    except SerializationError as exc:
        raise CliError(f"{path}: {exc}", code=1) from None


def summary_table(records: Sequence[RunRecord], title: str) -> Table:
    """Per-task rollouts, success rate, mean return, mean steps and errors, plus a total row;
    a "why 0 / error" column when a rollout failed (its error's type and first line) or a
    verifier scored 0 without an error (its output's telling line). Task names in full."""
    table = Table(title=title)
    groups: dict[int | str, list[Trajectory]] = {}
    for record in records:
        groups.setdefault(record.task, []).append(record.trajectory)
    everything = [t for ts in groups.values() for t in ts]
    rows = sorted(groups.items(), key=lambda item: (isinstance(item[0], str), str(item[0])))
    reasons = {name: why_error(trajs) or why_zero(trajs) for name, trajs in rows}
    columns = ["task", "rollouts", "success", "mean return", "mean steps", "errors"]
    if any(reasons.values()):
        columns.append(_WHY)
    for column in columns:
        if column in ("task", _WHY):  # folded onto more lines when too wide, never cut
            table.add_column(column, justify="left", overflow="fold")
        else:
            table.add_column(column, justify="right", no_wrap=True)
    for name, trajs in [*rows, ("total", everything)]:
        if name == "total":
            table.add_section()
        n = len(trajs)
        cells = [
            escape(str(name)),
            str(n),
            f"{sum(t.success for t in trajs) / n:.0%}" if n else "-",
            _mean(t.total_reward for t in trajs),
            _mean(float(len(t)) for t in trajs),
            str(sum(t.error is not None for t in trajs)),
        ]
        if len(columns) > len(cells):
            cells.append(escape(reasons.get(name) or ""))
        table.add_row(*cells)
    return table


def print_summary(console: Console, table: Table) -> None:
    """Print ``table``: on a terminal within its width; into a file or a pipe at the
    table's own full width (a file has no screen to fit, so nothing is folded)."""
    if console.is_terminal:
        console.print(table)
        return
    options = console.options.update_width(_FILE_WIDTH)
    width = max(console.width, Measurement.get(console, options, table).maximum)
    Console(file=console.file, width=width, color_system=None).print(table)


def why_error(trajectories: Iterable[Trajectory]) -> str | None:
    """For the last rollout that failed: its error's type and the first line of its
    message (a failed build's log follows on later lines), cut to fit a table cell."""
    for traj in reversed(list(trajectories)):
        if traj.error is not None:
            first = next((ln.strip() for ln in traj.error.message.splitlines() if ln.strip()), "")
            first = _RUN_STEP_RE.sub("a RUN step returned", first)  # the step is in the log
            return _cut(f"{traj.error.type}: {first}", _ERROR_CHARS)
    return None


_WHY = "why 0 / error"
_RUN_STEP_RE = re.compile(r"The command '/bin/sh -c .*' returned")
_FILE_WIDTH = 1000
_ERROR_CHARS = 240
_TELLING_RE = re.compile(
    r"error|fail|assert|not found|no such|denied|cannot|could not|refused|timed? ?out",
    re.IGNORECASE,
)
_WHY_CHARS = 80


def why_zero(trajectories: Iterable[Trajectory]) -> str | None:
    """For the last rollout whose verifier scored 0 without an error: the last line of its
    verifier output that says what failed (else its last line), cut to fit a table cell."""
    for traj in reversed(list(trajectories)):
        if traj.error is not None or not traj.transitions:
            continue
        final = traj.transitions[-1]
        output = final.info.get("verifier_output")
        if final.reward != 0.0 or not isinstance(output, str):
            continue
        lines = [line.strip() for line in output.splitlines() if line.strip(" =-_")]
        if not lines:
            return "the verifier printed nothing"
        content = [ln for ln in lines if not ln.startswith(("===", "___", "---"))] or lines
        line = next(
            (ln for ln in reversed(content) if ln.startswith(("FAILED ", "ERROR "))),
            next((ln for ln in reversed(content) if _TELLING_RE.search(ln)), content[-1]),
        )
        kind, _, rest = line.partition(" ")
        if kind in ("FAILED", "ERROR") and "::" in rest:  # pytest: the test, not its path
            line = f"{kind} {rest.rsplit('::', 1)[1]}"
        return _cut(line, _WHY_CHARS)
    return None


def _cut(line: str, limit: int) -> str:
    return line if len(line) <= limit else line[: limit - 3] + "..."


def _mean(values: Iterable[float]) -> str:
    items = list(values)
    return f"{math.fsum(items) / len(items):.2f}" if items else "-"
