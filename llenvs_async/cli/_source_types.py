"""What a CLI source is: its spec (kept in results files), options, tasks, the opened source.

Plain values, imported by the commands and by each source's builder (``_harbor.py``);
opening one is ``_sources.open_source``. A spec is what results files record as a
trajectory's ``source`` (its Harbor part a ``HarborSettings``).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..adapters.harbor.settings import HarborSettings, HarborSettingsError
from ..env import EnvFactory, Environment, RestoreFn
from ..policies import OraclePolicy
from ..serialization.results import ResultsError
from ..types import State

__all__ = ["BUILTIN_ENVS", "Source", "SourceSpec", "TaskRef"]

BUILTIN_ENVS = ("arithmetic", "chain", "counter")
_NO_HARBOR_SETTINGS = HarborSettings()


@dataclass(frozen=True, slots=True, kw_only=True)
class SourceSpec:
    """A built-in environment (``env``) or a Harbor dataset (``dataset``: path or name@version)."""

    env: str | None = None
    dataset: str | None = None
    max_steps: int | None = None
    harbor: HarborSettings = _NO_HARBOR_SETTINGS

    @classmethod
    def from_flags(
        cls,
        dataset: str | None,
        env: str | None,
        max_steps: int | None,
        harbor: HarborSettings | None = None,
    ) -> SourceSpec:
        if (dataset is None) == (env is None):
            raise ResultsError("give exactly one of a DATASET (path or name@version) or --env NAME")
        if max_steps is not None and max_steps < 1:
            raise ResultsError(f"--max-steps must be >= 1, got {max_steps}")
        harbor = harbor or _NO_HARBOR_SETTINGS
        if env is not None:
            if env not in BUILTIN_ENVS:
                raise ResultsError(
                    f"unknown --env {env!r}: choose one of {', '.join(BUILTIN_ENVS)}"
                )
            if harbor != _NO_HARBOR_SETTINGS:
                raise ResultsError("--base-image, --build-network, ... need a Harbor DATASET")
            return cls(env=env, max_steps=max_steps)
        assert dataset is not None
        path = Path(dataset).expanduser()
        if path.exists() or "@" not in dataset:
            if not path.is_dir():
                raise ResultsError(f"dataset {dataset!r}: no such directory (or name@version)")
            dataset = str(path.resolve())
        return cls(dataset=dataset, max_steps=max_steps, harbor=harbor)

    def to_json(self) -> dict[str, Any]:
        data: dict[str, Any] = {
            "env": self.env,
            "dataset": self.dataset,
            "max_steps": self.max_steps,
        }
        if self.harbor != _NO_HARBOR_SETTINGS:  # older files (and built-in envs) have none
            data["harbor"] = self.harbor.to_json()
        return data

    @classmethod
    def from_json(cls, data: Any, where: str) -> SourceSpec:
        if not isinstance(data, dict):
            raise ResultsError(f"{where}: no 'source' object (not written by `llenvs-async run`?)")
        try:
            harbor = HarborSettings.from_json(data["harbor"]) if "harbor" in data else None
            return cls.from_flags(
                data.get("dataset"), data.get("env"), data.get("max_steps"), harbor
            )
        except HarborSettingsError as exc:
            raise ResultsError(f"{where}: harbor: {exc}") from None
        except ResultsError as exc:
            raise ResultsError(f"{where}: {exc}") from None

    @property
    def label(self) -> str:
        what = f"env {self.env}" if self.env else f"dataset {self.dataset}"
        return what if self.max_steps is None else f"{what} (--max-steps {self.max_steps})"


@dataclass(frozen=True, slots=True, kw_only=True)
class TaskRef:
    """One task: ``key`` (stable, recorded in results), what ``reset`` takes, a description."""

    key: int | str
    task: int | str
    description: str = ""


@dataclass(slots=True, kw_only=True)
class Source:
    """An opened source: the runner's environment pieces, its tasks and its oracle policy."""

    spec: SourceSpec
    environment: Environment
    env_factory: EnvFactory | None
    restore_fn: RestoreFn | None
    tasks: list[TaskRef]
    oracle: Callable[[float, int], OraclePolicy]
    system_prompt: str | None = None
    preflight: Callable[[], Awaitable[None]] | None = None
    """Fails fast (e.g. no Docker engine) before any rollout or output file is started."""
    start: Callable[[Environment, TaskRef, int | None], Awaitable[State]] | None = None
    """How a task's episode starts (``None``: ``environment.reset(ref.task, seed=seed)``)."""
    close: Callable[[], Awaitable[None]] | None = None
    """Closes what the source opened besides its environment (a Harbor adapter)."""

    async def reset(self, env: Environment, ref: TaskRef, seed: int | None) -> State:
        """Start ``ref``'s episode on ``env`` (a fresh instance of this source's)."""
        if self.start is not None:
            return await self.start(env, ref, seed)
        return await env.reset(ref.task, seed=seed)

    async def check(self) -> None:
        if self.preflight is not None:
            await self.preflight()
