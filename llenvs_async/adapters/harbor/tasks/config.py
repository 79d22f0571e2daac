"""What a Harbor ``task.toml`` says, as frozen values (parsed by ``task_toml.py``)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from types import MappingProxyType
from typing import Any

__all__ = [
    "AgentConfig",
    "ArtifactSpec",
    "Author",
    "CollectHook",
    "EnvironmentConfig",
    "NetworkMode",
    "SolutionConfig",
    "StepConfig",
    "TaskConfig",
    "TaskInfo",
    "VerifierConfig",
]

_EMPTY: Mapping[str, Any] = MappingProxyType({})


def _empty() -> Mapping[str, Any]:
    return _EMPTY


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
