"""Live rollout progress (rich): done / in flight / live instances / failed, from RunnerStats."""

from __future__ import annotations

from types import TracebackType

from rich.console import Console
from rich.progress import BarColumn, Progress, ProgressColumn, Task, TextColumn, TimeElapsedColumn
from rich.text import Text

from ..runner import RunnerStats
from ..types import Trajectory

__all__ = ["RolloutProgress"]


class _StatsColumn(ProgressColumn):
    """Reads the runner's live counters on every refresh."""

    def __init__(self, stats: RunnerStats) -> None:
        super().__init__()
        self.stats = stats

    def render(self, task: Task) -> Text:
        s = self.stats
        return Text(
            f"{s.active_rollouts} in flight · {s.live_instances} live envs · "
            f"{task.fields.get('success', 0)} ok · {task.fields.get('failed', 0)} failed",
            style="cyan",
        )


class RolloutProgress:
    """A progress bar over ``total`` rollouts; call ``advance`` as each trajectory finishes."""

    def __init__(
        self, total: int, stats: RunnerStats, *, console: Console, enabled: bool = True
    ) -> None:
        self._progress = Progress(
            TextColumn("[bold]rollouts"),
            BarColumn(bar_width=20),
            TextColumn("{task.completed}/{task.total}"),
            _StatsColumn(stats),
            TimeElapsedColumn(),
            console=console,
            disable=not enabled,
            transient=False,
        )
        self._task = self._progress.add_task("rollouts", total=total, failed=0, success=0)
        self.failed = 0
        self.success = 0

    def advance(self, trajectory: Trajectory) -> None:
        self.failed += trajectory.error is not None
        self.success += trajectory.success
        self._progress.update(self._task, advance=1, failed=self.failed, success=self.success)

    def __enter__(self) -> RolloutProgress:
        self._progress.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._progress.stop()
