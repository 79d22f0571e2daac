"""A scripted stand-in for bash and busybox ``sh -i`` behind a ``ShellChannel``, whose two
output streams are delivered in an order the test chooses: every interleaving a host that
copies the streams independently (Docker, the gVisor relay) can produce.

The shell's side is what the real shells print for the framing ``ShellSession`` sends
(start-up text, prompts, syntax errors, sentinels and end marks, ``sh -n`` probes),
produced from the lines actually sent, so a change of framing that the session relies on
shows up here.
"""

from __future__ import annotations

import asyncio
import re
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

Kind = Literal["bash", "busybox"]

STARTUP: dict[Kind, tuple[bytes, ...]] = {
    "busybox": (b"/bin/sh: can't access tty; job control turned off\n", b"/ # "),
    "bash": (
        b"bash: cannot set terminal process group (-1): Inappropriate ioctl for device\n"
        b"bash: no job control in this shell\n",
        b"bash-5.2# ",
    ),
}
EXE: dict[Kind, str] = {"busybox": "/bin/busybox", "bash": "/usr/bin/bash"}
_SYNTAX: dict[Kind, str] = {
    "busybox": 'sh: syntax error: unexpected ")"\n',
    "bash": "bash: syntax error near unexpected token `)'\n",
}
_PARSER: dict[Kind, str] = {
    "busybox": 'sh: syntax error: unexpected ")"\n',
    "bash": "bash: line 1: syntax error near unexpected token `)'\nbash: line 1: `echo )'\n",
}
_GROUP = re.compile(r"^\{ (.*); \} </dev/null >&\d+ 2>\S+ \d+>&-$")
_PROBE = re.compile(r"^LC_ALL=C \S+(?: sh)? -n 2>&1 <<'(\S+)' \|\| \\:$")
_MARK_PRINTF = re.compile(r"printf '(__llps2_[0-9a-f]+_)e%d__' (\d+) >&2")


def run_body(kind: Kind, body: str) -> tuple[str, str, int] | int:
    """What a command prints on the data channel and on the shell's own, and its exit
    code; an ``int`` alone: the shell exits with that status."""
    if body.startswith("exit "):
        return int(body.split()[1])
    if "echo )" in body.split("\n"):
        return "", _SYNTAX[kind], 2
    if body == "ls /nope":
        return "ls: cannot access '/nope': No such file or directory\n", "", 2
    lines = body.split("\n")
    if all(line.startswith("echo ") for line in lines):
        return "".join(line.removeprefix("echo ") + "\n" for line in lines), "", 0
    raise AssertionError(f"the fake shell has no script for {body!r}")


class Wire:
    """The shell's two output streams, queued; ``choose(n)`` picks which of n ready
    streams is delivered next (the test's interleaving)."""

    def __init__(self, choose: Callable[[int], int], *, split: bool = False) -> None:
        self.queues: dict[int, deque[bytes]] = {1: deque(), 2: deque()}
        self.choose = choose
        self.split = split
        self.ended = False
        self.changed = asyncio.Event()

    def emit(self, stream: int, data: bytes) -> None:
        if not data:
            return
        chunks = [data[i : i + 1] for i in range(len(data))] if self.split else [data]
        self.queues[stream].extend(chunks)
        self.changed.set()

    def end(self) -> None:
        self.ended = True
        self.changed.set()

    def ready(self, streams: tuple[int, ...] = (1, 2)) -> list[int]:
        return [s for s in streams if self.queues[s]]

    def pick(self, ready: list[int]) -> int:
        return ready[0] if len(ready) == 1 else ready[self.choose(len(ready))]

    async def changes(self) -> None:
        await self.changed.wait()
        self.changed.clear()


@dataclass
class FakeShell:
    """Runs the lines a ``ShellSession`` sends, printing to ``wire`` as the real shells do."""

    kind: Kind
    wire: Wire
    probes: int = 0
    status: int | None = None
    _buffer: str = ""
    _tag: str = ""
    _marker: str = ""
    _p: int = 0
    _rc: int = 0
    _block: list[str] | None = None
    _sent: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        for chunk in STARTUP[self.kind]:  # printed before the shell reads its first line
            self.wire.emit(2, chunk)

    def write(self, data: bytes) -> None:
        assert self.status is None, "written to after the shell exited"
        self._buffer += data.decode()
        while "\n" in self._buffer and self.status is None:
            line, self._buffer = self._buffer.split("\n", 1)
            self._line(line)

    def _line(self, line: str) -> None:
        self._sent.append(line)
        if self._block is not None:  # inside a ``{`` block: each line read after a PS2
            self.wire.emit(2, f"{self._marker}{self._p}__".encode())
            if line.startswith("} </dev/null"):
                body, self._block = "\n".join(self._block), None
                self._run(body)
            else:
                self._block.append(line)
        elif line == "{":
            self._block = []
        elif "__llenvs_fd=9" in line:
            self._init(line)
        elif line.startswith("__llenvs_rc=$?;"):
            self._sentinel(line)
        elif match := _GROUP.match(line):
            self._run(match.group(1))
        else:
            raise AssertionError(f"the fake shell cannot read {line!r}")

    def _init(self, line: str) -> None:
        tag = re.search(r"printf '(__llend_[0-9a-f]+_)(\d+):0:", line)
        marker = re.search(r"PS2='(__llps2_[0-9a-f]+_)\$\{__llenvs_p\}__'", line)
        assert tag and marker, line
        self._tag, self._marker, self._p = tag.group(1), marker.group(1), int(tag.group(2))
        bash = "bash" if self.kind == "bash" else ""
        self.wire.emit(1, f"{self._tag}{self._p}:0:4242:57:{bash}:{EXE[self.kind]}\n".encode())
        self._marks(line)

    def _run(self, body: str) -> None:
        first, *rest = body.split("\n")
        if (probe := _PROBE.match(first)) and rest[-1:] == [probe.group(1)]:
            self.probes += 1
            self.wire.emit(1, (_PARSER[self.kind] if "echo )" in rest else "").encode())
            self._rc = 0  # ``|| \:``
            return
        outcome = run_body(self.kind, body)
        if isinstance(outcome, int):
            self.status = outcome
            self.wire.end()
            return
        out, err, self._rc = outcome
        self.wire.emit(1, out.encode())
        self.wire.emit(2, err.encode())

    def _sentinel(self, line: str) -> None:
        seq = re.search(r"__llenvs_p=(\d+);", line)
        assert seq, line
        self._p = int(seq.group(1))
        flags = "hB" if self.kind == "bash" else "i"
        self.wire.emit(1, f"{self._tag}{self._p}:{self._rc}:{flags}\n".encode())
        self._marks(line)

    def _marks(self, line: str) -> None:
        for marker, seq in _MARK_PRINTF.findall(line):
            self.wire.emit(2, f"{marker}e{seq}__".encode())
        # The framing before end marks were printed every time: only after exit code 2.
        old = re.search(r'"%\.\$\(\(__llenvs_rc == 2 \? \d+ : 0\)\)s" (\S+) >&2', line)
        if old and self._rc == 2:
            self.wire.emit(2, old.group(1).encode())


@dataclass(frozen=True)
class Message:
    stream: int
    data: bytes


class FakeChannel:
    """A Docker-style channel: each read takes the next chunk of a stream ``choose`` picks."""

    def __init__(self, shell: FakeShell) -> None:
        self.shell = shell

    async def write_in(self, data: bytes) -> None:
        self.shell.write(data)

    async def read_out(self) -> Message | None:
        wire = self.shell.wire
        while True:
            if ready := wire.ready():
                stream = wire.pick(ready)
                return Message(stream, wire.queues[stream].popleft())
            if wire.ended:
                return None
            await wire.changes()

    async def close(self) -> None:
        pass

    async def exit_code(self) -> int | None:
        return self.shell.status


class RelayReader:
    """One relay stream (``proc.stdout`` / ``proc.stderr`` of the gVisor relay): a read
    completes only when the wire hands it the next chunk, one chunk in flight at a time."""

    def __init__(self, relay: FakeRelay, stream: int) -> None:
        self.relay, self.stream = relay, stream

    async def read(self, n: int) -> bytes:
        return await self.relay.take(self.stream)


class FakeRelay:
    """What ``FifoChannel`` reads: the relay process's stdin and two output streams. A
    chunk handed to a stream is delivered once that stream's reader asks again (the channel
    returned it), so the handing order is the order the session sees."""

    def __init__(self, shell: FakeShell) -> None:
        self.shell = shell
        self.stdin = _Stdin(shell)
        self.stdout, self.stderr = RelayReader(self, 1), RelayReader(self, 2)
        self.returncode: int | None = None
        self._waiting: dict[int, asyncio.Future[bytes]] = {}
        self._in_flight: int | None = None
        self._pumping: asyncio.Task[None] | None = None

    async def take(self, stream: int) -> bytes:
        if self._in_flight == stream:
            self._in_flight = None
        future: asyncio.Future[bytes] = asyncio.get_running_loop().create_future()
        self._waiting[stream] = future
        self.shell.wire.changed.set()  # a pump waiting for this read goes on
        if self._pumping is None or self._pumping.done():
            self._pumping = asyncio.ensure_future(self._pump())
        return await future

    async def _pump(self) -> None:
        wire = self.shell.wire
        while self._waiting:
            if self._in_flight is None and (ready := wire.ready(tuple(self._waiting))):
                stream = wire.pick(ready)
                future = self._waiting.pop(stream)
                if not future.done():  # else its read was cancelled (the channel closed)
                    self._in_flight = stream
                    future.set_result(wire.queues[stream].popleft())
                continue
            if wire.ended and not wire.ready():
                for future in self._waiting.values():
                    if not future.done():
                        future.set_result(b"")
                self._waiting.clear()
                return
            await wire.changes()

    async def wait(self) -> int:
        self.returncode = self.shell.status if self.shell.status is not None else -9
        return self.returncode

    def kill(self) -> None:
        self.returncode = -9
        self.shell.wire.end()
        if self._pumping is not None:
            self._pumping.cancel()


@dataclass
class _Stdin:
    shell: FakeShell

    def write(self, data: bytes) -> None:
        self.shell.write(data)

    async def drain(self) -> None:
        pass

    def is_closing(self) -> bool:
        return False

    def close(self) -> None:
        pass


class FakeHost:
    """A ``ShellHost`` whose every channel is a new fake shell of ``kind``."""

    id = short_id = "fake"
    closed = False

    def __init__(
        self,
        kind: Kind,
        choose: Callable[[int], int],
        *,
        relay: bool = False,
        split: bool = False,
    ) -> None:
        self.kind, self.choose, self.relay, self.split = kind, choose, relay, split
        self.shells: list[FakeShell] = []

    async def open_channel(self, argv: list[str]) -> Any:
        shell = FakeShell(self.kind, Wire(self.choose, split=self.split))
        self.shells.append(shell)
        if not self.relay:
            return FakeChannel(shell)
        from llenvs_async.sandbox.channel import FifoChannel

        return FifoChannel(_ClosedSandbox(), "/run/llenvs-shell/fake", FakeRelay(shell))  # type: ignore[arg-type]

    async def signal_tree(self, root_pid: int, signal: str, **_: Any) -> int:
        return 0


class _ClosedSandbox:
    """Just enough of a ``Sandbox`` for ``FifoChannel.close`` (gone: nothing to kill)."""

    closed = True


class Explorer:
    """Enumerates every sequence of choices (depth first): ``choose`` answers 0 past the
    prefix being explored and records where another answer was possible."""

    def __init__(self) -> None:
        self._todo: list[list[int]] = [[]]
        self._prefix: list[int] = []
        self._taken: list[tuple[int, int]] = []
        self.runs = 0

    def next_run(self) -> bool:
        for j in range(len(self._prefix), len(self._taken)):
            choice, width = self._taken[j]
            taken = [c for c, _ in self._taken[:j]]
            self._todo.extend([*taken, alt] for alt in range(choice + 1, width))
        if not self._todo:
            return False
        self._prefix, self._taken = self._todo.pop(), []
        self.runs += 1
        return True

    def choose(self, width: int) -> int:
        i = len(self._taken)
        choice = self._prefix[i] if i < len(self._prefix) else 0
        self._taken.append((choice, width))
        return choice
