"""Checkpoint a sandbox with its persistent shell, and resume copies of it: the fork that
keeps processes (servers, background jobs) and the whole shell state.

A checkpoint stops the sandbox, so the episode that was checkpointed continues in a
restore too. After each restore a new relay attaches to the shell's FIFOs and a
``ShellSession`` adopts the running shell (``ShellSession.adopt``): cwd, unexported
variables, functions, aliases, options and traps are simply still there.
``SandboxProcessFork`` is the gVisor runtime's ``ProcessFork``: how
``SnapshotRestore(processes=True)`` forks sandboxes.
"""

from __future__ import annotations

import asyncio
import logging
import shutil
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from .._shield import shielded
from ..docker.container import ContainerSpec
from ..errors import ContainerError, RestoreError
from ..host import ShellHost, ShellSession, ShellSnapshot
from ..types import State
from .channel import FifoChannel
from .reaper import write_owner
from .runsc import Runsc
from .sandbox import Sandbox

_log = logging.getLogger("llenvs_async.sandbox")

__all__ = [
    "CheckpointForkable",
    "SandboxCheckpoint",
    "SandboxProcessFork",
    "checkpoint_sandbox",
]


@dataclass(frozen=True, slots=True, kw_only=True)
class SandboxCheckpoint:
    """A checkpoint image of a sandbox and what restoring it needs (bundle, shell)."""

    directory: Path
    runsc: Runsc
    spec: ContainerSpec
    config: Mapping[str, Any]
    shell: ShellSnapshot
    shell_dir: str

    @property
    def name(self) -> str:
        return self.directory.name

    @property
    def image(self) -> str:
        return self.spec.image

    @property
    def image_path(self) -> Path:
        return self.directory / "image"

    async def resume(self, labels: Mapping[str, str]) -> tuple[Sandbox, ShellSession]:
        """A new sandbox restored from this checkpoint, and a session on its (running) shell.

        A restore runsc fails is tried once more in a new sandbox (logged with runsc's
        reason): on two loaded cores runsc 2022-12 crashed (a Go panic) in about one restore
        of a thousand.
        """
        try:
            sandbox = await self._restore(labels)
        except ContainerError as exc:
            _log.warning("restoring checkpoint %s failed; trying once more: %s", self.name, exc)
            sandbox = await self._restore(labels)
        try:
            channel = await sandbox.attach_channel(self.shell_dir)
            session = ShellSession.adopt(sandbox, self.shell, channel)
            sandbox.track(session)
        except BaseException:
            await sandbox.aclose()
            raise
        return sandbox, session

    async def _restore(self, labels: Mapping[str, str]) -> Sandbox:
        return await Sandbox.restore(
            self.runsc, self.spec, self.config, self.image_path, labels=labels
        )


async def checkpoint_sandbox(
    sandbox: Sandbox, shell: ShellSession, name: str, labels: Mapping[str, str]
) -> SandboxCheckpoint:
    """Checkpoint ``sandbox`` (which stops) into the state root, recording its owner."""
    channel = shell.channel
    if not isinstance(channel, FifoChannel):
        raise ContainerError("the shell to checkpoint does not run in a gVisor sandbox")
    snap = shell.snapshot()
    directory = sandbox.runsc.checkpoints / name
    directory.mkdir(parents=True, exist_ok=True, mode=0o700)
    write_owner(directory, labels)
    checkpoint = SandboxCheckpoint(
        directory=directory,
        runsc=sandbox.runsc,
        spec=sandbox.spec,
        config=sandbox.config,
        shell=snap,
        shell_dir=channel.directory,
    )
    await sandbox.checkpoint(checkpoint.image_path)
    return checkpoint


class CheckpointForkable(Protocol):
    """What ``SandboxProcessFork`` needs of an environment: its live shell and box, and a
    way to continue a state in a sandbox restored from a checkpoint."""

    @property
    def shell(self) -> ShellSession | None: ...

    @property
    def container(self) -> ShellHost | None: ...

    async def resume(self, point: SandboxCheckpoint, state: State) -> State: ...


class SandboxProcessFork:
    """Forks whole gVisor sandboxes (processes, memory, filesystem, the shell's full state)
    for a ``SnapshotFork``: checkpoints the replayed one, resumes copies; ``aclose`` removes
    the checkpoint images (``timeout`` bounds a checkpoint and each removal)."""

    runtime = "gvisor"

    def __init__(self, *, timeout: float = 120.0) -> None:
        self.timeout = timeout
        self._directories: list[Path] = []  # checkpoint images made (removed by aclose)

    async def checkpoint(
        self, env: CheckpointForkable, state: State, name: str, labels: Mapping[str, str]
    ) -> SandboxCheckpoint:
        """Checkpoint ``env``'s sandbox (it stops) and continue ``env`` in a restore of it
        while the stopped one is deleted."""
        shell, sandbox = env.shell, env.container
        if shell is None or not isinstance(sandbox, Sandbox):
            raise RestoreError("processes=True needs an environment running in a gVisor sandbox")
        owner = {**labels, **sandbox.config["annotations"]}
        try:
            made = checkpoint_sandbox(sandbox, shell, name, owner)
            checkpoint = await shielded(made, within=self.timeout)
        finally:  # made or half-made, aclose removes it
            directory = sandbox.runsc.checkpoints / name
            if directory.exists():
                self._directories.append(directory)
        try:
            async with asyncio.TaskGroup() as tg:  # the stopped sandbox goes while env resumes
                tg.create_task(sandbox.delete_stopped())
                tg.create_task(env.resume(checkpoint, state))
        except ExceptionGroup as group:  # a failed resume or delete raises as itself
            if len(group.exceptions) == 1:
                raise group.exceptions[0] from None
            raise
        return checkpoint

    async def resume(
        self, env: CheckpointForkable, checkpoint: SandboxCheckpoint, state: State
    ) -> None:
        await env.resume(checkpoint, state)

    async def aclose(self) -> None:
        """Remove the checkpoint images (idempotent; each removal shielded and bounded)."""
        directories, self._directories = self._directories, []
        for directory in directories:
            await shielded(asyncio.to_thread(shutil.rmtree, directory, True), within=self.timeout)
