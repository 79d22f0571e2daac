"""What a CLI source is: its spec (kept in results files), options, tasks, the opened source.

Plain values, imported by the commands and by each source's builder (``_harbor.py``);
opening one is ``_sources.open_source``. The spec and its options are results-file values
(``serialization.results``), shared with the viewer.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from ..env import EnvFactory, Environment, RestoreFn
from ..policies import OraclePolicy
from ..serialization.results import BUILTIN_ENVS, HarborOptions, SourceSpec
from ..types import State

__all__ = ["BUILTIN_ENVS", "HarborOptions", "Source", "SourceSpec", "TaskRef"]


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
