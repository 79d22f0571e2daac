"""`Container`: a live container made from a ``ContainerSpec`` (``container_spec.py``): exec
with timeouts, persistent shells, files, commit, removal."""

from __future__ import annotations

import asyncio
import http.client
import json
import secrets
import tarfile
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

from .._ownership import OWNER_LABELS, SESSION_LABEL
from .._shield import shielded
from ..errors import ContainerError, LlenvsError
from ..host import (
    Capability,
    Carrier,
    Host,
    ShellChannel,
    ShellSession,
)
from .container_spec import DEFAULT_CAP_DROP, ContainerSpec
from .engine import DockerEngine, ExecStream
from .reaper import register_backstop, remove_container_sync

__all__ = ["DEFAULT_CAP_DROP", "Container", "ContainerSpec"]

# One value per ``Container.create`` call: finds a container whose create request was cut
# off (timeout) after the daemon made it but before its id came back.
_CREATE_LABEL = "llenvs.create"


class Container(Host):
    """A started container owned by this process; ``aclose`` force-removes it (idempotent,
    shielded from cancellation and bounded by ``remove_timeout``).
    """

    capabilities: ClassVar[frozenset[Capability]] = frozenset(
        {"warm_pool", "commit", "archives", "sidecars", "pids", "storage"}
    )

    def __init__(
        self, engine: DockerEngine, container_id: str, spec: ContainerSpec, *, remove_timeout: float
    ) -> None:
        self.engine = engine
        self.id = container_id
        self.spec = spec
        self.remove_timeout = remove_timeout
        self._sessions: list[ShellSession] = []
        self._closed = False

    @classmethod
    async def create(
        cls,
        engine: DockerEngine,
        spec: ContainerSpec,
        *,
        create_timeout: float = 120.0,
        remove_timeout: float = 30.0,
    ) -> Container:
        """Create and start a container (never pulls: images must exist locally)."""
        config = spec.to_config(engine.labels)
        nonce = secrets.token_hex(8)
        config["Labels"][_CREATE_LABEL] = nonce
        register_backstop(engine.url)
        created: list[str] = []

        async def remove_leftovers() -> None:
            if not created:  # the create request may have been cut off after the daemon acted
                found = await engine.list_containers({_CREATE_LABEL: nonce})
                created.extend(str(item["Id"]) for item in found)
            for cid in created:
                await engine.remove_container(cid)

        async def create() -> str:
            action = f"creating a container from {spec.image!r}"
            container_id = await engine.create_container(
                config, name=spec.name, action=action, image=spec.image
            )
            created.append(container_id)
            await engine.start_container(container_id)
            return container_id

        try:
            container_id = await shielded(create(), within=create_timeout)
        except BaseException as exc:
            try:
                await shielded(remove_leftovers(), within=remove_timeout)
            except (LlenvsError, TimeoutError) as cleanup:  # keep the original error first
                exc.add_note(f"removing the half-made container failed too: {cleanup!r}")
            if isinstance(exc, TimeoutError):
                raise ContainerError(
                    f"creating a container from {spec.image!r} took over {create_timeout}s"
                ) from exc
            raise
        return cls(engine, container_id, spec, remove_timeout=remove_timeout)

    @property
    def short_id(self) -> str:
        return self.id[:12]

    async def inspect(self) -> dict[str, Any]:
        self._check_open()
        return await self.engine.inspect_container(self.id)

    async def pids(self) -> tuple[int, int | None]:
        """How many processes the container holds and its limit (``None``: none), from the
        engine's stats: no process needs to start inside (one may not be able to)."""
        self._check_open()
        stats = await self.engine.request_json(
            "GET",
            f"containers/{self.id}/stats",
            params={"stream": "false", "one-shot": "true"},
            action=f"reading the stats of container {self.short_id}",
        )
        pids = stats.get("pids_stats") or {}
        limit = pids.get("limit")
        return int(pids.get("current", 0)), int(limit) if limit else None

    async def storage_used(self) -> int:
        """Bytes in the container's writable layer (the engine's ``SizeRw``: a walk of the
        layer by the daemon, ~10-30 ms for a few thousand files)."""
        self._check_open()
        data = await self.engine.request_json(
            "GET",
            f"containers/{self.id}/json",
            params={"size": "true"},
            action=f"measuring the writable layer of container {self.short_id}",
        )
        return int(data.get("SizeRw") or 0)

    async def open_exec(
        self,
        argv: Sequence[str],
        *,
        stdin: bool = False,
        env: Mapping[str, str] | None = None,
        workdir: str | None = None,
        user: str | None = None,
    ) -> ExecStream:
        """Start an exec with its stream attached (the caller closes the stream)."""
        self._check_open()
        return await self.engine.open_exec(
            self.id, argv, stdin=stdin, env=env, workdir=workdir, user=user
        )

    async def open_channel(self, argv: list[str]) -> ShellChannel:
        """An exec of ``argv`` with stdin attached, as a persistent shell's channel."""
        return await self.open_exec(argv, stdin=True)

    async def _spawn(
        self,
        argv: Sequence[str],
        *,
        env: Mapping[str, str] | None = None,
        workdir: str | None = None,
        user: str | None = None,
        stdin: bytes | None = None,
    ) -> Carrier:
        if stdin is not None:
            raise ValueError("a Docker exec takes no stdin here: use put_archive for files")
        return _ExecCarrier(await self.open_exec(argv, env=env, workdir=workdir, user=user))

    async def put_archive(self, directory: str, tar_bytes: bytes) -> None:
        """Extract a tar archive into ``directory`` (which must exist)."""
        self._check_open()
        await self.engine.put_archive(self.id, directory, tar_bytes)

    async def get_archive(self, path: str) -> tarfile.TarFile:
        """A file or directory of the container as an in-memory tar (members rooted at its
        base name); a missing path raises ``ContainerError`` with ``status`` 404."""
        self._check_open()
        return await self.engine.get_archive(self.id, path)

    async def get_file(self, path: str) -> bytes:
        """Read one regular file from the container."""
        self._check_open()
        with await self.engine.get_archive(self.id, path) as tar:
            member = tar.next()
            extracted = tar.extractfile(member) if member is not None else None
            if extracted is None:
                raise ContainerError(f"{path!r} is not a regular file", container_id=self.id)
            return extracted.read()

    async def commit(
        self,
        repo: str,
        tag: str = "latest",
        *,
        labels: Mapping[str, str] | None = None,
        changes: Sequence[str] = (),
    ) -> str:
        """Snapshot the container's filesystem as image ``repo:tag``; returns the image id.

        Our ownership labels are blanked on the image, so containers run from it by
        others are never mistaken for ours.
        """
        self._check_open()
        blank = dict.fromkeys((*OWNER_LABELS, SESSION_LABEL, _CREATE_LABEL), "")
        label_line = " ".join(
            f"{json.dumps(k)}={json.dumps(v)}" for k, v in {**blank, **(labels or {})}.items()
        )
        return await self.engine.commit_container(
            self.id, repo, tag, changes=[*changes, f"LABEL {label_line}"]
        )

    async def aclose(self) -> None:
        """Close shells and force-remove the container; safe to call twice or when cancelled."""
        if self._closed:
            return
        self._closed = True
        sessions, self._sessions = self._sessions, []
        for session in sessions:
            await session.detach()
        try:
            if not self.engine.connected:  # no client: a plain synchronous call still works
                await shielded(self._remove_without_engine(), within=self.remove_timeout)
                return
            try:
                await shielded(self.engine.remove_container(self.id), within=self.remove_timeout)
            except ContainerError as exc:
                if exc.status is not None:
                    raise
                # The client went away mid-call (its owner disconnected it while this
                # container's work was in flight): the container must still go.
                await shielded(self._remove_without_engine(), within=self.remove_timeout)
        except TimeoutError as exc:
            raise ContainerError(
                f"removing container {self.short_id} timed out after {self.remove_timeout}s",
                container_id=self.id,
            ) from exc

    async def _remove_without_engine(self) -> None:
        try:
            await asyncio.to_thread(remove_container_sync, self.id, self.engine.url)
        except (OSError, ValueError, http.client.HTTPException) as exc:
            raise ContainerError(
                f"removing container {self.short_id} failed: {exc}", container_id=self.id
            ) from exc

    def __repr__(self) -> str:
        state = "closed" if self._closed else "open"
        return f"<Container {self.short_id} image={self.spec.image!r} {state}>"


class _ExecCarrier:
    """A ``Carrier`` over one exec's stream (the client's errors mapped by the engine)."""

    __slots__ = ("_stream",)

    def __init__(self, stream: ExecStream) -> None:
        self._stream = stream

    async def read(self) -> tuple[bytes, bool] | None:
        return await self._stream.read()

    async def exit_code(self) -> int | None:
        return await self._stream.exit_status()

    async def close(self) -> None:
        await self._stream.close()
