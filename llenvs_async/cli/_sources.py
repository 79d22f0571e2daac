"""Where rollouts come from: a built-in pure/stateful env by name, or a Harbor dataset.

A ``SourceSpec`` is what a results file records, so ``q-values`` can rebuild the
same environment; ``open_source`` turns it into a live ``Source``.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..env import EnvFactory, Environment, RestoreFn
from ..envs import ArithmeticEnv, ChainEnv, CounterEnv
from ..policies import OraclePolicy, arithmetic_oracle, chain_oracle, counter_oracle
from ._common import CliError

__all__ = [
    "BUILTIN_ENVS",
    "HarborOptions",
    "Source",
    "SourceSpec",
    "TaskRef",
    "open_source",
    "select_tasks",
]

BUILTIN_ENVS = ("arithmetic", "chain", "counter")
_COUNTER_TARGETS = (1, 2, 3, 4, 5)


@dataclass(frozen=True, slots=True, kw_only=True)
class HarborOptions:
    """How Harbor tasks are built and run (``--base-image``, ``--build-network``,
    ``--build-ca-bundle``, ``--allow-network``, ``--command-timeout``,
    ``--provision-verifier``)."""

    base_images: tuple[tuple[str, str], ...] = ()
    build_network: bool = False
    build_ca_bundle: str | None = None
    allow_network: bool = False
    command_timeout: float | None = None
    """Seconds per command; ``None``: the task's ``[agent].timeout_sec``."""
    provision_verifier: bool = False
    runtime: str = "runc"
    """``runc`` (Docker containers) or ``gvisor`` (runsc sandboxes)."""

    def to_json(self) -> dict[str, Any]:
        return {
            "base_images": [list(pair) for pair in self.base_images],
            "build_network": self.build_network,
            "build_ca_bundle": self.build_ca_bundle,
            "allow_network": self.allow_network,
            "command_timeout": self.command_timeout,
            "provision_verifier": self.provision_verifier,
            "runtime": self.runtime,
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
            runtime=str(data.get("runtime", "runc")),
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
    close: Callable[[], Awaitable[None]] | None = None
    """Closes what the source opened besides its environment (a Harbor adapter)."""

    async def check(self) -> None:
        if self.preflight is not None:
            await self.preflight()


def _builtin(spec: SourceSpec) -> Source:
    steps = spec.max_steps
    factory: EnvFactory | None = None
    env: Environment
    if spec.env == "arithmetic":
        arith = ArithmeticEnv(num_tasks=20, max_steps=steps or 3)
        env, oracle = arith, arithmetic_oracle
        tasks = [TaskRef(key=i, task=i, description=arith.problem(i)[0]) for i in range(20)]

    elif spec.env == "chain":
        chain = ChainEnv(max_steps=steps or 10)
        env, oracle = chain, chain_oracle
        tasks = [
            TaskRef(key=i, task=i, description=f"corridor of length {chain.min_length + i}")
            for i in range(chain.num_tasks)
        ]
    else:

        async def factory() -> Environment:
            return CounterEnv(max_steps=steps or 20)

        env, oracle = CounterEnv(max_steps=steps or 20), counter_oracle
        tasks = [TaskRef(key=t, task=t, description=f"count to {t}") for t in _COUNTER_TARGETS]
    return Source(
        spec=spec, environment=env, env_factory=factory, restore_fn=None, tasks=tasks,
        oracle=lambda eps, seed: oracle(epsilon=eps, seed=seed),
    )  # fmt: skip


@contextlib.asynccontextmanager
async def open_source(spec: SourceSpec) -> AsyncIterator[Source]:
    """Open ``spec``'s environment (and, for Harbor, its dataset); close it on exit."""
    if spec.env is not None:
        source = _builtin(spec)
    else:
        from ._harbor import open_harbor

        source = await open_harbor(spec)
    try:
        yield source
    finally:
        try:
            await source.environment.aclose()
        finally:
            if source.close is not None:
                await source.close()


def select_tasks(
    tasks: Sequence[TaskRef], selectors: Sequence[str], limit: int | None
) -> list[TaskRef]:
    """The tasks named by ``selectors`` (keys, short names or positions), else all; then
    the first ``limit``.
    """
    chosen = list(tasks)
    if selectors:
        chosen = [_find(tasks, s) for s in selectors]
    if limit is not None:
        if limit < 1:
            raise CliError(f"--limit must be >= 1, got {limit}")
        chosen = chosen[:limit]
    return chosen


def _find(tasks: Sequence[TaskRef], selector: str) -> TaskRef:
    for ref in tasks:
        if str(ref.key) == selector or str(ref.key).rsplit("/", 1)[-1] == selector:
            return ref
    if selector.isdigit() and int(selector) < len(tasks):
        return tasks[int(selector)]
    known = ", ".join(str(t.key) for t in tasks[:8])
    raise CliError(f"unknown task {selector!r} (known: {known}{', ...' if len(tasks) > 8 else ''})")
