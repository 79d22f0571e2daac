"""What ``run`` records per trajectory (its (task, rollout) key, its source spec), outside the
CLI so every reader of results files (the CLI, the viewer) parses them the same way."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import LlenvsError
from ..types import Trajectory
from ._decode import from_dict

__all__ = [
    "BUILTIN_ENVS",
    "HarborOptions",
    "ResultRecord",
    "ResultsError",
    "SourceSpec",
    "parse_result",
    "record_fields",
    "unique_by_key",
]

BUILTIN_ENVS = ("arithmetic", "chain", "counter")


class ResultsError(LlenvsError, ValueError):
    """A results record, or the source spec it records (a flag's value too), is not valid."""


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
            raise ResultsError(f"'harbor' options must be an object, got {data!r}")
        pairs = data.get("base_images") or []
        if not all(isinstance(p, list) and len(p) == 2 for p in pairs):
            raise ResultsError(
                f"'harbor.base_images' must be [pattern, image] pairs, got {pairs!r}"
            )
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
            raise ResultsError("give exactly one of a DATASET (path or name@version) or --env NAME")
        if max_steps is not None and max_steps < 1:
            raise ResultsError(f"--max-steps must be >= 1, got {max_steps}")
        harbor = harbor or _NO_HARBOR_OPTIONS
        if env is not None:
            if env not in BUILTIN_ENVS:
                raise ResultsError(
                    f"unknown --env {env!r}: choose one of {', '.join(BUILTIN_ENVS)}"
                )
            if harbor != _NO_HARBOR_OPTIONS:
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
        if self.harbor != _NO_HARBOR_OPTIONS:  # older files (and built-in envs) have none
            data["harbor"] = self.harbor.to_json()
        return data

    @classmethod
    def from_json(cls, data: Any, where: str) -> SourceSpec:
        if not isinstance(data, dict):
            raise ResultsError(f"{where}: no 'source' object (not written by `llenvs-async run`?)")
        try:
            harbor = HarborOptions.from_json(data["harbor"]) if "harbor" in data else None
            return cls.from_flags(
                data.get("dataset"), data.get("env"), data.get("max_steps"), harbor
            )
        except ResultsError as exc:
            raise ResultsError(f"{where}: {exc}") from None

    @property
    def label(self) -> str:
        what = f"env {self.env}" if self.env else f"dataset {self.dataset}"
        return what if self.max_steps is None else f"{what} (--max-steps {self.max_steps})"


Key = tuple[int | str, int]


@dataclass(frozen=True, slots=True, kw_only=True)
class ResultRecord:
    """One trajectory of a results file, with the key and source ``run`` stored beside it."""

    task: int | str
    rollout: int
    source: SourceSpec
    trajectory: Trajectory

    @property
    def key(self) -> Key:
        return (self.task, self.rollout)


def record_fields(task: int | str, rollout: int, source: SourceSpec) -> dict[str, object]:
    """The fields ``run`` stores next to each trajectory."""
    return {"key": {"task": task, "rollout": rollout}, "source": source.to_json()}


def parse_result(record: Mapping[str, Any], where: str) -> ResultRecord:
    """One results-file record; ``where`` (file and record) starts every error message."""
    key = record.get("key")
    if not isinstance(key, dict) or not isinstance(key.get("rollout"), int):
        raise ResultsError(f"{where}: no 'key' with task and rollout (not a results file?)")
    task = key.get("task")
    if not isinstance(task, int | str):
        raise ResultsError(f"{where}: key.task must be an int or a string, got {task!r}")
    return ResultRecord(
        task=task,
        rollout=key["rollout"],
        source=SourceSpec.from_json(record.get("source"), where),
        trajectory=from_dict(Trajectory, record.get("trajectory") or {}),
    )


def unique_by_key(records: Iterable[ResultRecord]) -> list[ResultRecord]:
    """One record per (task, rollout): the last one written wins (retries append)."""
    latest: dict[Key, ResultRecord] = {}
    for record in records:
        latest.pop(record.key, None)
        latest[record.key] = record
    return list(latest.values())
