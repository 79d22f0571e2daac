"""What a CLI source is: its spec (kept in results files), options, tasks, the opened source.

Plain values, imported by the commands and by each source's builder (``_harbor.py``);
opening one is ``_sources.open_source``.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..env import EnvFactory, Environment, RestoreFn
from ..policies import OraclePolicy
from ..types import State
from ._common import CliError

__all__ = ["BUILTIN_ENVS", "HarborOptions", "Source", "SourceSpec", "TaskRef"]

BUILTIN_ENVS = ("arithmetic", "chain", "counter")


@dataclass(frozen=True, slots=True, kw_only=True)
class HarborOptions:
    """How Harbor tasks are built and run (``--base-image``, ``--build-network``,
    ``--build-ca-bundle``, ``--allow-network``, ``--command-timeout``,
    ``--provision-verifier``, ``--provision-index-url``)."""

    base_images: tuple[tuple[str, str], ...] = ()
    build_network: bool = False
    build_ca_bundle: str | None = None
    allow_network: bool = False
    command_timeout: float | None = None
    """Seconds per command (``None``: 180 s, within the task's budget)."""
    provision_verifier: bool = False
    provision_index_url: str | None = None
    """The index ``--provision-verifier`` downloads from (``--provision-index-url``)."""
    runtime: str = "runc"
    """``runc`` (Docker containers) or ``gvisor`` (runsc sandboxes)."""
    artifacts_dir: str | None = None
    """Where verified episodes' artifacts are kept (``--artifacts-dir``); None: not kept."""
    start_step: str | None = None
    """Multi-step tasks: the step every rollout starts at (``--start-step``)."""
    action_format: str = "text"
    """``text`` or ``tools`` (``--action-format``)."""
    max_format_errors: int = 3
    """Consecutive unparseable replies that end a rollout (``--max-format-errors``)."""
    observation_chars: int = 10_000
    """Characters of one command's output shown to the model (``--observation-chars``)."""

    def to_json(self) -> dict[str, Any]:
        return {
            "base_images": [list(pair) for pair in self.base_images],
            "build_network": self.build_network,
            "build_ca_bundle": self.build_ca_bundle,
            "allow_network": self.allow_network,
            "command_timeout": self.command_timeout,
            "provision_verifier": self.provision_verifier,
            "provision_index_url": self.provision_index_url,
            "runtime": self.runtime,
            "artifacts_dir": self.artifacts_dir,
            "start_step": self.start_step,
            "action_format": self.action_format,
            "max_format_errors": self.max_format_errors,
            "observation_chars": self.observation_chars,
        }

    @classmethod
    def from_json(cls, data: Any) -> HarborOptions:
        if not isinstance(data, dict):
            raise CliError(f"'harbor' options must be an object, got {data!r}")
        pairs = data.get("base_images") or []
        if not all(isinstance(p, list) and len(p) == 2 for p in pairs):
            raise CliError(f"'harbor.base_images' must be [pattern, image] pairs, got {pairs!r}")
        return cls(
            base_images=tuple((str(a), str(b)) for a, b in pairs),
            build_network=bool(data.get("build_network", False)),
            build_ca_bundle=data.get("build_ca_bundle"),
            allow_network=bool(data.get("allow_network", False)),
            command_timeout=data.get("command_timeout"),
            provision_verifier=bool(data.get("provision_verifier", False)),
            provision_index_url=data.get("provision_index_url"),
            runtime=str(data.get("runtime", "runc")),
            artifacts_dir=data.get("artifacts_dir"),
            start_step=data.get("start_step"),
            action_format=str(data.get("action_format", "text")),
            max_format_errors=int(data.get("max_format_errors", 3)),
            observation_chars=int(data.get("observation_chars", 10_000)),
        )


_NO_HARBOR_OPTIONS = HarborOptions()


@dataclass(frozen=True, slots=True, kw_only=True)
class SourceSpec:
    """A built-in environment (``env``) or a Harbor dataset (``dataset``: path or name@version)."""

    env: str | None = None
    dataset: str | None = None
    max_steps: int | None = None
    harbor: HarborOptions = _NO_HARBOR_OPTIONS

    @classmethod
    def from_flags(
        cls,
        dataset: str | None,
        env: str | None,
        max_steps: int | None,
        harbor: HarborOptions | None = None,
    ) -> SourceSpec:
        if (dataset is None) == (env is None):
            raise CliError("give exactly one of a DATASET (path or name@version) or --env NAME")
        if max_steps is not None and max_steps < 1:
            raise CliError(f"--max-steps must be >= 1, got {max_steps}")
        harbor = harbor or _NO_HARBOR_OPTIONS
        if env is not None:
            if env not in BUILTIN_ENVS:
                raise CliError(f"unknown --env {env!r}: choose one of {', '.join(BUILTIN_ENVS)}")
            if harbor != _NO_HARBOR_OPTIONS:
                raise CliError("--base-image, --build-network, ... need a Harbor DATASET")
            return cls(env=env, max_steps=max_steps)
        assert dataset is not None
        path = Path(dataset).expanduser()
        if path.exists() or "@" not in dataset:
            if not path.is_dir():
                raise CliError(f"dataset {dataset!r}: no such directory (or name@version)")
            dataset = str(path.resolve())
        return cls(dataset=dataset, max_steps=max_steps, harbor=harbor)

    def to_json(self) -> dict[str, Any]:
        data: dict[str, Any] = {
            "env": self.env,
            "dataset": self.dataset,
            "max_steps": self.max_steps,
        }
        if self.harbor != _NO_HARBOR_OPTIONS:  # older files (and built-in envs) have none
            data["harbor"] = self.harbor.to_json()
        return data

    @classmethod
    def from_json(cls, data: Any, where: str) -> SourceSpec:
        if not isinstance(data, dict):
            raise CliError(f"{where}: no 'source' object (not written by `llenvs-async run`?)")
        try:
            harbor = HarborOptions.from_json(data["harbor"]) if "harbor" in data else None
            return cls.from_flags(
                data.get("dataset"), data.get("env"), data.get("max_steps"), harbor
            )
        except CliError as exc:
            raise CliError(f"{where}: {exc}") from None

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
