"""Artifacts and ``[[verifier.collect]]`` hooks: what crosses from the agent's container.

Before a verification the task's collect hooks run, in order, in their service (``main``:
the agent's container, else the compose sidecar of that name; a hook that fails is
recorded, never fatal, as in Harbor). Then ``/logs/artifacts`` and every declared
``artifacts`` entry (``exclude`` patterns dropped, as ``tar --exclude`` would) are read out
of their service's container (the agent's by default): a separate verifier gets them
at their original absolute paths, and with an artifacts directory (``HarborAdapter(
artifacts_dir=...)``) they are kept on the host under ``<task>/<episode>/<destination>``
in either verifier mode. A missing source is recorded as missing, not an error.
"""

from __future__ import annotations

import asyncio
import fnmatch
import io
import tarfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from ....docker.container import Container
from ....docker.runtime import RuntimeHost
from ....errors import ContainerError, VerifierError
from ..tasks.config import ArtifactSpec, CollectHook

__all__ = [
    "ARTIFACTS_DIR",
    "MAX_ARTIFACT_BYTES",
    "Collected",
    "collect_artifacts",
    "run_collect_hooks",
    "save_artifacts",
    "transfer_tar",
]

ARTIFACTS_DIR = "/logs/artifacts"
MAX_ARTIFACT_BYTES = 512 << 20
"""Artifacts are held in memory on their way; more than this is a ``VerifierError``."""
T = TypeVar("T")
_CONVENTION = ArtifactSpec(source=ARTIFACTS_DIR, destination="logs-artifacts")


async def run_collect_hooks(
    services: Mapping[str, RuntimeHost], hooks: Sequence[CollectHook], *, task_name: str
) -> list[dict[str, Any]]:
    """Run each hook in its service; their outcomes (``service``, ``command``, ``exit_code``,
    ``timed_out``) for the step's info."""
    outcomes: list[dict[str, Any]] = []
    for hook in hooks:
        container = _service(services, hook.service, task_name, "a [[verifier.collect]] hook")
        run = await container.exec(["/bin/sh", "-c", hook.command], timeout=hook.timeout_sec)
        outcomes.append(
            {
                "service": hook.service,
                "command": hook.command[:200],
                "exit_code": run.exit_code,
                "timed_out": run.timed_out,
            }
        )
    return outcomes


def _service(services: Mapping[str, T], name: str, task_name: str, what: str) -> T:
    """The container of service ``name`` (load_task checks the names; a sidecar that is not
    running, e.g. under a runtime without sidecars, is a setup error)."""
    if name not in services:
        raise VerifierError(
            f"{what} of {task_name!r} uses service {name!r}, which this environment does not "
            f"have (services: {sorted(services)})",
            kind="setup",
        )
    return services[name]


@dataclass(frozen=True, slots=True, kw_only=True)
class Collected:
    """One artifact read out of a container: its tar members (``None``: the source is
    missing), names relative to the source's parent directory."""

    spec: ArtifactSpec
    members: tuple[tuple[tarfile.TarInfo, bytes | None], ...] | None

    @property
    def size(self) -> int:
        return sum(len(data or b"") for _, data in self.members or ())

    def manifest(self) -> dict[str, Any]:
        where = {"source": self.spec.source}
        if self.spec.service not in (None, "main"):
            where["service"] = self.spec.service
        if self.members is None:
            return {**where, "missing": True}
        files = sum(1 for info, _ in self.members if info.isfile())
        return {**where, "target": self.spec.target, "files": files, "bytes": self.size}

    def renamed(self, root: str) -> list[tuple[tarfile.TarInfo, bytes | None]]:
        """The members with their first path component replaced by ``root``."""
        out = []
        for info, data in self.members or ():
            _, _, rest = info.name.partition("/")
            copy = tarfile.TarInfo(f"{root}/{rest}" if rest else root)
            for key in ("mode", "type", "linkname", "size", "mtime"):
                setattr(copy, key, getattr(info, key))
            out.append((copy, data))
        return out


def _excluded(relative: str, patterns: Sequence[str]) -> bool:
    """``tar --exclude`` semantics: a pattern matches a path prefix or any component."""
    parts = relative.split("/")
    for pattern in patterns:
        pattern = pattern.removeprefix("./").rstrip("/")
        for end in range(1, len(parts) + 1):
            if fnmatch.fnmatchcase("/".join(parts[:end]), pattern) or fnmatch.fnmatchcase(
                parts[end - 1], pattern
            ):
                return True
    return False


async def _read_one(container: Container, spec: ArtifactSpec) -> Collected:
    try:
        tar = await container.get_archive(spec.source)
    except ContainerError as exc:
        if exc.status == 404:
            return Collected(spec=spec, members=None)
        raise
    members: list[tuple[tarfile.TarInfo, bytes | None]] = []
    with tar:
        for info in tar:
            _, _, relative = info.name.partition("/")
            if relative and _excluded(relative, spec.exclude):
                continue
            extracted = tar.extractfile(info) if info.isfile() else None
            members.append((info, extracted.read() if extracted is not None else None))
    return Collected(spec=spec, members=tuple(members))


async def collect_artifacts(
    services: Mapping[str, Container], specs: Sequence[ArtifactSpec], *, task_name: str
) -> list[Collected]:
    """``/logs/artifacts`` (the main container's) and every declared artifact, each read
    from its service's container (``services``: ``main`` and the sidecars by name)."""
    collected = []
    for spec in (_CONVENTION, *specs):
        container = _service(services, spec.service or "main", task_name, "an artifact")
        collected.append(await _read_one(container, spec))
    total = sum(c.size for c in collected)
    if total > MAX_ARTIFACT_BYTES:
        raise VerifierError(
            f"the artifacts of {task_name!r} hold {total} bytes, more than "
            f"{MAX_ARTIFACT_BYTES} (sources: {[c.spec.source for c in collected]})",
            kind="artifacts",
        )
    return collected


def transfer_tar(collected: Sequence[Collected]) -> tuple[bytes, list[str]]:
    """A tar to extract at ``/`` that puts every found artifact at its original path, and
    the parent directories to create first."""
    buf = io.BytesIO()
    parents: list[str] = []
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for item in collected:
            if item.members is None:
                continue
            parents.append(item.spec.source.rstrip("/").rsplit("/", 1)[0] or "/")
            for info, data in item.renamed(item.spec.source.strip("/")):
                info.uid = info.gid = 0
                info.uname = info.gname = "root"
                tar.addfile(info, io.BytesIO(data) if data is not None else None)
    return buf.getvalue(), parents


async def save_artifacts(collected: Sequence[Collected], directory: Path) -> None:
    """Write the found artifacts under ``directory/<destination>`` (safe extraction)."""

    def write() -> None:
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w") as tar:
            for item in collected:
                for info, data in item.renamed(item.spec.target):
                    tar.addfile(info, io.BytesIO(data) if data is not None else None)
        directory.mkdir(parents=True, exist_ok=True)
        buf.seek(0)
        with tarfile.open(fileobj=buf, mode="r") as tar:
            tar.extractall(directory, filter="data")

    await asyncio.to_thread(write)
