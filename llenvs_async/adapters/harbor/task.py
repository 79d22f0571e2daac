"""Harbor task directories parsed into frozen, typed configuration.

A task directory holds ``task.toml``, ``instruction.md``, ``environment/Dockerfile``
(or a prebuilt ``[environment].docker_image``), ``tests/test.sh`` and optionally
``solution/solve.sh``. Anything malformed raises ``TaskLoadError`` naming the
file, the field and the bad value; so does a format feature we do not run
(multi-step ``[[steps]]``, a separate verifier environment): a clear refusal rather
than a silently different episode. ``environment/docker-compose.yaml`` is parsed by
``compose.py`` (its sidecars run pod-style, see ``sidecars.py``).
"""

from __future__ import annotations

import base64
import io
import logging
import math
import os
import re
import shlex
import tarfile
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from types import MappingProxyType
from typing import Any

from ...errors import EnvError, TaskLoadError
from .compose import ComposeSpec, load_compose

__all__ = [
    "AgentConfig",
    "Author",
    "EnvironmentConfig",
    "HarborTask",
    "NetworkMode",
    "SolutionConfig",
    "TaskConfig",
    "TaskInfo",
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
_IGNORED_KEYS = ("artifacts",)
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
class VerifierConfig:
    """The ``[verifier]`` table; ``environment_mode`` is ``"shared"`` (the agent's container)
    unless the task says ``"separate"`` (which ``load_task`` refuses)."""

    timeout_sec: float = 600.0
    env: Mapping[str, str] = field(default_factory=_empty)
    user: str | int | None = None
    environment_mode: str = "shared"


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
    """Harbor keys present that llenvs-async does not act on (``artifacts``); logged on load."""


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

    def oracle_command(self) -> str:
        """Harbor's oracle as ONE shell action: unpack ``solution/`` to ``/solution`` and run
        ``bash /solution/solve.sh`` once, with ``[solution].env``, from the working directory.

        The files travel inside the command (a base64 tar), so the action is self-contained:
        nothing is uploaded behind an agent's back, and a replay of it restores the same state.
        """
        solution_dir = self._solve_sh().parent
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
    """``solution/`` as a gzipped tar rooted at ``solution/`` (root-owned, no mtimes)."""

    def normalise(info: tarfile.TarInfo) -> tarfile.TarInfo:
        info.uid = info.gid = 0
        info.uname = info.gname = "root"
        info.mtime = 0
        return info

    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz", compresslevel=9) as tar:
        tar.add(solution_dir, arcname=SOLUTION_DIR.lstrip("/"), filter=normalise)
    return buf.getvalue()


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
        ignored=tuple(key for key in _IGNORED_KEYS if root.has(key)),
    )


def _steps(root: _Table, path: str) -> int:
    value = root.data.get("steps", [])
    if not isinstance(value, list) or not all(isinstance(v, dict) for v in value):
        raise root.error("steps", value, "must be an array of tables ([[steps]])")
    return len(value)


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
    mode = table.string("environment_mode", "shared") or "shared"
    if mode not in ("shared", "separate"):
        raise table.error("environment_mode", mode, "must be 'shared' or 'separate'")
    return VerifierConfig(
        timeout_sec=table.number("timeout_sec", 600.0),
        env=table.str_map("env"),
        user=table.user("user"),
        environment_mode=mode,
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
    _refuse_unsupported(root, config, str(toml_path))
    for key in config.ignored:
        _log.warning("%s: %r is not supported by llenvs-async and is ignored", toml_path, key)
    instruction_path = root / "instruction.md"
    if not instruction_path.is_file():
        raise TaskLoadError("is missing", path=str(instruction_path))
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
    if not (tests_dir / "test.sh").is_file():
        raise TaskLoadError("is missing (the verifier)", path=str(tests_dir / "test.sh"))
    solution_dir = root / "solution"
    compose_files = [root / "environment" / n for n in COMPOSE_FILES]
    compose_path = next((p for p in compose_files if p.is_file()), None)
    compose = load_compose(compose_path) if compose_path is not None else None
    name = config.task.name if config.task is not None else (fallback_name or root.name)
    return HarborTask(
        path=root,
        name=name,
        config=config,
        instruction=instruction,
        dockerfile=dockerfile_or_none,
        tests_dir=tests_dir,
        solution_dir=solution_dir if solution_dir.is_dir() else None,
        compose=compose,
    )


def _refuse_unsupported(root: Path, config: TaskConfig, toml_path: str) -> None:
    """Raise ``TaskLoadError`` for format features whose episode we would run differently."""
    if config.steps or (root / "steps").is_dir():
        raise TaskLoadError(
            f"is a multi-step task ({config.steps} [[steps]], steps/*/instruction.md), which "
            "llenvs-async does not run yet (each step has its own instruction, tests and reward)",
            path=toml_path,
            field="steps",
        )
    if config.verifier.environment_mode == "separate":
        raise TaskLoadError(
            "asks for a separate verifier environment (tests/Dockerfile), which llenvs-async "
            "does not build yet; running the verifier in the agent's container instead could "
            "score differently, so the task is refused",
            path=toml_path,
            field="verifier.environment_mode",
            value="separate",
        )


def _read(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise TaskLoadError(f"is not UTF-8 text: {exc}", path=str(path)) from exc
    except OSError as exc:
        raise TaskLoadError(f"cannot be read: {exc}", path=str(path)) from exc
