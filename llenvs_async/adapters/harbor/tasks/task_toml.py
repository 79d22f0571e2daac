"""``task.toml`` text parsed into a ``TaskConfig`` (any schema version, legacy keys folded
in); anything malformed raises ``TaskLoadError`` naming the file, the dotted field and the
bad value."""

from __future__ import annotations

import math
import re
import tomllib
from collections.abc import Mapping
from dataclasses import replace
from types import MappingProxyType
from typing import Any

from ....errors import TaskLoadError
from .config import (
    AgentConfig,
    ArtifactSpec,
    Author,
    CollectHook,
    EnvironmentConfig,
    NetworkMode,
    SolutionConfig,
    StepConfig,
    TaskConfig,
    TaskInfo,
    VerifierConfig,
)

__all__ = ["REWARD_STRATEGIES", "parse_task_config"]

_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*(/[A-Za-z0-9][A-Za-z0-9._-]*)?$")
_SIZE_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([KMG])B?\s*$", re.IGNORECASE)
_SIZE_FACTOR_MB = {"K": 1 / 1024, "M": 1.0, "G": 1024.0}
_IGNORED_KEYS: tuple[str, ...] = ()
_STEP_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
REWARD_STRATEGIES = ("mean", "final")
_IGNORED_STEP_KEYS = ("healthcheck", "artifacts")


class _Table:
    """Typed reads from one TOML table, raising ``TaskLoadError`` with the dotted field."""

    def __init__(self, data: Mapping[str, Any], prefix: str, path: str) -> None:
        self.data = data
        self.prefix = prefix
        self.path = path

    def error(self, key: str, value: Any, message: str) -> TaskLoadError:
        return TaskLoadError(message, path=self.path, field=f"{self.prefix}{key}", value=value)

    def has(self, key: str) -> bool:
        return key in self.data

    def table(self, key: str) -> _Table:
        value = self.data.get(key, {})
        if not isinstance(value, dict):
            raise self.error(key, value, "must be a table")
        return _Table(value, f"{self.prefix}{key}.", self.path)

    def string(self, key: str, default: str | None = None) -> str | None:
        value = self.data.get(key, default)
        if value is not None and not isinstance(value, str):
            raise self.error(key, value, "must be a string")
        return value

    def number(self, key: str, default: float) -> float:
        value = self.optional_number(key)
        return default if value is None else value

    def optional_number(self, key: str) -> float | None:
        value = self.data.get(key)
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise self.error(key, value, "must be a number")
        if not math.isfinite(value) or value <= 0:
            raise self.error(key, value, "must be a finite number > 0")
        return float(value)

    def integer(self, key: str, default: int, *, minimum: int) -> int:
        value = self.data.get(key, default)
        if isinstance(value, bool) or not isinstance(value, int):
            raise self.error(key, value, "must be an integer")
        if value < minimum:
            raise self.error(key, value, f"must be >= {minimum}")
        return value

    def boolean(self, key: str, default: bool) -> bool:
        value = self.data.get(key, default)
        if not isinstance(value, bool):
            raise self.error(key, value, "must be true or false")
        return value

    def user(self, key: str) -> str | int | None:
        value = self.data.get(key)
        if value is not None and (isinstance(value, bool) or not isinstance(value, str | int)):
            raise self.error(key, value, "must be a user name or a uid")
        return value

    def strings(self, key: str) -> tuple[str, ...]:
        value = self.data.get(key, [])
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise self.error(key, value, "must be a list of strings")
        return tuple(value)

    def str_map(self, key: str) -> Mapping[str, str]:
        value = self.data.get(key, {})
        if not isinstance(value, dict) or not all(isinstance(v, str) for v in value.values()):
            raise self.error(key, value, "must be a table of strings")
        return MappingProxyType(dict(value))

    def size_mb(self, key: str) -> int | None:
        value = self.data.get(key)
        if value is None:
            return None
        match = _SIZE_RE.match(value) if isinstance(value, str) else None
        if match is None:
            raise self.error(key, value, "must be a size such as '512M' or '2G'")
        mb = int(float(match.group(1)) * _SIZE_FACTOR_MB[match.group(2).upper()])
        if mb < 1:
            raise self.error(key, value, "must be at least 1M")
        return mb


def parse_task_config(text: str, *, path: str = "task.toml") -> TaskConfig:
    """Parse the text of a ``task.toml`` (any schema version, legacy keys included)."""
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise TaskLoadError(f"is not valid TOML: {exc}", path=path) from exc
    root = _Table(data, "", path)
    schema = root.string("schema_version") or root.string("version") or "1.0"
    return TaskConfig(
        schema_version=schema,
        task=_task_info(root) if root.has("task") else None,
        metadata=MappingProxyType(dict(root.table("metadata").data)),
        agent=_agent(root.table("agent")),
        verifier=_verifier(root.table("verifier")),
        environment=_environment(root.table("environment")),
        solution=SolutionConfig(env=root.table("solution").str_map("env")),
        steps=_steps(root, path),
        ignored=tuple(key for key in _IGNORED_KEYS if root.has(key)) + _ignored_step_keys(root),
        artifacts=_artifacts(root, "artifacts"),
        step_configs=_step_configs(root, path),
        multi_step_reward_strategy=_strategy(root),
    )


def _steps(root: _Table, path: str) -> int:
    value = root.data.get("steps", [])
    if not isinstance(value, list) or not all(isinstance(v, dict) for v in value):
        raise root.error("steps", value, "must be an array of tables ([[steps]])")
    return len(value)


def _ignored_step_keys(root: _Table) -> tuple[str, ...]:
    """Per-step keys Harbor has that no step of ours acts on (logged on load)."""
    found = []
    for index, data in enumerate(root.data.get("steps", [])):
        found += [f"steps[{index}].{key}" for key in _IGNORED_STEP_KEYS if key in data]
        verifier = data.get("verifier")
        if isinstance(verifier, dict) and "artifacts" in verifier:
            found.append(f"steps[{index}].verifier.artifacts")
    return tuple(found)


def _strategy(root: _Table) -> str:
    strategy = root.string("multi_step_reward_strategy", "mean") or "mean"
    if strategy not in REWARD_STRATEGIES:
        raise root.error("multi_step_reward_strategy", strategy, "must be 'mean' or 'final'")
    return strategy


def _step_configs(root: _Table, path: str) -> tuple[StepConfig, ...]:
    """The ``[[steps]]`` tables; each step's agent/verifier fall back to the task's."""
    agent, verifier = _agent(root.table("agent")), _verifier(root.table("verifier"))
    steps: list[StepConfig] = []
    for index, data in enumerate(root.data.get("steps", [])):
        table = _Table(data, f"steps[{index}].", path)
        name = table.string("name")
        if name is None or not _STEP_NAME_RE.match(name):
            raise table.error("name", name, "is required: a directory name under steps/")
        if any(step.name == name for step in steps):
            raise table.error("name", name, "is used by two steps")
        step_agent, step_verifier = table.table("agent"), table.table("verifier")
        user = step_agent.user("user")
        if user is not None and user != agent.user:
            raise step_agent.error(
                "user",
                user,
                "differs from [agent].user; llenvs-async runs every step in the one shell of "
                "the episode, as one user",
            )
        if step_verifier.has("environment_mode") or step_verifier.has("environment"):
            raise step_verifier.error(
                "environment_mode",
                step_verifier.data.get("environment_mode", "separate"),
                "a separate verifier per step is not supported by llenvs-async (one shared "
                "environment runs every step's tests)",
            )
        steps.append(
            StepConfig(
                name=name,
                agent=AgentConfig(
                    timeout_sec=step_agent.optional_number("timeout_sec") or agent.timeout_sec,
                    user=agent.user,
                ),
                verifier=replace(
                    verifier,
                    timeout_sec=step_verifier.number("timeout_sec", verifier.timeout_sec),
                    env=MappingProxyType({**verifier.env, **step_verifier.str_map("env")}),
                    user=step_verifier.user("user") or verifier.user,
                ),
                min_reward=_min_reward(table),
            )
        )
    return tuple(steps)


def _min_reward(table: _Table) -> float | Mapping[str, float] | None:
    value = table.data.get("min_reward")
    if value is None:
        return None
    if isinstance(value, dict):
        if not value or not all(_is_number(v) for v in value.values()):
            raise table.error("min_reward", value, "must be a number or a table of numbers")
        return MappingProxyType({str(k): float(v) for k, v in value.items()})
    if not _is_number(value):
        raise table.error("min_reward", value, "must be a number or a table of numbers")
    return float(value)


def _is_number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def _artifacts(table: _Table, key: str) -> tuple[ArtifactSpec, ...]:
    """``artifacts``: paths (strings) or ``{source, destination, exclude, service}`` tables."""
    value = table.data.get(key, [])
    if not isinstance(value, list):
        raise table.error(key, value, "must be a list of paths or {source, ...} tables")
    specs: list[ArtifactSpec] = []
    for index, item in enumerate(value):
        entry = _Table(item if isinstance(item, dict) else {"source": item},
                       f"{table.prefix}{key}[{index}].", table.path)  # fmt: skip
        source = entry.string("source")
        if source is None or not source.startswith("/") or ".." in source.split("/"):
            raise entry.error("source", source, "must be an absolute container path without '..'")
        destination = entry.string("destination")
        if destination is not None and (
            destination.startswith("/") or ".." in destination.split("/") or not destination
        ):
            raise entry.error("destination", destination, "must be a relative path without '..'")
        specs.append(
            ArtifactSpec(
                source=source,
                destination=destination,
                exclude=entry.strings("exclude"),
                service=entry.string("service"),
            )
        )
    return tuple(specs)


def _collect_hooks(table: _Table) -> tuple[CollectHook, ...]:
    value = table.data.get("collect", [])
    if not isinstance(value, list) or not all(isinstance(v, dict) for v in value):
        raise table.error("collect", value, "must be an array of tables ([[verifier.collect]])")
    hooks: list[CollectHook] = []
    for index, data in enumerate(value):
        entry = _Table(data, f"{table.prefix}collect[{index}].", table.path)
        command = entry.string("command")
        if not command or not command.strip():
            raise entry.error("command", command, "is required (a shell command)")
        hooks.append(
            CollectHook(
                command=command,
                service=entry.string("service", "main") or "main",
                timeout_sec=entry.number("timeout_sec", 60.0),
            )
        )
    return tuple(hooks)


def _task_info(root: _Table) -> TaskInfo:
    table = root.table("task")
    name = table.string("name")
    if name is None:
        raise table.error("name", None, "is required in [task]")
    if not _NAME_RE.match(name) or ".." in name:
        raise table.error("name", name, "must look like 'org/name' (letters, digits, . _ -)")
    authors = table.data.get("authors", [])
    if not isinstance(authors, list) or not all(
        isinstance(a, dict) and isinstance(a.get("name"), str) for a in authors
    ):
        raise table.error("authors", authors, "must be a list of {name, email} tables")
    return TaskInfo(
        name=name,
        version=table.string("version"),
        description=table.string("description", "") or "",
        authors=tuple(Author(name=a["name"], email=a.get("email")) for a in authors),
        keywords=table.strings("keywords"),
    )


def _agent(table: _Table) -> AgentConfig:
    return AgentConfig(timeout_sec=table.optional_number("timeout_sec"), user=table.user("user"))


def _verifier(table: _Table) -> VerifierConfig:
    environment = _environment(table.table("environment")) if table.has("environment") else None
    default_mode = "shared" if environment is None else "separate"
    mode = table.string("environment_mode", default_mode) or default_mode
    if mode not in ("shared", "separate"):
        raise table.error("environment_mode", mode, "must be 'shared' or 'separate'")
    if environment is not None and mode == "shared":
        raise table.error("environment_mode", mode, "contradicts the [verifier.environment] table")
    return VerifierConfig(
        timeout_sec=table.number("timeout_sec", 600.0),
        env=table.str_map("env"),
        user=table.user("user"),
        environment_mode=mode,
        environment=environment,
        collect=_collect_hooks(table),
    )


def _environment(table: _Table) -> EnvironmentConfig:
    workdir = table.string("workdir")
    if workdir is not None and not workdir.startswith("/"):
        raise table.error("workdir", workdir, "must be an absolute path")
    return EnvironmentConfig(
        build_timeout_sec=table.number("build_timeout_sec", 600.0),
        docker_image=table.string("docker_image"),
        workdir=workdir,
        cpus=table.number("cpus", 1.0),
        memory_mb=_size(table, "memory_mb", "memory", 2048),
        storage_mb=_size(table, "storage_mb", "storage", 10240),
        gpus=table.integer("gpus", 0, minimum=0),
        env=table.str_map("env"),
        network_mode=_network_mode(table),
        allowed_hosts=table.strings("allowed_hosts"),
    )


def _size(table: _Table, key_mb: str, legacy_key: str, default: int) -> int:
    """``memory_mb`` or the legacy ``memory = "2G"``; both given must agree."""
    legacy = table.size_mb(legacy_key)
    if not table.has(key_mb):
        return default if legacy is None else legacy
    value = table.integer(key_mb, default, minimum=1)
    if legacy is not None and legacy != value:
        raise table.error(
            legacy_key, table.data[legacy_key], f"contradicts {key_mb} = {value} (give one)"
        )
    return value


def _network_mode(table: _Table) -> NetworkMode:
    """``network_mode`` if given, else the legacy ``allow_internet`` (default: public)."""
    allow_internet = table.boolean("allow_internet", True)
    raw = table.string("network_mode")
    hosts = table.strings("allowed_hosts")
    if raw is None:
        if hosts:
            return NetworkMode.ALLOWLIST
        return NetworkMode.PUBLIC if allow_internet else NetworkMode.NO_NETWORK
    try:
        mode = NetworkMode(raw)
    except ValueError:
        choices = ", ".join(repr(m.value) for m in NetworkMode)
        raise table.error("network_mode", raw, f"must be one of {choices}") from None
    if hosts and mode is not NetworkMode.ALLOWLIST:
        raise table.error("allowed_hosts", list(hosts), "needs network_mode = 'allowlist'")
    if table.has("allow_internet") and allow_internet != (mode is not NetworkMode.NO_NETWORK):
        raise table.error("allow_internet", allow_internet, f"contradicts network_mode = {raw!r}")
    return mode
