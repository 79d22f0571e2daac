"""Harbor task directories parsed into frozen, typed configuration.

A task directory holds ``task.toml``, ``instruction.md``, ``environment/Dockerfile``
(or a prebuilt ``[environment].docker_image``), ``tests/test.sh`` and optionally
``solution/solve.sh``. Multi-step tasks (``[[steps]]``) keep each step's instruction,
tests, solution and ``workdir/`` under ``steps/<name>/``; a separate verifier
(``[verifier].environment_mode = "separate"`` or a ``[verifier.environment]`` table)
is built from ``tests/`` (``tests/Dockerfile``); ``environment/docker-compose.yaml`` is
parsed by ``compose.py`` (its sidecars run pod-style, see ``sidecars.py``). Anything
malformed raises ``TaskLoadError`` naming the file, the field and the bad value; so does
a format feature we do not run (a separate verifier inside a multi-step task): a clear
refusal rather than a silently different episode.
"""

from __future__ import annotations

import base64
import gzip
import io
import logging
import math
import os
import re
import shlex
import tarfile
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from enum import StrEnum
from pathlib import Path
from types import MappingProxyType
from typing import Any

from ...errors import EnvError, TaskLoadError
from .compose import ComposeSpec, load_compose

__all__ = [
    "AgentConfig",
    "ArtifactSpec",
    "Author",
    "CollectHook",
    "EnvironmentConfig",
    "HarborTask",
    "NetworkMode",
    "SolutionConfig",
    "StepConfig",
    "TaskConfig",
    "TaskInfo",
    "TaskStep",
    "VerifierConfig",
    "load_task",
    "parse_task_config",
    "resolve_env",
    "short_name",
]

_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*(/[A-Za-z0-9][A-Za-z0-9._-]*)?$")
_SIZE_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([KMG])B?\s*$", re.IGNORECASE)
_SIZE_FACTOR_MB = {"K": 1 / 1024, "M": 1.0, "G": 1024.0}
_EMPTY: Mapping[str, Any] = MappingProxyType({})
_ENV_VAR_RE = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}")
_WORKDIR_RE = re.compile(r"^\s*WORKDIR\s+(\S+)\s*$", re.IGNORECASE | re.MULTILINE)
_MAX_SOLUTION_B64 = 4 << 20
SOLUTION_DIR = "/solution"
_IGNORED_KEYS: tuple[str, ...] = ()
_STEP_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
REWARD_STRATEGIES = ("mean", "final")
_IGNORED_STEP_KEYS = ("healthcheck", "artifacts")
_log = logging.getLogger("llenvs_async.harbor")
COMPOSE_FILES = ("docker-compose.yaml", "docker-compose.yml", "compose.yaml", "compose.yml")


def _empty() -> Mapping[str, Any]:
    return _EMPTY


def short_name(name: str) -> str:
    """The part of a task name after its ``org/`` prefix (Harbor compares names on it)."""
    return name.rsplit("/", 1)[-1]


class NetworkMode(StrEnum):
    """Harbor's ``[environment].network_mode`` values."""

    NO_NETWORK = "no-network"
    PUBLIC = "public"
    ALLOWLIST = "allowlist"


@dataclass(frozen=True, slots=True, kw_only=True)
class Author:
    name: str
    email: str | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class TaskInfo:
    """The ``[task]`` table (schema 1.4): the package name and its description."""

    name: str
    version: str | None = None
    description: str = ""
    authors: tuple[Author, ...] = ()
    keywords: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True, kw_only=True)
class AgentConfig:
    """The ``[agent]`` table; ``timeout_sec`` is the trajectory budget (None = unlimited)."""

    timeout_sec: float | None = None
    user: str | int | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class CollectHook:
    """One ``[[verifier.collect]]`` entry: a command run in ``service`` (``"main"``: the
    agent's container) before the artifacts are collected."""

    command: str
    service: str = "main"
    timeout_sec: float = 60.0


@dataclass(frozen=True, slots=True, kw_only=True)
class ArtifactSpec:
    """One ``artifacts`` entry: a container path (``source``) handed to a separate verifier at
    the same path and kept under ``destination`` (relative; default: the source's name)."""

    source: str
    destination: str | None = None
    exclude: tuple[str, ...] = ()
    service: str | None = None

    @property
    def target(self) -> str:
        """Where it is kept, relative to an episode's artifact directory."""
        return self.destination or self.source.rstrip("/").rsplit("/", 1)[-1] or "root"


@dataclass(frozen=True, slots=True, kw_only=True)
class VerifierConfig:
    """The ``[verifier]`` table; ``environment_mode`` is ``"shared"`` (the agent's container)
    unless the task says ``"separate"`` or gives a ``[verifier.environment]`` table."""

    timeout_sec: float = 600.0
    env: Mapping[str, str] = field(default_factory=_empty)
    user: str | int | None = None
    environment_mode: str = "shared"
    environment: EnvironmentConfig | None = None
    """``[verifier.environment]``; a separate verifier without it copies ``[environment]``."""
    collect: tuple[CollectHook, ...] = ()

    @property
    def separate(self) -> bool:
        return self.environment_mode == "separate"


@dataclass(frozen=True, slots=True, kw_only=True)
class SolutionConfig:
    """The ``[solution]`` table: environment variables of the oracle's ``solve.sh``."""

    env: Mapping[str, str] = field(default_factory=_empty)


@dataclass(frozen=True, slots=True, kw_only=True)
class EnvironmentConfig:
    """The ``[environment]`` table, legacy ``allow_internet``/``memory``/``storage`` folded in."""

    build_timeout_sec: float = 600.0
    docker_image: str | None = None
    workdir: str | None = None
    cpus: float = 1.0
    memory_mb: int = 2048
    storage_mb: int = 10240
    gpus: int = 0
    env: Mapping[str, str] = field(default_factory=_empty)
    network_mode: NetworkMode = NetworkMode.PUBLIC
    allowed_hosts: tuple[str, ...] = ()

    @property
    def wants_network(self) -> bool:
        return self.network_mode is not NetworkMode.NO_NETWORK


@dataclass(frozen=True, slots=True, kw_only=True)
class TaskConfig:
    """A parsed ``task.toml``."""

    schema_version: str = "1.0"
    task: TaskInfo | None = None
    metadata: Mapping[str, Any] = field(default_factory=_empty)
    agent: AgentConfig = field(default_factory=AgentConfig)
    verifier: VerifierConfig = field(default_factory=VerifierConfig)
    environment: EnvironmentConfig = field(default_factory=EnvironmentConfig)
    solution: SolutionConfig = field(default_factory=SolutionConfig)
    steps: int = 0
    """How many ``[[steps]]`` tables the file has (multi-step tasks; 0 for ordinary ones)."""
    ignored: tuple[str, ...] = ()
    """Harbor keys present that llenvs-async does not act on; logged on load."""
    artifacts: tuple[ArtifactSpec, ...] = ()
    step_configs: tuple[StepConfig, ...] = ()
    """The ``[[steps]]`` tables, in order (their agent/verifier fall back to the task's)."""
    multi_step_reward_strategy: str = "mean"


@dataclass(frozen=True, slots=True, kw_only=True)
class StepConfig:
    """One ``[[steps]]`` table; ``agent``/``verifier`` already fall back to the task's
    ``[agent]``/``[verifier]``. ``min_reward``: a number gates the step's reward, a mapping
    gates named reward keys (a missing key fails); a miss ends the episode."""

    name: str
    agent: AgentConfig = field(default_factory=AgentConfig)
    verifier: VerifierConfig = field(default_factory=VerifierConfig)
    min_reward: float | Mapping[str, float] | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class TaskStep:
    """One step of a multi-step task: its configuration and ``steps/<name>/`` directory."""

    config: StepConfig
    path: Path
    instruction: str

    @property
    def name(self) -> str:
        return self.config.name

    @property
    def tests_dir(self) -> Path | None:
        found = self.path / "tests"
        return found if found.is_dir() else None

    @property
    def solution_dir(self) -> Path | None:
        found = self.path / "solution"
        return found if (found / "solve.sh").is_file() else None

    @property
    def workdir_dir(self) -> Path | None:
        found = self.path / "workdir"
        return found if found.is_dir() else None


def resolve_env(env: Mapping[str, str], task_name: str) -> dict[str, str]:
    """Expand ``${VAR}`` / ``${VAR:-default}`` in task env values from the host environment."""

    def expand(match: re.Match[str]) -> str:
        name, default = match.group(1), match.group(2)
        value = os.environ.get(name, default)
        if value is None:
            raise EnvError(
                f"task {task_name!r} needs host environment variable {name} "
                "(set it, or give a default as ${VAR:-default} in task.toml)"
            )
        return value

    return {key: _ENV_VAR_RE.sub(expand, value) for key, value in env.items()}


@dataclass(frozen=True, slots=True, kw_only=True)
class HarborTask:
    """One loaded task: its directory, name, configuration and instruction."""

    path: Path
    name: str
    config: TaskConfig
    instruction: str
    dockerfile: Path | None
    tests_dir: Path
    solution_dir: Path | None
    steps: tuple[TaskStep, ...] = ()
    """A multi-step task's steps, in order (empty for an ordinary task)."""
    compose: ComposeSpec | None = None
    """``environment/docker-compose.yaml``: the main service's settings and its sidecars."""

    @property
    def short_name(self) -> str:
        return short_name(self.name)

    @property
    def environment_dir(self) -> Path:
        return self.path / "environment"

    @property
    def declared_workdir(self) -> str:
        """``[environment].workdir``, else the Dockerfile's last absolute ``WORKDIR``, else ``/``
        (what a policy can know before a container exists)."""
        if self.config.environment.workdir:
            return self.config.environment.workdir
        if self.dockerfile is not None:
            found = _WORKDIR_RE.findall(_read(self.dockerfile))
            if found and found[-1].startswith("/"):
                return str(found[-1])
        return "/"

    def oracle_command(self, solution_dir: Path | None = None) -> str:
        """Harbor's oracle as ONE shell action: unpack ``solution/`` (or ``solution_dir``, a
        step's) to ``/solution`` and run ``bash /solution/solve.sh`` once, with
        ``[solution].env``, from the working directory.

        The files travel inside the command (a base64 tar), so the action is self-contained:
        nothing is uploaded behind an agent's back, and a replay of it restores the same state.
        """
        solution_dir = solution_dir or self._solve_sh().parent
        payload = base64.b64encode(_solution_tar(solution_dir)).decode("ascii")
        if len(payload) > _MAX_SOLUTION_B64:
            raise TaskLoadError(
                f"is too large for the oracle ({len(payload)} base64 bytes, at most "
                f"{_MAX_SOLUTION_B64})",
                path=str(solution_dir),
                field="solution",
            )
        env = resolve_env(self.config.solution.env, self.name)
        assign = "".join(f"{shlex.quote(f'{k}={v}')} " for k, v in sorted(env.items()))
        return (
            f"rm -rf {SOLUTION_DIR} && printf '%s' '{payload}' | base64 -d | tar -xzf - -C / "
            f"&& env {assign}bash {SOLUTION_DIR}/solve.sh"
        )

    def solution_commands(self) -> tuple[str, ...]:
        """``solution/solve.sh`` split into one command per non-blank, non-comment line: the
        example tasks' convention, for multi-step trajectories (restore, Q-value demos). Real
        scripts (heredocs, multi-line strings, ``set -e``, helper files) need ``oracle_command``.
        """
        text = _read(self._solve_sh())
        return tuple(
            line.strip()
            for line in text.splitlines()
            if line.strip() and not line.lstrip().startswith("#")
        )

    def _solve_sh(self) -> Path:
        if self.solution_dir is None or not (self.solution_dir / "solve.sh").is_file():
            raise TaskLoadError(
                "task has no solution/solve.sh", path=str(self.path), field="solution"
            )
        return self.solution_dir / "solve.sh"


def _solution_tar(solution_dir: Path) -> bytes:
    """``solution/`` as a gzipped tar rooted at ``solution/`` (root-owned, no mtimes, not
    even the gzip header's: the same files give the same command in every process, so an
    oracle recognises its earlier actions in a saved trajectory)."""

    def normalise(info: tarfile.TarInfo) -> tarfile.TarInfo:
        info.uid = info.gid = 0
        info.uname = info.gname = "root"
        info.mtime = 0
        return info

    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        tar.add(solution_dir, arcname=SOLUTION_DIR.lstrip("/"), filter=normalise)
    return gzip.compress(buf.getvalue(), compresslevel=9, mtime=0)


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


def load_task(path: Path | str, *, fallback_name: str | None = None) -> HarborTask:
    """Load and validate a task directory; its name is ``[task].name``, else
    ``fallback_name`` (the registry's name), else the directory name."""
    root = Path(path)
    if not root.is_dir():
        raise TaskLoadError("is not a task directory", path=str(root))
    toml_path = root / "task.toml"
    if not toml_path.is_file():
        raise TaskLoadError("is missing (every Harbor task has one)", path=str(toml_path))
    config = parse_task_config(_read(toml_path), path=str(toml_path))
    for key in config.ignored:
        _log.warning("%s: %r is not supported by llenvs-async and is ignored", toml_path, key)
    steps = _load_steps(root, config, str(toml_path))
    instruction_path = root / "instruction.md"
    if steps and not instruction_path.is_file():
        instruction = steps[0].instruction  # never shown: each step has its own
    elif not instruction_path.is_file():
        raise TaskLoadError("is missing", path=str(instruction_path))
    else:
        instruction = _read(instruction_path).strip()
    if not instruction:
        raise TaskLoadError("is empty", path=str(instruction_path))
    dockerfile = root / "environment" / "Dockerfile"
    if not dockerfile.is_file():
        if config.environment.docker_image is None:
            raise TaskLoadError(
                "is missing and task.toml names no prebuilt image",
                path=str(dockerfile),
                field="environment.docker_image",
            )
        dockerfile_or_none: Path | None = None
    else:
        dockerfile_or_none = dockerfile
    tests_dir = root / "tests"
    _check_verifier_files(root, config, steps)
    solution_dir = root / "solution"
    compose_files = [root / "environment" / n for n in COMPOSE_FILES]
    compose_path = next((p for p in compose_files if p.is_file()), None)
    compose = load_compose(compose_path) if compose_path is not None else None
    _check_services(config, compose, str(toml_path))
    name = config.task.name if config.task is not None else (fallback_name or root.name)
    return HarborTask(
        path=root,
        name=name,
        config=config,
        instruction=instruction,
        dockerfile=dockerfile_or_none,
        tests_dir=tests_dir,
        solution_dir=solution_dir if solution_dir.is_dir() else None,
        steps=steps,
        compose=compose,
    )


def _check_services(config: TaskConfig, compose: ComposeSpec | None, toml_path: str) -> None:
    """Every collect hook's and artifact's ``service`` is one the task has (``main``, or a
    service of its compose file)."""
    services = compose.service_names if compose is not None else ("main",)
    named: list[tuple[str, str | None]] = [
        (f"verifier.collect[{i}].service", hook.service)
        for i, hook in enumerate(config.verifier.collect)
    ]
    named += [(f"artifacts[{i}].service", a.service) for i, a in enumerate(config.artifacts)]
    for where, service in named:
        if service is not None and service not in services:
            raise TaskLoadError(
                f"names service {service!r}, which the task does not have "
                f"(services: {', '.join(services)}; sidecars come from "
                "environment/docker-compose.yaml)",
                path=toml_path,
                field=where,
                value=service,
            )


def _load_steps(root: Path, config: TaskConfig, toml_path: str) -> tuple[TaskStep, ...]:
    """Each ``[[steps]]`` table with its ``steps/<name>/instruction.md``."""
    if not config.step_configs:
        if (root / "steps").is_dir():
            raise TaskLoadError(
                "has a steps/ directory but task.toml declares no [[steps]]",
                path=toml_path,
                field="steps",
            )
        return ()
    if config.verifier.separate:
        raise TaskLoadError(
            "combines [[steps]] with a separate verifier environment, which llenvs-async does "
            "not run (every step's tests run in the one shared environment)",
            path=toml_path,
            field="verifier.environment_mode",
            value="separate",
        )
    steps = []
    for index, step in enumerate(config.step_configs):
        instruction_path = root / "steps" / step.name / "instruction.md"
        if not instruction_path.is_file():
            raise TaskLoadError(
                f"is missing (the instruction of step {index} {step.name!r})",
                path=str(instruction_path),
                field=f"steps[{index}].name",
                value=step.name,
            )
        instruction = _read(instruction_path).strip()
        if not instruction:
            raise TaskLoadError("is empty", path=str(instruction_path))
        steps.append(TaskStep(config=step, path=instruction_path.parent, instruction=instruction))
    return tuple(steps)


def _check_verifier_files(root: Path, config: TaskConfig, steps: tuple[TaskStep, ...]) -> None:
    """A test.sh for every verification: ``tests/test.sh`` (a step's own overrides it); a
    separate verifier's image holds it, so it needs ``tests/Dockerfile`` or a prebuilt image."""
    tests = root / "tests"
    if config.verifier.separate:
        env = config.verifier.environment
        if not (tests / "Dockerfile").is_file() and (env is None or env.docker_image is None):
            raise TaskLoadError(
                "is missing: a separate verifier is built from tests/Dockerfile (or "
                "[verifier.environment].docker_image names a prebuilt image)",
                path=str(tests / "Dockerfile"),
                field="verifier.environment_mode",
                value="separate",
            )
        return
    if steps:
        for step in steps:
            own = step.tests_dir is not None and (step.tests_dir / "test.sh").is_file()
            if not own and not (tests / "test.sh").is_file():
                raise TaskLoadError(
                    f"is missing (the verifier of step {step.name!r}; tests/test.sh would do)",
                    path=str(step.path / "tests" / "test.sh"),
                )
        return
    if not (tests / "test.sh").is_file():
        raise TaskLoadError("is missing (the verifier)", path=str(tests / "test.sh"))


def _read(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise TaskLoadError(f"is not UTF-8 text: {exc}", path=str(path)) from exc
    except OSError as exc:
        raise TaskLoadError(f"cannot be read: {exc}", path=str(path)) from exc
