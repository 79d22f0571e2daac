"""``Host``: a box commands run in (a Docker container, a gVisor sandbox). Its ``exec``, the
process-tree kill and the output drain are written here once, with one cleanup rule (anyio's):
on a timeout, or any exception or cancellation while a command runs, the command's process
group and descendants are killed, shielded from the cancellation and bounded in time, and its
carrier is let go. A subclass says only how a process is reached (``_spawn``) and how files
get in (``put_archive``)."""

from __future__ import annotations

import asyncio
import contextlib
import tarfile
import time
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from typing import ClassVar, Literal, Protocol

from .._resource import AsyncResource
from .._shield import shielded
from ..errors import ClosedError, ContainerError, EnvError
from ._exec import (
    PidMark,
    command_result,
    files_tar,
    kill_tree_argv,
    kill_tree_count,
    pid_marked,
    shell_command,
)
from ._output import DEFAULT_MAX_OUTPUT_BYTES, CappedOutput, CommandResult
from ._shell import ShellSession
from ._shell_channel import ShellChannel, ShellKind

__all__ = ["KILLED_DRAIN_TIMEOUT", "SIGNAL_TIMEOUT", "Capability", "Carrier", "Host"]

# What a box can do beyond exec and files, by name: be taken from a warm pool of started boxes,
# commit its filesystem to an image, checkpoint its processes and memory, copy archives out,
# share its network with sidecars, report its process count against its limit.
Capability = Literal["warm_pool", "commit", "checkpoint", "archives", "sidecars", "pids", "storage"]

# How long the exec that signals a process tree may take (then it is let go).
SIGNAL_TIMEOUT = 10.0
# How long the output of a command killed at its timeout may take to end.
KILLED_DRAIN_TIMEOUT = 10.0


class Carrier(Protocol):
    """How one exec's process is reached: a Docker exec's stream, a ``runsc exec``."""

    async def read(self) -> tuple[bytes, bool] | None:
        """The next chunk of output and whether it came on stdout (where the pid mark is);
        None once the output ended and the process exited."""
        ...

    async def exit_code(self) -> int | None:
        """The process's exit status, once ``read`` returned None."""
        ...

    async def close(self) -> None:
        """Let go of the process's carrier (killing it if it still runs); idempotent."""
        ...


class Host(AsyncResource, ABC):
    """A started box of some runtime, owned by this process: one-off execs with timeouts,
    process-tree signals, files and persistent shells (closed with it; a subclass keeps them
    in ``_sessions``)."""

    id: str
    _closed: bool
    _sessions: list[ShellSession]
    capabilities: ClassVar[frozenset[Capability]] = frozenset()

    @property
    @abstractmethod
    def short_id(self) -> str: ...

    @property
    def closed(self) -> bool:
        return self._closed

    def _check_open(self) -> None:
        if self._closed:
            raise ClosedError(f"{type(self).__name__} {self.short_id}")

    @abstractmethod
    async def _spawn(
        self,
        argv: Sequence[str],
        *,
        env: Mapping[str, str] | None = None,
        workdir: str | None = None,
        user: str | None = None,
        stdin: bytes | None = None,
    ) -> Carrier:
        """Start ``argv`` in the box (``stdin``: written to it, then closed)."""

    @abstractmethod
    async def open_channel(self, argv: list[str]) -> ShellChannel:
        """Start ``argv`` (a shell) with its stdin, stdout and stderr as a channel."""

    @abstractmethod
    async def get_file(self, path: str) -> bytes:
        """One regular file of the box (``ContainerError`` with ``status=404`` when missing)."""

    @abstractmethod
    async def put_archive(self, directory: str, tar_bytes: bytes) -> None:
        """Unpack ``tar_bytes`` into ``directory`` (which must exist), as root."""

    async def exec(
        self,
        argv: str | Sequence[str],
        *,
        timeout: float | None = None,  # noqa: ASYNC109 - on timeout the processes are killed
        env: Mapping[str, str] | None = None,
        workdir: str | None = None,
        user: str | None = None,
        stdin: bytes | None = None,
        max_output_bytes: int = DEFAULT_MAX_OUTPUT_BYTES,
    ) -> CommandResult:
        """Run one process (a string runs under ``/bin/sh -c``); stdout and stderr combined.

        On timeout, or on any exception or cancellation meanwhile, its process group and
        descendants are killed (see the module doc). Needs ``/bin/sh`` in the box.
        """
        self._check_open()
        command = shell_command(argv)
        started = time.monotonic()
        carrier = await self._spawn(
            pid_marked(command), env=env, workdir=workdir, user=user, stdin=stdin
        )
        out = CappedOutput(max_output_bytes)
        mark = PidMark()
        timed_out = False
        try:
            try:
                async with asyncio.timeout(timeout):
                    await _drain(carrier, out, mark)
            except TimeoutError:
                timed_out = True
                await self._end_killed(carrier, out, mark, command[0])
        except BaseException:
            if not timed_out:
                with contextlib.suppress(Exception):  # the original error goes first
                    await self._kill_tree(mark)
            raise
        finally:
            await shielded(carrier.close(), within=KILLED_DRAIN_TIMEOUT)
        return command_result(out, exit_code=await carrier.exit_code(), timed_out=timed_out,
                              started=started)  # fmt: skip

    async def _end_killed(
        self, carrier: Carrier, out: CappedOutput, mark: PidMark, program: str
    ) -> None:
        """A command past its timeout: kill its tree, then read what is left of its output."""
        try:
            await self._kill_tree(mark)
            async with asyncio.timeout(KILLED_DRAIN_TIMEOUT):
                await _drain(carrier, out, mark)
        except (TimeoutError, ContainerError) as exc:
            raise ContainerError(
                f"exec {program!r} did not end when killed after its timeout",
                container_id=self.id,
            ) from exc

    async def _kill_tree(self, mark: PidMark) -> None:
        if mark.pid:
            await shielded(self.signal_tree(mark.pid, "KILL"), within=SIGNAL_TIMEOUT + 5)

    async def signal_tree(
        self,
        root_pid: int,
        signal: Literal["INT", "TERM", "KILL"],
        *,
        keep_root: bool = False,
        max_age_s: float | None = None,
    ) -> int:
        """Signal ``root_pid``'s process group and descendants from a second exec (shell
        builtins only: it works when the pids limit is exhausted), within ``SIGNAL_TIMEOUT``.

        ``max_age_s`` limits it to processes started that recently; returns the count signalled.
        """
        self._check_open()
        argv = kill_tree_argv(signal, root_pid, keep_root=keep_root, max_age_s=max_age_s)
        carrier = await self._spawn(argv)
        out = CappedOutput(4096)
        try:
            async with asyncio.timeout(SIGNAL_TIMEOUT):
                await _drain(carrier, out)
        except TimeoutError as exc:
            raise ContainerError(
                f"signalling processes in {type(self).__name__} {self.short_id} took over "
                f"{SIGNAL_TIMEOUT}s",
                container_id=self.id,
            ) from exc
        finally:
            await shielded(carrier.close(), within=KILLED_DRAIN_TIMEOUT)
        return kill_tree_count(out.text())

    async def commit(
        self,
        repo: str,
        tag: str = "latest",
        *,
        labels: Mapping[str, str] | None = None,
        changes: Sequence[str] = (),
    ) -> str:
        """Snapshot the box's filesystem as image ``repo:tag``; its id (``commit``)."""
        raise self._lacking("commit", "commit its filesystem to an image")

    async def get_archive(self, path: str) -> tarfile.TarFile:
        """A file or directory of the box as an in-memory tar (``archives``)."""
        raise self._lacking("archives", f"copy {path!r} out as an archive")

    async def pids(self) -> tuple[int, int | None]:
        """How many processes the box holds and its limit, measured from outside (``pids``)."""
        raise self._lacking("pids", "report its process count")

    async def storage_used(self) -> int:
        """Bytes its writable layer holds, measured from outside (``storage``)."""
        raise self._lacking("storage", "report its disk use")

    def _lacking(self, capability: Capability, what: str) -> EnvError:
        return EnvError(
            f"{type(self).__name__} {self.short_id} cannot {what} (its runtime lacks the "
            f"{capability!r} capability; it has {sorted(self.capabilities)})"
        )

    async def shell(
        self, *, shell: ShellKind = "auto", max_output_bytes: int = DEFAULT_MAX_OUTPUT_BYTES
    ) -> ShellSession:
        """Start a persistent shell in this box; it is closed with the box."""
        session = await ShellSession.start(self, shell=shell, max_output_bytes=max_output_bytes)
        self._sessions.append(session)
        return session

    async def put_files(self, files: Mapping[str, bytes | str], *, mode: int = 0o644) -> None:
        """Write files (absolute paths; missing parent directories are created)."""
        await self.put_archive("/", files_tar(files, mode=mode))

    async def put_file(self, path: str, content: bytes | str, *, mode: int = 0o644) -> None:
        await self.put_files({path: content}, mode=mode)


async def _drain(carrier: Carrier, out: CappedOutput, mark: PidMark | None = None) -> None:
    """Read a carrier's output to its end into ``out``; ``mark`` takes the pid off stdout."""
    while (chunk := await carrier.read()) is not None:
        data, stdout = chunk
        out.feed(mark.feed(data) if mark is not None and stdout else data)
    if mark is not None:
        out.feed(mark.flush())
