"""Checkpoint a sandbox with its persistent shell, and resume copies of it: the fork that
keeps processes (servers, background jobs) and the whole shell state.

A checkpoint stops the sandbox, so the episode that was checkpointed continues in a
restore too. After each restore a new relay attaches to the shell's FIFOs and a
``ShellSession`` adopts the running shell (``ShellSession.adopt``): cwd, unexported
variables, functions, aliases, options and traps are simply still there.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..docker.container import ContainerSpec
from ..docker.shell import ShellSession, ShellSnapshot
from ..errors import ContainerError
from .channel import FifoChannel
from .reaper import write_owner
from .runsc import Runsc
from .sandbox import Sandbox

__all__ = ["SandboxCheckpoint", "checkpoint_sandbox", "resume_sandbox"]


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
    def image_path(self) -> Path:
        return self.directory / "image"


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


async def resume_sandbox(
    checkpoint: SandboxCheckpoint, labels: Mapping[str, str]
) -> tuple[Sandbox, ShellSession]:
    """A new sandbox restored from ``checkpoint``, and a session on its (running) shell."""
    sandbox = await Sandbox.restore(
        checkpoint.runsc, checkpoint.spec, checkpoint.config, checkpoint.image_path, labels=labels
    )
    try:
        channel = await sandbox.attach_channel(checkpoint.shell_dir)
        session = ShellSession.adopt(sandbox, checkpoint.shell, channel)
        sandbox.track(session)
    except BaseException:
        await sandbox.aclose()
        raise
    return sandbox, session
