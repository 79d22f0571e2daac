"""``Sandbox``: a gVisor (runsc) sandbox with a container's interface: exec with timeouts,
persistent shells, files, checkpoint and restore, idempotent removal.

Same defaults as ``Container``: no network (``--network=none``: loopback only), no new
privileges, Docker's capabilities less ``ContainerSpec.cap_drop``, pids/memory/cpu limits
(OCI ``linux.resources``, enforced by runsc's cgroups), tini as init, the ownership labels
as OCI annotations (``runsc list`` shows them: how ``reap_orphan_sandboxes`` finds leftovers).
An image whose own ``ls`` this runsc fails with EINVAL (runsc older than gVisor 20231030 and
coreutils >= 9) is logged as such, once per image: its sandboxes (and forks) cannot stat.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, ClassVar

from .._shield import shielded
from ..docker.container import ContainerSpec
from ..docker.engine import DockerEngine
from ..errors import ContainerError, EnvError
from ..host import (
    SIGNAL_TIMEOUT,
    Capability,
    Carrier,
    Host,
    ShellChannel,
    ShellSession,
)
from .bundle import ImageRootfs, ensure_rootfs, find_init, oci_config, write_bundle
from .channel import SHELL_DIR, START_SCRIPT, FifoChannel
from .reaper import register_sandbox_backstop, remove_sandbox_sync
from .runsc import Runsc, find_runsc

__all__ = ["Sandbox"]

# A missing file, told apart from other failures of ``get_file``.
_MISSING = 44
# Stats a path as the image's own ls does (GNU ls: statx with AT_NO_AUTOMOUNT).
_STAT_PROBE = "ls -d / >/dev/null"
# (runsc binary, image id) pairs whose ``ls`` was probed in this process.
_stat_checked: set[tuple[str, str]] = set()
_log = logging.getLogger("llenvs_async.sandbox")


class Sandbox(Host):
    """A running gVisor sandbox owned by this process; ``aclose`` kills and deletes it."""

    capabilities: ClassVar[frozenset[Capability]] = frozenset({"checkpoint"})

    def __init__(
        self,
        runsc: Runsc,
        sandbox_id: str,
        spec: ContainerSpec,
        config: Mapping[str, Any],
        *,
        remove_timeout: float = 30.0,
    ) -> None:
        self.runsc = runsc
        self.id = sandbox_id
        self.spec = spec
        self.config = config
        self.remove_timeout = remove_timeout
        self._sessions: list[ShellSession] = []
        self._channels: list[FifoChannel] = []
        self._closed = False

    @classmethod
    async def create(
        cls,
        engine: DockerEngine,
        spec: ContainerSpec,
        *,
        runsc: Runsc | None = None,
        create_timeout: float = 120.0,
    ) -> Sandbox:
        """Start a sandbox from ``spec.image`` (a local image, exported once for gVisor);
        ``EnvError`` for a spec asking for a network, which a sandbox never has."""
        if spec.network_mode != "none":
            raise EnvError(
                f"the gVisor runtime runs sandboxes without a network (--network=none), "
                f"not network_mode={spec.network_mode!r}"
            )
        runsc = runsc or find_runsc()
        rootfs: ImageRootfs = await ensure_rootfs(engine, spec.image)
        checked = (runsc.binary, rootfs.image_id)
        annotations = {**spec.labels, **engine.labels}
        config = oci_config(spec, rootfs, init=find_init(), annotations=annotations)
        sandbox = await cls._start(runsc, spec, config, ("run",), create_timeout)
        if checked not in _stat_checked:
            _stat_checked.add(checked)  # before the probe: concurrent creates probe once
            try:
                await sandbox._check_stat()
            except BaseException:
                await sandbox.aclose()
                raise
        return sandbox

    async def _check_stat(self) -> None:
        """Warn when this image's own ``ls`` fails with EINVAL here: runsc before gVisor
        release-20231030 rejects statx/fstatat's ``AT_NO_AUTOMOUNT``, which coreutils >= 9
        passes, so ``ls PATH``/``stat`` fail in every sandbox of the image, forks included."""
        result = await self.exec(["/bin/sh", "-c", _STAT_PROBE], timeout=SIGNAL_TIMEOUT)
        if result.ok or "Invalid argument" not in result.output:
            return
        version = (await self.runsc.call("--version", what="--version")).partition("\n")[0]
        _log.warning(
            "gVisor's runsc (%s) rejects statx/fstatat's AT_NO_AUTOMOUNT flag (accepted from "
            "gVisor release-20231030), so GNU ls/stat in image %r fail with 'Invalid argument' "
            "on every path (%r): run this image on runc, or name a runsc from release-20231030 "
            "on in LLENVS_RUNSC (Debian trixie's 0.0~20240729 stats fine but loses "
            "runsc-exec'd processes on restore: SnapshotRestore(processes=True) breaks there)",
            version, self.spec.image, result.output.strip()[-200:],
        )  # fmt: skip

    @classmethod
    async def restore(
        cls,
        runsc: Runsc,
        spec: ContainerSpec,
        config: Mapping[str, Any],
        image_path: Path,
        *,
        labels: Mapping[str, str],
        create_timeout: float = 120.0,
    ) -> Sandbox:
        """A new sandbox resumed from a checkpoint image made by ``checkpoint`` (processes,
        memory and the in-memory filesystem as they were); ``labels``: its owner now."""
        config = {**config, "annotations": {**config.get("annotations", {}), **labels}}
        restore = ("restore", f"--image-path={image_path}")
        return await cls._start(runsc, spec, config, restore, create_timeout)

    @classmethod
    async def _start(
        cls,
        runsc: Runsc,
        spec: ContainerSpec,
        config: Mapping[str, Any],
        how: Sequence[str],
        create_timeout: float,
    ) -> Sandbox:
        sandbox_id = f"llenvs-{secrets.token_hex(8)}"
        bundle = runsc.bundles / sandbox_id
        write_bundle(bundle, config)
        register_sandbox_backstop(runsc)
        start = runsc.call(*how, f"--bundle={bundle}", "-detach", sandbox_id, sandbox=True,
                           timeout=create_timeout, what=f"{how[0]} {sandbox_id}",
                           log=bundle / "runsc.log")  # fmt: skip
        try:
            await shielded(start, within=create_timeout + 5)
        except BaseException as exc:
            try:
                await shielded(asyncio.to_thread(remove_sandbox_sync, runsc, sandbox_id), within=30)
            except (OSError, subprocess.SubprocessError, TimeoutError) as cleanup:
                exc.add_note(f"removing the half-made sandbox failed too: {cleanup!r}")
            raise
        return cls(runsc, sandbox_id, spec, config)

    @property
    def short_id(self) -> str:
        return self.id.removeprefix("llenvs-")[:12]

    @property
    def workdir(self) -> str:
        return str(self.config["process"]["cwd"])

    async def inspect(self) -> dict[str, Any]:
        """A Docker-shaped subset (``Id``, ``Config.WorkingDir``/``Env``), for shared callers."""
        self._check_open()
        process = self.config["process"]
        return {"Id": self.id, "Config": {"WorkingDir": process["cwd"], "Env": process["env"]}}

    def _exec_args(
        self,
        argv: Sequence[str],
        *,
        env: Mapping[str, str] | None = None,
        workdir: str | None = None,
        user: str | None = None,
    ) -> list[str]:
        flags = [f"--env={k}={v}" for k, v in (env or {}).items()]
        if workdir:
            flags.append(f"--cwd={workdir}")
        if user:
            flags.append(f"--user={user}")
        return ["exec", *flags, self.id, *argv]

    async def _spawn(
        self,
        argv: Sequence[str],
        *,
        env: Mapping[str, str] | None = None,
        workdir: str | None = None,
        user: str | None = None,
        stdin: bytes | None = None,
    ) -> Carrier:
        self._check_open()
        proc = await asyncio.create_subprocess_exec(
            *self.runsc.argv(*self._exec_args(argv, env=env, workdir=workdir, user=user)),
            stdin=subprocess.PIPE if stdin is not None else subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
        )
        return _ExecCarrier(proc, stdin)

    async def open_channel(self, argv: list[str]) -> ShellChannel:
        """Start ``argv`` on FIFOs in the sandbox and relay to it (see ``channel``)."""
        self._check_open()
        directory = f"{SHELL_DIR}/{secrets.token_hex(6)}"
        result = await self.exec(["/bin/sh", "-c", START_SCRIPT, "sh", directory, *argv])
        if not result.ok:
            raise ContainerError(
                f"could not start a shell in sandbox {self.short_id} (needs mkfifo): "
                f"{result.output.strip()[-300:]!r}",
                container_id=self.id,
            )
        return await self.attach_channel(directory)

    async def attach_channel(self, directory: str) -> FifoChannel:
        """A new relay to the shell whose FIFOs are in ``directory`` (after a restore)."""
        self._check_open()
        channel = await FifoChannel.attach(self, self.runsc.argv("exec", self.id), directory)
        self._channels.append(channel)
        return channel

    def track(self, session: ShellSession) -> None:
        """Close ``session`` (an adopted shell) with this sandbox."""
        self._sessions.append(session)

    async def put_archive(self, directory: str, tar_bytes: bytes) -> None:
        """Extract a tar archive into ``directory`` (needs ``tar`` in the image)."""
        result = await self.exec(["tar", "-x", "-f", "-", "-C", directory], stdin=tar_bytes,
                                 user="0:0")  # fmt: skip
        if not result.ok:
            raise ContainerError(
                f"copying files into {directory!r} failed: {result.output.strip()[-300:]}",
                container_id=self.id,
            )

    async def get_file(self, path: str) -> bytes:
        """Read one regular file (``ContainerError`` with ``status=404`` when missing)."""
        script = f'[ -f "$1" ] || exit {_MISSING}; exec cat -- "$1"'
        result = await self.exec(["/bin/sh", "-c", script, "sh", path], user="0:0",
                                 max_output_bytes=64 << 20)  # fmt: skip
        if result.exit_code == _MISSING:
            raise ContainerError(f"{path!r} is not a file", container_id=self.id, status=404)
        if not result.ok:
            raise ContainerError(f"reading {path!r} failed: {result.output[-300:]}",
                                 container_id=self.id)  # fmt: skip
        return result.output.encode("utf-8", "surrogateescape")

    async def checkpoint(self, image_path: Path) -> None:
        """Save the whole sandbox (processes, memory, in-memory filesystem) into ``image_path``.

        The relays of its shells end first (a checkpoint holds no host descriptors); the
        sandbox stops: continue in one restored from the image. This object is closed, its
        stopped sandbox not yet deleted: ``delete_stopped`` does that (``runsc delete`` takes
        seconds here, so it runs alongside the restores).
        """
        self._check_open()
        channels, self._channels = self._channels, []
        for channel in channels:
            await channel.close()
        await asyncio.to_thread(image_path.mkdir, parents=True, exist_ok=True)
        try:
            await self.runsc.call("checkpoint", f"--image-path={image_path}", self.id,
                                  timeout=self.remove_timeout * 4, what="checkpoint")  # fmt: skip
        except BaseException:
            await self.aclose()
            raise
        self._closed = True
        sessions, self._sessions = self._sessions, []
        for session in sessions:
            await session.detach()

    async def delete_stopped(self) -> None:
        """Delete the sandbox ``checkpoint`` stopped (shielded; idempotent)."""
        await shielded(asyncio.to_thread(remove_sandbox_sync, self.runsc, self.id), within=60)

    async def aclose(self) -> None:
        """Kill and delete the sandbox and its bundle (idempotent, shielded, bounded)."""
        if self._closed:
            return
        self._closed = True
        try:
            await shielded(
                asyncio.to_thread(remove_sandbox_sync, self.runsc, self.id),
                within=self.remove_timeout,
            )
        except (OSError, subprocess.SubprocessError, TimeoutError) as exc:
            raise ContainerError(
                f"removing sandbox {self.id} failed: {exc!r}", container_id=self.id
            ) from exc
        finally:  # after the sandbox: the pipes it held are closed now
            sessions, self._sessions = self._sessions, []
            for session in sessions:
                await session.detach()
            channels, self._channels = self._channels, []
            for channel in channels:
                await shielded(channel.close(), within=15)

    def __repr__(self) -> str:
        state = "closed" if self._closed else "open"
        return f"<Sandbox {self.id} image={self.spec.image!r} {state}>"


class _ExecCarrier:
    """A ``Carrier`` over one ``runsc exec`` subprocess (stderr merged into stdout): ``stdin``
    is written on the first read, within the exec's timeout."""

    __slots__ = ("_proc", "_stdin")

    def __init__(self, proc: asyncio.subprocess.Process, stdin: bytes | None) -> None:
        self._proc, self._stdin = proc, stdin

    async def read(self) -> tuple[bytes, bool] | None:
        proc = self._proc
        if self._stdin is not None and proc.stdin is not None:
            data, self._stdin = self._stdin, None
            proc.stdin.write(data)
            await proc.stdin.drain()
            proc.stdin.close()
        assert proc.stdout is not None
        if chunk := await proc.stdout.read(65536):
            return chunk, True
        await proc.wait()
        return None

    async def exit_code(self) -> int | None:
        return self._proc.returncode

    async def close(self) -> None:
        if self._proc.returncode is None:
            self._proc.kill()
            await self._proc.wait()
