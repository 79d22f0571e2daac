"""Harbor datasets: an ordered catalogue of tasks, and loading one from a local directory.

Task order is stable and documented, because states record a task index:
a local directory is sorted by task directory name; a registry dataset (see
``registry.py``) keeps the registry's order. States also record the task name,
so a restore can detect that an index now points at another task (index drift).

A task that fails to load (malformed, or a format feature we refuse) never blocks
its siblings: it is kept in ``unloadable`` with its ``TaskLoadError``, which a
lookup by its name raises; indices count loadable tasks only.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType

from ....errors import TaskLoadError
from .task import HarborTask, load_task, short_name
from .task_toml import parse_task_config

__all__ = ["HarborDataset", "load_local_dataset", "load_tasks"]


@dataclass(frozen=True, slots=True, kw_only=True)
class HarborDataset:
    """An ordered, immutable catalogue of loaded tasks (no empty lists, no duplicate names)."""

    name: str
    version: str | None
    source: str
    tasks: tuple[HarborTask, ...]
    unloadable: Mapping[str, TaskLoadError] = field(default_factory=lambda: MappingProxyType({}))
    """Task name (else directory name) -> why that task could not be loaded."""
    _by_name: Mapping[str, int] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not self.tasks and not self.unloadable:
            raise TaskLoadError(
                "holds no tasks (no sub-directory with a task.toml)", path=self.source
            )
        by_name: dict[str, int] = {}
        for index, task in enumerate(self.tasks):
            if task.name in by_name:
                raise TaskLoadError(
                    f"holds two tasks named {task.name!r} "
                    f"(indices {by_name[task.name]} and {index})",
                    path=self.source,
                    field="name",
                    value=task.name,
                )
            by_name[task.name] = index
        object.__setattr__(self, "_by_name", MappingProxyType(by_name))

    def __len__(self) -> int:
        return len(self.tasks)

    @property
    def spec(self) -> str:
        """``name@version`` for registry datasets, the directory name for local ones."""
        return f"{self.name}@{self.version}" if self.version else self.name

    def list_tasks(self) -> list[tuple[int, str]]:
        """Every task as ``(index, name)``, in dataset order."""
        return [(i, t.name) for i, t in enumerate(self.tasks)]

    def index_of(self, name: str) -> int:
        """The index of the task with this full name or (unambiguous) short name; an
        unloadable task's name raises its ``TaskLoadError``."""
        if name in self._by_name:
            return self._by_name[name]
        broken = self.unloadable.get(name) or next(
            (e for n, e in self.unloadable.items() if short_name(n) == short_name(name)), None
        )
        if broken is not None and not any(t.short_name == short_name(name) for t in self.tasks):
            raise broken
        matches = [i for i, t in enumerate(self.tasks) if t.short_name == short_name(name)]
        if len(matches) == 1:
            return matches[0]
        if matches:
            names = [self.tasks[i].name for i in matches]
            raise KeyError(f"task name {name!r} is ambiguous in {self.spec}: {names}")
        raise KeyError(f"no task named {name!r} in {self.spec} ({len(self)} tasks)")

    def resolve(self, task: int | str | None) -> tuple[int, HarborTask]:
        """Look a task up by index or name; ``None`` is allowed for one-task datasets."""
        if task is None:
            if len(self.tasks) != 1:
                raise ValueError(
                    f"{self.spec} has {len(self)} tasks: reset() needs a task index or name"
                    f"{self._skipped()}"
                )
            return 0, self.tasks[0]
        if isinstance(task, bool) or not isinstance(task, int | str):
            raise TypeError(f"a task is an index or a name, got {type(task).__name__}")
        if isinstance(task, int):
            if not 0 <= task < len(self.tasks):
                raise IndexError(
                    f"task index {task} out of range: {self.spec} has {len(self)} loadable "
                    f"task(s){self._skipped()}"
                )
            return task, self.tasks[task]
        index = self.index_of(task)
        return index, self.tasks[index]

    def _skipped(self) -> str:
        """Why tasks were left out (for an error about a missing task), or ``""``."""
        if not self.unloadable:
            return ""
        shown = [
            f"{name}: {' '.join(str(exc).split())[:300]}"
            for name, exc in list(self.unloadable.items())[:3]
        ]
        more = len(self.unloadable) - len(shown)
        return (
            f"; {len(self.unloadable)} task(s) could not load and were skipped: "
            + "; ".join(shown)
            + (f"; and {more} more" if more > 0 else "")
        )


def load_local_dataset(path: Path | str) -> HarborDataset:
    """A task directory (one task) or a directory of task directories, sorted by name."""
    root = Path(path).expanduser().resolve()
    if not root.is_dir():
        raise TaskLoadError("is not a directory of Harbor tasks", path=str(root))
    if (root / "task.toml").is_file():
        return HarborDataset(
            name=root.name, version=None, source=str(root), tasks=(load_task(root),)
        )
    task_dirs = sorted(
        (p for p in root.iterdir() if p.is_dir() and (p / "task.toml").is_file()),
        key=lambda p: p.name,
    )
    tasks, unloadable = load_tasks((p, p.name) for p in task_dirs)
    return HarborDataset(
        name=root.name, version=None, source=str(root), tasks=tasks, unloadable=unloadable
    )


def load_tasks(
    dirs: Iterable[tuple[Path, str]],
) -> tuple[tuple[HarborTask, ...], Mapping[str, TaskLoadError]]:
    """Load ``(directory, fallback name)`` pairs in order; the ones that fail are returned
    apart, keyed by their ``[task].name`` when it can be read, else the fallback name."""
    tasks: list[HarborTask] = []
    unloadable: dict[str, TaskLoadError] = {}
    for path, fallback in dirs:
        try:
            tasks.append(load_task(path, fallback_name=fallback))
        except TaskLoadError as exc:
            unloadable[_declared_name(path) or fallback] = exc
    return tuple(tasks), MappingProxyType(unloadable)


def _declared_name(path: Path) -> str | None:
    try:
        config = parse_task_config((path / "task.toml").read_text(encoding="utf-8"))
    except (TaskLoadError, OSError, UnicodeDecodeError):
        return None
    return config.task.name if config.task is not None else None
