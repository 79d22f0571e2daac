"""The run summary printed into a file or a pipe: full task names (never cut at 80 columns)
and, for a task whose rollouts failed, the error's type and first line."""

from __future__ import annotations

import io

from rich.console import Console

from llenvs_async.cli._results import ResultRecord, print_summary, summary_table, why_error
from llenvs_async.cli._sources import SourceSpec
from llenvs_async.types import ErrorInfo, Observation, State, Trajectory

LONG = "android-emulator-boot-and-install-apk"


def _record(task: str, error: ErrorInfo | None) -> ResultRecord:
    state = State(observation=Observation(text=""), task=task)
    trajectory = Trajectory(episode_id="e", initial_state=state, error=error)
    return ResultRecord(
        task=task, rollout=0, source=SourceSpec(env="counter"), trajectory=trajectory
    )


def _render(records: list[ResultRecord]) -> str:
    out = io.StringIO()
    console = Console(file=out, width=80)  # what a redirected stdout gets
    assert not console.is_terminal
    print_summary(console, summary_table(records, "results.jsonl"))
    return out.getvalue()


def test_full_task_names_and_the_error_reason_in_a_file() -> None:
    build = ErrorInfo(
        type="ImageError",
        message="building the image of task 'org/android-emulator-boot-and-install-apk-b' "
        "failed: The command '/bin/sh -c make' returned a non-zero code: 2\nbuild log ...",
        phase="reset",
    )
    records = [
        _record(f"org/{LONG}-a", None),
        _record(f"org/{LONG}-b", build),
    ]
    text = _render(records)
    assert f"org/{LONG}-a" in text and f"org/{LONG}-b" in text
    assert "…" not in text
    assert "ImageError: building the image of task" in text
    assert "returned a non-zero code: 2" in text
    assert "build log" not in text  # the first line only
    assert max(len(line) for line in text.splitlines()) > 80


def test_on_a_terminal_long_cells_fold_instead_of_being_cut() -> None:
    out = io.StringIO()
    console = Console(file=out, width=80, force_terminal=True, color_system=None)
    print_summary(console, summary_table([_record(f"org/{LONG}-a", None)], "r"))
    text = out.getvalue()
    assert "…" not in text
    assert max(len(line) for line in text.splitlines()) <= 80
    assert "org/android" in text  # the name starts whole and folds onto the next lines


def test_why_error_is_the_last_failure_and_none_without_one() -> None:
    first = ErrorInfo(type="EnvError", message="first", phase="step")
    last = ErrorInfo(type="VerifierError", message="\n  the verifier ran past 60s\n", phase="step")
    records = [_record("t", first), _record("t", None), _record("t", last)]
    assert why_error(r.trajectory for r in records) == "VerifierError: the verifier ran past 60s"
    assert why_error([_record("t", None).trajectory]) is None
    long = ErrorInfo(type="E", message="x" * 1000, phase="step")
    cut = why_error([_record("t", long).trajectory])
    assert cut is not None and len(cut) == 240 and cut.endswith("...")
