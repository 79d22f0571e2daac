"""What a ``ShellSession`` runs over (a channel on a host: a Docker container, a gVisor
sandbox) and what it knows of its shell process (``ShellSnapshot``, to adopt it again)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, Protocol

__all__ = ["ChannelMessage", "ShellChannel", "ShellHost", "ShellKind", "ShellSnapshot"]

ShellKind = Literal["auto", "bash", "sh"]


class ChannelMessage(Protocol):
    """One chunk a channel read: ``stream`` 1 (the data channel) or 2 (the shell's own)."""

    @property
    def stream(self) -> int: ...

    @property
    def data(self) -> bytes: ...


class ShellChannel(Protocol):
    """The shell's byte streams: its stdin, its stdout (1) and stderr (2) as messages."""

    async def write_in(self, data: bytes) -> None: ...

    async def read_out(self) -> ChannelMessage | None:
        """The next chunk, ``None`` at the end of both streams (the shell is gone)."""
        ...

    async def close(self) -> None: ...

    async def exit_code(self) -> int | None:
        """The shell's exit status once its streams ended (``None``: unknown)."""
        ...


class ShellHost(Protocol):
    """Where a shell runs (a Docker container, a gVisor sandbox): opens its channel and
    signals process trees (see ``Container.signal_tree``)."""

    @property
    def id(self) -> str: ...

    @property
    def short_id(self) -> str: ...

    @property
    def closed(self) -> bool: ...

    async def open_channel(self, argv: list[str]) -> ShellChannel: ...

    async def signal_tree(
        self,
        root_pid: int,
        signal: Literal["INT", "TERM", "KILL"],
        *,
        keep_root: bool = False,
        max_age_s: float | None = None,
    ) -> int: ...


@dataclass(frozen=True, slots=True, kw_only=True)
class ShellSnapshot:
    """What a ``ShellSession`` knows of its shell process, so a session can adopt that
    process again after its host was checkpointed and restored (``ShellSession.adopt``)."""

    token: str
    requested_shell: ShellKind
    kind: str
    pid: int
    fd: int
    seq: int
    prompt_seq: bytes
    flags: str
    mark: int = 0
    check_syntax_first: bool
    parser: str
    max_output_bytes: int
    grace_s: float
