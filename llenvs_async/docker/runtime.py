"""Container runtimes: what starts a box (a Docker container under runc, a gVisor sandbox)
behind one interface, and the registry that names them.

This layer defines ``RUNC``; a layer above registers its own runtime when it is imported
(``llenvs_async.sandbox`` registers ``"gvisor"``). So that a name works without the caller
importing its provider first, ``get_runtime`` loads the provider of a known name on first
use: the name of a module, as data, never an import of it here, so the dependency stays
one-way (``tests/test_layering.py``).
"""

from __future__ import annotations

import importlib
import tarfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from ..errors import EnvError
from ..host import Capability, ShellHost, ShellKind
from .container import Container, ContainerSpec

if TYPE_CHECKING:
    from ..host import CommandResult, ShellSession
    from ..types import State
    from .engine import DockerEngine

__all__ = [
    "RUNC",
    "ForkPoint",
    "ProcessFork",
    "RuncRuntime",
    "Runtime",
    "RuntimeHost",
    "get_runtime",
    "register_runtime",
    "runtime_names",
]


class RuntimeHost(ShellHost, Protocol):
    """A started box of some runtime: persistent shells, one-off execs, removal."""

    async def shell(self, *, shell: ShellKind = ..., max_output_bytes: int = ...) -> ShellSession:
        """A persistent shell, closed with the box."""
        ...

    async def exec(
        self,
        argv: str | Sequence[str],
        *,
        timeout: float | None = ...,  # noqa: ASYNC109 - the box kills the process past it
        env: Mapping[str, str] | None = ...,
        workdir: str | None = ...,
        user: str | None = ...,
        max_output_bytes: int = ...,
    ) -> CommandResult: ...

    async def put_file(self, path: str, content: bytes | str, *, mode: int = ...) -> None: ...

    async def put_files(self, files: Mapping[str, bytes | str], *, mode: int = ...) -> None: ...

    async def put_archive(self, directory: str, tar_bytes: bytes) -> None:
        """Unpack ``tar_bytes`` into ``directory`` (as root)."""
        ...

    async def get_file(self, path: str) -> bytes:
        """A regular file's bytes (``ContainerError`` when it is not one)."""
        ...

    async def inspect(self) -> dict[str, Any]:
        """Docker-shaped details (``Id``, ``Config.WorkingDir``/``Env``)."""
        ...

    @property
    def capabilities(self) -> frozenset[Capability]: ...

    async def commit(
        self,
        repo: str,
        tag: str = ...,
        *,
        labels: Mapping[str, str] | None = ...,
        changes: Sequence[str] = ...,
    ) -> str:
        """The box's filesystem as an image (``commit``; else ``EnvError``)."""
        ...

    async def get_archive(self, path: str) -> tarfile.TarFile:
        """A path of the box as a tar (``archives``; else ``EnvError``)."""
        ...

    async def pids(self) -> tuple[int, int | None]:
        """Its process count and limit (``pids``; else ``EnvError``)."""
        ...

    async def storage_used(self) -> int:
        """Bytes its writable layer holds (``storage``; else ``EnvError``)."""
        ...

    async def aclose(self) -> None: ...


class Runtime(Protocol):
    """How boxes are started: ``check`` says whether it can run here (raising an error that
    names what is missing), ``create`` starts one from a spec."""

    @property
    def name(self) -> str: ...

    @property
    def capabilities(self) -> frozenset[Capability]:
        """What its boxes can do beyond exec and files (``Capability``): a ``WarmPool``
        standing in for ``create``, commits, checkpoints, archives, sidecars, pids."""
        ...

    def check(self) -> None: ...

    async def create(self, engine: DockerEngine, spec: ContainerSpec) -> RuntimeHost: ...

    def process_fork(self, *, timeout: float) -> ProcessFork[Any, Any]:
        """A fork of whole boxes, processes included (``checkpoint``), else ``EnvError``."""
        ...


class ForkPoint(Protocol):
    """A checkpoint a ``ProcessFork`` made, named in the restore records."""

    @property
    def name(self) -> str: ...

    @property
    def image(self) -> str:
        """The image of the checkpointed box."""
        ...

    async def resume(self, labels: Mapping[str, str]) -> tuple[RuntimeHost, ShellSession]:
        """A new box resumed from this checkpoint, owned per ``labels``, and a session on
        its (running) shell."""
        ...


E_contra = TypeVar("E_contra", contravariant=True)
P = TypeVar("P", bound=ForkPoint)


class ProcessFork(Protocol[E_contra, P]):
    """How a ``SnapshotFork`` forks whole boxes, processes included, on one runtime: the
    replayed box is checkpointed and copies resume from it. It owns its checkpoints."""

    @property
    def runtime(self) -> str:
        """The runtime whose boxes it forks (the environment's ``container_runtime``)."""
        ...

    async def checkpoint(
        self, env: E_contra, state: State, name: str, labels: Mapping[str, str]
    ) -> P:
        """Checkpoint ``env``'s replayed box (at ``state``; it stops) as ``name``, owned
        per ``labels``, and continue ``env`` in a box resumed from it."""
        ...

    async def resume(self, env: E_contra, checkpoint: P, state: State) -> None:
        """Continue ``state`` in ``env``, in a new box resumed from ``checkpoint``."""
        ...

    async def aclose(self) -> None:
        """Remove every checkpoint made (idempotent)."""
        ...


@dataclass(frozen=True, slots=True)
class RuncRuntime:
    """Docker containers (the daemon's default runtime, runc)."""

    name: str = "runc"
    capabilities: frozenset[Capability] = Container.capabilities

    def check(self) -> None:
        """Nothing to check before connecting: the engine reports an unreachable daemon."""

    async def create(self, engine: DockerEngine, spec: ContainerSpec) -> RuntimeHost:
        return await Container.create(engine, spec)

    def process_fork(self, *, timeout: float) -> ProcessFork[Any, Any]:
        raise EnvError(
            "runc boxes are not checkpointed (the runtime lacks the 'checkpoint' capability); "
            "their filesystem is committed instead"
        )


RUNC = RuncRuntime()
_registered: dict[str, Runtime] = {RUNC.name: RUNC}
# Runtimes provided by layers above this one: importing the module registers the runtime.
_PROVIDERS = {"gvisor": "llenvs_async.sandbox"}


def register_runtime(runtime: Runtime) -> None:
    """Make ``runtime`` available by its name (a later registration of a name replaces it)."""
    _registered[runtime.name] = runtime


def runtime_names() -> tuple[str, ...]:
    """Every runtime name ``get_runtime`` knows (registered, or provided on first use)."""
    return tuple(dict.fromkeys([*_registered, *_PROVIDERS]))


def get_runtime(name: str) -> Runtime:
    """The runtime registered as ``name`` (loading its provider if need be), else
    ``ValueError`` naming the known ones."""
    if name not in _registered and name in _PROVIDERS:
        importlib.import_module(_PROVIDERS[name])
    try:
        return _registered[name]
    except KeyError:
        known = " or ".join(repr(n) for n in runtime_names())
        raise ValueError(f"runtime must be {known}, got {name!r}") from None
